"""Asynchronous RL (data staleness): the rl_* policies, the learner's time and the replay's numerics.

Schedules first (cheap: no numerics): η = 0 is synchronous, every consumed rollout is at most
η stale, one-step off-policy is exactly one version stale once the learner takes time, the
learner trains one update at a time for its modelled seconds, rl_sync at learner = 0 is BSP.
Then the replay: a synchronous one-actor run equals a plain on-policy loop written here, each
objective's first (on-policy) and second (one version stale) updates move the parameters by
lr × a float64 per-sample gradient that is tied to `bandit.expected_gradient`, and decoupled
PPO is naive PPO when π_prox = π_behav. Then bad inputs and `st.rollouts.summary`; last,
regressions of the pace mode's gate (`Capacity` once kept the place of every dropped or lost
rollout, so the run deadlocked or fell back to lockstep).
"""

from __future__ import annotations

import functools
import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import core
from staleness.engine import rollout as engine_rollout
from staleness.engine.run import replay
from staleness.policies.work import Rollout
from staleness.sim.scheduler import simulate_schedule
from staleness.tasks import rl
from staleness.tasks.rl import bandit

MAX_WORKERS = 5
COMPARED = ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start", "end", "push_time",
            "wait", "dropped", "lost")


@functools.lru_cache(maxsize=None)
def _bandit():
    """A bandit for MAX_WORKERS actors: its long-tailed decode lengths time the rollouts."""
    return rl.get("rl-bandit", num_workers=MAX_WORKERS, objective="reinforce")


@pytest.fixture(scope="module")
def sizes_task():
    return _bandit()


def _sizes(task, seed=0):
    return task.rollout_sizes(core.keys(seed)[1])


def _same_schedule(a, b, canonical: bool = False) -> list[str]:
    """The columns (and 'update_time') on which two schedules differ. canonical: rows of
    simultaneous pushes may come in another order (compared sorted by push time, then worker)."""
    order = lambda s: (np.lexsort((s.columns["worker"], s.columns["push_time"])) if canonical   # noqa: E731
                       else np.arange(s.num_gradients))
    if a.num_gradients != b.num_gradients:
        return ["rows"]
    oa, ob = order(a), order(b)
    diff = [k for k in COMPARED if not np.array_equal(a.columns[k][oa], b.columns[k][ob], equal_nan=True)]
    if not np.array_equal(a.update_time, b.update_time):
        diff.append("update_time")
    return diff


def _learner_seconds(sched, learner, cluster, sizes):
    """[U] the learner's seconds for each update: learner × mean step × Σ sizes of its rows / λ
    (sizes None: every rollout is one step)."""
    f, applied = sched.columns, sched.applied
    mean_step = float(np.mean(cluster.mean_seconds))
    out = np.zeros(sched.num_updates)
    for u in range(sched.num_updates):
        rows = np.flatnonzero(applied & (f["apply_version"] == u))
        total = sum(1.0 if sizes is None else float(sizes(int(f["worker"][r]), int(f["iteration"][r])))
                    for r in rows)
        out[u] = learner * mean_step * total / cluster.num_workers
    return out


# ---------------------------------------------------------------------------
# Schedules: η = 0 is synchronous


def _clusters_without_failures():
    """(cluster, whether two actors can push at the same instant)."""
    return [(C.heterogeneous([1.0, 1.0, 1.5, 3.0]), True),
            (C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.4), False),
            (C.heterogeneous([0.3, 2.2, 0.9]).jitter(0.2).network(0.1, 0.05), False),
            (C.constant(3, 1.0), True)]


@pytest.mark.parametrize("learner", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("with_sizes", [True, False])
def test_eta_zero_schedule_is_rl_sync(sizes_task, learner, with_sizes):
    """rl_async:0 (Capacity(0) + Fresh(0)) and rl_sync (RoundLag(0) + AllLive) make the same
    schedule, every column and every update time, on clusters without failures. Where two
    actors push at the same instant (equal speeds and sizes, no jitter) their rows may come in
    the other order: RoundLag releases a round's actors by worker id (one key, the round),
    Capacity by ticket (the order they asked), and simultaneous pushes keep the release order."""
    sizes = _sizes(sizes_task) if with_sizes else None
    for cluster, ties in _clusters_without_failures():
        for seed in (0, 7):
            a = simulate_schedule(P.rl_sync(learner), cluster, num_updates=15, seed=seed, sizes=sizes)
            b = simulate_schedule(P.rl_async(0, learner=learner), cluster, num_updates=15, seed=seed, sizes=sizes)
            assert a.num_updates == b.num_updates == 15
            assert _same_schedule(a, b, canonical=ties) == [], (cluster.describe(), seed)
            assert np.all(a.staleness[a.applied] == 0)
    # the comparison can fail: η = 1 makes another schedule on a heterogeneous cluster
    cluster = _clusters_without_failures()[1][0]
    sync = simulate_schedule(P.rl_sync(learner), cluster, num_updates=15, seed=0, sizes=sizes)
    one = simulate_schedule(P.rl_async(1, learner=learner), cluster, num_updates=15, seed=0, sizes=sizes)
    assert _same_schedule(sync, one) != []


def test_eta_zero_replay_is_rl_sync_bitwise():
    """The same schedule replays to the same parameters, bit for bit: the plan (rows, slots,
    ring) is the same and so is the compiled program; only the policy value differs."""
    task = rl.get("rl-bandit", num_workers=3, objective="decoupled_ppo")
    cluster = C.heterogeneous([1.0, 1.7, 0.6]).jitter(0.3)
    sizes = _sizes(task)
    a = simulate_schedule("rl_sync", cluster, num_updates=5, seed=0, sizes=sizes)
    b = simulate_schedule("rl_async:0", cluster, num_updates=5, seed=0, sizes=sizes)
    assert _same_schedule(a, b) == []
    ra = replay(a, task, lr=0.5, num_evals=1)
    rb = replay(b, task, lr=0.5, num_evals=1)
    jax.tree.map(np.testing.assert_array_equal, ra.params, rb.params)
    np.testing.assert_array_equal(ra.train_loss, rb.train_loss)
    init = task.init_params(core.keys(0)[0])
    assert np.abs(np.asarray(ra.params["W"]) - np.asarray(init["W"])).max() > 1e-3   # it trained


# ---------------------------------------------------------------------------
# Schedules: properties over random clusters


@hst.composite
def rl_runs(draw):
    """(cluster, has_failures, kind, η, policy, learner, use_sizes, seed)."""
    n = draw(hst.integers(1, MAX_WORKERS))
    cluster = C.heterogeneous(draw(hst.lists(hst.floats(0.2, 3.0), min_size=n, max_size=n)))
    if draw(hst.booleans()):
        cluster = cluster.jitter(draw(hst.floats(0.0, 0.6)))
    if draw(hst.booleans()):
        cluster = cluster.network(draw(hst.floats(0.0, 0.3)), draw(hst.floats(0.0, 0.3)))
    events = []
    if draw(hst.integers(0, 2)) == 0:   # a third of the runs: failures and rejoins (worker 0 stays)
        for w in range(1, n):
            if draw(hst.booleans()):
                t0 = draw(hst.floats(0.0, 20.0))
                back = draw(hst.one_of(hst.none(), hst.floats(0.1, 20.0)))
                events.append((w, t0, None if back is None else t0 + back))
    if events:
        cluster = cluster.failures(events)
    kind = draw(hst.sampled_from(["sync", "one_step_off", "pace", "drop", "unbounded"]))
    eta = draw(hst.integers(0, 4))
    learner = draw(hst.sampled_from([0.0, 0.5, 2.0]))
    policy = {"sync": lambda: P.rl_sync(learner), "one_step_off": lambda: P.rl_one_step_off(learner),
              "pace": lambda: P.rl_async(eta, "pace", learner), "drop": lambda: P.rl_async(eta, "drop", learner),
              "unbounded": lambda: P.rl_async(None, learner=learner)}[kind]()
    return cluster, bool(events), kind, eta, policy, learner, draw(hst.booleans()), draw(hst.integers(0, 10_000))


@settings(max_examples=80, deadline=None)
@given(run=rl_runs())
def test_staleness_bounds_and_learner_time(run):
    cluster, failures, kind, eta, policy, learner, use_sizes, seed = run
    sizes = _sizes(_bandit()) if use_sizes else None
    budget = 25
    sched = simulate_schedule(policy, cluster, num_updates=budget, seed=seed, sizes=sizes)
    f, applied = sched.columns, sched.applied
    stale = sched.staleness[applied]
    assert sched.num_updates == budget
    # every row is consumed exactly once, or dropped, or lost
    assert np.all(applied ^ (f["dropped"] | f["lost"]))
    assert np.all(stale >= 0)
    bound = {"sync": 0, "one_step_off": 1, "pace": eta, "drop": eta, "unbounded": None}[kind]
    if bound is not None and len(stale):
        assert stale.max() <= bound, (policy.describe(), stale.max())
    if kind in ("sync", "one_step_off", "unbounded"):
        assert not f["dropped"].any()                       # only a bound drops rollouts
    if kind == "one_step_off" and learner > 0 and not failures:
        av = f["apply_version"][applied]
        np.testing.assert_array_equal(stale, np.where(av == 0, 0, 1))   # exactly one stale after the first
    if kind == "pace" and not failures:
        # AReaL's capacity: when a rollout starts, the rollouts started so far and not dropped
        # number at most (η + 1 + completed versions) × λ (rows still in flight at the end are
        # not in the schedule: the count can only be low)
        pull_time = f["pull_time"]
        started = np.searchsorted(np.sort(pull_time), pull_time, side="right")
        dropped = np.searchsorted(np.sort(f["push_time"][f["dropped"]]), pull_time, side="right")
        assert np.all(started - dropped <= (eta + 1 + f["pull_version"]) * cluster.num_workers)
    if kind == "pace" and eta == 0 and not failures:
        same = simulate_schedule(P.rl_sync(learner), cluster, num_updates=budget, seed=seed, sizes=sizes)
        assert _same_schedule(sched, same, canonical=True) == []

    # the learner trains one update at a time, each for its modelled seconds
    ut = sched.update_time
    took = _learner_seconds(sched, learner, cluster, sizes)
    assert np.all(np.diff(ut) >= 0)
    prev = np.concatenate([[0.0], ut[:-1]])
    assert np.all(ut - prev >= took - 1e-9 * np.maximum(1.0, ut)), (ut - prev, took)
    decided = np.array([f["push_time"][applied & (f["apply_version"] == u)].max() for u in range(sched.num_updates)])
    assert np.all(ut >= decided + took - 1e-9 * np.maximum(1.0, ut))
    if not failures:   # decided at its last rollout's push: completed at max(decided, learner free) + seconds
        want, free = np.zeros(sched.num_updates), 0.0
        for u in range(sched.num_updates):
            free = max(decided[u], free) + took[u]
            want[u] = free
        np.testing.assert_allclose(ut, want, rtol=1e-12, atol=1e-9)
    # released actors pull the newest completed version (ties: a release at the same instant as
    # a completion may come before it)
    pulled = f["pull_version"]
    assert np.all(np.searchsorted(ut, f["pull_time"], side="left") <= pulled)
    assert np.all(pulled <= np.searchsorted(ut, f["pull_time"], side="right"))


@pytest.mark.parametrize("mode", ["pace", "drop"])
@pytest.mark.parametrize("eta", [1, 2, 3])
def test_the_bound_is_reached(sizes_task, mode, eta):
    """The bound is tight (an off-by-one in it fails here or in the property test): on a
    heterogeneous cluster some consumed rollout is exactly η stale; drop mode drops, the
    unbounded policy drops nothing and goes staler than η."""
    cluster = C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.3)
    sizes = _sizes(sizes_task)
    sched = simulate_schedule(P.rl_async(eta, mode), cluster, num_updates=40, seed=0, sizes=sizes)
    assert sched.staleness[sched.applied].max() == eta
    if mode == "drop":
        assert sched.columns["dropped"].sum() > 0
    free = simulate_schedule(P.rl_async(None), cluster, num_updates=40, seed=0, sizes=sizes)
    assert not free.columns["dropped"].any() and free.staleness[free.applied].max() > eta


# ---------------------------------------------------------------------------
# Learner time


@settings(max_examples=30, deadline=None)
@given(run=rl_runs())
def test_rl_sync_at_learner_zero_is_bsp(run):
    """RoundLag(0) + AllLive at learner = 0 is ClockBound(0) + AllLive: the same schedule, also
    with failures and rejoins (the update is completed at the instant it is decided). Up to the
    order of simultaneous pushes (equal speeds and sizes): BSP's last pusher of a round is
    released first, by its own push, then the others by worker id; rl_sync releases them all
    by worker id when the update completes."""
    cluster, _, _, _, _, _, use_sizes, seed = run
    sizes = _sizes(_bandit()) if use_sizes else None
    a = simulate_schedule(P.rl_sync(0.0), cluster, num_updates=20, seed=seed, sizes=sizes)
    b = simulate_schedule(P.bsp(), cluster, num_updates=20, seed=seed, sizes=sizes)
    assert _same_schedule(a, b, canonical=True) == []
    assert a.num_updates == 20


def test_rl_sync_at_learner_zero_is_bsp_row_for_row():
    """Without simultaneous pushes (jitter) the rows come in the same order too; a learner
    that takes time makes another schedule."""
    cluster = C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.3).failures([(2, 5.0, 9.0)])
    a = simulate_schedule(P.rl_sync(0.0), cluster, num_updates=20, seed=0)
    assert _same_schedule(a, simulate_schedule(P.bsp(), cluster, num_updates=20, seed=0)) == []
    assert _same_schedule(a, simulate_schedule(P.rl_sync(0.5), cluster, num_updates=20, seed=0)) != []


def test_learner_time_one_step_off_overlaps_training():
    """Constant cluster, generation 1 s and training 1 s per update: rl_sync alternates them
    (update u completes at 2(u + 1)); rl_one_step_off generates round u + 1 while update u
    trains (update u completes at u + 2). At learner = 0 both are BSP's (u + 1)."""
    cluster = C.constant(4, 1.0)
    u = np.arange(10)
    sync = simulate_schedule(P.rl_sync(1.0), cluster, num_updates=10, seed=0)
    off = simulate_schedule(P.rl_one_step_off(1.0), cluster, num_updates=10, seed=0)
    np.testing.assert_allclose(sync.update_time, 2.0 * (u + 1))
    np.testing.assert_allclose(off.update_time, u + 2.0)
    np.testing.assert_allclose(simulate_schedule(P.rl_sync(0.0), cluster, num_updates=10, seed=0).update_time,
                               u + 1.0)


def test_one_step_off_is_faster_than_sync_on_a_heterogeneous_cluster(sizes_task):
    """Generation and training of comparable length (learner = 1): one-step off-policy hides
    the learner behind generation."""
    cluster = C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.3)
    sizes = _sizes(sizes_task)
    for seed in (0, 1):
        sync = simulate_schedule(P.rl_sync(1.0), cluster, num_updates=30, seed=seed, sizes=sizes)
        off = simulate_schedule(P.rl_one_step_off(1.0), cluster, num_updates=30, seed=seed, sizes=sizes)
        assert off.update_time[-1] < 0.85 * sync.update_time[-1], (off.update_time[-1], sync.update_time[-1])
        # the learner's time is hidden, not removed: a learner that takes none is faster still
        sync0 = simulate_schedule(P.rl_sync(0.0), cluster, num_updates=30, seed=seed, sizes=sizes)
        assert off.update_time[-1] > sync0.update_time[-1]


# ---------------------------------------------------------------------------
# The replay is a plain on-policy loop


def _plain_on_policy(task, seed, lr, updates):
    """A plain on-policy SGD loop, actor 0, one call per step of the task's own functions:
    prompts, generate (its own jit), the objective's gradient with π_prox = the current
    params (jitted here), params − lr·grad."""
    init_key, data_key = core.keys(seed)
    params = task.init_params(init_key)
    grad_fn = jax.jit(jax.grad(task.loss))
    for u in range(updates):
        idx = task.prompt_indices(data_key, 0, u)
        rollout = task.generate(params, engine_rollout.generation_key(data_key, 0, u), idx)
        grad = grad_fn(params, rollout, jax.lax.stop_gradient(task.logp(params, rollout)))
        params = jax.tree.map(lambda p, g: p - lr * g, params, grad)
    return params


def test_one_actor_sync_replay_is_a_plain_loop_bandit():
    """rl-bandit: bit for bit. One actor makes one slot per update (no vmap, the gradient
    unscaled: `aggregate`'s one-gradient path), and SGD's p + (−lr·g) is p − lr·g exactly."""
    task = rl.get("rl-bandit", num_workers=1, objective="ppo")
    res = st.simulate(task, "rl_sync", C.constant(1), num_updates=4, seed=3, lr=0.5, num_evals=1)
    np.testing.assert_array_equal(res.schedule.columns["pull_version"], np.arange(4))
    want = _plain_on_policy(task, 3, 0.5, 4)
    init = task.init_params(core.keys(3)[0])
    assert np.abs(np.asarray(want["W"]) - np.asarray(init["W"])).max() > 1e-2   # it moved
    jax.tree.map(np.testing.assert_array_equal, res.params, want)


def test_one_actor_sync_replay_is_a_plain_loop_digits():
    """rl-digits (a small transformer): equal to float32 rounding, not bitwise: the replay
    compiles generation, log-probs and the loss of a step into one XLA program inside a
    `lax.scan`, which fuses and orders the transformer's float32 reductions differently from
    the separately jitted calls (observed: 3.4e-7 of the distance the parameters moved, |Δ| ~
    4e-9 after 3 updates). The sampled tokens are the same (a rollout drawn with another key
    fails the check), so the difference stays below 1e-4 of that distance."""
    task = rl.get("rl-digits", num_workers=1, objective="decoupled_ppo", warm_start_steps=0, num_prompts=32,
                  num_eval_prompts=4, group_size=2, prompts_per_rollout=2, max_digits=4, num_layers=1, d_model=16,
                  num_heads=2)
    res = st.simulate(task, "rl_sync", C.constant(1), num_updates=3, seed=0, lr=0.05, num_evals=1,
                      optimizer="sgd")
    want = _plain_on_policy(task, 0, 0.05, 3)
    init = task.init_params(core.keys(0)[0])
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(init)))
    err = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
              for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(want)))
    assert moved > 1e-4 and err <= 1e-4 * moved, (err, moved)


# ---------------------------------------------------------------------------
# Each objective's update against float64


def _sample_gradient(task, theta, behavior, prox, prompt_idx, arms):
    """([..., d, K] float64 ∇_W task.loss of each rollout, fraction of samples where the clip
    or the truncation binds) for rollouts of prompts `prompt_idx` [..., B] whose groups sampled
    `arms` [..., B, G], from the objectives' formulas (see `bandit.expected_gradient`): per
    sample i, ∇ = −coef_i · x ⊗ (e_{a_i} − π_θ) / (B·G)."""
    obj = dict(task.objective.params)
    x = np.asarray(task.prompts["x"], np.float64)[prompt_idx]                   # [..., B, d]
    r = np.asarray(task.prompts["r"], np.float64)[prompt_idx]                   # [..., B, K]
    p_new, p_beh, p_prox = (bandit.probs(p, x) for p in (theta, behavior, prox))   # [..., B, K]
    take = lambda p: np.take_along_axis(p, arms, axis=-1)                        # noqa: E731  [..., B, G]
    rew = take(r)
    adv = rew - rew.mean(-1, keepdims=True)
    rho, rho_prox, w = take(p_new) / take(p_beh), take(p_new) / take(p_prox), take(p_prox) / take(p_beh)
    eps = obj.get("eps")
    binds = np.zeros(adv.shape, bool)
    if task.objective.name == "reinforce":
        coef = adv
    elif task.objective.name == "ppo":
        binds = ((adv > 0) & (rho >= 1 + eps)) | ((adv < 0) & (rho <= 1 - eps))
        coef = adv * rho * ~binds
    elif task.objective.name == "decoupled_ppo":
        binds = ((adv > 0) & (rho_prox >= 1 + eps)) | ((adv < 0) & (rho_prox <= 1 - eps))
        coef = w * adv * rho_prox * ~binds
    else:
        binds = rho > obj["c"]
        coef = np.minimum(rho, obj["c"]) * adv
    onehot = np.eye(p_new.shape[-1])[arms]                                       # [..., B, G, K]
    b, g = arms.shape[-2:]
    dlogits = -np.einsum("...bg,...bgk->...bk", coef, onehot - p_new[..., None, :]) / (b * g)
    return np.einsum("...bd,...bk->...dk", x, dlogits), float(binds.mean())


OBJECTIVES = [("reinforce", {}), ("ppo", {"eps": 0.05}), ("decoupled_ppo", {"eps": 0.05}), ("tis", {"c": 1.0})]
LR = 8.0   # large enough that one update moves π past the clip: ε = 0.05 binds on ~2/3 of update 1's samples


@pytest.mark.parametrize("objective, extra", OBJECTIVES)
def test_bandit_updates_match_float64(objective, extra):
    """rl_one_step_off, 2 actors, SGD: update 0 is on-policy (rollouts of θ0, gradient at θ0),
    update 1 is one version stale (rollouts of θ0, gradient at θ1, π_prox = θ1). Each moves the
    replay's params by −lr × the float64 gradient of the very rollouts the replay sampled
    (recomputed from the generation keys), to 1e-5 of the step: float32 rounding of a
    log-softmax, an exp and a mean over 2 × 8 × 4 samples is ~1e-7 of it, while another
    objective's formula is off by > 1e-2 of it off-policy. The per-sample formula, averaged
    over every joint outcome with its probability, is `bandit.expected_gradient` (1e-12)."""
    task = rl.get("rl-bandit", num_workers=2, objective=objective, **extra)
    seed = 1
    sched = simulate_schedule(P.rl_one_step_off(1.0), C.constant(2), num_updates=2, seed=seed)
    f = sched.columns
    np.testing.assert_array_equal(f["pull_version"], [0, 0, 0, 0])
    np.testing.assert_array_equal(f["apply_version"], [0, 0, 1, 1])
    first = replay(sched, task, lr=LR, eval_every=1, stop_after=1)     # one compiled chunk for both
    both = replay(sched, task, lr=LR, eval_every=1)
    assert first.status == "stopped" and both.status == "complete"
    init_key, data_key = core.keys(seed)
    theta0 = jax.device_get(task.init_params(init_key))
    theta1, theta2 = first.params, both.params

    def sampled(rows):
        ros = [engine_rollout.generate_rollout(task, theta0, data_key, int(f["worker"][r]), int(f["iteration"][r]))
               for r in rows]
        return np.stack([np.asarray(ro.prompt_idx) for ro in ros]), np.stack([np.asarray(ro.tokens[..., 0])
                                                                             for ro in ros])

    def check(before, after, grads):
        step = -LR * grads.mean(0)      # the mean over the update's rollouts
        got = np.asarray(after["W"], np.float64) - np.asarray(before["W"], np.float64)
        assert np.abs(got - step).max() <= 1e-5 * np.abs(step).max(), (np.abs(got - step).max(), np.abs(step).max())
        return np.abs(step).max()

    # update 0: on-policy
    idx0, arms0 = sampled([0, 1])
    g0, _ = _sample_gradient(task, theta0, theta0, theta0, idx0, arms0)
    check(theta0, theta1, g0)
    # update 1: rollouts of θ0, gradient at θ1 with π_prox = θ1
    idx1, arms1 = sampled([2, 3])
    g1, binds = _sample_gradient(task, theta1, theta0, theta1, idx1, arms1)
    scale = check(theta1, theta2, g1)
    if objective in ("ppo", "tis"):
        assert binds > 0.05          # the clip / the truncation is exercised
    plain, _ = _sample_gradient(rl.get("rl-bandit", objective="reinforce"), theta1, theta0, theta1, idx1, arms1)
    if objective != "reinforce":     # off-policy the objectives differ: the check tells them apart
        assert LR * np.abs(plain.mean(0) - g1.mean(0)).max() > 1e-2 * scale

    # the per-sample formula is the reference's, in expectation (off-policy, every outcome)
    prompts = np.unique(idx1)[:4]
    outcomes = np.array(list(itertools.product(range(4), repeat=task.group_size)))          # [M, G]
    behav = bandit.probs(theta0, np.asarray(task.prompts["x"])[prompts])                   # [P, K]
    weight = np.prod(np.take_along_axis(behav[:, None, :], outcomes[None], axis=-1), axis=-1)   # [P, M]
    grads, _ = _sample_gradient(task, theta1, theta0, theta1,                             # [P, M, d, K]
                                np.broadcast_to(prompts[:, None, None], (len(prompts), len(outcomes), 1)),
                                np.broadcast_to(outcomes[None, :, None, :], (len(prompts),) + outcomes.shape[:1]
                                                + (1,) + outcomes.shape[1:]))
    expected = np.einsum("pm,pmij->ij", weight, grads) / len(prompts)
    ref = bandit.expected_gradient(task, theta1, prompts, behavior_params=theta0, prox_params=theta1)["W"]
    np.testing.assert_allclose(expected, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


# ---------------------------------------------------------------------------
# Decoupled PPO with π_prox = π_behav is naive PPO


def test_decoupled_ppo_equals_ppo_at_staleness_zero():
    """rl_sync: the learner's version is the behavior version, so π_prox = π_behav and decoupled
    PPO's replay is naive PPO's, bit for bit on the bandit: π_behav (recorded while sampling)
    and π_prox (`task.logp` at the same params) are the same log-softmax of x·W, so
    w = exp(prox − behav) is exactly 1 and exp(new − prox) is exp(new − behav). (On rl-digits
    the decode's scan and the one-pass logp differ in the last bits, so there it would be equal
    to rounding only.) One version stale (π_prox = θ_u ≠ π_behav) they differ by far more."""
    ppo = rl.get("rl-bandit", num_workers=2, objective="ppo", eps=0.05)
    dec = rl.get("rl-bandit", num_workers=2, objective="decoupled_ppo", eps=0.05)
    init = np.asarray(ppo.init_params(core.keys(1)[0])["W"])
    # eval_every=1 and the float64 test's shapes: its compiled chunks are reused
    sync = simulate_schedule("rl_sync", C.heterogeneous([1.0, 1.4]).jitter(0.2), num_updates=3, seed=1)
    a, b = (np.asarray(replay(sync, t, lr=LR, eval_every=1).params["W"]) for t in (ppo, dec))
    assert np.abs(a - init).max() > 1e-2
    np.testing.assert_array_equal(a, b)
    stale = simulate_schedule(P.rl_one_step_off(1.0), C.constant(2), num_updates=2, seed=1)
    assert stale.staleness[stale.applied].max() == 1
    a, b = (np.asarray(replay(stale, t, lr=LR, eval_every=1).params["W"]) for t in (ppo, dec))
    assert np.abs(a - b).max() > 1e-3 * np.abs(a - init).max(), (np.abs(a - b).max(), np.abs(a - init).max())


# ---------------------------------------------------------------------------
# Bad inputs: one-line ValueErrors naming the argument


@pytest.mark.parametrize("build, arg", [
    (lambda: P.rl_async(-1), "eta = -1"),
    (lambda: P.rl_async(1.5), "eta = 1.5"),
    (lambda: P.rl_async(2, mode="bogus"), "mode = 'bogus'"),
    (lambda: P.rl_async(2, batch=0), "batch = 0"),
    (lambda: P.parse("rl_async:-1"), "eta = -1"),
    (lambda: P.parse("rl_async:2:mode=bogus"), "mode = 'bogus'"),
    (lambda: P.parse("rl_sync:learner=-1"), "learner = -1"),
    (lambda: Rollout(learner=-1), "learner = -1"),
    (lambda: Rollout(learner=float("inf")), "learner = inf"),
    (lambda: Rollout(learner=True), "learner = True"),
    (lambda: P.rl_one_step_off(learner=float("nan")), "learner = nan"),
    (lambda: st.simulate("digits-mlp", "rl_sync", C.constant(2), num_updates=2), "task 'digits-mlp'"),
    (lambda: st.simulate("rl-bandit", "asp", C.constant(2), num_updates=2), "task 'rl-bandit' is an RL task"),
    (lambda: simulate_schedule("rl_sync", C.constant(2).allreduce("ring", 1e9), num_updates=2), "all-reduce"),
    (lambda: st.simulate("rl-bandit", "rl_one_step_off", C.constant(2).allreduce("ring", 1e9), num_updates=2),
     "all-reduce"),
    (lambda: simulate_schedule("rl_sync", C.constant(2), num_updates=2, sizes=3), "sizes = 3"),
])
def test_bad_inputs_are_one_line_value_errors(build, arg):
    with pytest.raises(ValueError) as err:
        build()
    message = str(err.value)
    assert arg in message and "\n" not in message, message


def test_rl_policy_messages_name_the_policy():
    with pytest.raises(ValueError, match="got 'asp'"):
        st.simulate("rl-bandit", "asp", C.constant(2), num_updates=2)
    with pytest.raises(ValueError, match="policy 'rl_sync' trains on rollouts"):
        st.simulate("digits-mlp", "rl_sync", C.constant(2), num_updates=2)
    with pytest.raises(ValueError, match=r"cluster = '2\+allreduce=ring:8gbps' has an all-reduce.*policy 'rl_sync'"):
        simulate_schedule("rl_sync", C.constant(2).allreduce("ring", 1e9), num_updates=2)


# ---------------------------------------------------------------------------
# st.rollouts.summary


@pytest.fixture(scope="module")
def digits_lengths_task():
    """rl-digits for its lengths only (no params are made): one prompt per rollout."""
    return rl.get("rl-digits", num_workers=4, prompts_per_rollout=1, warm_start_steps=0)


def test_summary_counts_and_fractions(digits_lengths_task):
    task = digits_lengths_task
    cluster = C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.2).failures([(2, 40.0, 70.0), (3, 100.0, None)])
    sched = simulate_schedule("rl_async:2:mode=drop", cluster, num_updates=60, seed=0, sizes=_sizes(task))
    s = st.rollouts.summary(sched, task, seed=0)
    assert s["consumed"] + s["dropped"] + s["lost"] == s["rollouts"] == sched.num_gradients
    assert s["consumed"] == int(sched.applied.sum()) and s["dropped"] > 0 and s["lost"] > 0
    assert np.isclose(sum(s["staleness_per_token"]), 1.0) and np.isclose(sum(s["staleness_per_rollout"]), 1.0)
    assert s["max_staleness"] == len(s["staleness_per_token"]) - 1 <= 2
    # per token, recomputed: each consumed rollout weighs G × its prompts' completion lengths
    t = st.rollouts.table(sched, task, seed=0)
    used = t[t["consumed"]]
    idx = task.prompt_indices(core.keys(0)[1], np.asarray(used["worker"])[:, None],
                              np.asarray(used["iteration"])[:, None])
    tokens = task.group_size * np.asarray(task.completion_lengths)[np.asarray(idx).reshape(len(used), -1)].sum(1)
    np.testing.assert_array_equal(used["completion_tokens"], tokens)
    want = np.bincount(used["staleness"], weights=tokens, minlength=3) / tokens.sum()
    np.testing.assert_allclose(s["staleness_per_token"], want[:len(s["staleness_per_token"])], rtol=1e-12)
    np.testing.assert_array_equal(used["staleness"], sched.staleness[sched.applied])


def test_drop_mode_consumes_shorter_rollouts(digits_lengths_task):
    """An actor 4x slower than the others, η = 1, free-running actors: its rollouts, and long
    ones of every actor, arrive too stale and are dropped, so what the learner consumes is
    shorter than what was generated; the unbounded policy consumes everything it generates."""
    task = digits_lengths_task
    cluster = C.heterogeneous([1.0, 1.0, 1.0, 4.0])
    sizes = _sizes(task)
    sched = simulate_schedule("rl_async:1:mode=drop", cluster, num_updates=100, seed=0, sizes=sizes)
    s = st.rollouts.summary(sched, task, seed=0)
    assert s["dropped"] > 0.1 * s["rollouts"]
    assert s["length_consumed"]["mean"] < s["length_generated"]["mean"] - 0.1, (s["length_consumed"],
                                                                                s["length_generated"])
    free = st.rollouts.summary(simulate_schedule("rl_async", cluster, num_updates=100, seed=0, sizes=sizes), task,
                               seed=0)
    assert free["dropped"] == 0 and free["length_consumed"] == free["length_generated"]


# ---------------------------------------------------------------------------
# Pace mode: dropped and lost rollouts free their place (regressions)


@pytest.mark.parametrize("eta, events", [(0, [(1, 0.5, 3.0)]),
                                         (1, [(1, 0.5, 3.0), (1, 5.5, 8.0), (1, 10.5, 13.0)])])
def test_pace_mode_survives_lost_rollouts(eta, events):
    """A worker fails mid-rollout and rejoins: the run goes on, as rl_sync's does. The gate once
    counted a lost rollout's place forever: η = 0 stopped after 0 updates, η = 1 after 5 of 30
    (3 losses > η × 2), and the simulation silently returned the short schedule."""
    cluster = C.constant(2, 1.0).failures(events)
    assert simulate_schedule("rl_sync", cluster, num_updates=30, seed=0).num_updates == 30
    sched = simulate_schedule(P.rl_async(eta), cluster, num_updates=30, seed=0)
    assert sched.num_updates == 30 and sched.columns["lost"].sum() == len(events)
    assert sched.staleness[sched.applied].max() <= eta


def test_pace_mode_stays_asynchronous(sizes_task):
    """AReaL's rule frees the place of a rejected rollout, so pace mode keeps overlapping
    generation with training for the whole run. The gate once counted dropped rollouts: after
    the first η·c = 8 out-of-order drops every rollout was 0 stale and the last 100 updates
    took as long as rl_sync's (243k vs 256k simulated seconds; now ~79k)."""
    cluster = C.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.3)
    sizes = _sizes(sizes_task)
    sched = simulate_schedule("rl_async:2", cluster, num_updates=200, seed=0, sizes=sizes)
    sync = simulate_schedule("rl_sync", cluster, num_updates=200, seed=0, sizes=sizes)
    late = sched.applied & (sched.columns["apply_version"] >= 100)
    assert sched.columns["dropped"].sum() > 8
    assert (sched.staleness[late] > 0).mean() > 0.2 and sched.staleness[late].max() == 2
    assert sched.update_time[-1] - sched.update_time[99] < 0.6 * (sync.update_time[-1] - sync.update_time[99])
