"""Tests for staleness.cluster: speed models, determinism, parsing, validation."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from staleness import cluster as C


def run(sampler, num_iters, order="round_robin"):
    """Simulate each worker computing back to back; return times[w][i] and starts[w][i].

    Each worker starts its next iteration when the previous one ends, so a
    worker's start times depend only on its own compute times.
    """
    W = sampler.num_workers
    times = [[None] * num_iters for _ in range(W)]
    starts = [[None] * num_iters for _ in range(W)]
    clock = [0.0] * W
    if order == "round_robin":
        visits = [(w, i) for i in range(num_iters) for w in range(W)]
    elif order == "worker_by_worker_reversed":
        visits = [(w, i) for w in reversed(range(W)) for i in range(num_iters)]
    else:
        raise AssertionError(order)
    for w, i in visits:
        starts[w][i] = clock[w]
        times[w][i] = sampler.compute_time(w, i, clock[w])
        clock[w] += times[w][i]
    return times, starts


NOISY = (C.heterogeneous([1.0, 2.0, 2.6, 0.5, 1.5])
         .jitter(0.3)
         .stragglers(0.05, 3.0, 4.0)
         .periodic(50.0, 5.0, 2.0, workers=[1, 3])
         .network(0.01, 0.02, jitter=0.5))


# ---------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------
def test_same_seed_identical_other_seed_differs():
    a, _ = run(NOISY.sampler(7), 200)
    b, _ = run(NOISY.sampler(7), 200)
    c, _ = run(NOISY.sampler(8), 200)
    assert a == b
    assert a != c
    s1, s2, s3 = NOISY.sampler(7), NOISY.sampler(7), NOISY.sampler(8)
    push1 = [s1.push_delay(w, i) for w in range(5) for i in range(100)]
    assert push1 == [s2.push_delay(w, i) for w in range(5) for i in range(100)]
    assert push1 != [s3.push_delay(w, i) for w in range(5) for i in range(100)]
    pull1 = [s1.pull_delay(w, i) for w in range(5) for i in range(100)]
    assert pull1 == [s2.pull_delay(w, i) for w in range(5) for i in range(100)]
    assert pull1 != push1


def test_call_order_across_workers_does_not_matter():
    # Straggler episodes are per-worker state; visiting workers in another
    # order (each worker still in its own time order) must not change anything.
    a, _ = run(NOISY.sampler(3), 300, "round_robin")
    b, _ = run(NOISY.sampler(3), 300, "worker_by_worker_reversed")
    assert a == b
    s1, s2 = NOISY.sampler(3), NOISY.sampler(3)
    fwd = {(w, i): s1.pull_delay(w, i) for w in range(5) for i in range(300)}
    bwd = {(w, i): s2.pull_delay(w, i) for w in reversed(range(5)) for i in reversed(range(300))}
    assert fwd == bwd


def test_random_access_by_iteration():
    # Iterations may jump forward (a rejoined worker) or be revisited.
    c = C.constant(3).jitter(0.2)
    s1, s2 = c.sampler(0), c.sampler(0)
    in_order = [s1.compute_time(1, i, 0.0) for i in range(5000)]
    assert s2.compute_time(1, 4999, 0.0) == in_order[4999]
    assert s2.compute_time(1, 70, 0.0) == in_order[70]
    assert s2.compute_time(1, 0, 0.0) == in_order[0]


def test_draws_do_not_depend_on_cluster_size():
    small = C.constant(3).jitter(0.2).sampler(5)
    large = C.constant(40).jitter(0.2).sampler(5)
    for w in range(3):
        for i in (0, 1, 63, 64, 1000):
            assert small.compute_time(w, i, 0.0) == large.compute_time(w, i, 0.0)


def test_adding_a_later_modifier_keeps_earlier_draws():
    a = C.constant(4).jitter(0.2)
    b = a.network(0.1, 0.1, jitter=0.3)
    sa, sb = a.sampler(1), b.sampler(1)
    assert [sa.compute_time(w, i, 0.0) for w in range(4) for i in range(100)] == \
           [sb.compute_time(w, i, 0.0) for w in range(4) for i in range(100)]


# ---------------------------------------------------------------------------
# Speed models
# ---------------------------------------------------------------------------
def test_no_modifiers_exact_means():
    s = C.heterogeneous([1.0, 2.6, 0.25]).sampler(0)
    assert [s.compute_time(w, i, 3.0 * i) for w in range(3) for i in range(3)] == \
           [1.0] * 3 + [2.6] * 3 + [0.25] * 3
    assert s.push_delay(0, 0) == 0.0 and s.pull_delay(2, 9) == 0.0
    assert s.membership_events() == []


def test_jitter_mean_is_base():
    # 32 workers x 1000 iterations of a mean-1 lognormal factor with sigma 0.5:
    # the factor's sd is sqrt(e^0.25 - 1) = 0.53, so the standard error of the
    # mean over 32000 draws is 0.003; tolerance 0.015 is 5 standard errors.
    sigma = 0.5
    c = C.constant(32, seconds=2.0).jitter(sigma)
    times, _ = run(c.sampler(11), 1000)
    x = np.asarray(times) / 2.0
    assert abs(x.mean() - 1.0) < 0.015
    assert abs(np.log(x).std() - sigma) < 0.01
    assert abs(np.log(x).mean() + sigma**2 / 2) < 0.01
    assert np.all(x > 0) and np.all(np.isfinite(x))


def test_jitter_zero_is_identity_and_large_sigma_stays_positive():
    s = C.constant(2, 1.5).jitter(0.0).sampler(0)
    assert s.compute_time(1, 7, 0.0) == 1.5
    t = np.asarray(run(C.constant(4).jitter(5.0).sampler(0), 500)[0])
    assert np.all(t > 0) and np.all(np.isfinite(t))


def test_stragglers_single_iteration_episodes_fraction_equals_prob():
    # Base 1 s, slowdown 4, duration 4: the iteration that starts an episode
    # ends exactly when the episode does, so each episode slows one iteration
    # and the slowed fraction is prob. 16000 iterations: SE = 0.0024; tol 0.01.
    p = 0.1
    times, _ = run(C.constant(8).stragglers(p, 4.0, 4.0).sampler(2), 2000)
    t = np.asarray(times)
    assert set(np.unique(t)) == {1.0, 4.0}
    assert abs((t == 4.0).mean() - p) < 0.01


def test_stragglers_long_episodes_fraction():
    # Base 1 s, slowdown 2, duration 10: an episode slows the iterations
    # starting at t, t+2, t+4, t+6, t+8 (5 of them); between episodes a
    # geometric number of normal iterations with mean (1-p)/p = 19. Renewal
    # argument: slowed fraction 5 / (5 + 19) = 0.208. About 670 cycles give an
    # SE near 0.007; tolerance 0.03.
    p = 0.05
    times, starts = run(C.constant(8).stragglers(p, 2.0, 10.0).sampler(4), 2000)
    t = np.asarray(times)
    assert abs((t == 2.0).mean() - 5 / 24) < 0.03
    # Runs of slowed iterations are whole episodes of 5 (an episode may start
    # right after the previous one ends); only a run cut off by the horizon
    # may be shorter.
    for row in t:
        runs, n = [], 0
        for v in row:
            if v == 2.0:
                n += 1
            elif n:
                runs.append(n)
                n = 0
        assert runs and all(r % 5 == 0 for r in runs)


def test_stragglers_subset_and_prob_edges():
    t = np.asarray(run(C.constant(4).stragglers(0.5, 3.0, 1.0, workers=[0, 2]).sampler(0), 300)[0])
    assert np.all(t[[1, 3]] == 1.0)
    assert np.all(np.isin(t[[0, 2]], [1.0, 3.0])) and (t[[0, 2]] == 3.0).mean() > 0.3
    assert np.all(np.asarray(run(C.constant(2).stragglers(0.0, 3.0, 1.0).sampler(0), 100)[0]) == 1)
    assert np.all(np.asarray(run(C.constant(2).stragglers(1.0, 3.0, 1.0).sampler(0), 100)[0]) == 3)


def test_periodic_windows():
    s = C.constant(3).periodic(period=10.0, duration=3.0, slowdown=2.0, workers=[0, 1],
                               phase=1.0).sampler(0)
    slow = [1.0, 2.0, 3.999, 11.0, 13.5, 101.0, -9.0]
    fast = [0.0, 0.999, 4.0, 10.5, 14.0, 100.9]
    for w in (0, 1):
        assert all(s.compute_time(w, 0, x) == 2.0 for x in slow)
        assert all(s.compute_time(w, 0, x) == 1.0 for x in fast)
    assert all(s.compute_time(2, 0, x) == 1.0 for x in slow)


def test_modifiers_stack_multiplicatively():
    c = C.constant(1, 2.0).periodic(10, 5, 3).periodic(20, 5, 2)
    s = c.sampler(0)
    assert s.compute_time(0, 0, 1.0) == 12.0   # both windows
    assert s.compute_time(0, 0, 11.0) == 6.0   # first only
    assert s.compute_time(0, 0, 7.0) == 2.0    # neither


def test_network_delays():
    s = C.constant(2).network(push=0.01, pull=0.03).sampler(0)
    assert s.push_delay(0, 0) == 0.01 and s.push_delay(1, 99) == 0.01
    assert s.pull_delay(0, 5) == 0.03
    two = C.constant(2).network(push=0.01).network(push=0.02, pull=0.5).sampler(0)
    assert two.push_delay(1, 3) == pytest.approx(0.03) and two.pull_delay(1, 3) == 0.5
    # Jittered: mean-1 lognormal factor, sigma 0.4 (sd 0.42); 8x2000 draws give
    # SE 0.0033 relative; tolerance 2 %.
    j = C.constant(8).network(push=0.2, pull=0.1, jitter=0.4).sampler(3)
    push = np.array([j.push_delay(w, i) for w in range(8) for i in range(2000)])
    pull = np.array([j.pull_delay(w, i) for w in range(8) for i in range(2000)])
    assert np.all(push > 0) and np.all(pull > 0)
    assert abs(push.mean() / 0.2 - 1) < 0.02 and abs(pull.mean() / 0.1 - 1) < 0.02
    assert abs(np.corrcoef(push, pull)[0, 1]) < 0.05  # independent streams


def test_failures_events_sorted():
    c = C.constant(4).failures([(3, 100, 200), (1, 50, None), (3, 300, 400)]) \
                     .failures([(0, 200, 250), (2, 200.0, None)])
    ev = c.sampler(0).membership_events()
    assert ev == [(50.0, "fail", 1), (100.0, "fail", 3), (200.0, "join", 3),
                  (200.0, "fail", 0), (200.0, "fail", 2), (250.0, "join", 0),
                  (300.0, "fail", 3), (400.0, "join", 3)]
    assert [e[0] for e in ev] == sorted(e[0] for e in ev)
    ev.clear()  # a copy: the sampler's list is untouched
    assert len(c.sampler(0).membership_events()) == 8


def test_failures_layers_combine_as_the_union_of_their_down_intervals():
    # an earlier failures() call's interval no longer forbids an overlapping one in a later call
    c = C.constant(2).failures([(1, 1, None)]).failures([(1, 50, 60)])
    assert c.sampler(0).membership_events() == [(1.0, "fail", 1)]
    c = C.constant(2).failures([(1, 10, 50)]).failures([(1, 20, 30), (0, 5, 6)]).failures([(1, 40, 70)])
    assert c.sampler(0).membership_events() == [(5.0, "fail", 0), (6.0, "join", 0), (10.0, "fail", 1),
                                                (70.0, "join", 1)]
    assert [k for _, k, _ in c.sampler(0).membership()] == ["fail", "join", "fail", None, None, None, None, "join"]


def test_failures_touching_intervals_join_before_fail():
    ev = C.constant(1).failures([(0, 10, 20), (0, 20, 30)]).sampler(0).membership_events()
    assert ev == [(10.0, "fail", 0), (20.0, "join", 0), (20.0, "fail", 0), (30.0, "join", 0)]


def test_gpus_presets():
    assert C.PRESETS["gtx1060"] == 1 / 2.6
    assert C.PRESETS["gtx1080ti"] == 1.0
    for name in ("gtx1060", "gtx1080ti", "v100", "a100", "h100"):
        assert name in C.PRESETS
    assert all(math.isfinite(v) and v > 0 for v in C.PRESETS.values())
    # Newer GPUs are faster: a coarse sanity ordering.
    assert C.PRESETS["gtx1080ti"] < C.PRESETS["v100"] < C.PRESETS["a100"] < C.PRESETS["h100"]
    c = C.gpus(["GTX1080Ti", "gtx1060", "v100"], seconds=2.0)
    assert c.mean_seconds == (2.0, 2.0 * 2.6, 2.0 / C.PRESETS["v100"])
    s = c.sampler(0)
    assert s.compute_time(1, 0, 0.0) == pytest.approx(5.2)


def test_default_cluster():
    d = C.default()
    assert d.num_workers == 8
    assert d.mean_seconds == (1.0,) * 4 + (2.6,) * 4
    assert d == C.heterogeneous([1.0] * 4 + [2.6] * 4)
    assert d.describe() == "1*4,2.6*4"


def test_immutable_composition():
    base = C.constant(2)
    j = base.jitter(0.1)
    assert base.modifiers == () and len(j.modifiers) == 1 and j != base
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.num_workers = 3
    assert hash(j) == hash(C.constant(2).jitter(0.1))


# ---------------------------------------------------------------------------
# Trace CSV
# ---------------------------------------------------------------------------
def write(path, text):
    path.write_text(text)
    return path


def test_trace_csv_round_trip(tmp_path):
    rows = [(0, 0, 1.0), (0, 1, 2.0), (0, 2, 3.0), (1, 0, 0.5), (2, 1, 4.0), (2, 0, 5.0)]
    lines = ["seconds,worker,iteration,host"] + [f"{s},{w},{i},h{w}" for w, i, s in reversed(rows)]
    p = write(tmp_path / "speeds.csv", "\n".join(lines) + "\n")
    c = C.from_trace_csv(p)
    assert c.num_workers == 3
    assert c.mean_seconds == (2.0, 0.5, 4.5)
    s = c.sampler(0)
    assert [s.compute_time(0, i, 0.0) for i in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    assert [s.compute_time(1, i, 0.0) for i in range(3)] == [0.5] * 3
    assert [s.compute_time(2, i, 0.0) for i in range(4)] == [5, 4, 5, 4]
    assert c.describe() == f"trace:{p}"
    assert C.parse(c.describe()) == c
    j = C.parse(f"trace:{p}+jitter=0.1")
    assert j.num_workers == 3 and j.sampler(0).compute_time(0, 0, 0.0) != 1.0


@pytest.mark.parametrize("text, needle", [
    ("worker,seconds\n0,1\n", "lacks column(s) iteration"),
    ("worker,iteration,seconds\n0,0,abc\n", "line 2"),
    ("worker,iteration,seconds\n0,0,1\n0,x,1\n", "line 3"),
    ("worker,iteration,seconds\n0,0,-1\n", "seconds = '-1'"),
    ("worker,iteration,seconds\n0,0,inf\n", "seconds = 'inf'"),
    ("worker,iteration,seconds\n0,0,nan\n", "seconds = 'nan'"),
    ("worker,iteration,seconds\n0,0,0\n", "finite number > 0"),
    ("worker,iteration,seconds\n0,0,1\n2,0,1\n", "no rows for worker(s) [1]"),
    ("worker,iteration,seconds\n0,0,1\n0,0,2\n", "appears twice"),
    ("worker,iteration,seconds\n0,0,1\n0,2,2\n", "lacks iteration 1"),
    ("worker,iteration,seconds\n-1,0,1\n", ">= 0"),
    ("worker,iteration,seconds\n0,0\n", "has 2 fields"),
    ("worker,iteration,seconds\n", "no rows"),
    ("", "is empty"),
])
def test_trace_csv_malformed(tmp_path, text, needle):
    p = write(tmp_path / "bad.csv", text)
    with pytest.raises(ValueError) as e:
        C.from_trace_csv(p)
    msg = str(e.value)
    assert "from_trace_csv" in msg and str(p) in msg and needle in msg


def test_trace_csv_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        C.from_trace_csv(tmp_path / "nope.csv")


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    "8",
    "1",
    "1*4,2.6*4",
    "1,2.6,1",
    "3*1",
    "0.5*2,1e-05",
    "1e16*2,3",
    "gtx1080ti*4,gtx1060*4",
    "v100*8@0.25",
    "gtx1080ti*4,gtx1060*4+jitter=0.1+stragglers=0.01:4:5+network=0.01:0.01"
    "+periodic=100:10:3+fail=3@100-200",
    "4+stragglers=0.5:2:1:0-1,3",
    "4+periodic=10:2:3:all:5+periodic=10:2:3:2:0.5",
    "4+network=0:0.5:0.2",
    "4+fail=0@1e-05-2,1@3,0@5-6",
])
def test_parse_describe_round_trip(spec):
    c = C.parse(spec)
    assert c.describe() == spec
    assert C.parse(c.describe()) == c


def test_parse_examples():
    assert C.parse("8") == C.constant(8)
    assert C.parse("1,1,2.6,2.6") == C.heterogeneous([1, 1, 2.6, 2.6])
    assert C.parse("1*2,2.6*2") == C.heterogeneous([1, 1, 2.6, 2.6])
    assert C.parse("3.0") == C.heterogeneous([3.0])
    assert C.parse(" GTX1080Ti*2 , gtx1060 ") == C.gpus(["gtx1080ti"] * 2 + ["gtx1060"])
    assert C.parse("gtx1080ti*4,gtx1060*4") == C.gpus(["gtx1080ti"] * 4 + ["gtx1060"] * 4)
    full = C.parse("gtx1080ti*4,gtx1060*4+jitter=0.1+stragglers=0.01:4:5+network=0.01:0.01"
                   "+periodic=100:10:3+fail=3@100-200")
    assert full == (C.gpus(["gtx1080ti"] * 4 + ["gtx1060"] * 4).jitter(0.1)
                    .stragglers(0.01, 4, 5).network(0.01, 0.01).periodic(100, 10, 3)
                    .failures([(3, 100, 200)]))
    assert C.parse("2+fail=1@5-").sampler(0).membership_events() == [(5.0, "fail", 1)]
    assert C.parse("4+stragglers=0.1:2:3:1-2").modifiers[0].workers == (1, 2)


@st.composite
def clusters(draw):
    kind = draw(st.sampled_from(["const", "het", "gpus"]))
    pos = st.floats(1e-3, 1e3, allow_nan=False)
    if kind == "const":
        c = C.constant(draw(st.integers(1, 12)), draw(pos))
    elif kind == "het":
        c = C.heterogeneous(draw(st.lists(pos, min_size=1, max_size=12)))
    else:
        c = C.gpus(draw(st.lists(st.sampled_from(sorted(C.PRESETS)), min_size=1, max_size=12)),
                   draw(pos))
    W = c.num_workers
    subset = st.none() | st.lists(st.integers(0, W - 1), min_size=1, unique=True)
    for _ in range(draw(st.integers(0, 4))):
        m = draw(st.sampled_from(["jitter", "stragglers", "periodic", "network", "fail"]))
        if m == "jitter":
            c = c.jitter(draw(st.floats(0, 2)))
        elif m == "stragglers":
            c = c.stragglers(draw(st.floats(0, 1)), draw(st.floats(1, 10)), draw(pos),
                             draw(subset))
        elif m == "periodic":
            period = draw(pos)
            c = c.periodic(period, period * draw(st.floats(0.01, 1)), draw(st.floats(1, 10)),
                           draw(subset), draw(st.floats(-100, 100)))
        elif m == "network":
            c = c.network(draw(st.floats(0, 1)), draw(st.floats(0, 1)), draw(st.floats(0, 1)))
        else:   # several failures layers combine (their down intervals' union)
            w = draw(st.integers(0, W - 1))
            f = draw(st.floats(0, 1e4))
            c = c.failures([(w, f, draw(st.none() | st.floats(f + 1, 2e4)))])
    return c


@settings(max_examples=60, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_parse_round_trip_property(c, seed):
    assert C.parse(c.describe()) == c
    s = c.sampler(seed)
    for w in range(c.num_workers):
        t = 0.0
        for i in range(5):
            d = s.compute_time(w, i, t)
            assert math.isfinite(d) and d > 0
            assert s.push_delay(w, i) >= 0 and s.pull_delay(w, i) >= 0
            t += d


@pytest.mark.parametrize("spec, needle", [
    ("", "empty"),
    ("0", ">= 1"),
    ("abc", "neither a number nor a known GPU"),
    ("1,gtx1060", "mixes"),
    ("1*0", "count"),
    ("1*x", "count"),
    ("1,,2", "empty item"),
    ("1,2@3", "only to a list of GPU"),
    ("v100@x", "not a number"),
    ("4+", "empty modifier"),
    ("4+jitter", "name=value"),
    ("4+jitter=a", "not a number"),
    ("4+bogus=1", "unknown modifier"),
    ("4+stragglers=0.1:2", "PROB:SLOWDOWN:DURATION"),
    ("4+stragglers=0.1:2:3:x", "workers"),
    ("4+stragglers=0.1:2:3:3-1", "empty"),
    ("4+periodic=1:2", "PERIOD"),
    ("4+network=1", "PUSH:PULL"),
    ("4+fail=3", "WORKER@FAIL_AT"),
    ("4+fail=3@1-2-3", "WORKER@FAIL_AT"),
    ("trace:", "needs a CSV path"),
])
def test_parse_errors(spec, needle):
    with pytest.raises(ValueError) as e:
        C.parse(spec)
    assert needle in str(e.value) and "parse" in str(e.value)


def test_parse_errors_from_values_name_the_argument():
    with pytest.raises(ValueError, match=r"jitter: sigma = -0.1"):
        C.parse("4+jitter=-0.1")
    with pytest.raises(ValueError, match=r"stragglers: workers\[0\] = 9"):
        C.parse("4+stragglers=0.1:2:3:9")
    with pytest.raises(ValueError, match=r"failures: events\[0\] worker = 7"):
        C.parse("4+fail=7@1-2")
    with pytest.raises(ValueError, match="must be a string"):
        C.parse(8)


# ---------------------------------------------------------------------------
# Validation: every bad input is a ValueError naming the argument and value
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("make, needle", [
    (lambda: C.constant(0), "constant: num_workers = 0 must be an integer >= 1"),
    (lambda: C.constant(2.5), "constant: num_workers = 2.5"),
    (lambda: C.constant(True), "constant: num_workers = True"),
    (lambda: C.constant(2, 0.0), "constant: seconds = 0.0 must be a finite number > 0"),
    (lambda: C.constant(2, float("nan")), "constant: seconds = nan"),
    (lambda: C.heterogeneous([]), "heterogeneous: seconds is empty"),
    (lambda: C.heterogeneous([1.0, 2.0, -1.0]),
     "heterogeneous: seconds[2] = -1.0 must be a finite number > 0"),
    (lambda: C.heterogeneous([1.0, float("inf")]), "heterogeneous: seconds[1] = inf"),
    (lambda: C.heterogeneous(["1"]), "heterogeneous: seconds[0] = '1' must be a real number"),
    (lambda: C.heterogeneous(3.0), "heterogeneous: seconds = 3.0 must be a sequence"),
    (lambda: C.gpus([]), "gpus: names is empty"),
    (lambda: C.gpus(["v100", "tpu"]), "gpus: names[1] = 'tpu' is not a known GPU; known: "),
    (lambda: C.gpus(["v100"], seconds=-1), "gpus: seconds = -1"),
    (lambda: C.constant(2).jitter(-0.1), "jitter: sigma = -0.1 must be a finite number >= 0"),
    (lambda: C.constant(2).jitter(6.0), "jitter: sigma = 6.0"),
    (lambda: C.constant(2).stragglers(1.5, 2, 1), "stragglers: prob = 1.5 must be a finite "
                                                 "number >= 0 and <= 1"),
    (lambda: C.constant(2).stragglers(-0.1, 2, 1), "stragglers: prob = -0.1"),
    (lambda: C.constant(2).stragglers(0.1, 0.5, 1), "stragglers: slowdown = 0.5 must be a "
                                                   "finite number >= 1"),
    (lambda: C.constant(2).stragglers(0.1, float("inf"), 1), "stragglers: slowdown = inf"),
    (lambda: C.constant(2).stragglers(0.1, 2, 0), "stragglers: duration = 0"),
    (lambda: C.constant(2).stragglers(0.1, 2, 1, workers=[2]),
     "stragglers: workers[0] = 2 is not a worker id; valid ids are 0..1"),
    (lambda: C.constant(2).stragglers(0.1, 2, 1, workers=[]), "stragglers: workers = []"),
    (lambda: C.constant(2).periodic(0, 1, 2), "periodic: period = 0"),
    (lambda: C.constant(2).periodic(10, 11, 2), "periodic: duration = 11 must be a finite "
                                               "number > 0 and <= 10"),
    (lambda: C.constant(2).periodic(10, 1, 0.9), "periodic: slowdown = 0.9"),
    (lambda: C.constant(2).periodic(10, 1, 2, phase=float("nan")), "periodic: phase = nan"),
    (lambda: C.constant(2).periodic(10, 1, 2, workers=[-1]), "periodic: workers[0] = -1"),
    (lambda: C.constant(2).network(push=-1), "network: push = -1"),
    (lambda: C.constant(2).network(pull=float("inf")), "network: pull = inf"),
    (lambda: C.constant(2).network(jitter=-1), "network: jitter = -1"),
    (lambda: C.constant(2).failures([(2, 1, 2)]),
     "failures: events[0] worker = 2 is not a worker id; valid ids are 0..1"),
    (lambda: C.constant(2).failures([(0, -1, 2)]), "failures: events[0] fail_at = -1"),
    (lambda: C.constant(2).failures([(0, 5, 5)]), "failures: events[0] rejoin_at = 5 must be > "
                                                 "fail_at = 5"),
    (lambda: C.constant(2).failures([(0, 1)]), "failures: events[0] = (0, 1) must be a tuple"),
    (lambda: C.constant(2).failures([]), "failures: events is empty"),
    (lambda: C.constant(2).failures([(0, 1, 10), (0, 5, 20)]),
     "failures: worker 0 has overlapping down intervals [1, 10) and [5, 20)"),
    (lambda: C.constant(2).sampler(-1), "Cluster.sampler: seed = -1 must be an integer >= 0"),
    (lambda: C.constant(2).sampler(1.5), "Cluster.sampler: seed = 1.5"),
])
def test_validation_errors(make, needle):
    with pytest.raises(ValueError) as e:
        make()
    assert needle in str(e.value)


def test_gpus_error_lists_known_presets():
    with pytest.raises(ValueError) as e:
        C.gpus(["gtx9999"])
    for name in C.PRESETS:
        assert name in str(e.value)


def test_jitter_fused_over_constant_speeds_equals_the_wrapped_path(tmp_path):
    """The jitter layer reads the bare workers' seconds directly when it wraps them
    (the hot path); over a trace base it calls the layer it wraps. Same seconds,
    same stream: the same times, bitwise."""
    path = tmp_path / "trace.csv"
    path.write_text("worker,iteration,seconds\n0,0,1.0\n1,0,2.6\n2,0,1.3\n")
    fused = C.heterogeneous([1.0, 2.6, 1.3]).jitter(0.3).stragglers(0.1, 3.0, 2.0)
    wrapped = C.from_trace_csv(path).jitter(0.3).stragglers(0.1, 3.0, 2.0)
    a, b = fused.sampler(5), wrapped.sampler(5)
    assert a.layer.inner.inner.constant_seconds is not None and b.layer.inner.inner.constant_seconds is None
    times = [(w, i, 0.5 * i) for w in range(3) for i in range(300)]
    assert [a.compute_time(*x) for x in times] == [b.compute_time(*x) for x in times]


def test_modifiers_wrap_the_layer_below():
    """Each modifier's layer holds the one it wraps, base innermost; latencies of
    stacked links add, bandwidths take the bottleneck."""
    c = C.constant(2).links(1e6, 0.25).network(0.5, 0.0).links(4e6, 0.125, workers=[1]).server(2e6, 1.0)
    s = c.sampler(0)
    depth, layer = 0, s.layer
    while layer.inner is not None:
        depth, layer = depth + 1, layer.inner
    assert depth == 4
    assert s.bandwidth == (1e6, 1e6) and s.server == (2e6, 1.0)
    assert [s.push_delay(w, 0) for w in (0, 1)] == [1.75, 1.875]
    assert [s.pull_delay(w, 0) for w in (0, 1)] == [1.25, 1.375]
