"""Invariants of simulated schedules (property-based) and golden schedules."""

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.schedule import NOT_APPLIED, Schedule
from staleness.sim.scheduler import simulate_schedule

GOLDEN = Path(__file__).parent / "golden"


@hst.composite
def clusters(draw, max_workers=10):
    n = draw(hst.integers(1, max_workers))
    secs = draw(hst.lists(hst.floats(0.2, 3.0), min_size=n, max_size=n))
    c = C.heterogeneous(secs)
    if draw(hst.booleans()):
        c = c.jitter(draw(hst.floats(0.0, 0.6)))
    if draw(hst.booleans()):
        c = c.stragglers(draw(hst.floats(0.0, 0.2)), draw(hst.floats(1.0, 6.0)), draw(hst.floats(0.1, 10.0)))
    if draw(hst.booleans()):
        c = c.network(draw(hst.floats(0.0, 0.3)), draw(hst.floats(0.0, 0.3)))
    return c


@hst.composite
def policies(draw, num_workers):
    kind = draw(hst.sampled_from(["bsp", "asp", "ssp", "dssp", "softsync", "backup", "local_sgd", "diloco",
                                  "async_diloco", "decoupled_diloco"]))
    if kind == "bsp":
        return P.bsp()
    if kind == "decoupled_diloco":
        return P.decoupled_diloco(draw(hst.integers(1, 5)), quorum=draw(hst.integers(1, num_workers)),
                                  grace=draw(hst.sampled_from([0.0, 0.3, 2.0, "adaptive"])), dynamic=draw(hst.booleans()))
    if kind == "local_sgd":
        return P.local_sgd(draw(hst.integers(1, 5)))
    if kind == "diloco":
        return P.diloco(draw(hst.integers(1, 5)))
    if kind == "async_diloco":
        bound = draw(hst.one_of(hst.none(), hst.integers(0, 4)))
        return P.async_diloco(draw(hst.integers(1, 5)), bound=bound, dynamic=draw(hst.booleans()))
    if kind == "asp":
        return P.asp()
    if kind == "ssp":
        return P.ssp(draw(hst.integers(0, 6)))
    if kind == "dssp":
        return P.dssp(draw(hst.integers(0, 4)), draw(hst.integers(0, 8)), cap=draw(hst.booleans()))
    if kind == "softsync":
        return P.softsync(draw(hst.integers(1, num_workers)))
    return P.backup_workers(draw(hst.integers(0, num_workers - 1)))


def expected_update_size(policy, lam):
    agg = policy.aggregation
    if isinstance(agg, P.AllLive):
        return lam
    if isinstance(agg, P.Count):
        return lam // agg.n
    if isinstance(agg, P.FirstOfRound):
        return max(1, lam - agg.b)
    if isinstance(agg, P.Quorum):
        return None   # from the quorum to every learner
    return 1


def check_invariants(sched: Schedule, policy, lam: int, failures=False):
    f = sched.columns
    applied = sched.applied
    # every gradient applied exactly once, or dropped (counted), never both
    assert np.all(applied ^ (f["dropped"] | f["lost"]))
    assert np.all(~(f["dropped"] & f["lost"]))
    # each update holds at least one gradient; versions strictly increase in time
    sizes = np.bincount(f["apply_version"][applied], minlength=sched.num_updates)
    assert len(sizes) == sched.num_updates and np.all(sizes >= 1)
    assert np.all(np.diff(sched.update_time) >= 0)
    pushed = ~f["lost"]
    assert np.all(np.diff(f["push_time"][pushed]) >= 0)  # rows in push order
    av = f["apply_version"][applied]
    assert np.all(np.diff(av) >= 0)  # a later push never lands in an earlier update
    assert np.all(f["pull_version"] <= np.where(applied, f["apply_version"], np.iinfo(np.int64).max))
    assert np.all(sched.staleness[applied] >= 0)
    # time moves forward within a gradient
    assert np.all(f["pull_time"] <= f["start"]) and np.all(f["start"] < f["end"])
    assert np.all(f["end"][pushed] <= f["push_time"][pushed]) and np.all(f["wait"] >= 0)
    if not failures:
        expected = expected_update_size(policy, lam)
        if expected is None:   # a quorum's merge: at least k arrivals, each learner at most once
            assert np.all((sizes >= policy.quorum) & (sizes <= lam))
        else:
            assert np.all(sizes == expected)
        # the gate: when p starts iteration i, every worker q has pushed >= i - bound
        bound = policy.staleness_bound()
        if bound is not None:
            push_times = [np.sort(f["push_time"][(f["worker"] == q) & pushed]) for q in range(lam)]
            for q in range(lam):
                done = np.searchsorted(push_times[q], f["pull_time"], side="right")
                assert np.all(done >= f["iteration"] - bound), (q, bound)
        # iteration is the worker's clock: 0, 1, 2, ... per worker
        for q in range(lam):
            its = f["iteration"][f["worker"] == q]
            assert np.array_equal(its, np.arange(len(its)))
    if policy == P.bsp() or isinstance(policy.aggregation, P.AllLive):   # BSP, local_sgd, diloco: rounds
        assert np.all(sched.staleness[applied] == 0)
    if policy == P.ssp(0) and not failures:
        # SSP(0)'s gate is BSP's barrier: every round computes on one version
        for i in np.unique(f["iteration"]):
            assert len(np.unique(f["pull_version"][f["iteration"] == i])) == 1


@given(data=hst.data())
def test_schedule_invariants(data):
    cluster = data.draw(clusters())
    policy = data.draw(policies(cluster.num_workers))
    n = data.draw(hst.integers(1, 120))
    seed = data.draw(hst.integers(0, 2**31 - 1))
    sched = simulate_schedule(policy, cluster, num_updates=n, seed=seed)
    assert sched.num_updates == n
    check_invariants(sched, policy, cluster.num_workers)


@given(data=hst.data())
def test_failures_never_deadlock(data):
    cluster = data.draw(clusters(max_workers=6))
    lam = cluster.num_workers
    events = []
    for w in range(lam):
        if data.draw(hst.booleans()):
            t0 = data.draw(hst.floats(0.0, 20.0))
            rejoin = data.draw(hst.one_of(hst.none(), hst.floats(0.1, 20.0)))
            events.append((w, t0, None if rejoin is None else t0 + rejoin))
    # keep at least one worker alive forever so the budget can be met
    events = [e for e in events if e[0] != 0]
    if events:
        cluster = cluster.failures(events)
    policy = data.draw(policies(lam))
    sched = simulate_schedule(policy, cluster, num_updates=60, seed=1)
    assert sched.num_updates == 60
    check_invariants(sched, policy, lam, failures=True)


def test_lost_gradient_counted_and_rejoin_pulls_newest():
    cluster = C.constant(3, 1.0).failures([(2, 2.5, 6.2)])
    sched = simulate_schedule(P.ssp(1), cluster, num_updates=30, seed=0)
    f = sched.to_frame()
    lost = f[f["lost"]]
    assert len(lost) == 1 and lost["worker"].item() == 2 and lost["iteration"].item() == 2
    after = f[(f["worker"] == 2) & (f["pull_time"] >= 6.2)].iloc[0]
    # it pulls the newest version at the rejoin time
    assert after["pull_time"] == pytest.approx(6.2)
    assert after["pull_version"] == int(np.searchsorted(sched.update_time, 6.2, side="right"))
    assert sched.summary()["lost"] == 1


def test_all_workers_failing_ends_the_schedule():
    cluster = C.constant(2, 1.0).failures([(0, 3.5, None), (1, 3.5, None)])
    sched = simulate_schedule(P.bsp(), cluster, num_updates=100, seed=0)
    assert sched.num_updates == 3 and sched.summary()["lost"] == 2


def test_bsp_updates_hold_all_workers_and_wait_for_the_slowest():
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6])
    sched = simulate_schedule(P.bsp(), cluster, num_updates=1000, seed=0)
    assert np.allclose(np.diff(sched.update_time), 2.6)
    wf = sched.wait_fraction()
    # fraction of the run: the last round's wait is not part of any recorded gradient (1/1000)
    assert wf[0] == pytest.approx(1.6 / 2.6, rel=2e-3) and wf[3] == 0.0


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_softsync_mean_staleness_close_to_n(n):
    lam = 16
    cluster = C.constant(lam, 1.0).jitter(0.3)
    sched = simulate_schedule(P.softsync(n), cluster, num_updates=4000, seed=3)
    s = sched.staleness[sched.applied]
    # each gradient waits for the other λ-1 gradients in flight: <τ> ≈ n(λ-1)/λ
    assert abs(s.mean() - n * (lam - 1) / lam) < 0.1 * n + 0.05
    assert abs(s.mean() - n) < 0.15 * n
    # Rudra measured P(τ > 2n) < 1e-4 on its cluster; lognormal σ = 0.3 jitter has a fatter tail
    assert (s > 2 * n + 1).mean() < 1e-2


def test_asp_one_worker_has_zero_staleness():
    sched = simulate_schedule(P.asp(), C.constant(1).jitter(0.5), num_updates=50, seed=0)
    assert np.all(sched.staleness == 0)


def test_dssp_cap_bounds_gap_and_nocap_may_drift():
    # constant speeds 1 : 2.6 -> a capped DSSP never exceeds s_U; uncapped drifts past it
    cluster = C.heterogeneous([1.0, 2.6])
    capped = simulate_schedule(P.dssp(1, 3), cluster, num_updates=400, seed=0)
    free = simulate_schedule(P.dssp(1, 3, cap=False), cluster, num_updates=400, seed=0)
    assert capped.meta["max_gap"] <= 4
    assert free.meta["max_gap"] > 4
    assert capped.rstar and all(0 <= r <= 3 for _, _, r in capped.rstar)


def test_same_seed_same_frame_other_seed_differs():
    cluster = C.heterogeneous([1.0, 1.5, 2.6]).jitter(0.2).stragglers(0.05, 3.0, 2.0)
    a = simulate_schedule(P.ssp(2), cluster, num_updates=200, seed=7).to_frame()
    b = simulate_schedule(P.ssp(2), cluster, num_updates=200, seed=7).to_frame()
    c = simulate_schedule(P.ssp(2), cluster, num_updates=200, seed=8).to_frame()
    assert a.equals(b)
    assert not a.equals(c)


def test_time_budget_and_spec_strings():
    sched = simulate_schedule("asp", "1,2", max_time=10.0, seed=0)
    assert sched.update_time.max() <= 10.0 and sched.end_time == 10.0
    # 1 s and 2 s workers over 10 s: 10 + 5 pushes
    assert sched.num_updates == 15


def test_frame_columns():
    f = simulate_schedule(P.ssp(1), C.constant(2), num_updates=5, seed=0).to_frame()
    for col in ["worker", "iteration", "pull_version", "apply_version", "staleness",
                "start", "end", "push_time", "wait", "dropped"]:
        assert col in f.columns
    assert str(f["apply_version"].dtype) == "Int64"


def test_save_load_roundtrip(tmp_path):
    cluster = C.heterogeneous([1.0, 2.0]).failures([(1, 3.0, 5.0)])
    s = simulate_schedule(P.dssp(1, 2), cluster, num_updates=20, seed=0)
    s.save(tmp_path / "s.json")
    assert Schedule.load(tmp_path / "s.json").equals(s)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [(dict(num_updates=0), "num_updates = 0"), (dict(max_time=math.inf), "max_time"),
     (dict(), "budget"), (dict(num_updates=3, seed=1.5), "seed")],
)
def test_bad_budget(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        simulate_schedule(P.asp(), C.constant(2), **kwargs)


def test_softsync_more_than_workers_is_rejected():
    with pytest.raises(ValueError, match="n = 5"):
        simulate_schedule(P.softsync(5), C.constant(4), num_updates=3)


GOLDEN_CASES = {
    "bsp": P.bsp(), "asp": P.asp(), "ssp3": P.ssp(3), "dssp": P.dssp(1, 4),
    "dssp_nocap": P.dssp(1, 4, cap=False), "softsync2": P.softsync(2), "backup1": P.backup_workers(1),
}


def golden_cluster():
    return C.heterogeneous([1.0, 1.3, 2.6, 2.0]).jitter(0.2).stragglers(0.05, 3.0, 4.0).network(0.01, 0.02)


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_schedule(name):
    sched = simulate_schedule(GOLDEN_CASES[name], golden_cluster(), num_updates=40, seed=11)
    path = GOLDEN / f"schedule_{name}.json"
    if os.environ.get("STALENESS_REGEN_GOLDEN"):
        sched.save(path)
    golden = Schedule.load(path)
    assert golden.equals(sched), f"schedule differs from {path}; regenerate with STALENESS_REGEN_GOLDEN=1 if intended"
    assert json.loads(path.read_text())["policy"] == GOLDEN_CASES[name].describe()


# -- one event loop for every cluster kind (issue 37): digests recorded before the merge ------------
_LOOP_CLUSTERS = {
    "independent": "1,1.3,2.6,2+jitter=0.2+stragglers=0.05:3:4",
    "fixed_net": "1*4+jitter=0.1+network=0.01:0.02:0.1",
    "links": "1,1.5,2,3+jitter=0.1+net=1gbps:5ms",
    "server": "1,1.5,2,3+jitter=0.1+server=100mbps:1ms",
    "allreduce": "1*4+jitter=0.1+allreduce=ring:1gbps:1ms",
    "failures": "1,1.3,2.6,2+jitter=0.2+fail=3@10-30,1@15-,0@40-45",
    "links_fail": "1*4+jitter=0.1+net=1gbps:5ms+fail=2@6-14,0@20-",
    "server_fail": "1*4+jitter=0.1+server=100mbps:1ms+fail=2@6-14,0@20-",
    "allreduce_fail": "1*4+jitter=0.1+allreduce=tree:1gbps:1ms+fail=2@6-14,0@20-",
    "periodic": "1*4+jitter=0.1+periodic=20:5:3+fail=1@30-60",
}
_LOOP_POLICIES = ["asp", "bsp", "ssp:2", "dssp:1:4", "softsync:2", "backup:1", "diloco:4", "local_sgd:3",
                  "async_diloco:4:grace=0.5", "streaming_diloco:4:fragments=2", "rl_sync", "rl_async:2",
                  "rl_partial:2", "rl_inflight:2", "rl_one_step_off"]


def schedule_digest(sched) -> str:
    """The schedule's columns, update times and end time, bitwise (16 hex digits)."""
    h = hashlib.sha256()
    for k in sorted(sched.columns):
        a = np.ascontiguousarray(sched.columns[k])
        h.update(k.encode() + a.dtype.str.encode() + a.tobytes())
    h.update(np.asarray(sched.update_time).tobytes() + repr(sched.end_time).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("cluster", sorted(_LOOP_CLUSTERS))
def test_golden_schedules_over_every_cluster_kind(cluster):
    """Every policy family on every cluster kind (independent links, fixed delays, a shared
    server link, an all-reduce, failures and joins on each, periodic slowdowns), with and
    without overlap, in-flight rollout sizes for RL: the schedules' digests as recorded before
    the two event loops became one, bitwise ("ValueError": a combination that is refused)."""
    golden = json.loads((GOLDEN / "loop_digests.json").read_text())
    net = cluster.startswith(("links", "server", "allreduce"))
    got = {}
    for p in _LOOP_POLICIES:
        for overlap in ((False, True) if net else (False,)):
            kw = dict(num_updates=60, seed=5, overlap=overlap, payload_bytes=40000 if net else None)
            if p.startswith("rl_") and p != "rl_sync":
                kw["sizes"] = lambda w, it: 1 + (w * 7 + it * 3) % 5
            try:
                got[f"{cluster}|{p}|{overlap}"] = schedule_digest(simulate_schedule(p, _LOOP_CLUSTERS[cluster], **kw))
            except ValueError:
                got[f"{cluster}|{p}|{overlap}"] = "ValueError"
    assert got == {k: v for k, v in golden.items() if k.startswith(cluster + "|")}
