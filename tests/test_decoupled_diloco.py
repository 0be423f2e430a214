"""Decoupled DiLoCo (issue 38): a quorum and a grace window merge learners' deltas into one
update; its reductions to asynchronous and synchronous DiLoCo, a timeline computed by hand,
and goodput in every schedule's summary."""

import json
import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.sim.scheduler import simulate_schedule

JITTERED = "1,1.3,2.6,2+jitter=0.2"
TIMES = ("worker", "iteration", "pull_time", "start", "end", "push_time", "wait", "lost")


def _same(a, b, keys=None) -> bool:
    keys = a.columns if keys is None else keys
    return (all(np.array_equal(a.columns[k], b.columns[k], equal_nan=True) for k in keys)
            and np.array_equal(a.update_time, b.update_time) and a.end_time == b.end_time)


def _members(s):
    c = s.columns
    return [sorted(c["worker"][(c["apply_version"] == v) & s.applied].tolist()) for v in range(s.num_updates)]


def test_the_spec_and_its_checks():
    p = st.policies.parse("decoupled_diloco:8:quorum=2:grace=0.5:dynamic:notokens")
    assert p == P.decoupled_diloco(8, quorum=2, grace=0.5, dynamic=True, tokens=False)
    assert p.describe() == "decoupled_diloco:8:quorum=2:grace=0.5:dynamic:notokens" and p.merges and p.quorum == 2
    assert P.decoupled_diloco(8).work == P.LocalSteps(8, weighted=True) and P.decoupled_diloco(8).describe() == \
        "decoupled_diloco:8"
    assert "decoupled_diloco[:STEPS][:quorum=QUORUM][:grace=GRACE][:dynamic][:notokens]" in st.policies.spec_help()
    with pytest.raises(ValueError, match="decoupled_diloco: quorum = 0 must be"):
        P.decoupled_diloco(8, quorum=0)
    with pytest.raises(ValueError, match="decoupled_diloco: grace = -1"):
        P.decoupled_diloco(8, grace=-1)
    with pytest.raises(ValueError, match=r"quorum = 5 must be <= the number of learners \(4\)"):
        simulate_schedule("decoupled_diloco:2:quorum=5", "1*4", num_updates=3)
    with pytest.raises(ValueError, match="synchronization window, which is not modelled"):
        simulate_schedule("decoupled_diloco:2", "1*4+server=1gbps", num_updates=3, payload_bytes=1000)


@pytest.mark.parametrize("cluster", [JITTERED, JITTERED + "+fail=3@10-30,1@15-", JITTERED + "+net=1gbps:5ms"])
def test_quorum_one_without_grace_is_async_diloco(cluster):
    """k = 1, no window: every arrival is merged alone, on arrival: the schedule of
    async_diloco, bitwise (every column, the update times, the end)."""
    kw = dict(num_updates=80, seed=3, payload_bytes=40000 if "net=" in cluster else None)
    assert _same(simulate_schedule("decoupled_diloco:4", cluster, **kw),
                 simulate_schedule("async_diloco:4", cluster, **kw))


def test_quorum_of_every_learner_is_diloco():
    """k = λ, no window: each merge waits for every learner: DiLoCo's rounds, bitwise."""
    for steps in (1, 4):
        assert _same(simulate_schedule(f"decoupled_diloco:{steps}:quorum=4", JITTERED, num_updates=40, seed=5),
                     simulate_schedule(f"diloco:{steps}", JITTERED, num_updates=40, seed=5))


def test_a_grace_window_has_async_diloco_grace_timing_and_merges_its_arrivals():
    """k = 1 with a window: the windows and every time are async_diloco(grace)'s, bitwise;
    the window's arrivals make one update instead of one each."""
    a = simulate_schedule("decoupled_diloco:4:grace=0.7", JITTERED, max_time=200.0, seed=3)
    b = simulate_schedule("async_diloco:4:grace=0.7", JITTERED, max_time=200.0, seed=3)
    assert all(np.array_equal(a.columns[k], b.columns[k], equal_nan=True) for k in TIMES)
    assert b.num_updates == b.num_gradients and a.num_updates < b.num_updates   # merged: fewer, larger updates
    c = a.columns
    assert a.applied.sum() == b.applied.sum()   # the same deltas, grouped by window
    last = [c["push_time"][a.applied & (c["apply_version"] == v)].max() for v in range(a.num_updates)]
    assert a.update_time.tolist() == last   # a window's merge at its last arrival


def test_a_quorum_and_grace_timeline_by_hand():
    """Learners of 1, 2, 4 and 8 s per step, H = 1, k = 2, grace 0.5 s:
    t=1 w0 arrives (1 < k: held); t=2 w1: quorum, nothing in flight arrives by 2.5: merge {0, 1};
    t=3 w0 held; t=4 w2 opens, w1 (also at 4) joins: merge {0, 1, 2}; t=5 w0; t=6 w1: merge {0, 1};
    t=7 w0; t=8 w3 opens, w2 and w1 (at 8) join: merge {0, 1, 2, 3}."""
    s = simulate_schedule("decoupled_diloco:1:quorum=2:grace=0.5", "1,2,4,8", num_updates=4, seed=0)
    c = s.columns
    assert s.update_time.tolist() == [2.0, 4.0, 6.0, 8.0]
    assert [sorted(c["worker"][c["apply_version"] == v].tolist()) for v in range(4)] == [
        [0, 1], [0, 1, 2], [0, 1], [0, 1, 2, 3]]
    # held learners wait for the merge: w0 arrives 1 s before each merge
    assert c["wait"][(c["worker"] == 0) & (c["iteration"] > 0)].tolist() == [1.0, 1.0, 1.0]
    # w2's first delta (pulled at version 0) is merged into version 1, w3's into version 3
    assert s.staleness[(c["worker"] == 2) & (c["iteration"] == 0)].tolist() == [1]
    assert s.staleness[(c["worker"] == 3) & (c["iteration"] == 0)].tolist() == [3]


def test_the_adaptive_grace_window_by_hand():
    """The paper's adaptive window, γ·max(0, τ·ξ_step − (ξ_quorum + ξ_sync)) with γ = 0.5, τ = 2:
    learners of 1, 1.1, 1.5 and 2.9 s per step, H = 4 (phases of 4, 4.4, 6 and 11.6 s).
    k = 1: t=4 w0 (step 1 s: window 1 s) takes w1 (4.4): merge at 4.4; t=6 w2 (1.5 s: 1.5 s) finds
    nobody by 7.5: alone; t=8.4 w0 takes w1 (8.8); t=11.6 w3 (2.9 s: 2.9 s) takes w2 (12), w0
    (12.8) and w1 (13.2). k = 2: t=4.4 w1 meets the quorum 0.4 s after w0: 0.5·(2.2 − 0.4) = 0.9 s,
    nobody by 5.3; t=8.4 w0 meets it 2.4 s after w2: no slack, merge at once; t=11.6 w3 meets it
    2.8 s after w1: 0.5·(5.8 − 2.8) = 1.5 s takes w0 (12.4)."""
    def merges(spec, cluster, n, **kw):
        s = simulate_schedule(spec, cluster, num_updates=n, seed=0, **kw)
        c = s.columns
        return ([round(t, 6) for t in s.update_time.tolist()],
                [sorted(c["worker"][c["apply_version"] == v].tolist()) for v in range(s.num_updates)])

    assert merges("decoupled_diloco:4:grace=adaptive", "1,1.1,1.5,2.9", 4) == (
        [4.4, 6.0, 8.8, 13.2], [[0, 1], [2], [0, 1], [0, 1, 2, 3]])
    assert merges("decoupled_diloco:4:quorum=2:grace=adaptive", "1,1.1,1.5,2.9", 3) == (
        [4.4, 8.4, 12.4], [[0, 1], [0, 2], [0, 1, 3]])
    # ξ_sync: a push's transfer and the way back. Without latency w0 (t=4) takes w1 (4.8) within
    # its 1 s; with 300 ms each way (pulls too) w1 arrives 0.8 s after w0, beyond 0.5·(2 − 0.6)
    assert merges("decoupled_diloco:4:grace=adaptive", "1,1.2", 2) == ([4.8, 9.6], [[0, 1], [0, 1]])
    assert merges("decoupled_diloco:4:grace=adaptive", "1,1.2+net=1gbps:300ms", 2, payload_bytes=1000) == (
        [4.600016, 5.400016], [[0], [1]])


def test_an_adaptive_window_without_slack_is_async_diloco():
    """When the transfers eat the overlapped steps' time (4 s each way, longer than any step here; τ = 2) the
    adaptive window is 0 s: every arrival is merged alone, async_diloco's schedule, bitwise."""
    kw = dict(num_updates=40, seed=4, payload_bytes=1000)
    cluster = JITTERED + "+net=1gbps:4s"
    assert _same(simulate_schedule("decoupled_diloco:1:grace=adaptive", cluster, **kw),
                 simulate_schedule("async_diloco:1", cluster, **kw))


def test_the_adaptive_window_spec_and_its_checks():
    p = st.policies.parse("decoupled_diloco:8:grace=adaptive:gamma=0.2:tau=3")
    assert p == P.decoupled_diloco(8, grace="adaptive", gamma=0.2, tau=3)
    assert p.describe() == "decoupled_diloco:8:grace=adaptive:gamma=0.2:tau=3"
    assert P.decoupled_diloco(8, grace="adaptive").describe() == "decoupled_diloco:8:grace=adaptive"
    assert p.window_seconds(1.0, 0.5, 0.5) == pytest.approx(0.2 * (3 - 1.0))
    assert p.window_seconds(1.0, 2.0, 2.0) == 0.0 and P.decoupled_diloco(8, grace=0.7).window_seconds(9, 9, 9) == 0.7
    assert P.async_diloco(8, grace=0.7).window_seconds is None   # a fixed window: the protocol's default
    for kw, match in ((dict(grace="soon"), "grace = 'soon' must be a number of seconds >= 0 or 'adaptive'"),
                      (dict(grace="adaptive", gamma=1.0), r"gamma = 1.0 must be a number in \(0, 1\)"),
                      (dict(grace="adaptive", tau=0), "tau = 0 must be an integer >= 1"),
                      (dict(gamma=0.2), "gamma and tau are the adaptive window's")):
        with pytest.raises(ValueError, match=match):
            P.decoupled_diloco(8, **kw)
    with pytest.raises(ValueError, match="decoupled_diloco: grace = 'x' must be"):
        st.policies.parse("decoupled_diloco:8:grace=x")


def test_a_learner_that_fails_while_held_loses_no_computation():
    """A worker waiting for a window (held, not computing) that fails is not recorded as a lost
    computation (it was, with the span of its previous one); its arrived delta is still merged."""
    for spec in ("decoupled_diloco:1:quorum=2", "async_diloco:1:grace=3"):
        # w3 (0.5 s) arrives at 0.5 and waits; it fails at 1.0, before the window closes
        s = simulate_schedule(spec, C.heterogeneous([1.0, 1.0, 1.0, 0.5, 1.0]).failures([(3, 1.0, None)]),
                              num_updates=20, seed=1)
        c = s.columns
        assert not c["lost"].any(), spec
        assert np.all(c["pull_time"] <= c["start"]) and (c["worker"] == 3).sum() == 1
        assert s.applied[c["worker"] == 3].all()


def test_failures_below_the_quorum_do_not_stall():
    """With fewer live learners than k, the quorum is every live one (the run goes on)."""
    s = simulate_schedule("decoupled_diloco:2:quorum=4", JITTERED + "+fail=2@5-,3@6-", num_updates=30, seed=2)
    assert s.num_updates == 30
    late = s.update_time > 10.0
    sizes = np.bincount(s.columns["apply_version"][s.applied], minlength=s.num_updates)
    assert np.all(sizes[late] == 2)


def test_a_learner_that_rejoins_while_the_quorum_is_pending_is_not_held():
    """Quorum 5 of 5; w4 fails at 0 and rejoins at 2, while the others' arrivals wait for the
    quorum. The rejoined learner starts at once (its arrival completes the quorum); held with
    the others, it waited for a close that needed its arrival: 0 updates (hypothesis found it)."""
    cluster = C.heterogeneous([1.0, 1.0, 1.0, 2.0, 1.0]).failures([(4, 0.0, 2.0)])
    s = simulate_schedule("decoupled_diloco:1:quorum=5", cluster, num_updates=60, seed=1)
    assert s.num_updates == 60
    assert _members(s)[0] == [0, 1, 2, 3, 4] and s.update_time[0] == 3.0


def test_goodput_by_hand():
    """BSP on learners of 1 and 2 s: each round the fast one computes 1 s and waits 1 s:
    (1 + 2) / (2 × 2) = 0.75. ASP wastes nothing: 1.0 up to the last unfinished step.
    A failure's lost computation and the down time are not useful."""
    bsp = simulate_schedule("bsp", "1,2", num_updates=10)
    assert bsp.summary()["goodput"] == pytest.approx(0.75)
    asp = simulate_schedule("asp", "1,2", max_time=10.0)
    c = asp.columns
    assert asp.summary()["goodput"] == pytest.approx((c["end"] - c["start"]).sum() / 20.0) == pytest.approx(1.0)
    lost = simulate_schedule("asp", "1,2+fail=1@3.5-7.5", max_time=10.0)
    # w0: 10 s useful; w1: [0, 2) applied, [2, 3.5) lost, down to 7.5, [7.5, 9.5) applied
    assert lost.summary()["goodput"] == pytest.approx((10.0 + 2.0 + 2.0) / 20.0)


@pytest.mark.parametrize("policy", ["diloco:4", "decoupled_diloco:4:quorum=4"])
def test_for_a_fixed_h_the_loss_trajectory_is_bit_identical_across_bandwidths(policy):
    """diloco-measured's invariant: a synchronous method's bandwidth changes when things
    happen, not what is computed. Over links of 200 kbit/s and 5 Gbit/s the run takes
    different simulated time, and its losses and final parameters are the same, bitwise."""
    runs = [st.simulate("digits-mlp", policy, f"1*4+jitter=0.1+net={bw}:1ms", num_updates=12, seed=4, eval_every=4)
            for bw in ("200kbps", "5gbps")]
    slow, fast = runs
    assert slow.schedule.end_time > 1.5 * fast.schedule.end_time   # 38 kB of parameters: 1.5 s a transfer
    assert np.array_equal(slow.train_loss, fast.train_loss)
    assert slow.history["loss"].tolist() == fast.history["loss"].tolist()
    for a, b in zip(*(jax.tree.leaves(r.params) for r in runs)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


# -- chaos: chip failures at scale ----------------------------------------------------------------
def _down_intervals(cluster, seed, worker, n):
    import itertools
    ev = [e for e in itertools.islice(cluster.sampler(seed).membership(), 4 * n) if e[2] == worker]
    return [(f[0], j[0]) for f, j in zip(ev[0::2], ev[1::2])][:n]


def test_chaos_draws_exponential_failures_per_chip_and_fixed_repairs():
    """A learner of 50 chips of MTBF 1000 s fails every 20 s on average (exponential: the sd
    equals the mean) and is down exactly the repair time; the same seed gives the same
    failures, another seed others; the spec round-trips."""
    c = st.cluster.parse("1*2+chaos=1000:3:50:1")
    assert c.describe() == "2+chaos=1000:3:50:1" and st.cluster.parse(c.describe()) == c
    down = _down_intervals(c, 0, 1, 3000)
    assert len(down) == 3000 and all(j - f == pytest.approx(3.0) for f, j in down)
    ups = np.diff([0.0] + [f for f, _ in down]) - np.array([0.0] + [3.0] * (len(down) - 1))
    assert ups.mean() == pytest.approx(20.0, rel=0.06) and ups.std() == pytest.approx(20.0, rel=0.08)
    assert _down_intervals(c, 0, 1, 5) == down[:5] and _down_intervals(c, 1, 1, 5) != down[:5]
    assert not _down_intervals(c, 0, 0, 1)   # worker 0 is not in WORKERS
    assert st.cluster.parse("1*2+chaos=1e+03:3:50:1") == c   # an exponent's '+' is not a modifier's
    with pytest.raises(ValueError, match="chaos chips = 2.5 must be an integer"):
        st.cluster.parse("1*2+chaos=1000:3:2.5")
    with pytest.raises(ValueError, match="chaos: mtbf"):
        C.constant(2).chaos(0, 3)


def test_goodput_under_chaos_decoupled_learners_beat_one_data_parallel_job():
    """The shape of Decoupled DiLoCo's claim: the same 8,000 chips as one data-parallel job
    (any chip's failure stalls it) or as 8 learners of 1,000 (a failure takes one down):
    at a chip MTBF of 10^6 s and 30 s repairs the job is up ~81% of the time, each learner ~97%."""
    dp = simulate_schedule("diloco:4", "1+chaos=1e6:30:8000", max_time=4000.0, seed=1)
    dec = simulate_schedule("decoupled_diloco:4", "1*8+chaos=1e6:30:1000", max_time=4000.0, seed=1)
    sync = simulate_schedule("diloco:4", "1*8+chaos=1e6:30:1000", max_time=4000.0, seed=1)
    g = {k: s.summary()["goodput"] for k, s in (("dp", dp), ("dec", dec), ("sync", sync))}
    assert g["dp"] == pytest.approx(125 / 155, abs=0.08) and g["dec"] == pytest.approx(1000 / 1030, abs=0.03)
    assert g["dec"] > g["sync"] > g["dp"], g


# -- numerics: the token-weighted merge ------------------------------------------------------------
def _params_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))


def test_the_reductions_train_bitwise():
    """decoupled_diloco with a quorum of every learner trains as diloco, and with k = 1 and no
    window as async_diloco, under one outer step: the same parameters and losses, bitwise (equal
    inner steps: the token weights are 1/c, the same bits as the plain mean under a constant lr
    rule). Its own default outer step is `test_the_clocked_outer_step_reduces_bitwise`'s."""
    kw = dict(num_updates=8, seed=3, inner_optimizer="adamw:lr=3e-3", num_evals=2, optimizer="nesterov:0.9,lr=0.7")
    for ours, theirs in (("decoupled_diloco:4:quorum=4", "diloco:4"), ("decoupled_diloco:4", "async_diloco:4")):
        a, b = (st.simulate("digits-mlp", p, JITTERED, **kw) for p in (ours, theirs))
        assert _params_equal(a, b) and np.array_equal(a.train_loss, b.train_loss), (ours, theirs)


def test_token_weights_from_hand_counted_steps():
    """Dynamic Local Updates on learners of 1, 1.3, 2.6 and 2 s per step with H = 4 take
    round(4 · 1 / t) = 4, 3, 2, 2 inner steps; a merge of all four weights their deltas
    4/11, 3/11, 2/11, 2/11 (tokens ∝ steps at one minibatch size), computed by `aggregate`
    exactly as by hand; without `tokens` the plain mean, and the two runs differ."""
    from staleness.engine import local as L
    from staleness.engine import update as U

    s = simulate_schedule("decoupled_diloco:4:quorum=4:dynamic", JITTERED, num_updates=2, seed=3)
    assert s.meta["local_steps"] == [4, 3, 2, 2]
    assert L.configure(P.decoupled_diloco(4).work).weighted and not L.configure(P.diloco(4).work).weighted
    deltas = {"w": np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 1.0}
    steps = np.array([4, 3, 2, 2, 7], np.float32)   # a fifth, padded slot (masked out)
    mask, tau = np.array([True] * 4 + [False]), np.zeros(5, np.int32)
    padded = {"w": np.concatenate([deltas["w"], np.full((1, 3), 99.0, np.float32)])}
    got = U.aggregate(padded, tau, mask, (st.lr.constant(),), 0, steps)["w"]
    assert np.allclose(got, (np.array([4, 3, 2, 2]) / 11.0) @ deltas["w"], rtol=1e-6)
    plain = U.aggregate(padded, tau, mask, (st.lr.constant(),), 0)["w"]
    assert np.allclose(plain, deltas["w"].mean(0), rtol=1e-6)
    kw = dict(num_updates=6, seed=3, inner_optimizer="adamw:lr=3e-3", num_evals=2)
    a, b = (st.simulate("digits-mlp", p, JITTERED, **kw) for p in ("decoupled_diloco:4:quorum=4:dynamic",
                                                                      "decoupled_diloco:4:quorum=4:dynamic:notokens"))
    assert not _params_equal(a, b)


def test_the_clocked_outer_step_by_hand():
    """clocked_nesterov (Delayed Nesterov clocked by tokens): each merge is applied at once as
    s·g (s its share of a round); the momentum folds the buffered s·g once the shares since
    its last fold reach 1, carrying the excess. Checked in float64 by hand on uneven shares;
    shares of 1 are Nesterov's steps bitwise, shares of 1/4 `delayed_nesterov:4`'s (1/3: 3's, to
    float32 rounding)."""
    import optax

    from staleness.tasks import optim

    rng = np.random.default_rng(0)
    p = {"w": np.zeros(5, np.float32)}
    gs = [{"w": rng.normal(size=5).astype(np.float32)} for _ in range(9)]
    clocked = optim.clocked_nesterov(0.9)
    for share, other in (((4, 4), optax.trace(0.9, nesterov=True)), ((3, 3), optax.trace(0.9, nesterov=True)),
                         ((1, 4), optim.delayed_nesterov(0.9, 4)), ((1, 3), optim.delayed_nesterov(0.9, 3))):
        a, b = clocked.init(p), other.init(p)
        for g in gs:
            (ua, a), (ub, b) = clocked.update(g, a, p, share=share), other.update(g, b, p)
            if share[1] == 3 and share[0] == 1:   # s·g against g/3: float32 rounding apart
                np.testing.assert_allclose(ua["w"], ub["w"], rtol=1e-6, atol=1e-7)
            else:
                assert np.array_equal(ua["w"], ub["w"]), share
    tokens = [8, 7, 10, 5, 20, 6, 6, 6, 12]   # of rounds of 20
    m, buf, clock, state = np.zeros(5), np.zeros(5), 0, clocked.init(p)
    fired = []
    for g, k in zip(gs, tokens):
        u, state = clocked.update(g, state, p, share=(k, 20))
        part = k / 20 * g["w"].astype(np.float64)
        buf, clock = buf + part, clock + k
        if clock >= 20:
            m, buf, clock = 0.9 * m + buf, np.zeros(5), clock - 20
            want = part + 0.9 * m
            fired.append(True)
        else:
            want = part
            fired.append(False)
        np.testing.assert_allclose(np.asarray(u["w"]), want, rtol=1e-5, atol=1e-6)
    assert fired == [False, False, True, False, True, False, True, False, True]   # the excess tokens carried
    with pytest.raises(ValueError, match="clocked_nesterov: the update's share of a round was not given"):
        clocked.update(gs[0], clocked.init(p), p)
    assert optim.get("clocked_nesterov:0.8,lr=0.7").describe() == "clocked_nesterov:0.8,lr=0.7"


@given(hst.lists(hst.sampled_from([1, 2, 3, 4]), min_size=1, max_size=40), hst.sampled_from([1, 4, 5]))
@settings(deadline=None, max_examples=40)
def test_the_clocked_momentum_folds_once_per_round_of_tokens(merged, learners):
    """For any sequence of merges (each of k of λ equal learners: share k/λ), the momentum folds
    exactly once per λ learners merged (the clock's excess carried, never lost), and every
    update moves by its share: with momentum 0 the updates are s·g."""
    from staleness.tasks import optim

    merged = [min(k, learners) for k in merged]
    p = {"w": np.zeros(2, np.float32)}
    g = {"w": np.array([1.0, -2.0], np.float32)}
    clocked, plain = optim.clocked_nesterov(0.5), optim.clocked_nesterov(0.0)
    a, b, folds, total = clocked.init(p), plain.init(p), 0, 0
    for k in merged:
        _, a = clocked.update(g, a, p, share=(k, learners))
        u, b = plain.update(g, b, p, share=(k, learners))
        folds += not np.asarray(a.buffer["w"]).any()   # a fold empties the buffer (else it holds s·g ≠ 0)
        total += k
        np.testing.assert_allclose(np.asarray(u["w"]), k / learners * g["w"], rtol=1e-6)
    assert folds == total // learners


@pytest.mark.parametrize("policy", ["asp"])
def test_the_clocked_outer_step_is_refused_without_local_merges(policy):
    from staleness.runtime.spec import make_spec

    msg = "optimizer = 'clocked_nesterov:0.9,lr=0.1' is the outer step of local-update merges"
    with pytest.raises(ValueError, match=msg):
        st.simulate("digits-mlp", policy, "1,2", num_updates=2, optimizer="clocked_nesterov:lr=0.1")
    with pytest.raises(ValueError, match=msg):
        make_spec("digits-mlp", policy, num_workers=2, num_updates=2, optimizer="clocked_nesterov:lr=0.1")


def test_a_merges_share_of_a_round_from_hand_counted_steps():
    """Learners of 4, 3, 2, 2 inner steps (11 tokens a round): a merge of learners 0 and 2 is
    6 of a round's 11 tokens; every learner once is the whole round."""
    from staleness.engine import update as U

    steps = np.array([4, 3, 2, 2], np.int32)
    assert [int(x) for x in U.round_share(np.array([4, 2, 9], np.int32), np.array([True, True, False]), steps)] \
        == [6, 11]
    assert [int(x) for x in U.round_share(steps, np.ones(4, bool), steps)] == [11, 11]


def test_the_clocked_outer_step_reduces_bitwise():
    """decoupled_diloco with clocked_nesterov: a quorum of every learner (each merge a whole
    round, share 1) trains as diloco with its Nesterov step; quorum 1 without a window (each
    merge one learner of 4, share 1/4) as async_diloco with `delayed_nesterov:4`: the same
    parameters and losses, bitwise."""
    kw = dict(num_updates=8, seed=3, inner_optimizer="adamw:lr=3e-3", num_evals=2)
    assert st.policies.parse("decoupled_diloco:4").optimizer == "clocked_nesterov:0.9,lr=0.7"   # its default
    for ours, theirs, opt in (("decoupled_diloco:4:quorum=4", "diloco:4", "nesterov:0.9,lr=0.7"),
                              ("decoupled_diloco:4", "async_diloco:4", "delayed_nesterov:4,lr=0.7")):
        a = st.simulate("digits-mlp", ours, JITTERED, **kw)
        b = st.simulate("digits-mlp", theirs, JITTERED, optimizer=opt, **kw)
        assert _params_equal(a, b) and np.array_equal(a.train_loss, b.train_loss), (ours, theirs)


@pytest.fixture(scope="module")
def digits4():
    return st.tasks.get("digits-mlp", num_workers=4)


@pytest.mark.parametrize("policy, outer", [("decoupled_diloco:4:quorum=2:grace=0.05", None),
                                           ("decoupled_diloco:4:grace=adaptive", None),
                                           ("decoupled_diloco:4:grace=adaptive", "clocked_nesterov:0.9,lr=0.7"),
                                           ("async_diloco:4:grace=0.05", None)])
def test_a_real_windowed_run_replays_bitwise(digits4, policy, outer):
    """The synchronizer's window for real (the server holds the arrived learners until its
    close: the grace's end, or once no learner is in flight) and its merges replay bitwise.
    Before the replay wrote back only the real slots' inner states, a merge of fewer than λ
    learners that held worker 0 undid worker 0's inner optimizer state there (a padding slot
    names worker 0, and the last of two writes won): 1.8e-3 apart after two merges."""
    from staleness.runtime.replay import replay_trace

    res = st.runtime.run(digits4, policy, "0.5,0.75,1.5,3.3", num_updates=6, time_scale=0.01,
                         inner_optimizer="adamw:lr=1e-3", worker_timeout=120, **({"optimizer": outer} if outer else {}))
    s = res.schedule
    assert res.status == "complete" and s.num_updates == 6
    quorum = 2 if "quorum=2" in policy else 1
    assert all(len(m) >= quorum for m in _members(s))
    if "decoupled" in policy:   # a merge's members all restart at its close, on the merged version
        c = s.columns
        for v in range(s.num_updates - 1):
            again = [(w, c["pull_time"][(c["worker"] == w) & (c["pull_version"] == v + 1)]) for w in _members(s)[v]]
            assert all(len(t) == 0 or t.min() >= s.update_time[v] - 1e-9 for _, t in again)
    assert replay_trace(res)[1].bitwise


def test_a_real_diloco_run_that_loses_a_learner_replays_bitwise():
    """Elastic rounds after a failure hold fewer slots than the first (padding slots): the
    same write-back bug made this replay differ by 6e-3 after four rounds."""
    from staleness.runtime.replay import replay_trace

    task = st.tasks.get("digits-mlp", num_workers=3)
    res = st.runtime.run(task, "diloco:4", "1,1,1+fail=2@6-", num_updates=4, time_scale=0.01,
                         inner_optimizer="adamw:lr=1e-3", worker_timeout=120)
    members = _members(res.schedule)   # [[0, 1, 2], [0, 1], ...]; on a loaded machine learner 2 may fail
    assert members[-1] == [0, 1] and all(len(m) >= 2 for m in members), members   # before its first round
    assert res.schedule.num_updates == 4
    assert replay_trace(res)[1].bitwise


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["decoupled_diloco:4:quorum=2:grace=adaptive", "async_diloco:4:grace=0.5"])
def test_a_real_windowed_run_checkpoints_at_a_close_and_resumes_replayably(tmp_path, policy):
    """Checkpoints with a window were refused. A checkpoint due while a window is open (workers
    held, arrivals buffered for a merge) is now taken at its close; the merge is one of the
    policy's recorded calls, so the resumed run rebuilds the quorum's state. Its trace starts
    with the first run's, up to the checkpoint, and replays bitwise."""
    from staleness.runtime.replay import replay_trace

    task = st.tasks.get("digits-mlp", num_workers=4)
    kw = dict(time_scale=0.01, inner_optimizer="adamw:lr=1e-3", worker_timeout=120, seed=1,
              checkpoint=tmp_path / "ckpt")
    first = st.runtime.run(task, policy, "0.5,0.75,1.5,3.3", num_updates=5, checkpoint_every=2, **kw)
    saved = json.loads((tmp_path / "ckpt" / "server.json").read_text())["meta"]
    k = len(saved["recorder"]["update_time"])
    assert k in (2, 3, 4) and first.schedule.num_updates == 5
    assert ("merge" in {c[0] for c in saved["policy"]["calls"]}) == ("decoupled" in policy)
    res = st.runtime.run(task, policy, "0.5,0.75,1.5,3.3", num_updates=7, resume=True, **kw)
    f0, f1 = first.schedule.columns, res.schedule.columns
    rows = int(np.flatnonzero(f0["apply_version"] == k - 1)[-1]) + 1
    assert all(np.array_equal(f1[c][:rows], f0[c][:rows]) for c in f0)
    assert res.schedule.num_updates == 7 and replay_trace(res)[1].bitwise


# -- SparseLoCo: top-k, quantization and error feedback --------------------------------------------
def _quantize64(x, bits):
    if bits >= 32 or not np.any(x):
        return x
    levels = 2 ** (bits - 1) - 1
    scale = np.max(np.abs(x))
    mag = np.abs(x) / scale
    e = np.round(np.log2(np.where(mag > 0, mag, 1.0)))
    keep = (mag > 0) & (e > -levels)
    return np.where(keep, np.sign(x) * scale * np.exp2(np.maximum(e, -(levels - 1))), 0.0)


def _compress64(x, topk, bits):
    k = max(1, int(np.ceil(topk * x.size)))
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out[idx] = x[idx]
    return _quantize64(out, bits)


def test_compression_with_error_feedback_against_float64_on_a_quadratic():
    """diloco:3 with top-30% + 4-bit pushes and error feedback on the quadratic (exact gradients
    A(θ − θ*)), inner SGD 0.05, outer SGD 0.7, two identical workers: the float32 replay follows
    a float64 reference of local steps, top-k, quantization and the error buffer for 12 rounds;
    without error feedback it follows the reference without the buffer, and the two differ."""
    from staleness.engine import core

    task = st.tasks.get("quadratic", num_workers=2)
    a, star = np.asarray(task.hessian, np.float64), np.asarray(task.optimum["theta"], np.float64)
    theta0 = np.asarray(task.init_params(core.keys(0)[0])["theta"], np.float64)
    for ef in (True, False):
        spec = "diloco:3:topk=0.3:bits=4" + (":error_feedback" if ef else "")
        res = st.simulate(task, spec, "1*2", num_updates=12, seed=0, optimizer="sgd:lr=0.7",
                          inner_optimizer="sgd:lr=0.05", num_evals=1)
        theta, err = theta0.copy(), np.zeros_like(theta0)
        for _ in range(12):
            local = theta.copy()
            for _ in range(3):
                local -= 0.05 * a @ (local - star)
            target = (theta - local) + (err if ef else 0.0)
            sent = _compress64(target, 0.3, 4)
            err = target - sent
            theta = theta - 0.7 * sent   # both workers sent the same: their mean
        np.testing.assert_allclose(np.asarray(res.params["theta"]), theta, rtol=2e-5, atol=2e-6)
        if ef:
            with_ef = theta
    assert np.max(np.abs(with_ef - theta)) > 1e-3   # error feedback changes the trajectory


def test_sparse_and_quantized_payload_bytes():
    """Top-10% with 2-bit values: a [10, 3] tensor sends 3 values × (2 + 32 index bits) = 13 bytes
    and a float32 scale, a [3] tensor 1 value (5 bytes + 4); dense 4-bit: 30 × 4 bits + 4. The
    schedule's push bytes are these, of the task's real parameters."""
    from staleness.policies import payload

    shapes = {"w": jax.ShapeDtypeStruct((10, 3), np.float32), "b": jax.ShapeDtypeStruct((3,), np.float32)}
    assert payload.sparse_bytes(shapes, 0.1, 2) == (13 + 4) + (5 + 4)
    assert payload.sparse_bytes(shapes, 1.0, 4) == (15 + 4) + (2 + 4)
    assert payload.sparse_bytes(shapes, 1.0, 32) == payload.tree_bytes(shapes) == 4 * 33
    task = st.tasks.get("digits-mlp", num_workers=2)
    p = task.init_params(jax.random.key(0))
    res = st.simulate(task, "diloco:2:topk=0.02:bits=2:error_feedback", "1*2+net=1gbps", num_updates=2,
                      inner_optimizer="adamw:lr=3e-3", num_evals=1)
    c = res.schedule.columns
    assert set(c["push_bytes"].tolist()) == {payload.sparse_bytes(p, 0.02, 2)}
    assert set(c["pull_bytes"].tolist()) == {payload.tree_bytes(p)} and payload.sparse_bytes(p, 0.02, 2) * 20 < \
        payload.tree_bytes(p)


# -- fragments: each fragment merged by its own quorum and window -------------------------------------


def test_the_fragments_spec_and_its_checks():
    p = st.policies.parse("decoupled_diloco:8:quorum=2:fragments=4:overlap=1:bits=4")
    assert p == P.decoupled_diloco(8, quorum=2, fragments=4, overlap=1, bits=4)
    assert p.describe() == "decoupled_diloco:8:quorum=2:fragments=4:overlap=1:bits=4"
    assert p.work == P.Streaming(2, False, 4, 1, 0.0, 4, weighted=True, anchored=True) and p.merge_keys == 4
    assert P.decoupled_diloco(8).merge_keys == 1 and P.streaming_diloco(8, 4).merge_keys == 1   # no merging window
    with pytest.raises(ValueError, match="steps = 6 must be a multiple of fragments = 4"):
        P.decoupled_diloco(6, fragments=4)
    with pytest.raises(ValueError, match="dynamic, topk and error_feedback are not implemented with fragments = 2"):
        P.decoupled_diloco(8, fragments=2, dynamic=True)
    with pytest.raises(ValueError, match=r"overlap = 1 is the fragments' \(fragments > 1\)"):
        P.decoupled_diloco(8, overlap=1)


def test_fragment_windows_by_hand():
    """Learners of 1, 1.5 and 2.2 s per step, H = 2 in P = 2 fragments (an iteration is one
    step, then a push of fragment iteration mod 2), quorum 2, no grace:
    t=1 w0 f0 held; 1.5 w1 f0: merge f0 {0, 1}; 2.2 w2 f0 held; 2.5 w0 f1 held (both windows
    pending at once); 3 w1 f1: merge f1 {0, 1}; 4 w0 f0 joins w2: merge f0 {0, 2}; 4.5 w1 f0
    held; 5 w0 f1 held; 6.2 w2 f1: merge f1 {0, 2}; 7.2 w0 f0 joins w1 (held 2.7 s): merge f0 {0, 1}."""
    s = simulate_schedule("decoupled_diloco:2:quorum=2:fragments=2", "1,1.5,2.2", num_updates=6, seed=0)
    c = s.columns
    assert s.update_time.tolist()[:5] == pytest.approx([1.5, 3.0, 4.0, 6.2, 7.2])
    assert _members(s)[:5] == [[0, 1], [0, 1], [0, 2], [0, 2], [0, 1]]
    frags = [sorted(set((c["iteration"][(c["apply_version"] == v) & s.applied] % 2).tolist())) for v in range(5)]
    assert frags == [[0], [1], [0], [1], [0]]   # a merge takes one fragment's pushes
    waits = {(int(w), int(i)): float(x) for w, i, x in zip(c["worker"], c["iteration"], c["wait"])}
    assert waits[(2, 1)] == pytest.approx(1.8) and waits[(1, 3)] == pytest.approx(2.7)
    assert waits[(0, 2)] == pytest.approx(0.5)   # w0 pushed f1 at 2.5, merged at 3


@pytest.mark.parametrize("cluster", [JITTERED, JITTERED + "+net=1gbps:5ms"])
def test_fragments_with_a_quorum_of_every_learner_are_streaming_diloco(cluster):
    """k = λ, no window: each fragment's merge waits for every learner: Streaming DiLoCo's
    rounds, bitwise (schedules with and without overlap), and its training under either outer
    step (the clocked one's merges are whole rounds), bitwise."""
    kw = dict(num_updates=30, seed=5, payload_bytes=40000 if "net=" in cluster else None)
    for extra in ("", ":overlap=1"):
        a = simulate_schedule(f"decoupled_diloco:4:quorum=4:fragments=2{extra}", cluster, **kw)
        b = simulate_schedule(f"streaming_diloco:4:fragments=2{extra}", cluster, **kw)
        assert _same(a, b), extra
    kw = dict(num_updates=8, seed=3, inner_optimizer="adamw:lr=3e-3", num_evals=2)
    a = st.simulate("digits-mlp", "decoupled_diloco:4:quorum=4:fragments=2:overlap=1", JITTERED, **kw)
    b = st.simulate("digits-mlp", "streaming_diloco:4:fragments=2:overlap=1", JITTERED, **kw)
    c = st.simulate("digits-mlp", "streaming_diloco:4:fragments=2:overlap=1", JITTERED,
                    optimizer="clocked_nesterov:0.9,lr=0.7", **kw)
    assert _params_equal(a, b) and np.array_equal(a.train_loss, b.train_loss)
    assert _params_equal(b, c) and np.array_equal(b.train_loss, c.train_loss)


def test_an_anchored_fragment_delta_by_hand():
    """Other learners' merges move a global fragment between two of a learner's merges of it:
    its outer gradient is taken from the fragment as it last merged it (the anchor), not from the
    one it pulled. With a zero inner learning rate the own parameters only move at the merge:
    round 1 of P = 2 merges fragment 0 (own_0 = anchor_0 = pulled_0) and pushes fragment 1,
    anchor_1 − own_1; unanchored (Streaming DiLoCo) it would be pulled_1 − own_1."""
    import optax
    from staleness.engine import local as L

    task = st.tasks.get("digits-mlp", num_workers=2)
    params = task.init_params(jax.random.key(0))
    keys = L.fragment_keys(params, 2)
    assert all(keys)
    shift = lambda tree, x: jax.tree.map(lambda a: a + x, tree)   # noqa: E731
    pulled, own, anchor = params, shift(params, 1.0), shift(params, 3.0)
    for anchored in (True, False):
        local = L.Local(optax.sgd(0.0), 1, False, fragments=2, fragment_keys=keys, anchored=anchored)
        q = (own, anchor) if anchored else own
        _, delta, _, out = L.streaming_delta(task, local, pulled, q, optax.sgd(0.0).init(params),
                                             jax.random.key(1), 0, 1)
        new_own = out[0] if anchored else out
        for k in keys[0]:   # merged: own = pulled; nothing pushed
            assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new_own[k]), jax.tree.leaves(pulled[k])))
            assert not any(np.asarray(d).any() for d in jax.tree.leaves(delta[k]))
        for k in keys[1]:   # pushed: from the anchor (3 − 1 = 2) or from the pulled fragment (0 − 1 = −1)
            want = 2.0 if anchored else -1.0
            assert all(np.allclose(d, want) for d in jax.tree.leaves(delta[k])), (anchored, k)
        if anchored:
            new_anchor = out[1]
            for p, keep in ((0, pulled), (1, anchor)):
                for k in keys[p]:
                    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new_anchor[k]),
                                                                    jax.tree.leaves(keep[k])))


def test_a_real_fragmented_run_replays_bitwise(digits4):
    """Fragments for real: the server's windows, one per fragment, merge each fragment's pushes
    (its own outer step and clock), and the run replays bitwise."""
    from staleness.runtime.replay import replay_trace

    res = st.runtime.run(digits4, "decoupled_diloco:4:quorum=2:fragments=2", "0.5,0.75,1.5,3.3", num_updates=6,
                         time_scale=0.01, inner_optimizer="adamw:lr=1e-3", worker_timeout=120)
    s = res.schedule
    assert res.status == "complete" and s.num_updates == 6
    c = s.columns
    for v, members in enumerate(_members(s)):
        rows = s.applied & (c["apply_version"] == v)
        assert len(members) >= 2 and len(set((c["iteration"][rows] % 2).tolist())) == 1, v
    assert replay_trace(res)[1].bitwise


def test_checkpoints_of_fragment_windows_are_refused_with_one_line(tmp_path):
    from staleness.runtime.spec import make_spec

    with pytest.raises(ValueError, match="checkpoint_every with fragments merged by their own windows is not supported"):
        make_spec("digits-mlp", "decoupled_diloco:4:quorum=2:fragments=2", num_workers=2, num_updates=2,
                  checkpoint=str(tmp_path), checkpoint_every=1)


@given(hst.lists(hst.sampled_from([1.0, 1.3, 1.7, 2.2, 3.1]), min_size=2, max_size=5), hst.sampled_from([2, 3]),
       hst.integers(1, 5), hst.sampled_from(["", ":grace=0.4", ":grace=adaptive"]), hst.booleans())
@settings(deadline=None, max_examples=30)
def test_every_fragment_merge_takes_one_fragment_and_restarts_its_learners_on_it(speeds, p, k, grace, fail):
    """Any speeds, quorum, window and a failure: a merge holds only pushes of one fragment (at
    least the quorum's without a failure), never one learner twice, and a learner's next
    iteration starts on a version that holds its merged push (it waited for its fragment's merge)."""
    lam = len(speeds)
    cluster = ",".join(f"{x:g}" for x in speeds) + ("+fail=1@5-15" if fail else "")
    s = simulate_schedule(f"decoupled_diloco:{2 * p}:quorum={min(k, lam)}:fragments={p}{grace}", cluster,
                          num_updates=20, seed=0)
    c = s.columns
    assert s.num_updates == 20
    for v in range(s.num_updates):
        rows = s.applied & (c["apply_version"] == v)
        assert len(set((c["iteration"][rows] % p).tolist())) == 1, v
        assert len(set(c["worker"][rows].tolist())) == rows.sum() >= (1 if fail else min(k, lam)), v
    for w in range(lam):
        mine = (c["worker"] == w) & s.applied
        its, pulls, applied = c["iteration"][mine], c["pull_version"][mine], c["apply_version"][mine]
        order = np.argsort(its)
        its, pulls, applied = its[order], pulls[order], applied[order]
        for j in range(len(its) - 1):
            if its[j + 1] == its[j] + 1:
                assert pulls[j + 1] >= applied[j] + 1, (w, its[j])
