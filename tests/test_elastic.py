"""Elastic learners (`Cluster.elastic`): a chip's failure takes its slice out, the learner goes on.

Hand computations come from `chaos`'s own draws: the modifier in the same position reads the
same random stream, and one slice without reconfiguration fails exactly when `chaos` does.
"""

import pytest
from hypothesis import given, settings, strategies as hst

from staleness import cluster as C
from staleness.sim.scheduler import simulate_schedule


def _outages(chaos: str, worker: int, until: float) -> list[tuple[float, float]]:
    ev = [(t, kind) for t, kind, w in C.parse(chaos).sampler(4).membership_events(until=until) if w == worker]
    return [(a, b) for (a, k1), (b, k2) in zip(ev[::2], ev[1::2]) if (k1, k2) == ("fail", "join")]


def test_one_slice_without_reconfiguration_pauses_through_chaos_outages():
    """A one-slice learner is out exactly when `chaos` takes the learner down, but keeps its
    work: an iteration begun half a second before a failure ends half a second after the rejoin."""
    s = C.parse("1*3+elastic=1e5:30:100:1").sampler(4)
    for w in range(3):
        outs = _outages("1*3+chaos=1e5:30:100", w, 20_000)
        assert len(outs) >= 3
        for f, j in outs:
            assert s.useful(w, f, j) == 0.0 and s.useful(w, f - 0.25, f) == pytest.approx(0.25, abs=1e-9)
            assert s.compute_time(w, 0, f - 0.5) == pytest.approx(j - f + 1.0, abs=1e-9)


def test_the_rate_is_the_share_of_live_slices():
    """Two slices, a repair longer than the run: from the first failure the learner computes
    at half rate, from the second at none. The failure times by hand from `chaos`'s draws:
    the first at chaos's first failure (the same mean time, mtbf / chips); the second one
    draw later at twice the mean (only the live slice's chips can fail): f1 + 2 d, where d is
    chaos's gap from its first rejoin (repair 1 s) to its second failure."""
    (f1, j1), (f2, _) = _outages("1+chaos=1e5:1:100", 0, 50_000)[:2]
    d = f2 - j1
    s = C.parse("1+elastic=1e5:1e9:100:2").sampler(4)
    second = f1 + 2 * d
    assert s.useful(0, 0.0, f1) == pytest.approx(f1, rel=1e-12)
    assert s.useful(0, f1, second) == pytest.approx(d, rel=1e-9)
    assert s.useful(0, second, second + 100.0) == pytest.approx(0.0, abs=1e-9)
    assert s.compute_time(0, 0, f1) == pytest.approx(2.0, rel=1e-9)   # 1 s of work at half rate


def test_a_reconfiguration_stalls_the_learner_at_each_leave_and_rejoin():
    f, j = _outages("1+chaos=1e5:30:100", 0, 50_000)[0]
    s = C.parse("1+elastic=1e5:30:100:1:4").sampler(4)
    assert s.useful(0, f, j + 4.0) == 0.0                          # out, then 4 s of reconfiguration
    assert s.useful(0, j + 4.0, j + 5.0) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(start=hst.floats(0.0, 5_000.0), work=hst.floats(0.01, 80.0), mid=hst.floats(0.0, 1.0))
def test_a_stretched_iteration_holds_its_full_rate_seconds(start, work, mid):
    """For any start and nominal seconds: the stretched iteration's useful seconds are its
    nominal ones; useful is additive and at most the elapsed time."""
    s = C.parse(f"{work!r}*2+elastic=2e4:40:64:8:3").sampler(1)   # the slices' timeline does not depend on
    d = s.compute_time(1, 0, start)                                 # the workers' seconds
    end = start + d
    assert d >= work * (1 - 1e-12) and s.useful(1, start, end) == pytest.approx(work, rel=1e-9, abs=1e-9)
    cut = start + mid * d
    assert s.useful(1, start, cut) + s.useful(1, cut, end) == pytest.approx(work, rel=1e-9, abs=1e-9)
    assert 0.0 <= s.useful(1, start, cut) <= cut - start + 1e-9


def test_goodput_counts_the_full_rate_compute():
    """Data parallel as one elastic learner of one slice (bsp, 1 s steps): its steps pause
    through the outages, so the goodput is the time up, to the last step's second; `chaos`
    loses the step in progress as well."""
    T = 20_000.0
    down = sum(min(j, T) - f for f, j in _outages("1+chaos=1e5:30:100", 0, T) if f < T)
    g = simulate_schedule("bsp", "1+elastic=1e5:30:100:1", max_time=T, seed=4).goodput()
    assert g == pytest.approx(1.0 - down / T, abs=1.5 / T)
    assert simulate_schedule("bsp", "1+chaos=1e5:30:100", max_time=T, seed=4).goodput() < g


def test_elastic_specs_round_trip_and_bad_ones_name_the_field():
    c = C.parse("1*4+elastic=3.15e7:60:150000:600:5:0-1")
    assert C.parse(c.describe()).describe() == c.describe() and "elastic=" in c.describe()
    for spec, fragment in [("1+elastic=1e5:30:100:101", "slices = 101 must be <= chips"),
                           ("1+elastic=1e5:30:100:1.5", "slices = 1.5 must be an integer"),
                           ("1+elastic=1e5:30:100", "MTBF:REPAIR:CHIPS:SLICES"),
                           ("1+elastic=1e5:30:100:4:-1", "reconfig")]:
        with pytest.raises(ValueError, match=fragment):
            C.parse(spec)
