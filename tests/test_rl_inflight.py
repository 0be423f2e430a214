"""In-flight weight updates (PipelineRL, `rl_inflight`): segments of one rollout on several versions.

The schedule: rl_inflight times everything as rl_async (the weight transfer overlaps the
decode) and records, per rollout, the first decoded token of every newer version that reached
its actor while it decoded; checked here against an independent reconstruction from the update
times over random clusters. The numerics: generation with segments samples each position with
its segment's version (checked token by token against teacher-forced log-probs of each
version); a replay without switches is rl_async's; a sweep mixing both replays each as alone.
Then the per-token staleness of `st.rollouts` and the spec (real runs: test_rl_inflight_real.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from _strategies import actors
from hypothesis import strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import core
from staleness.engine import plan as engine_plan
from staleness.engine.run import replay
from staleness.schedule import Schedule
from staleness.sim.scheduler import simulate_schedule
from staleness.tasks import rl
from staleness.tasks.rl import decode

SAME = ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start", "end", "push_time",
        "dropped", "lost")


def _bandit(n=4):
    return rl.get("rl-bandit", num_workers=n, objective="reinforce")


def _sizes(task, seed=0):
    return task.rollout_sizes(core.keys(seed)[1])


def _expected_switches(sched, row, sizes, pull_delay):
    """The in-flight switches of `row`, rebuilt from the update times: version v (completed at
    update_time[v − 1]) reaches the actor pull_delay later; the first token decoded at or after
    that instant, of the row's `size` tokens evenly spread over [start, end), is v's."""
    f = sched.columns
    start, end = float(f["start"][row]), float(f["end"][row])
    size = float(sizes(int(f["worker"][row]), int(f["iteration"][row]))) if sizes is not None else 1.0
    tau = (end - start) / size
    out = {}
    for v in range(int(f["pull_version"][row]) + 1, len(sched.update_time) + 1):
        arrive = sched.update_time[v - 1] + pull_delay
        if arrive >= end:
            break
        k = max(0, math.ceil((arrive - start) / tau))
        if k < size:
            out[k] = v   # a later version arriving before the same token replaces it
    return sorted(out.items())


@hst.composite
def inflight_runs(draw):
    cluster = actors(draw)
    pull = draw(hst.sampled_from([0.0, 0.05, 0.4]))
    if pull:
        cluster = cluster.network(0.01, pull)
    eta = draw(hst.sampled_from([None, 0, 1, 3]))
    learner = draw(hst.sampled_from([0.0, 0.5, 2.0]))
    return cluster, pull, eta, learner, draw(hst.booleans()), draw(hst.integers(0, 10_000))


@settings(max_examples=60, deadline=None)
@given(run=inflight_runs())
def test_segments_carry_the_versions_that_reached_the_actor(run):
    cluster, pull, eta, learner, use_sizes, seed = run
    sizes = _sizes(_bandit()) if use_sizes else None
    sched = simulate_schedule(P.rl_inflight(eta, learner=learner), cluster, num_updates=20, seed=seed, sizes=sizes)
    plain = simulate_schedule(P.rl_async(eta, learner=learner), cluster, num_updates=20, seed=seed, sizes=sizes)
    # the same timing as rl_async: in-flight updates change which version decodes a token, not when
    for k in SAME:
        np.testing.assert_array_equal(sched.columns[k], plain.columns[k], err_msg=k)
    np.testing.assert_array_equal(sched.update_time, plain.update_time)
    assert "segments" not in plain.meta
    got = engine_plan.segment_lists(sched)
    for row in range(sched.num_gradients):
        if sched.columns["lost"][row]:
            continue
        assert got.get(row, []) == _expected_switches(sched, row, sizes, pull), row


def test_a_run_with_switches_has_them_and_the_schedule_round_trips(tmp_path):
    sizes = _sizes(_bandit())
    sched = simulate_schedule("rl_inflight", C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.3), num_updates=30,
                              seed=0, sizes=sizes)
    segs = sched.meta["segments"]
    assert len(segs) > 10
    path = tmp_path / "s.json"
    sched.save(path)
    back = Schedule.load(path)
    assert back.meta["segments"] == segs
    assert engine_plan.fingerprint(back) == engine_plan.fingerprint(sched)
    plan = engine_plan.make_plan(sched, 8)
    assert plan.segments.shape[:2] == plan.worker.shape and plan.segments.shape[2] == 2
    # every slot's first segment is its pulled version, from token 0
    real = plan.mask
    np.testing.assert_array_equal(plan.segments[..., 1, 0][real], plan.pull_version[real])
    assert (plan.segments[..., 0, 0] == 0).all()


@pytest.mark.parametrize("entry", [[10_000, 1, 1], [0, 1, 0], [0, -1, 1], ["x", 1, 1]])
def test_bad_segments_in_a_schedule_are_one_line_errors(entry):
    sched = simulate_schedule("rl_inflight", "1,2", num_updates=4, seed=0)
    bad = Schedule(columns=sched.columns, update_time=sched.update_time, num_workers=2, policy=sched.policy,
                   cluster=sched.cluster, seed=0, rstar=sched.rstar, end_time=sched.end_time,
                   meta=dict(sched.meta, segments=[entry]))
    with pytest.raises(ValueError, match=r"meta\['segments'\]") as e:
        engine_plan.make_plan(bad, 4)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------
# Numerics


def _digits():
    return rl.get("rl-digits", num_workers=2, objective="reinforce", warm_start_steps=0, num_prompts=32,
                  num_eval_prompts=8)


def test_generation_samples_each_position_with_its_segment_version():
    task = _digits()
    a = task.init_params(jax.random.key(1))
    b = task.init_params(jax.random.key(2))
    idx = jnp.arange(4, dtype=jnp.int32)
    key = jax.random.key(5)
    stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)
    starts = jnp.asarray([0, 3], jnp.int32)
    out = task.generate(stacked, key, idx, starts, keep_cache=False)   # re-prefill: version s(t) on the whole prefix
    t = task.max_length
    la = np.asarray(task.logp(a, out)).reshape(-1, t)
    lb = np.asarray(task.logp(b, out)).reshape(-1, t)
    want = np.where(np.arange(t) < 3, la, lb)
    np.testing.assert_allclose(np.asarray(out.logp).reshape(-1, t), want, rtol=1e-5, atol=1e-5)
    assert np.abs(la - lb)[:, 3:].max() > 1e-3          # the versions differ where it matters
    # one segment (the rest padding) is plain generation, token for token
    pad = jnp.asarray([0, engine_plan.NO_SEGMENT], jnp.int32)
    one = task.generate(jax.tree.map(lambda x: jnp.stack([x, x]), a), key, idx, pad)
    ref = task.generate(a, key, idx)
    np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(one.logp), np.asarray(ref.logp), rtol=1e-6, atol=1e-6)


def test_sample_starts_pick_the_segment():
    """decode.sample with segments [0, 2, 5]: position t reads version #{j: starts[j] <= t} − 1."""
    seen = []

    def logits_fn(params, prompt, tokens):
        seen.append(None)
        return jnp.broadcast_to(params["w"], (tokens.shape[0], 3))

    params = {"w": jnp.asarray([[9.0, 0, 0], [0, 9.0, 0], [0, 0, 9.0]])}   # version j always emits token j
    tokens, _ = decode.sample(logits_fn, params, jax.random.key(0), jnp.zeros(()), jnp.int32(7), max_length=7,
                              pad_token=0, greedy=True, starts=jnp.asarray([0, 2, 5], jnp.int32))
    np.testing.assert_array_equal(np.asarray(tokens), [0, 0, 1, 1, 1, 2, 2])


@pytest.fixture(scope="module")
def digits_runs():
    task = _digits()
    cluster = C.heterogeneous([1.0, 2.5]).jitter(0.3)
    sizes = _sizes(task)
    sched = simulate_schedule("rl_inflight", cluster, num_updates=6, seed=0, sizes=sizes)
    return task, cluster, sched


def test_replay_without_switches_is_rl_async(digits_runs):
    """The same schedule with its switches removed replays as rl_async's (one version per
    rollout); with them, to other parameters."""
    task, cluster, sched = digits_runs
    assert sched.meta["segments"]
    plain = simulate_schedule("rl_async", cluster, num_updates=6, seed=0, sizes=_sizes(task))
    stripped = Schedule(columns=sched.columns, update_time=sched.update_time, num_workers=2, policy=sched.policy,
                        cluster=sched.cluster, seed=0, rstar=sched.rstar, end_time=sched.end_time,
                        meta=dict(sched.meta, segments=[]))
    r_plain = replay(plain, task, lr=1e-3, num_evals=1)
    r_strip = replay(stripped, task, lr=1e-3, num_evals=1)
    r_in = replay(sched, task, lr=1e-3, num_evals=1)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), r_plain.params, r_strip.params)
    assert _maxdiff(r_in.params, r_plain.params) > 1e-4


def test_sweep_mixing_inflight_and_async_replays_each_as_alone(digits_runs):
    """Each configuration of a sweep runs its own replay's ops (its own learner: with or
    without in-flight segments, its own slots and segments), so it is bitwise its replay."""
    task, cluster, sched = digits_runs
    res = st.sweep(task, ["rl_async", "rl_inflight"], cluster, seeds=[0], lrs=[1e-3], num_updates=6, num_evals=1)
    by = {r.config["policy"]: r for r in res}
    alone = replay(sched, task, lr=1e-3, num_evals=1)
    assert _maxdiff(by["rl_inflight"].params, alone.params) == 0
    plain = replay(simulate_schedule("rl_async", cluster, num_updates=6, seed=0, sizes=_sizes(task)), task,
                   lr=1e-3, num_evals=1)
    assert _maxdiff(by["rl_async"].params, plain.params) == 0
    assert _maxdiff(by["rl_async"].params, by["rl_inflight"].params) > 1e-4


def _maxdiff(a, b) -> float:
    return max(float(np.abs(np.asarray(x) - np.asarray(y)).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ---------------------------------------------------------------------------
# Analysis, specs, refusals


def test_token_staleness_counts_each_segment_at_its_version(digits_runs):
    task, _, sched = digits_runs
    table = st.rollouts.table(sched, task)
    s = st.rollouts.summary(sched, task)
    lists = engine_plan.segment_lists(sched)
    f = sched.columns
    # by hand for one consumed rollout with a switch inside its completions
    row = next(r for r, sw in lists.items() if sched.applied[r] and table["segments"].iat[r] > 1)
    idx = np.asarray(task.prompt_indices(np.asarray(jax.random.key_data(core.keys(0)[1])), int(f["worker"][row]),
                                         int(f["iteration"][row])))
    lengths = np.asarray(task.completion_lengths)[idx]
    version = np.full(task.max_length, f["pull_version"][row])
    for k, v in lists[row]:
        version[max(0, math.ceil(k - task.prefill)):] = v
    ages = np.concatenate([f["apply_version"][row] - version[:n] for n in lengths])
    assert table["token_staleness"].iat[row] == pytest.approx(ages.mean())
    assert table["token_staleness"].iat[row] < table["staleness"].iat[row]
    # in-flight tokens are fresher than their rollouts' oldest ones
    assert s["mean_staleness_per_token"] < s["mean_staleness_per_rollout"] + 1e-12 or s["mean_segments"] > 1
    plain = st.rollouts.summary(simulate_schedule("rl_async", "1,2.5+jitter=0.3", num_updates=6, seed=0,
                                                  sizes=_sizes(task)), task)
    assert plain["mean_segments"] == 1.0
    assert sum(s["staleness_per_token"]) == pytest.approx(1.0)


def test_spec_round_trips_and_bad_arguments():
    for spec in ["rl_inflight", "rl_inflight:4", "rl_inflight:2:mode=drop", "rl_inflight:1:batch=2:learner=2"]:
        p = st.policies.parse(spec)
        assert p.describe() == spec and p.work.inflight and p.learner
        assert st.policies.parse(p.describe()) == p
    assert st.policies.rl_inflight(4) == st.policies.parse("rl_inflight:4")
    for call, match in [(lambda: P.rl_inflight(-1), "rl_inflight: eta"), (lambda: P.rl_inflight(2, mode="x"),
                                                                          "rl_inflight: mode"),
                        (lambda: P.rl_inflight(batch=0), "rl_inflight: batch")]:
        with pytest.raises(ValueError, match=match):
            call()
