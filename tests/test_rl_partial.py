"""Partial rollouts (AReaL's interruptible generation, `rl_partial`): in-flight versions that pause the decode.

rl_partial records a rollout's segments as rl_inflight does, but a version that reaches an actor
mid-rollout interrupts it: after the token in progress, the actor pauses for the weight load (the
pull's transfer time) and `refill` token-times of re-prefill, so the rollout ends later. Checked
here: the spec; the reduction to rl_inflight (no pause: refill = 0 on a network without latency or
bytes); a timeline computed by hand; over random clusters, each rollout's duration and segments
against a reconstruction from the update times, the bound's invariants, and what can be proved
about throughput against rl_inflight; a replay on rl-digits (real runs: test_rl_inflight_real.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from _strategies import actors, bounded_policy
from hypothesis import strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import core
from staleness.engine import plan as engine_plan
from staleness.sim.scheduler import simulate_schedule
from staleness.tasks import rl

BANDIT = rl.get("rl-bandit", num_workers=4, objective="reinforce")
SIZES = BANDIT.rollout_sizes(core.keys(0)[1])   # long-tailed rollout lengths, up to 1024 tokens
BYTES = 2_000_000                                # parameters pulled over a 1e7 B/s link: 0.2 s of data


# ---------------------------------------------------------------------------
# Spec


def test_spec_round_trips_and_bad_arguments():
    for spec in ["rl_partial", "rl_partial:4", "rl_partial:2:mode=drop", "rl_partial:1:batch=2:learner=2",
                 "rl_partial:3:mode=requeue:refill=0", "rl_partial:refill=2.5"]:
        p = st.policies.parse(spec)
        assert p.describe() == spec and p.work.inflight and p.learner
        assert st.policies.parse(p.describe()) == p
    assert P.rl_partial(4) == st.policies.parse("rl_partial:4")
    assert P.rl_partial(refill=1) == P.rl_partial() and P.rl_partial().work.refill == 1.0
    assert P.rl_inflight().work.refill is None and P.rl_async().work.refill is None
    assert "rl_partial[:ETA]" in st.policies.spec_help()
    for call, match in [(lambda: P.rl_partial(-1), "rl_partial: eta"),
                        (lambda: P.rl_partial(2, mode="x"), "rl_partial: mode"),
                        (lambda: P.rl_partial(batch=0), "rl_partial: batch"),
                        (lambda: P.rl_partial(refill=-1.0), "rl_partial: refill"),
                        (lambda: P.rl_partial(refill=math.inf), "rl_partial: refill"),
                        (lambda: P.rl_partial(refill="1"), "rl_partial: refill"),
                        (lambda: st.policies.parse("rl_partial:refill=-2"), "rl_partial: refill"),
                        (lambda: P.Rollout(0.5, False, 1.0), "refill = 1.0 .*needs inflight=True")]:
        with pytest.raises(ValueError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------------------
# Differential: no pause is rl_inflight


@hst.composite
def free_transfer_runs(draw):
    """Clusters whose pull takes no time (no latency, no bytes), with failures sometimes."""
    cluster = actors(draw)
    if draw(hst.booleans()):
        cluster = cluster.network(draw(hst.sampled_from([0.0, 0.3])), 0.0)   # push latency only
    if draw(hst.booleans()):
        fail = draw(hst.floats(1.0, 400.0))
        cluster = cluster.failures([(0, fail, draw(hst.sampled_from([None, fail + 50.0])))])
    policy = bounded_policy(draw)
    return cluster, policy, draw(hst.booleans()), draw(hst.integers(0, 10_000))


@settings(max_examples=25, deadline=None)
@given(run=free_transfer_runs())
def test_without_a_pause_partial_is_inflight_exactly(run):
    """refill = 0 and a pull that takes no time: an interruption costs nothing, so every
    column, update time and segment is rl_inflight's, bit for bit."""
    cluster, (eta, mode, learner, batch), use_sizes, seed = run
    sizes = SIZES if use_sizes else None
    got = simulate_schedule(P.rl_partial(eta, mode, learner, batch, refill=0), cluster, num_updates=15, seed=seed,
                            sizes=sizes)
    want = simulate_schedule(P.rl_inflight(eta, mode, learner, batch), cluster, num_updates=15, seed=seed,
                             sizes=sizes)
    assert got.columns.keys() == want.columns.keys()
    for k in want.columns:
        np.testing.assert_array_equal(got.columns[k], want.columns[k], err_msg=k)
    np.testing.assert_array_equal(got.update_time, want.update_time)
    assert got.meta == want.meta


# ---------------------------------------------------------------------------
# A timeline by hand


def test_a_hand_computed_timeline():
    """2 actors of 1 and 2 s per token, 10 tokens a rollout, a pull of 0.5 s (latency), refill 1
    token. The learner trains an update of 2 rollouts in 0.2 × 1.5 s × 20 tokens / 2 = 3 s.

    t=0: both pull v0, decode from 0.5; actor 0 pushes at 10.5, pulls v0 again (11.0–21.0);
    actor 1 pushes at 20.5: update 1 (rows 0, 1) trains until 23.5, while actor 1 decodes
    from 21.0 and actor 0 (pushed at 21.0) from 21.5. v1 reaches both at 24.0:
      actor 0 (1 s/token from 21.5) is in token 2; token 3 would start at 24.5: it pauses
      0.5 + 1 × 1 s, so token 3 (decoded by v1) starts at 26.0 and it ends at 31.5 + 1.5 = 33.0;
      actor 1 (2 s/token from 21.0) is in token 1; token 2 starts at 25.0 after a pause of
      0.5 + 1 × 2 s, so it would end at 41.0 + 2.5 = 43.5.
    Actor 0's push at 33.0 completes update 2 (rows 2, 3), trained 33.0–36.0; actor 0 decodes
    from 33.5 on v1 and v2 reaches it at 36.5, at token 3 exactly: end 43.5 + 1.5 = 45.0.
    v2 reaches actor 1 at 36.5 too: on its own clock (less the 2.5 s pause) that is 13.0 s, 6.5
    tokens, after its start: token 7 (not 8, as 15.5 s / 2 would say) starts at 37.5 and waits
    2.5 s: the rollout ends at 46.0, with 2 interruptions (segments v1 from token 2, v2 from 7).
    Update 3 (rows 4, 5) trains 46.0–49.0."""
    cluster = C.heterogeneous([1.0, 2.0]).network(0.0, 0.5)
    s = simulate_schedule(P.rl_partial(learner=0.2), cluster, num_updates=3, seed=0, sizes=lambda w, i: 10)
    f = s.columns
    rows = [(int(f["worker"][r]), int(f["iteration"][r]), int(f["pull_version"][r]), int(f["apply_version"][r]),
             float(f["start"][r]), float(f["end"][r]), float(f["push_time"][r])) for r in range(s.num_gradients)]
    assert rows == [(0, 0, 0, 0, 0.5, 10.5, 10.5), (1, 0, 0, 0, 0.5, 20.5, 20.5), (0, 1, 0, 1, 11.0, 21.0, 21.0),
                    (0, 2, 0, 1, 21.5, 33.0, 33.0), (0, 3, 1, 2, 33.5, 45.0, 45.0), (1, 1, 0, 2, 21.0, 46.0, 46.0)]
    np.testing.assert_allclose(s.update_time, [23.5, 36.0, 49.0], rtol=0, atol=1e-12)
    assert s.meta["segments"] == [[3, 3, 1], [4, 3, 2], [5, 2, 1], [5, 7, 2]]
    # rl_inflight takes the same versions at the same instants without pausing: the same first
    # tokens while nothing has paused yet; actor 1's second switch is token ceil(15.5 / 2) = 8
    inflight = simulate_schedule(P.rl_inflight(learner=0.2), cluster, num_updates=3, seed=0, sizes=lambda w, i: 10)
    assert inflight.columns["end"][3] == 31.5 and [3, 3, 1] in inflight.meta["segments"]


def test_a_version_arriving_during_a_pause_interrupts_again_before_the_same_token():
    """2 actors at 1 s/token, pull 0.5 s, learner = 0, one rollout per update, refill 2 tokens.
    Actor 0 decodes 10 tokens from 0.5; actor 1 two 2-token rollouts (then a long one).
    Actor 1 pushes at 2.5: v1 (learner = 0: trained at once) reaches actor 0 at 3.0, before
    its token ceil(2.5) = 3: a pause of 0.5 + 2 × 1 = 2.5 s. Actor 1, released at 2.5 on v0,
    starts at 3.0 just as v1 arrives: a free segment from token 0 (nothing decoded yet), and
    pushes at 5.0; v2 reaches actor 0 at 5.5, during its pause (which lasts until token 3 at
    6.0): it interrupts again before the same token 3 (one segment, v2) and pauses another
    2.5 s, so actor 0 ends at 0.5 + 10 + 2 × 2.5 = 15.5."""
    cluster = C.heterogeneous([1.0, 1.0]).network(0.0, 0.5)
    s = simulate_schedule(P.rl_partial(learner=0.0, batch=1, refill=2), cluster, num_updates=3, seed=0,
                          sizes=lambda w, i: 10 if w == 0 else (2 if i < 2 else 1000))
    f = s.columns
    row = {(int(f["worker"][r]), int(f["iteration"][r])): r for r in range(s.num_gradients)}
    a0, a1 = row[(0, 0)], row[(1, 1)]
    assert (f["pull_version"][a0], f["start"][a0], f["end"][a0]) == (0, 0.5, 15.5)
    assert (f["pull_version"][a1], f["start"][a1], f["end"][a1]) == (0, 3.0, 5.0)   # no pause for a free switch
    segs = sorted(tuple(seg) for seg in s.meta["segments"])
    assert segs == sorted([(a0, 3, 2), (a1, 0, 1)])


# ---------------------------------------------------------------------------
# Properties over random clusters


@hst.composite
def partial_runs(draw):
    cluster = actors(draw)
    net = draw(hst.sampled_from(["none", "latency", "links"]))
    payload = None
    if net == "latency":
        cluster = cluster.network(0.01, draw(hst.sampled_from([0.05, 0.4, 5.0])))
    elif net == "links":
        cluster, payload = cluster.links(1e7, 0.02), BYTES
    policy = (*bounded_policy(draw), draw(hst.sampled_from([0.0, 1.0, 7.5])))
    return cluster, payload, policy, draw(hst.booleans()), draw(hst.integers(0, 10_000))


def _interruptions(start, end0, size, tau, pause, arrivals):
    """(interruptions, switches) of a rollout decoding `size` tokens of `tau` seconds from
    `start` (until `end0` without pauses), each interruption pausing it `pause` seconds, for
    versions reaching it at `arrivals` [(seconds, version)], oldest first: the rule written out
    step by step (the simulator keeps it per actor as the updates complete)."""
    n, out = 0, []
    for arrive, v in arrivals:
        if arrive >= end0 + n * pause or tau <= 0.0:
            break
        if arrive <= start:   # before the first token: the rollout starts on it, no pause
            out = [(0, v)]
            continue
        k = max(out[-1][0] if out else 0, math.ceil((arrive - start - n * pause) / tau))   # on the decode's clock
        if k >= size:
            break
        if out and out[-1][0] == k:
            out[-1] = (k, v)
        else:
            out.append((k, v))
        n += 1
    return n, out


@settings(max_examples=60, deadline=None)
@given(run=partial_runs())
def test_durations_and_segments_follow_the_interruptions(run):
    """Every rollout lasts size × τ + n × (transfer + refill × τ) for τ its per-token time and
    n the versions that interrupted it (rebuilt from the update times: version v reaches the
    actor at update_time[v − 1] + the pull's transfer); its segments are those interruptions,
    two before the same token counting as one (so #segments ≤ n, equal unless a version
    arrived during a pause), and a version that arrived by the decode's start a free segment
    from token 0 (no pause: nothing was decoded yet); segment tokens and versions increase, versions lie in
    (pull_version, apply_version], and the bound η holds on the pulled version."""
    cluster, payload, (eta, mode, learner, batch, refill), use_sizes, seed = run
    sizes = SIZES if use_sizes else None
    sched = simulate_schedule(P.rl_partial(eta, mode, learner, batch, refill), cluster, num_updates=15, seed=seed,
                              sizes=sizes, payload_bytes=payload, push_bytes=0 if payload else None)
    sampler = cluster.sampler(seed)
    segs = engine_plan.segment_lists(sched) or {}   # also validates versions against pull/apply versions
    f, ut = sched.columns, sched.update_time
    for r in range(sched.num_gradients):
        w, it, pulled = int(f["worker"][r]), int(f["iteration"][r]), int(f["pull_version"][r])
        start, end = float(f["start"][r]), float(f["end"][r])
        transfer = sampler.pull_delay(w, it) + (payload / sampler.bandwidth[w] if payload else 0.0)
        assert start == pytest.approx(float(f["pull_time"][r]) + transfer, rel=1e-12, abs=1e-12)
        size = float(sizes(w, it)) if sizes is not None else 1.0
        end0 = start + sampler.compute_time(w, it, start) * (size if sizes is not None else 1.0)
        tau = (end0 - start) / size
        pause = transfer + refill * tau
        arrivals = [(ut[v - 1] + transfer, v) for v in range(pulled + 1, len(ut) + 1)]
        n, switches = _interruptions(start, end0, size, tau, pause, arrivals)
        assert end - start == pytest.approx(size * tau + n * (transfer + refill * tau), rel=1e-12), r
        assert segs.get(r, []) == switches, r
        assert len(switches) <= n + (1 if switches and switches[0][0] == 0 else 0)   # a free switch at token 0
        ks, vs = [k for k, _ in switches], [v for _, v in switches]
        assert ks == sorted(set(ks)) and vs == sorted(set(vs)) and all(0 <= k < size for k in ks)
        if sched.applied[r] and eta is not None:
            assert f["apply_version"][r] - pulled <= eta


@hst.composite
def unbounded_runs(draw):
    cluster = actors(draw)
    cluster = cluster.network(0.01, draw(hst.sampled_from([0.0, 0.05, 0.4, 5.0])))
    return (cluster, draw(hst.sampled_from([0.0, 0.5, 2.0])), draw(hst.sampled_from([None, 1, 3])),
            draw(hst.sampled_from([0.0, 1.0, 7.5])), draw(hst.booleans()), draw(hst.integers(0, 10_000)))


@settings(max_examples=30, deadline=None)
@given(run=unbounded_runs())
def test_partial_is_never_ahead_of_inflight_without_a_bound(run):
    """What can be proved, with η = None, no failures, and token times that depend only on the
    actor and its iteration (not on when it starts: speeds and jitter, not straggler episodes):

    1. every actor's i-th push comes no earlier with rl_partial than with rl_inflight: without a
       bound the gate never holds an actor back, so its i-th rollout starts the pull's transfer
       after its (i−1)-th push and lasts c(w, i) under rl_inflight but c(w, i) + n × pause under
       rl_partial; by induction on i;
    2. so is the learner's u-th update when each update trains for the same time whatever its
       rows (learner = 0, or rollouts of one size): nothing is dropped, the u-th update is
       decided at the (u × batch)-th push, an order statistic of later pushes, and trained
       max(decided, previous) + the same time later. With sizes that differ it is not: the
       rows of an update (arrival order) and so its training time change (seen).
    With a bound η it does not hold either (seen, e.g. η = 1, pace): an interrupted rollout
    delays an update, and a rollout that rl_inflight dropped as too stale arrives in time to be
    consumed, so rl_partial completes a later update earlier."""
    cluster, learner, batch, refill, use_sizes, seed = run
    sizes = SIZES if use_sizes else None
    part = simulate_schedule(P.rl_partial(None, "pace", learner, batch, refill), cluster, num_updates=12, seed=seed,
                             sizes=sizes)
    infl = simulate_schedule(P.rl_inflight(None, "pace", learner, batch), cluster, num_updates=12, seed=seed,
                             sizes=sizes)

    def pushes(s):
        f = s.columns
        return {(int(w), int(i)): float(t) for w, i, t in zip(f["worker"], f["iteration"], f["push_time"])}

    a, b = pushes(part), pushes(infl)
    assert all(a[k] >= b[k] for k in a.keys() & b.keys())
    if learner == 0.0 or sizes is None:
        assert (part.update_time >= infl.update_time).all()


# ---------------------------------------------------------------------------
# Replay


def test_a_partial_run_replays_on_rl_digits():
    task = st.tasks.get("rl-digits", num_workers=2, warm_start_steps=0, num_layers=1, d_model=16, num_heads=2)
    cluster = C.heterogeneous([1.0, 2.5]).jitter(0.3).network(0.0, 3.0)
    res = st.simulate(task, "rl_partial", cluster, num_updates=4, seed=0, lr=1e-3, num_evals=1)
    assert res.schedule.meta["segments"]   # interrupted rollouts, replayed segment by segment
    assert res.history["update"].iloc[-1] == 4 and np.isfinite(res.history["reward"]).all()
    plain = simulate_schedule("rl_inflight", cluster, num_updates=4, seed=0,
                              sizes=task.rollout_sizes(core.keys(0)[1]))

    def durations(s):
        f = s.columns
        return {(int(w), int(i)): e - b for w, i, b, e in zip(f["worker"], f["iteration"], f["start"], f["end"])}

    mine, theirs = durations(res.schedule), durations(plain)
    f = res.schedule.columns
    paused = {(int(f["worker"][r]), int(f["iteration"][r])) for r, _, _ in res.schedule.meta["segments"]}
    assert paused & theirs.keys() and all(mine[k] > theirs[k] for k in paused & theirs.keys())   # the pauses took time
