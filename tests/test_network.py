"""The network model: transfer times from bytes, the shared server link, all-reduce
rounds, byte accounting in schedules, and the spec grammar of the network modifiers."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from staleness import cluster as C
from staleness import policies as P
from staleness.cluster.network import SharedLink, allreduce_time
from staleness.schedule import Schedule
from staleness.sim.scheduler import simulate_schedule
from test_sim import GOLDEN, GOLDEN_CASES, check_invariants, golden_cluster, policies

# Powers of two keep every sum below exact, so times compare with ==.
B = 2**20            # bytes
BW = 2.0**27         # bytes/s: B / BW = 2**-7 s
LAT = 2.0**-6        # s


def rows(sched, worker):
    f = sched.columns
    return {k: v[f["worker"] == worker] for k, v in f.items()}


# ---------------------------------------------------------------------------
# One transfer: latency + bytes / bandwidth
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("server", [False, True])
def test_one_transfer_takes_latency_plus_bytes_over_bandwidth(server):
    c = C.constant(1).links(BW, LAT)
    if server:
        c = c.server(4 * BW)   # faster than the worker's link: the worker's link is the bottleneck
    s = simulate_schedule(P.asp(), c, num_updates=3, seed=0, payload_bytes=B)
    f = s.columns
    assert np.all(f["start"] - f["pull_time"] == LAT + B / BW)
    assert np.all(f["push_time"] - f["end"] == LAT + B / BW)
    assert np.all(f["end"] - f["start"] == 1.0)
    assert np.all(f["pull_bytes"] == B) and np.all(f["push_bytes"] == B)
    assert c.sampler(0).transfer_time(0, 5, B, "pull") == LAT + B / BW


def test_server_link_slower_than_the_worker_link_is_the_bottleneck():
    c = C.constant(1).links(4 * BW, LAT).server(BW, LAT)
    s = simulate_schedule(P.asp(), c, num_updates=2, seed=0, payload_bytes=B)
    assert np.all(s["start"] - s["pull_time"] == 2 * LAT + B / BW)
    assert c.sampler(0).transfer_time(0, 0, B) == 2 * LAT + B / BW


def test_compressed_push_bytes():
    c = C.constant(2).links(BW, LAT)
    s = simulate_schedule(P.asp(), c, num_updates=4, seed=0, payload_bytes=B, push_bytes=B // 4)
    assert np.all(s["start"] - s["pull_time"] == LAT + B / BW)
    assert np.all(s["push_time"] - s["end"] == LAT + B / 4 / BW)
    assert np.all(s["push_bytes"] == B // 4) and np.all(s["pull_bytes"] == B)


def test_latency_only_network_is_a_case_of_the_model():
    old = C.heterogeneous([1.0, 1.3, 2.6]).jitter(0.2).network(0.01, 0.02)
    # without bytes a link's bandwidth does not matter: latency only, as network= does
    as_links = C.heterogeneous([1.0, 1.3, 2.6]).jitter(0.2).links("1gbps", 0.01)
    a = simulate_schedule(P.ssp(1), old.network(0.0, 0.0), num_updates=60, seed=3)
    sym = simulate_schedule(P.ssp(1), C.heterogeneous([1.0, 1.3, 2.6]).jitter(0.2).network(0.01, 0.01),
                            num_updates=60, seed=3)
    b = simulate_schedule(P.ssp(1), as_links, num_updates=60, seed=3)
    assert sym.equals(b) and not a.equals(b)
    # with bytes but no bandwidth anywhere, the times are the latency-only ones
    s0 = simulate_schedule(P.ssp(1), old, num_updates=60, seed=3)
    s1 = simulate_schedule(P.ssp(1), old, num_updates=60, seed=3, payload_bytes=10**9)
    for k in ("pull_time", "start", "end", "push_time", "apply_version"):
        assert np.array_equal(s0[k], s1[k])
    assert np.all(s1["pull_bytes"] == 10**9) and np.all(s0["pull_bytes"] == 0)


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_times_unchanged_by_bytes_on_a_latency_only_network(name):
    golden = Schedule.load(GOLDEN / f"schedule_{name}.json")
    s = simulate_schedule(GOLDEN_CASES[name], golden_cluster(), num_updates=40, seed=11, payload_bytes=4096)
    for k in ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start", "end", "push_time"):
        assert np.array_equal(golden[k], s[k], equal_nan=golden[k].dtype.kind == "f"), k
    assert s.summary()["bytes_sent"] == 2 * 4096 * s.num_gradients


# ---------------------------------------------------------------------------
# The shared server link: processor sharing
# ---------------------------------------------------------------------------
def test_two_concurrent_transfers_take_twice_as_long():
    one = simulate_schedule(P.asp(), C.constant(1).server(BW), num_updates=1, seed=0, payload_bytes=B)
    two = simulate_schedule(P.asp(), C.constant(2).server(BW), num_updates=2, seed=0, payload_bytes=B)
    assert np.all(one["start"] == B / BW)
    assert np.all(two["start"] == 2 * B / BW)             # both pulls share the link from t = 0
    assert np.all(two["push_time"] - two["end"] == 2 * B / BW)


def test_a_transfer_starting_half_way_finishes_when_processor_sharing_says():
    # Server link 1 MB/s, pushes of 1 MB (1 s alone). Worker 0's push starts at 1.0;
    # worker 1's at 1.5, when worker 0's is half done. Both then run at 0.5 MB/s:
    # worker 0's last half takes 1 s (arrives 2.5), worker 1 has 0.5 MB left and
    # finishes it alone at 1 MB/s (arrives 3.0).
    c = C.heterogeneous([1.0, 1.5]).server(1e6)
    s = simulate_schedule(P.asp(), c, num_updates=2, seed=0, payload_bytes=0, push_bytes=10**6)
    assert list(s["worker"]) == [0, 1]
    assert list(s["push_time"]) == [2.5, 3.0]
    link = SharedLink(1e6)
    a = link.add(1.0, 1e6)
    assert link.next_completion() == (2.0, a)
    b = link.add(1.5, 1e6)
    assert link.next_completion() == (2.5, a) and link.rate(a) == link.rate(b) == 5e5
    link.remove(2.5, a)
    assert link.next_completion() == (3.0, b) and link.rate(b) == 1e6


def test_max_min_fair_share_with_worker_caps():
    # worker 0's own link is a quarter of the server's: it gets its cap, worker 1 the rest
    link = SharedLink(4e6)
    slow, fast = link.add(0.0, 1e6, cap=1e6), link.add(0.0, 3e6)
    assert link.rate(slow) == 1e6 and link.rate(fast) == 3e6
    c = C.constant(2).links(1e6, workers=[0]).server(4e6)
    s = simulate_schedule(P.asp(), c, num_updates=2, seed=0, payload_bytes=10**6)
    first = {int(w): st for w, st in zip(s["worker"][:2], s["start"][:2])}
    assert first == {0: 1.0, 1: 1e6 / 3e6}
    # three uncapped flows and a capped one: water-filling gives 1, 1, 1 (cap 0.5 -> 0.5, rest 3.5/3)
    link = SharedLink(4e6)
    capped = link.add(0.0, 1e6, cap=5e5)
    others = [link.add(0.0, 1e6) for _ in range(3)]
    assert link.rate(capped) == 5e5
    assert all(link.rate(f) == pytest.approx(3.5e6 / 3) for f in others)


def test_a_failure_mid_transfer_speeds_up_the_others_and_its_bytes_are_lost():
    # two pushes share a 1 MB/s link from t = 1; worker 1 dies at 1.5: worker 0 has
    # 0.75 MB left, alone at 1 MB/s -> arrives at 2.25.
    c = C.constant(2).server(1e6).failures([(1, 1.5, None)])
    s = simulate_schedule(P.asp(), c, num_updates=1, seed=0, payload_bytes=0, push_bytes=10**6)
    f = s.to_frame()
    arrived = f[~f["lost"]].iloc[0]
    assert arrived["worker"] == 0 and arrived["push_time"] == 2.25
    lost = f[f["lost"]].iloc[0]
    assert lost["worker"] == 1 and lost["push_bytes"] == 10**6
    t = s.bytes_totals()
    assert t["bytes_lost"] == 10**6 and t["bytes_sent"] == t["bytes_received"] + t["bytes_lost"]


def test_a_failure_before_the_push_loses_the_pull_bytes_only():
    c = C.constant(2).links(BW, LAT).failures([(1, 0.5, None)])
    s = simulate_schedule(P.asp(), c, num_updates=3, seed=0, payload_bytes=B)
    lost = rows(s, 1)
    assert list(lost["lost"]) == [True]
    assert list(lost["pull_bytes"]) == [B] and list(lost["push_bytes"]) == [0]
    assert s.bytes_totals()["bytes_lost"] == B


# ---------------------------------------------------------------------------
# All-reduce rounds
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("lam", [1, 2, 3, 4, 8, 13])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_allreduce_cost_matches_its_formula(lam, algorithm):
    nbytes, bw, lat = 3 * 10**7, 1.25e9, 1e-3
    if algorithm == "ring":
        want = 2 * (lam - 1) / lam * nbytes / bw + 2 * (lam - 1) * lat
    else:
        want = 2 * math.ceil(math.log2(lam)) * (lat + nbytes / bw)
    assert allreduce_time(algorithm, nbytes, lam, bw, lat) == pytest.approx(want, rel=1e-15, abs=0)
    c = C.heterogeneous([1.0 + 0.25 * w for w in range(lam)]).allreduce(algorithm, bw, lat)
    assert c.sampler(0).allreduce_time(nbytes, lam) == pytest.approx(want, rel=1e-15, abs=0)
    s = simulate_schedule(P.bsp(), c, num_updates=3, seed=0, payload_bytes=nbytes)
    slowest = 1.0 + 0.25 * (lam - 1)
    # each round's pushes all complete at the end of its last compute + the all-reduce
    assert s.update_time[0] == pytest.approx(slowest + want, rel=1e-15)
    assert np.diff(s.update_time) == pytest.approx(slowest + want, rel=1e-12)
    f = s.columns
    for v in range(3):
        sel = f["apply_version"] == v
        assert np.all(f["push_time"][sel] == s.update_time[v])
    # no separate pull: the next round starts at the update
    assert np.all(f["start"] == f["pull_time"]) and np.all(f["pull_bytes"] == 0)
    assert np.all(f["push_bytes"] == nbytes)


def test_allreduce_is_used_by_synchronous_rounds_only():
    c = C.constant(4).links(BW, LAT).allreduce("ring", BW, 0.0)
    sync = simulate_schedule(P.diloco(2), c, num_updates=2, seed=0, payload_bytes=B)
    assert sync.meta["network"]["aggregation"] == "allreduce"
    assert np.all(sync["pull_bytes"] == 0)
    other = simulate_schedule(P.asp(), c, num_updates=8, seed=0, payload_bytes=B)
    assert other.meta["network"]["aggregation"] == "links"
    assert np.all(other["start"] - other["pull_time"] == LAT + B / BW)


def test_allreduce_rejoining_worker_fetches_parameters_over_its_link():
    c = C.constant(3).links(BW, LAT).allreduce("ring", BW, 0.0).failures([(2, 1.5, 4.0)])
    s = simulate_schedule(P.bsp(), c, num_updates=8, seed=0, payload_bytes=B)
    f = s.to_frame()
    back = f[(f["worker"] == 2) & (f["pull_time"] >= 4.0)].iloc[0]
    assert back["pull_bytes"] == B and back["start"] - back["pull_time"] == pytest.approx(LAT + B / BW)
    check_invariants(s, P.bsp(), 3, failures=True)


# ---------------------------------------------------------------------------
# Overlap
# ---------------------------------------------------------------------------
def test_overlap_hides_the_push_behind_the_compute():
    # alone: 2**-7 s of data, 2**-6 s latency; compute 1 s hides the data phase
    c = C.constant(1).links(BW, LAT)
    s = simulate_schedule(P.asp(), c, num_updates=3, seed=0, payload_bytes=B, overlap=True)
    assert np.all(s["push_time"] - s["end"] == LAT)
    # a data phase longer than the compute shows through: push_time = start + data + latency
    slow = C.constant(1, 2.0**-8).links(BW, LAT)
    s = simulate_schedule(P.asp(), slow, num_updates=3, seed=0, payload_bytes=B, overlap=True)
    assert np.all(s["push_time"] == s["start"] + B / BW + LAT)
    # shared link: the push flow runs from the compute start
    shared = C.constant(1, 2.0**-8).server(BW)
    s = simulate_schedule(P.asp(), shared, num_updates=3, seed=0, payload_bytes=B, overlap=True)
    assert np.all(s["push_time"] == s["start"] + B / BW)
    ar = C.constant(2, 2.0**-8).allreduce("tree", BW, LAT)
    s = simulate_schedule(P.bsp(), ar, num_updates=2, seed=0, payload_bytes=B, overlap=True)
    assert s.update_time[0] == 2 * (B / BW) + 2 * LAT   # data from t = 0, longer than the compute


# ---------------------------------------------------------------------------
# Schedules: byte columns, totals, peak bandwidth, old files
# ---------------------------------------------------------------------------
def test_old_schedule_files_load_with_zero_bytes(tmp_path):
    data = json.loads((GOLDEN / "schedule_asp.json").read_text())
    assert "pull_bytes" not in data["columns"] and data["format_version"] == 1
    s = Schedule.load(GOLDEN / "schedule_asp.json")
    assert s["pull_bytes"].dtype == np.int64 and not s["pull_bytes"].any() and not s["push_bytes"].any()
    assert s.summary()["bytes_sent"] == 0 and s.summary()["peak_bytes_per_s"] == 0.0
    # a constructor without byte columns (a pipeline timeline, a hand-made schedule)
    cols = {k: v for k, v in s.columns.items() if not k.endswith("_bytes")}
    t = Schedule(columns=cols, update_time=s.update_time, num_workers=s.num_workers, policy="asp")
    assert t.equals(s) and "pull_bytes" not in cols
    # new files carry the columns and round-trip
    n = simulate_schedule(P.asp(), "1,2+net=1gbps:1ms+server=1gbps", num_updates=10, seed=0,
                          payload_bytes=12345, push_bytes=678)
    n.save(tmp_path / "n.json")
    back = Schedule.load(tmp_path / "n.json")
    assert back.equals(n) and list(back["push_bytes"]) == [678] * n.num_gradients


def test_peak_bandwidth_from_intervals():
    base = Schedule.load(GOLDEN / "schedule_asp.json")
    g = 3
    cols = {k: v[:g].copy() for k, v in base.columns.items()}
    cols.update(pull_time=np.array([0.0, 0.5, 2.0]), start=np.array([1.0, 1.5, 3.0]),
                end=np.array([5.0, 5.0, 5.0]), push_time=np.array([6.0, 7.0, 9.0]),
                pull_bytes=np.array([100, 300, 50]), push_bytes=np.array([10, 20, 0]),
                lost=np.zeros(g, bool), dropped=np.zeros(g, bool), apply_version=np.array([-1, -1, -1]))
    s = Schedule(columns=cols, update_time=np.zeros(0), num_workers=base.num_workers, policy="hand", end_time=10.0)
    # pulls: 100 B/s on [0, 1), 300 B/s on [0.5, 1.5), 50 B/s on [2, 3): peak 400 on [0.5, 1)
    assert s.peak_bandwidth() == pytest.approx(400.0)
    assert s.summary()["bytes_sent"] == 480 and s.summary()["mean_bytes_per_s"] == pytest.approx(48.0)


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------
BANDWIDTHS = ["8mbps", "80mbps", "1gbps", "25MB/s"]


@hst.composite
def network_clusters(draw, max_workers=8, allow_failures=False):
    n = draw(hst.integers(1, max_workers))
    c = C.heterogeneous(draw(hst.lists(hst.floats(0.2, 3.0), min_size=n, max_size=n)))
    if draw(hst.booleans()):
        c = c.jitter(draw(hst.floats(0.0, 0.5)))
    if draw(hst.booleans()):
        c = c.network(draw(hst.floats(0.0, 0.1)), draw(hst.floats(0.0, 0.1)), draw(hst.floats(0.0, 0.5)))
    for _ in range(draw(hst.integers(0, 2))):
        subset = draw(hst.none() | hst.lists(hst.integers(0, n - 1), min_size=1, unique=True))
        c = c.links(draw(hst.sampled_from(BANDWIDTHS)), draw(hst.floats(0.0, 0.05)), subset)
    if draw(hst.booleans()):
        c = c.server(draw(hst.sampled_from(BANDWIDTHS)), draw(hst.floats(0.0, 0.02)))
    if draw(hst.booleans()):
        c = c.allreduce(draw(hst.sampled_from(["ring", "tree"])), draw(hst.sampled_from(BANDWIDTHS)),
                        draw(hst.floats(0.0, 0.01)))
    if allow_failures:
        events = []
        for w in range(1, n):   # worker 0 stays, so the budget can be met
            if draw(hst.booleans()):
                t0 = draw(hst.floats(0.0, 20.0))
                back = draw(hst.none() | hst.floats(0.1, 20.0))
                events.append((w, t0, None if back is None else t0 + back))
        if events:
            c = c.failures(events)
    return c


@hst.composite
def network_policies(draw, num_workers):
    """test_sim's policies (but a merging window, which a shared link or an all-reduce refuses), and
    Streaming DiLoCo (whose overlap credit changes the times)."""
    if draw(hst.integers(0, 4)) == 0:
        p = draw(hst.integers(1, 3))
        h = p * draw(hst.integers(1, 3))
        return P.streaming_diloco(h, fragments=p, overlap=draw(hst.integers(0, h // p - 1)),
                                  bits=draw(hst.sampled_from([4, 32])))
    return draw(policies(num_workers).filter(lambda p: not p.merges))


def check_bytes(sched, pull_n, push_n, collective):
    f = sched.columns
    ok = ~f["lost"]
    totals = sched.bytes_totals()
    assert totals["bytes_sent"] == totals["bytes_received"] + totals["bytes_lost"]
    assert totals["bytes_sent"] == int(f["pull_bytes"].sum() + f["push_bytes"].sum())
    # every gradient that was not lost pushed all its bytes, and they arrived
    assert np.all(f["push_bytes"][ok] == push_n)
    assert np.all(np.isin(f["push_bytes"][~ok], [0, push_n]))
    assert np.all(np.isin(f["pull_bytes"], [0, pull_n] if collective else [pull_n]))
    assert totals["bytes_lost"] == int((f["pull_bytes"] + f["push_bytes"])[~ok].sum())


def check_intervals(sched, failures):
    f = sched.columns
    ok = ~f["lost"]
    assert np.all(f["start"] - f["pull_time"] >= 0) and np.all(f["push_time"][ok] - f["end"][ok] >= 0)
    # per worker: pull, compute, push, then the next pull, never overlapping
    for q in range(sched.num_workers):
        sel = (f["worker"] == q) & ok
        order = np.argsort(f["pull_time"][sel], kind="stable")
        chain = np.stack([f[k][sel][order] for k in ("pull_time", "start", "end", "push_time")], 1).ravel()
        assert np.all(np.diff(chain) >= 0), q
        if not failures:
            assert np.array_equal(f["iteration"][sel][order], np.arange(sel.sum()))
    begin, end, nbytes = sched.transfer_intervals()
    assert np.all(end >= begin) and np.all(nbytes > 0)
    assert sched.peak_bandwidth() >= 0


@settings(max_examples=60, deadline=None)
@given(data=hst.data())
def test_schedule_invariants_with_random_networks(data):
    cluster = data.draw(network_clusters())
    policy = data.draw(network_policies(cluster.num_workers))
    pull_n = data.draw(hst.integers(0, 10**7))
    push_n = data.draw(hst.one_of(hst.none(), hst.integers(0, 10**7)))
    overlap = data.draw(hst.booleans())
    n = data.draw(hst.integers(1, 60))
    sched = simulate_schedule(policy, cluster, num_updates=n, seed=data.draw(hst.integers(0, 2**31 - 1)),
                              payload_bytes=pull_n, push_bytes=push_n, overlap=overlap)
    assert sched.num_updates == n
    check_invariants(sched, policy, cluster.num_workers)
    collective = sched.meta["network"]["aggregation"] == "allreduce"
    check_bytes(sched, pull_n, pull_n if push_n is None else push_n, collective)
    check_intervals(sched, failures=False)
    # no transfer is faster than it would be alone on its path
    s = cluster.sampler(0)
    f = sched.columns
    if not collective and s.server is not None:
        for q in range(cluster.num_workers):
            alone = pull_n / min(s.bandwidth[q], s.server[0])
            sel = f["worker"] == q
            assert np.all(f["start"][sel] - f["pull_time"][sel] >= alone * (1 - 1e-9))


@settings(max_examples=40, deadline=None)
@given(data=hst.data())
def test_failures_with_random_networks(data):
    cluster = data.draw(network_clusters(max_workers=6, allow_failures=True))
    policy = data.draw(network_policies(cluster.num_workers))
    pull_n = data.draw(hst.integers(1, 10**7))
    overlap = data.draw(hst.booleans())
    sched = simulate_schedule(policy, cluster, num_updates=40, seed=1, payload_bytes=pull_n, overlap=overlap)
    assert sched.num_updates == 40
    check_invariants(sched, policy, cluster.num_workers, failures=True)
    check_bytes(sched, pull_n, pull_n, sched.meta["network"]["aggregation"] == "allreduce")
    check_intervals(sched, failures=True)


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.floats(0.0, 5.0), hst.floats(1.0, 1e6), hst.sampled_from([1e3, 1e4, 1e5, math.inf])),
                 min_size=1, max_size=12),
       hst.sampled_from([1e4, 3e4, 1e5]))
def test_shared_link_conserves_bytes_and_is_max_min_fair(flows, capacity):
    """Drive a SharedLink with flows starting at random times; between events every
    rate is constant: check fairness there, and that each flow's integrated rate is its size."""
    link = SharedLink(capacity)
    arrivals = sorted(enumerate(flows), key=lambda x: (x[1][0], x[0]))
    served = {}      # flow id -> bytes integrated
    size = {}
    caps = {}
    now, k = 0.0, 0
    while k < len(arrivals) or len(link):
        nc = link.next_completion()
        t_arr = arrivals[k][1][0] if k < len(arrivals) else math.inf
        t = min(t_arr, nc[0] if nc else math.inf)
        active = list(served)
        rates = {fid: link.rate(fid) for fid in active}
        if active:
            total = sum(rates.values())
            assert total <= capacity * (1 + 1e-9)
            assert all(rates[f] <= caps[f] * (1 + 1e-12) for f in active)
            top = max(rates.values())
            # max-min: a flow below the top rate is held by its own cap; if the link
            # is not full, every flow is at its cap
            assert all(rates[f] >= top * (1 - 1e-9) or rates[f] >= caps[f] * (1 - 1e-9) for f in active)
            if total < capacity * (1 - 1e-9):
                assert all(rates[f] >= caps[f] * (1 - 1e-9) for f in active)
            for f in active:
                served[f] += rates[f] * (t - now)
        now = t
        if nc is not None and nc[0] <= t_arr:
            fid = nc[1]
            left = link.remove(now, fid)
            assert left <= 1e-6 * size[fid]
            assert served.pop(fid) == pytest.approx(size[fid], rel=1e-9)
        else:
            _, (start, nbytes, cap) = arrivals[k]
            fid = link.add(now, nbytes, cap)
            served[fid], size[fid], caps[fid] = 0.0, nbytes, cap
            k += 1
    assert not served


# ---------------------------------------------------------------------------
# Spec grammar
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec, canonical", [
    ("8+net=1gbps:5ms", None),
    ("8+net=1gbps", None),
    ("8+net=1gbps:5ms+server=10gbps", None),
    ("1*4,2.6*4+allreduce=ring:10gbps:1ms", None),
    ("8+allreduce=tree:100mbps", None),
    ("4+net=100mbps:20ms:2-3+net=1gbps:0:0,1", "4+net=100mbps:20ms:2-3+net=1gbps:0:0-1"),
    ("4+net=1.5gbps:250us+server=40gbps:1ms+network=0.01:0.02:0.1", None),
    ("4+net=123456789bps:0.3s", "4+net=123.456789mbps:300ms"),
    ("4+jitter=0.1+net=10kbps:1ms+fail=3@10-20", None),
    ("4+net=125MB/s:0.005+server=1.25GB/s", "4+net=1gbps:5ms+server=10gbps"),
    ("4+net=0.5bps:1.5s", None),
    ("4+net=1GBPS:5000US:ALL", "4+net=1gbps:5ms"),
])
def test_network_spec_round_trip(spec, canonical):
    """describe() writes the canonical form (bit rates in the largest unit >= 1,
    latencies in the shortest exact unit, worker ranges as a-b) and reads back
    to an equal cluster."""
    c = C.parse(spec)
    assert c.describe() == (spec if canonical is None else canonical)
    assert C.parse(c.describe()) == c
    assert C.parse(c.describe()).describe() == c.describe()


@settings(max_examples=200, deadline=None)
@given(hst.floats(1e-3, 1e13, allow_nan=False), hst.floats(0.0, 10.0))
def test_bandwidth_and_latency_texts_read_back_exactly(bytes_per_s, seconds):
    from staleness.cluster.network import format_bandwidth, format_latency, parse_bandwidth, parse_latency
    assert parse_bandwidth(format_bandwidth(bytes_per_s)) == bytes_per_s
    assert parse_latency(format_latency(seconds)) == seconds
    c = C.constant(3).links(bytes_per_s, seconds, workers=[0, 2])
    assert C.parse(c.describe()) == c


def test_network_spec_values_and_units():
    c = C.parse("2+net=1gbps:5ms+server=10gbps")
    s = c.sampler(0)
    assert s.bandwidth == (1.25e8, 1.25e8) and s.server == (1.25e9, 0.0)
    assert s.pull_delay(0, 0) == 0.005
    assert C.parse("2+net=125MB/s:5000us+server=1.25GB/s") == c
    assert C.parse("2+net=1GBPS:5MS+server=10Gbps") == c   # units are case-insensitive
    assert C.parse("2+allreduce=ring:8gbps:0.001").sampler(0).allreduce == ("ring", 1e9, 0.001)
    assert C.constant(2).links("1gbps", "5ms").server("10gbps") == c
    assert C.constant(2).links(1.25e8, 0.005).server(1.25e9) == c


@pytest.mark.parametrize("spec, needle", [
    ("4+net=1", "unit"),
    ("4+net=1furlongs", "unit"),
    ("4+net=-1gbps", "unit"),
    ("4+net=0gbps", "> 0"),
    ("4+net=1gbps:5parsecs", "latency"),
    ("4+net=1gbps:5ms:9", "workers[0] = 9"),
    ("4+net=1gbps:1:2:3", "BANDWIDTH[:LATENCY[:WORKERS]]"),
    ("4+server=10gbps+server=1gbps", "already has a server link"),
    ("4+allreduce=ring", "ring|tree:BANDWIDTH"),
    ("4+allreduce=star:1gbps", "must be one of ring, tree"),
    ("4+allreduce=ring:1gbps+allreduce=tree:1gbps", "already has an all-reduce"),
])
def test_network_spec_errors(spec, needle):
    with pytest.raises(ValueError) as e:
        C.parse(spec)
    assert needle in str(e.value)


@pytest.mark.parametrize("make, needle", [
    (lambda: C.constant(2).links(0), "links: bandwidth = 0 must be a finite number > 0"),
    (lambda: C.constant(2).links("fast"), "links: bandwidth = 'fast' must be a number > 0 with a unit"),
    (lambda: C.constant(2).links(1e6, -1), "links: latency = -1 must be a finite number >= 0"),
    (lambda: C.constant(2).links(1e6, workers=[5]), "links: workers[0] = 5 is not a worker id"),
    (lambda: C.constant(2).server(math.inf), "server: bandwidth = inf"),
    (lambda: C.constant(2).allreduce("ring", -1.0), "allreduce: bandwidth = -1.0"),
    (lambda: C.constant(2).allreduce("mesh", 1e9), "allreduce: algorithm = 'mesh'"),
    (lambda: simulate_schedule(P.asp(), C.constant(2), num_updates=1, payload_bytes=-1), "payload_bytes = -1"),
    (lambda: simulate_schedule(P.asp(), C.constant(2), num_updates=1, payload_bytes=1.5), "payload_bytes = 1.5"),
    (lambda: simulate_schedule(P.asp(), C.constant(2), num_updates=1, push_bytes=10), "needs payload_bytes"),
    (lambda: simulate_schedule(P.asp(), C.constant(2), num_updates=1, overlap=1), "overlap = 1"),
])
def test_network_validation_errors(make, needle):
    with pytest.raises(ValueError) as e:
        make()
    assert needle in str(e.value)


# ---------------------------------------------------------------------------
# Local-update methods: deltas under the network model
# ---------------------------------------------------------------------------
def test_a_diloco_round_costs_its_allreduce():
    # 4 inner steps of 1 s, then a ring all-reduce of the delta
    c = C.constant(4).allreduce("ring", BW, LAT)
    s = simulate_schedule(P.diloco(4), c, num_updates=3, seed=0, payload_bytes=B)
    ring = 2 * 3 / 4 * B / BW + 2 * 3 * LAT
    assert np.array_equal(s.update_time, np.array([1, 2, 3]) * (4.0 + ring))
    # through the server instead: 4 pushes share its link, then 4 pulls do
    srv = simulate_schedule(P.diloco(4), C.constant(4).server(BW), num_updates=2, seed=0, payload_bytes=B)
    assert srv.update_time[0] == 4 * B / BW + 4.0 + 4 * B / BW


def test_streaming_diloco_overlap_hides_communication_up_to_tau_steps():
    # 2 workers, H = 8, P = 2: 4 inner steps of 1 s per sync; the ring all-reduce
    # of a fragment takes 2 s. Without overlap a round is 4 + 2 s; the τ steps after
    # a sync run while the fragment is in flight, so a round is 4 + max(0, 2 − τ) s.
    c = C.constant(2).allreduce("ring", "8mbps")   # 1e6 bytes/s
    for tau, period in ((0, 6.0), (1, 5.0), (2, 4.0), (3, 4.0)):
        pol = P.streaming_diloco(8, fragments=2, overlap=tau)
        s = simulate_schedule(pol, c, num_updates=4, seed=0, payload_bytes=0, push_bytes=2 * 10**6)
        assert s.update_time[0] == 6.0   # the first round has nothing to overlap
        assert np.array_equal(np.diff(s.update_time), [period] * 3), tau
        check_invariants(s, pol, 2)
        check_intervals(s, failures=False)


def test_streaming_overlap_credit_restarts_after_a_rejoin():
    c = C.constant(2).allreduce("ring", "8mbps").failures([(1, 7.0, 9.0)])
    pol = P.streaming_diloco(8, fragments=2, overlap=2)
    s = simulate_schedule(pol, c, num_updates=6, seed=0, payload_bytes=10**6, push_bytes=2 * 10**6)
    check_invariants(s, pol, 2, failures=True)
    f = s.to_frame()
    back = f[(f["worker"] == 1) & (f["pull_time"] >= 9.0) & ~f["lost"]].iloc[0]
    # its first iteration after the rejoin is not credited: 4 full steps after its pull
    assert back["end"] - back["start"] == 4.0


def test_payload_bytes_are_dtype_aware_and_count_compression():
    import jax.numpy as jnp

    from staleness.engine.payload import SCALE_BYTES, quantized_bytes, tree_bytes

    tree = {"a": {"w": jnp.zeros((3, 4), jnp.float32), "b": jnp.zeros(5, jnp.bfloat16)},
            "c": np.zeros(7, np.int8), "d": jnp.zeros((0, 3), jnp.float32)}
    assert tree_bytes(tree) == 3 * 4 * 4 + 5 * 2 + 7
    # 4 bits per value, rounded up per tensor, and one float32 scale per non-empty tensor
    assert quantized_bytes(tree, 4) == (6 + SCALE_BYTES) + (3 + SCALE_BYTES) + (4 + SCALE_BYTES)
    assert quantized_bytes(tree, 32) == tree_bytes(tree)
    with pytest.raises(ValueError, match="bits = 0 must be an integer in 1..32"):
        quantized_bytes(tree, 0)


def test_simulate_passes_the_task_payload_to_the_network():
    import jax

    import staleness as st
    from staleness.engine.payload import payload_bytes, quantized_bytes, tree_bytes

    task = st.tasks.get("digits-mlp", num_workers=2)
    shapes = jax.eval_shape(task.init_fn, jax.random.key(0))
    full = tree_bytes(shapes)
    assert full == 4 * (64 * 128 + 128 + 128 * 10 + 10)
    assert payload_bytes(task, P.diloco(4)) == (full, full)
    # Streaming DiLoCo, P = 2 fragments (one Dense layer each), 4-bit deltas: one
    # fragment per sync, at the fragments' mean size
    frags = [{"Dense_0": shapes["Dense_0"]}, {"Dense_1": shapes["Dense_1"]}]
    pull, push = payload_bytes(task, P.streaming_diloco(4, fragments=2, bits=4))
    assert pull == -(-full // 2)
    assert push == -(-sum(quantized_bytes(f, 4) for f in frags) // 2) and push < pull / 7
    r = st.simulate(task, "asp", "1*2+net=1gbps:5ms", num_updates=4, seed=0, eval_every=4)
    f = r.schedule.columns
    assert np.all(f["pull_bytes"] == full) and np.all(f["push_bytes"] == full)
    assert np.allclose(f["start"] - f["pull_time"], 0.005 + full / 1.25e8, rtol=1e-12, atol=0)
    assert r.schedule.summary()["bytes_sent"] == 2 * full * r.schedule.num_gradients


def test_cli_simulate_with_a_network(capsys, tmp_path):
    from staleness.cli import main

    code = main(["simulate", "--task", "quadratic", "--policy", "asp", "--cluster", "1*8+net=1gbps:5ms",
                 "--updates", "16", "--no-progress", "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "net=1gbps:5ms" in out
    sched = Schedule.load(tmp_path / "run" / "schedule.json")
    assert (sched["pull_bytes"] > 0).all() and sched.cluster == "8+net=1gbps:5ms"


@pytest.mark.parametrize("spec, fragment", [
    ("1*8+net=fast", "net bandwidth = 'fast' must be a number > 0 with a unit: bps, kbps"),
    ("1*8+net=1gbps:5ms:12", "workers"),
    ("1*8+allreduce=star:1gbps", "must be one of ring, tree"),
    ("1*8+server=1gbps:soon", "server latency = 'soon'"),
])
def test_cli_bad_network_spec_is_one_line_exit_2(spec, fragment, capsys):
    from staleness.cli import main

    code = main(["simulate", "--task", "quadratic", "--cluster", spec, "--updates", "4", "--no-progress"])
    _, err = capsys.readouterr()
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_streaming_diloco_moves_a_fraction_of_diloco_bytes_per_sync():
    """Peak bytes of one synchronization: DiLoCo all-reduces the whole delta, Streaming
    DiLoCo one fragment of it (1/P), quantized (4 bits here: about 1/8 more)."""
    import staleness as st
    from staleness.engine.payload import payload_bytes

    task = st.tasks.get("digits-mlp", num_workers=4)
    c = C.constant(4).links("1gbps", "1ms").server("10gbps")
    peak = {}
    for pol in (P.diloco(8), P.streaming_diloco(8, fragments=2), P.streaming_diloco(8, fragments=2, bits=4)):
        pull, push = payload_bytes(task, pol)
        s = simulate_schedule(pol, c, num_updates=6, seed=0, payload_bytes=pull, push_bytes=push)
        check_bytes(s, pull, push, collective=False)
        peak[pol.describe()] = s.summary()["peak_update_bytes"]
        assert peak[pol.describe()] == 4 * push
    d, s32, s4 = peak.values()
    assert s32 == pytest.approx(d / 2, rel=1e-3) and s4 < s32 / 7
