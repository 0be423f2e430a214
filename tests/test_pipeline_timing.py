"""Timing models of the pipeline schedules against hand-computed timelines and closed forms.

Equal stages: every stage takes c = 1 s per forward + backward of a whole batch,
a backward costs r = 2 forwards (f = 1/3, b = 2/3 per batch), a recomputed
forward costs ρ = rc · f, no messages, no jitter. The closed forms are derived
in `staleness.pipeline.timing`'s docstring; each is a longest path through the
plan's operations (all cross-stage dependencies of DSP and GPipe go from tick
t-1 to tick t, so a path visits one stage per tick). Tolerance: the simulator
adds the same fractions of a second in a different order than the formula, so
they agree to rounding (rel 1e-12), not bitwise.
"""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hst

import staleness.pipeline as pp
from staleness import cluster as C
from staleness.pipeline.timing import recomputes

R = 2.0                       # backward : forward
F, B = 1 / 3, 2 / 3           # per batch and stage, c = 1 s
REL = 1e-12


def _time(sched, k_all, n, rc, cluster=None, **kw):
    plan = pp.make_plan(sched, k_all, n)
    return pp.simulate_timing(plan, cluster or C.constant(k_all), backward_ratio=R, recompute_cost=rc, **kw)


def pipeline_closed_form(n: int, k_all: int, f: float, b: float, rho: float) -> float:
    """Seconds of DSP(1,...,1,0) over n batches (or one GPipe flush over n micro-batches,
    f, b, rho already divided by M) on k_all equal stages: the longest of three paths
    (fill + everything at the last stage + drain; the same through stage K-2; batch 0's
    round trip to the loss and back to stage K-2, then all of stage K-2's work)."""
    if k_all == 1:
        return n * (f + b)
    return max((n + k_all - 1) * (f + b) + (k_all - 1) * rho,
               (n + k_all - 2) * (f + b + rho),
               (k_all + max(0, n - 3)) * f + b + (n + k_all - 2) * (b + rho))


# -- GPipe -----------------------------------------------------------------------------------
@pytest.mark.parametrize("k_all", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_gpipe_is_the_textbook_fill_drain_when_recompute_is_free(k_all, m):
    """(M+K-1)/M × (f+b) per batch, and batches do not overlap (the flush)."""
    for n in (1, 3):
        tl = _time(pp.gpipe(m), k_all, n, rc=0)
        assert tl.end_time / n == pytest.approx((m + k_all - 1) / m * (F + B), rel=REL)
        assert tl.throughput == pytest.approx(m / ((m + k_all - 1) * (F + B)), rel=REL)


@pytest.mark.parametrize("k_all", [2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_gpipe_with_recompute_adds_the_rematerialisation_of_stages_0_to_k_minus_2(k_all, m):
    """rc = 1: the textbook formula plus GPipe's re-materialisation. Stages 0..K-2
    recompute each micro-batch's forward in its backward (the last stage has lag 0
    and backpropagates in the tick it forwards), so the time lies between the
    textbook formula without it and the all-stages-recompute (M+K-1)(f+b+ρ)/M."""
    rho = F
    tl = _time(pp.gpipe(m), k_all, 2, rc=1)
    per_batch = tl.end_time / 2
    assert per_batch == pytest.approx(pipeline_closed_form(m, k_all, F / m, B / m, rho / m), rel=REL)
    assert (m + k_all - 1) / m * (F + B) < per_batch <= (m + k_all - 1) / m * (F + B + rho) + 1e-12
    assert recomputes(tl.plan) == (True,) * (k_all - 1) + (False,)


@pytest.mark.parametrize("k_all, m, seconds", [(4, 1, 5.0), (4, 4, 25 / 12), (4, 8, 41 / 24), (2, 4, 17 / 12)])
def test_gpipe_numbers_of_the_audit(k_all, m, seconds):
    """The audit's numbers (rc = 1, the default) are the re-materialising GPipe, by hand:
    K = 4, M = 8: micro-batch 0 up to the loss (4 f/8) and its backward at stage 3 (b/8),
    then stage 2's 8 backwards with recompute ((b+ρ)/8 each) and its 5 remaining
    forwards, then 2 more backwards down to stage 0: 9/24 + 2/24 + 30/24 = 41/24 s."""
    tl = pp.simulate_timing(pp.make_plan(pp.gpipe(m), k_all, 5), C.heterogeneous([1] * k_all))
    assert tl.end_time / 5 == pytest.approx(seconds, rel=REL)
    free = pp.simulate_timing(pp.make_plan(pp.gpipe(m), k_all, 5), C.heterogeneous([1] * k_all), recompute_cost=0)
    assert free.end_time / 5 == pytest.approx((m + k_all - 1) / m, rel=REL)


def test_gpipe_hand_computed_timeline():
    """K = 2, M = 2, rc = 1. Per micro-batch: forward 1/6, stage 0's backward with its
    recompute (2/3 + 1/3)/2 = 1/2, stage 1's backward 1/3 (no recompute: lag 0).
    Ticks: stage 0 F0 F1 B0 B1 (ticks 0-3), stage 1 F0+B0 (tick 1), F1+B1 (tick 2)."""
    nan = np.nan
    tl = _time(pp.gpipe(2), 2, 1, rc=1)
    s = Fraction
    want_fs = [[0, nan], [s(1, 6), s(1, 6)], [nan, s(2, 3)], [nan, nan]]
    want_fe = [[s(1, 6), nan], [s(1, 3), s(1, 3)], [nan, s(5, 6)], [nan, nan]]
    want_bs = [[nan, nan], [nan, s(1, 3)], [s(2, 3), s(5, 6)], [s(7, 6), nan]]
    want_be = [[nan, nan], [nan, s(2, 3)], [s(7, 6), s(7, 6)], [s(5, 3), nan]]
    for got, want in ((tl.fwd_start, want_fs), (tl.fwd_end, want_fe), (tl.bwd_start, want_bs), (tl.bwd_end, want_be)):
        np.testing.assert_allclose(got, np.array(want, float), rtol=REL, atol=1e-15)
    # stage 0 waited 1/3 s for stage 1's first gradient; the next batch enters after the flush
    assert tl.idle[2, 0] == pytest.approx(1 / 3, rel=REL)
    assert _time(pp.gpipe(2), 2, 2, rc=1).fwd_start[4, 0] == pytest.approx(5 / 3, rel=REL)


@pytest.mark.parametrize("k_all, m", [(2, 3), (3, 4), (4, 8)])
@pytest.mark.parametrize("rc", [0.0, 1.0])
def test_one_gpipe_flush_is_dsp_over_its_microbatches(k_all, m, rc):
    """A GPipe batch has the tick tables of DSP(1,...,1,0) over its M micro-batches,
    each costing 1/M of a batch: the same timeline, which is why one closed form serves both."""
    g = _time(pp.gpipe(m), k_all, 1, rc=rc)
    d = _time(pp.dsp([1] * (k_all - 1) + [0]), k_all, m, rc=rc, cluster=C.heterogeneous([1 / m] * k_all))
    for a, b in ((g.fwd_start, d.fwd_start), (g.fwd_end, d.fwd_end), (g.bwd_start, d.bwd_start),
                 (g.bwd_end, d.bwd_end)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


# -- DSP and weight stashing ------------------------------------------------------------------
@pytest.mark.parametrize("k_all", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 50])
@pytest.mark.parametrize("rc", [0.0, 1.0])
@pytest.mark.parametrize("stash", [False, True])
def test_dsp_and_stash_closed_form(k_all, n, rc, stash):
    """DSP(1,...,1,0) with and without weight stashing: both recompute the forward in
    the backward on stages 0..K-2 (stash re-runs it with the stashed weights), so both
    take the same time."""
    tl = _time(pp.dsp([1] * (k_all - 1) + [0], stash=stash), k_all, n, rc=rc)
    assert tl.end_time == pytest.approx(pipeline_closed_form(n, k_all, F, B, rc * F), rel=REL)
    if rc == 0:
        assert tl.end_time == pytest.approx((n + k_all - 1) * (F + B), rel=REL)   # the textbook pipeline


def _locked_groups(delays):
    """Runs of consecutive stages joined by links of delay 0 (the last entry, the link to
    the loss, joins nothing): within a tick such a run is plain backpropagation."""
    groups, cur = [], [0]
    for k in range(1, len(delays)):
        if delays[k - 1] == 0:
            cur.append(k)
        else:
            groups.append(cur)
            cur = [k]
    return groups + [cur]


@pytest.mark.parametrize("delays", [(1, 1, 1, 0), (2, 2, 2, 0), (1, 0, 2, 0), (0, 1, 0, 0)])
@pytest.mark.parametrize("rc", [0.0, 1.0])
def test_dsp_throughput_on_equal_stages_tends_to_the_busiest_locked_group(delays, rc):
    """A stage with m_k > 0 forwards, recomputes and backpropagates one batch per tick
    (f + b + ρ). Stages joined by a link of delay 0 are locked together within a tick:
    stage k's forward, stage k+1's forward, k+1's backward, k's backward run in sequence,
    and k's next forward waits for its backward (stages never reorder), so such a run of
    stages costs the sum of its stages' work per tick. Throughput → 1 / (the busiest
    run): 1 / (f + b + ρ) = 0.75 batches/s at rc = 1 and 1 at rc = 0 when every link
    delays, 1 / (2 (f + b + ρ)) = 0.375 and 0.5 for DSP(1,0,2,0) (stages 1 and 2 locked);
    in the steady state each further batch costs exactly that (the marginal seconds per
    batch between 500 and 1000 batches), and over 1000 batches the throughput is within
    1% of it (fill and drain; the ticks at the edges hold a forward or a backward only,
    so a locked run can overlap them and the whole run may beat N × its period slightly)."""
    lags = pp.dsp(delays).lags
    per_tick = max(sum(F + B + (rc * F if lags[k] > 0 else 0.0) for k in g) for g in _locked_groups(delays))
    bound = 1 / per_tick
    tl = _time(pp.dsp(delays), 4, 1000, rc=rc)
    half = _time(pp.dsp(delays), 4, 500, rc=rc)
    assert (tl.end_time - half.end_time) / 500 == pytest.approx(per_tick, rel=1e-9)
    assert tl.throughput == pytest.approx(bound, rel=0.01)
    if delays == (1, 1, 1, 0):
        want = 1000 / pipeline_closed_form(1000, 4, F, B, rc * F)   # 0.74832 (rc = 1), 0.99701 (rc = 0)
        assert tl.throughput == pytest.approx(want, rel=REL)
    if delays == (1, 0, 2, 0):
        assert bound == pytest.approx(0.375 if rc else 0.5, rel=REL)


def test_dsp_hand_computed_timeline():
    """DSP(1,0), N = 2, rc = 1: lags m = (2, 0), so stage 0 recomputes (its backward costs
    b + ρ = 2/3 + 1/3 = 1) and stage 1 does not (b = 2/3).
    Stage 0: F0 [0, 1/3], F1 [1/3, 2/3] (ticks 0, 1).
    Stage 1, tick 1: F0 needs stage 0's F0 (arrives 1/3): [1/3, 2/3]; B0 right after,
      from its own loss: [2/3, 4/3].
    Stage 1, tick 2: F1 (stage 0's F1 arrived at 2/3, stage 1 free at 4/3): [4/3, 5/3];
      B1 [5/3, 7/3].
    Stage 0, tick 2: B0 needs stage 1's B0 (4/3): [4/3, 7/3]; tick 3: B1 needs stage 1's
      B1 (7/3): [7/3, 10/3]. End: 10/3 s."""
    tl = _time(pp.dsp((1, 0)), 2, 2, rc=1)
    nan = np.nan
    np.testing.assert_allclose(tl.fwd_start, [[0, nan], [1 / 3, 1 / 3], [nan, 4 / 3], [nan, nan]], rtol=REL)
    np.testing.assert_allclose(tl.fwd_end, [[1 / 3, nan], [2 / 3, 2 / 3], [nan, 5 / 3], [nan, nan]], rtol=REL)
    np.testing.assert_allclose(tl.bwd_start, [[nan, nan], [nan, 2 / 3], [4 / 3, 5 / 3], [7 / 3, nan]], rtol=REL)
    np.testing.assert_allclose(tl.bwd_end, [[nan, nan], [nan, 4 / 3], [7 / 3, 7 / 3], [10 / 3, nan]], rtol=REL)
    assert tl.idle[2, 0] == pytest.approx(4 / 3 - 2 / 3, rel=REL)   # stage 0 waited for stage 1's B0
    assert tl.idle[2, 1] == 0.0                                       # its F1 input was already there
    assert tl.end_time == pytest.approx(10 / 3, rel=REL)
    assert tl.end_time == pytest.approx(pipeline_closed_form(2, 2, F, B, F), rel=REL)


def test_stash_is_charged_its_recompute_on_any_cluster():
    """Weight stashing and DSP run the same operations at the same cost (the stash
    only changes which weights the recomputed forward uses)."""
    cl = C.heterogeneous([1.0, 1.5, 0.5, 1.0]).jitter(0.2).network(push=0.05)
    for rc in (0.0, 0.5, 1.0):
        a = _time(pp.dsp((1, 0, 2, 0)), 4, 30, rc=rc, cluster=cl, seed=2)
        b = _time(pp.dsp((1, 0, 2, 0), stash=True), 4, 30, rc=rc, cluster=cl, seed=2)
        np.testing.assert_array_equal(a.bwd_end, b.bwd_end)
    assert recomputes(pp.dsp((1, 0, 2, 0), stash=True)) == (True, True, True, False)
    assert recomputes(pp.dsp((0, 0, 0))) == (False,) * 3
    assert recomputes(pp.ddg().resolve(4)) == (False,) * 4
    assert recomputes(pp.backprop().resolve(3)) == (False,) * 3
    assert _time(pp.dsp((1, 1, 1, 0), stash=True), 4, 1000, rc=1).throughput == pytest.approx(0.7483, abs=1e-4)
    with pytest.raises(ValueError, match="resolve"):
        recomputes(pp.ddg())


def test_stash_stores_its_weights():
    """The memory side of stashing: each stage with m_k > 0 keeps m_k inputs and m_k
    weight copies (plus the last stage's loss gradients if it is stale); DSP keeps the inputs."""
    import jax
    import jax.numpy as jnp

    from staleness.engine import core
    from staleness.tasks import optim
    from staleness.pipeline import sim
    from staleness.pipeline import stage as S

    ptask = pp.tasks.get("digits-resmlp", num_stages=3, batch_size=8, width=16)
    params = ptask.init_stage_params(core.keys(0)[0])
    ctx = S.Context(ptask, core.keys(0)[1])
    opt = optim.resolve("momentum:0.9", 0.1)
    stored = {}
    for stash in (False, True):
        plan = pp.make_plan(pp.dsp((1, 1, 0), stash=stash), 3, 5)
        _, carry = sim.init(ptask, plan, opt, params, ctx)
        stored[stash] = sim.stored_bytes(carry)
    sh = sim.shapes(ptask, plan, params)
    lags = plan.lags
    for k in range(3):
        x_bytes = int(np.prod(sh[k].shape)) * jnp.dtype(sh[k].dtype).itemsize
        w_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(params[k]))
        assert stored[False][k] == lags[k] * x_bytes
        assert stored[True][k] == lags[k] * (x_bytes + w_bytes)


# -- DDG -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k_all", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 50])
def test_ddg_barrier_closed_form(k_all, n):
    """With its iteration barrier each DDG tick is the forward pass through all K stages
    plus one backward (all stages backpropagate in parallel); the last K-1 ticks only
    drain backwards: T = N (K f + b) + (K-1) b. DDG stores graphs: no recompute, any rc."""
    for rc in (0.0, 1.0):
        tl = _time(pp.ddg(), k_all, n, rc=rc)
        assert tl.end_time == pytest.approx(n * (k_all * F + B) + (k_all - 1) * B, rel=REL)


@pytest.mark.parametrize("k_all", [2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 50])
def test_ddg_without_barrier_closed_form(k_all, n):
    """Stages that wait only for data pipeline consecutive forwards: (N+K-1)(f+b), the
    textbook pipeline, like DSP with free recomputation."""
    tl = _time(pp.ddg(barrier=False), k_all, n, rc=1)
    assert tl.end_time == pytest.approx((n + k_all - 1) * (F + B), rel=REL)


def test_ddg_hand_computed_timelines():
    """K = 3, N = 2. With the barrier: tick 0 forwards [0,1/3], [1/3,2/3], [2/3,1], then stage 2's
    backward [1, 5/3]; tick 1 starts at 5/3: forwards to 8/3, then stages 2 and 1 backward in
    parallel [8/3, 10/3]; tick 2: stages 1 and 0 [10/3, 4]; tick 3: stage 0 [4, 14/3].
    Without it stage 0 forwards batch 1 at 1/3, right after batch 0."""
    nan = np.nan
    tl = _time(pp.ddg(), 3, 2, rc=1)
    np.testing.assert_allclose(tl.fwd_start, [[0, 1 / 3, 2 / 3], [5 / 3, 2, 7 / 3], [nan] * 3, [nan] * 3], rtol=REL)
    np.testing.assert_allclose(tl.bwd_start, [[nan, nan, 1], [nan, 8 / 3, 8 / 3], [10 / 3, 10 / 3, nan],
                                              [4, nan, nan]], rtol=REL)
    assert tl.end_time == pytest.approx(14 / 3, rel=REL)
    free = _time(pp.ddg(barrier=False), 3, 2, rc=1)
    np.testing.assert_allclose(free.fwd_start, [[0, 1 / 3, 2 / 3], [1 / 3, 2 / 3, 5 / 3], [nan] * 3, [nan] * 3],
                               rtol=REL)
    np.testing.assert_allclose(free.bwd_end, [[nan, nan, 5 / 3], [nan, 7 / 3, 8 / 3], [3, 10 / 3, nan],
                                              [4, nan, nan]], rtol=REL)
    assert free.end_time == pytest.approx(4, rel=REL)


def test_ddg_barrier_waits_for_the_slowest_backward():
    """Stage 1 twice as slow (f = 2/3, b = 4/3 there): a full tick is the forward pass
    1/3 + 2/3 + 1/3 plus the slowest backward 4/3 = 8/3 s; tick 0 has only stage 2's
    backward (2 s), the two drain ticks 4/3 and 2/3: T = 2 + (N-1)·8/3 + 2."""
    n = 20
    tl = _time(pp.ddg(), 3, n, rc=1, cluster=C.heterogeneous([1.0, 2.0, 1.0]))
    assert tl.end_time == pytest.approx(2 + (n - 1) * 8 / 3 + 2, rel=REL)


@given(hst.integers(2, 5), hst.integers(1, 8), hst.integers(0, 2**16))
def test_ddg_barrier_invariants(k_all, n, seed):
    """On jittered stages with message delays: a tick's backwards start after its whole
    forward pass, the next tick after every operation and message of this one; the
    barrier never makes DDG faster (durations depend only on the iteration index here)."""
    cl = C.heterogeneous([1.0 + 0.3 * k for k in range(k_all)]).jitter(0.3).network(push=0.02)
    tl = _time(pp.ddg(), k_all, n, rc=1, cluster=cl, seed=seed)
    fe = np.nan_to_num(tl.fwd_end, nan=-np.inf).max(1)
    be = np.nan_to_num(tl.bwd_end, nan=-np.inf).max(1)
    bs = np.nan_to_num(tl.bwd_start, nan=np.inf).min(1)
    fs = np.nan_to_num(tl.fwd_start, nan=np.inf).min(1)
    starts = np.minimum(fs, bs)
    assert (bs >= fe - 1e-12).all()
    assert (starts[1:] >= np.maximum(fe, be)[:-1] - 1e-12).all()
    free = _time(pp.ddg(barrier=False), k_all, n, rc=1, cluster=cl, seed=seed)
    assert tl.end_time >= free.end_time - 1e-12


# -- the five schedules side by side --------------------------------------------------------------
def test_throughputs_on_four_equal_stages():
    """Batches per simulated second, 1000 batches, K = 4 (the numbers reproduce_dsp reports)."""
    want = {  # spec: (rc = 1, rc = 0)
        "backprop": (0.25, 0.25),
        "gpipe:4": (1 / pipeline_closed_form(4, 4, F / 4, B / 4, F / 4), 4 / 7),   # 25/12 s and 7/4 s a batch
        "ddg": (1000 / 2002, 1000 / 2002),   # N (K f + b) + (K-1) b = 2000 + 2
        "ddg:nobarrier": (1000 / 1003, 1000 / 1003),
    }
    want["dsp:1,1,1,0"] = (1000 / pipeline_closed_form(1000, 4, F, B, F), 1000 / 1003)
    want["dsp:1,1,1,0+stash"] = want["dsp:1,1,1,0"]
    got = {}
    for spec, (w1, w0) in want.items():
        for rc, w in ((1.0, w1), (0.0, w0)):
            got[spec, rc] = _time(pp.parse(spec), 4, 1000, rc=rc).throughput
            assert got[spec, rc] == pytest.approx(w, rel=1e-9), (spec, rc)
    # DSP vs DDG with its barrier: 1.5x (rc = 1) to 2x (rc = 0); vs GPipe(4): 1.56x and 1.74x
    assert got["dsp:1,1,1,0", 1.0] / got["ddg", 1.0] == pytest.approx(1.498, abs=1e-3)
    assert got["dsp:1,1,1,0", 0.0] / got["ddg", 0.0] == pytest.approx(1.996, abs=1e-3)
    assert got["dsp:1,1,1,0", 1.0] / got["gpipe:4", 1.0] == pytest.approx(1.559, abs=1e-3)
    assert got["dsp:1,1,1,0", 0.0] / got["gpipe:4", 0.0] == pytest.approx(1.745, abs=1e-3)


@pytest.mark.parametrize("k_all", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 2, 5, 40])
@pytest.mark.parametrize("spec", ["backprop", "gpipe:1", "gpipe:3", "gpipe:8", "ddg", "ddg:nobarrier", "dsp",
                                  "dsp+stash"])
@pytest.mark.parametrize("rc", [0.0, 0.5, 1.0])
def test_closed_form_time_is_the_simulation(k_all, n, spec, rc):
    """`timing.closed_form_time` (what reproduce_dsp prints beside the simulation) against the
    simulation, and for DSP against this file's own formula."""
    from staleness.pipeline.timing import closed_form_time

    if spec.startswith("dsp"):
        spec = "dsp:" + ",".join(["1"] * (k_all - 1) + ["0"]) + spec[3:]
    got = closed_form_time(spec, k_all, n, recompute_cost=rc)
    assert got == pytest.approx(_time(pp.parse(spec), k_all, n, rc=rc).end_time, rel=REL)
    if spec.startswith("dsp"):
        assert got == pytest.approx(pipeline_closed_form(n, k_all, F, B, rc * F), rel=REL)


def test_closed_form_time_refuses_what_it_does_not_cover():
    from staleness.pipeline.timing import closed_form_time

    with pytest.raises(ValueError, match="no closed form for dsp:2,2,0"):
        closed_form_time("dsp:2,2,0", 3, 10)
    with pytest.raises(ValueError, match="PipelineSchedule or a spec"):
        closed_form_time(3, 3, 10)


# -- specs --------------------------------------------------------------------------------------
def test_ddg_barrier_specs_and_bad_input():
    assert pp.ddg().barrier and not pp.ddg(barrier=False).barrier
    assert pp.parse("ddg") == pp.ddg() and pp.parse("ddg:nobarrier") == pp.ddg(barrier=False)
    assert pp.parse("ddg:barrier") == pp.ddg()
    assert pp.ddg(barrier=False).describe() == "ddg:nobarrier" and pp.ddg().resolve(3).describe() == "ddg"
    assert pp.make_plan(pp.ddg(barrier=False), 3, 4).fwd.tolist() == pp.make_plan(pp.ddg(), 3, 4).fwd.tolist()
    with pytest.raises(ValueError, match="ddg takes 'barrier'"):
        pp.parse("ddg:sometimes")
    with pytest.raises(ValueError, match="barrier = 1 must be True or False"):
        pp.ddg(barrier=1)
    with pytest.raises(ValueError, match="applies to ddg only"):
        pp.PipelineSchedule("dsp", (1, 0), (1, 0), barrier=True)
