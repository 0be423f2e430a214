"""Pipeline schedules as tick tables, simulated time, and bad input (no JAX compilation here)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hst

import staleness.pipeline as pp
from staleness import cluster as C
from staleness.pipeline.plan import IDLE


def _ticks_of(plan, table):
    """{(micro-batch, stage): tick} of every entry of a plan table."""
    t, k = np.nonzero(table != IDLE)
    return {(int(table[a, b]), int(b)): int(a) for a, b in zip(t, k)}


def test_dsp_lags_are_twice_the_delays_below():
    assert pp.dsp((1, 1, 0)).lags == (4, 2, 0)
    assert pp.dsp((2, 0, 1, 0)).lags == (6, 2, 2, 0)
    assert pp.dsp((0, 0, 3)).lags == (6, 6, 6)          # a delayed loss link makes the last stage stale too
    assert pp.ddg().resolve(4).lags == (3, 2, 1, 0)     # DDG: K-1-k
    assert pp.gpipe(4).resolve(3).lags == (4, 2, 0)
    assert pp.backprop().resolve(5).lags == (0,) * 5


delays_st = hst.lists(hst.integers(0, 3), min_size=1, max_size=5)


@given(delays_st, hst.integers(1, 12), hst.booleans())
def test_dsp_plan_invariants(delays, n, stash):
    """Per stage: forward/backward gap m_k, exactly m_k micro-batches in flight
    between ticks once the pipeline is full, every batch applied exactly once,
    and messages respect each link's delay."""
    sched = pp.dsp(delays, stash=stash)
    plan = pp.make_plan(sched, len(delays), n)
    k_all, lags = plan.num_stages, np.array(plan.lags)
    assert plan.num_ticks == n + lags[0]
    f, b = _ticks_of(plan, plan.fwd), _ticks_of(plan, plan.bwd)
    assert set(f) == set(b) == {(i, k) for i in range(n) for k in range(k_all)}  # each once per stage
    for (i, k), t in f.items():
        assert b[(i, k)] - t == lags[k]                                   # batch gap in ticks = m_k
        if k > 0:
            assert t - f[(i, k - 1)] == delays[k - 1]                    # forward link delay
            assert b[(i, k - 1)] - b[(i, k)] == delays[k - 1]            # backward link delay
    gaps = plan.gaps()
    for k in range(k_all):
        assert gaps[k] in (lags[k], -1)  # -1: no tick does both (n <= m_k)
        if n > lags[k]:
            assert gaps[k] == lags[k]
    flight = plan.in_flight()
    assert (flight.max(0) == np.minimum(lags, n)).all()                 # the queue never holds more than m_k
    full = plan.in_flight()[lags[0]: n]                                 # ticks where every queue is full
    if len(full):
        assert (full == lags).all()
    assert (plan.update.sum(0) == n).all() and (plan.update == (plan.bwd != IDLE)).all()
    assert plan.batches_done(plan.num_ticks) == n and plan.batches_done(0) == 0


@given(hst.integers(1, 5), hst.integers(1, 4), hst.integers(1, 5))
def test_gpipe_plan_is_synchronous(k_all, m, n):
    """GPipe: per batch every stage forwards its M micro-batches on the same weights
    (no update in between), applies one update after the last backward, and the
    next batch enters only after that."""
    plan = pp.make_plan(pp.gpipe(m), k_all, n)
    f, b = _ticks_of(plan, plan.fwd), _ticks_of(plan, plan.bwd)
    assert len(f) == len(b) == n * m * k_all
    for k in range(k_all):
        upd = np.flatnonzero(plan.update[:, k])
        assert len(upd) == n
        for batch in range(n):
            ids = range(batch * m, (batch + 1) * m)
            assert max(b[(i, k)] for i in ids) == upd[batch]
            if batch + 1 < n:
                assert min(f[(i, k)] for i in range(m * (batch + 1), m * (batch + 2))) > upd[batch]
            if batch > 0:
                assert min(f[(i, k)] for i in ids) > upd[batch - 1]
    sched = pp.simulate_timing(plan, C.constant(k_all)).to_schedule()
    assert (sched.staleness == 0).all() and sched.num_updates == n


def test_ddg_forward_is_locked_backward_is_delayed():
    plan = pp.make_plan(pp.ddg(), 4, 6)
    f, b = _ticks_of(plan, plan.fwd), _ticks_of(plan, plan.bwd)
    for i in range(6):
        assert {f[(i, k)] for k in range(4)} == {i}                          # one tick, in sequence
        assert [b[(i, k)] - f[(i, k)] for k in range(4)] == [3, 2, 1, 0]      # K-1-k
    assert plan.forward_phases == (0, 1, 2, 3) and plan.backward_phases == (0, 0, 0, 0)
    assert pp.make_plan(pp.backprop(), 3, 2).backward_phases == (2, 1, 0)
    assert pp.make_plan(pp.dsp((2, 0, 1, 0)), 4, 2).forward_phases == (0, 0, 1, 0)


def test_timing_closed_forms_on_equal_stages():
    """1 s per batch per stage, backward = 2 forwards, recompute = 1 forward."""
    k_all, n = 4, 200
    backprop = pp.simulate_timing(pp.make_plan(pp.backprop(), k_all, n), C.constant(k_all))
    assert backprop.end_time == pytest.approx(n * k_all)                  # nothing overlaps
    assert backprop.to_schedule().wait_fraction() == pytest.approx(np.full(k_all, 0.75), abs=0.005)  # idle 3/4
    dsp = pp.simulate_timing(pp.make_plan(pp.dsp((1, 1, 1, 0)), k_all, n), C.constant(k_all))
    # steady state: the busiest stage recomputes, 4/3 s per batch; fill/drain adds a constant
    assert dsp.throughput == pytest.approx(0.75, rel=0.02)
    free = pp.simulate_timing(pp.make_plan(pp.dsp((1, 1, 1, 0)), k_all, n), C.constant(k_all), recompute_cost=0)
    assert free.throughput == pytest.approx(1.0, rel=0.03)
    gpipe = pp.simulate_timing(pp.make_plan(pp.gpipe(4), k_all, n), C.constant(k_all))
    assert gpipe.throughput < dsp.throughput < free.throughput
    sched = dsp.to_schedule()
    assert sched.staleness.max() == 6 and sched.num_workers == k_all and sched.num_updates == n
    by_stage = [sched.staleness[sched["worker"] == k].max() for k in range(k_all)]
    assert by_stage == [6, 4, 2, 0]


def test_timing_slow_stage_bounds_throughput_and_stragglers_hurt_gpipe_more():
    n = 300
    slow = C.heterogeneous([1.0, 1.0, 2.0, 1.0])
    dsp = pp.simulate_timing(pp.make_plan(pp.dsp((1, 1, 1, 0)), 4, n), slow)
    gpipe = pp.simulate_timing(pp.make_plan(pp.gpipe(4), 4, n), slow)
    assert dsp.throughput == pytest.approx(1 / (2 * 4 / 3), rel=0.03)   # the slow stage's pace
    assert dsp.throughput > gpipe.throughput
    strag = C.constant(4).stragglers(0.05, 4.0, 3.0)
    ratio = {}
    for delays in ((1, 1, 1, 0), (2, 2, 2, 0)):
        d = pp.simulate_timing(pp.make_plan(pp.dsp(delays), 4, n), strag, seed=1).throughput
        g = pp.simulate_timing(pp.make_plan(pp.gpipe(4), 4, n), strag, seed=1).throughput
        ratio[delays] = d / g
    assert ratio[(2, 2, 2, 0)] >= ratio[(1, 1, 1, 0)] > 1.5   # longer links absorb stragglers


def test_timing_is_deterministic_and_result_columns_are_consistent():
    plan = pp.make_plan(pp.dsp((1, 0, 2)), 3, 20)
    cl = C.heterogeneous([1.0, 1.5, 0.5]).jitter(0.2).network(push=0.05)
    a, b = pp.simulate_timing(plan, cl, seed=3), pp.simulate_timing(plan, cl, seed=3)
    assert a.to_schedule().equals(b.to_schedule())
    s = a.to_schedule()
    assert (s["start"] >= s["pull_time"]).all() and (s["end"] > s["start"]).all()
    assert np.all(np.diff(s.update_time) > 0) and s.end_time == pytest.approx(a.end_time)


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda: pp.dsp((1, -1, 0)), r"delays = \(1, -1, 0\).*>= 0"),
    (lambda: pp.dsp((1, 0.5)), "integer"),
    (lambda: pp.dsp(()), "empty"),
    (lambda: pp.make_plan(pp.dsp((1, 1)), 3, 5), r"delays = \(1, 1\) has 2 entries but the model has 3 stages"),
    (lambda: pp.make_plan(pp.dsp((1, 0)), 2, 0), "num_batches = 0"),
    (lambda: pp.gpipe(0), "microbatches = 0"),
    (lambda: pp.parse("dsp"), "dsp needs delays"),
    (lambda: pp.parse("dsp:1,x"), "comma-separated"),
    (lambda: pp.parse("pipedream"), "not known"),
    (lambda: pp.parse("ddg", delays="1,0"), "dsp only"),
    (lambda: pp.parse("gpipe:2+stash"), "dsp only"),
    (lambda: pp.model.residual_mlp(2, 3), "num_stages = 3 is more than the model's 2 blocks"),
    (lambda: pp.model.split([], 1), "more than the model's 0 blocks"),
    (lambda: pp.simulate_timing(pp.make_plan(pp.gpipe(2), 3, 2), C.constant(4)), "4 workers but the pipeline has 3"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_parse_round_trips():
    for spec in ("dsp:1,1,0", "dsp:2,0,1+stash", "gpipe:4", "ddg", "backprop"):
        assert pp.parse(spec).describe() == spec
    assert pp.parse("dsp", delays="1,1,0") == pp.dsp((1, 1, 0))
    assert pp.parse("gpipe", microbatches=2) == pp.gpipe(2)
    assert pp.parse("DSP:1, 2 ,0").forward_delays == (1, 2, 0)
    assert math.isclose(pp.make_plan(pp.gpipe(2), 2, 3).num_ticks, 3 * (2 + 2))


def test_one_plan_per_meaning():
    """The pipeline's tick tables are `TickPlan`; `Plan` is the engine's (a schedule's
    gradient slots). The pipeline's old name still works, with a DeprecationWarning."""
    import warnings

    import staleness as st

    plan = pp.make_plan(pp.ddg(), 3, 4)
    assert isinstance(plan, pp.TickPlan) and "Plan" not in pp.__all__
    assert pp.TickPlan is not st.engine.Plan
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert pp.Plan is pp.TickPlan
    assert any(issubclass(x.category, DeprecationWarning) and "TickPlan" in str(x.message) for x in w)
