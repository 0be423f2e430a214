"""The replay consumes the schedule as it is simulated (`st.simulate` of a policy whose updates
hold a fixed number of gradients): bitwise the replay of the finished schedule, also when the
ring must grow; the cases it cannot stream fall back to the whole schedule."""

import dataclasses
import itertools
import signal
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import core
from staleness.engine import plan as engine_plan
from staleness.engine.result import DivergenceError
from staleness.schedule import Schedule
from staleness.sim.scheduler import stream_schedule


@pytest.fixture(scope="module")
def digits4():
    return st.tasks.get("digits-mlp", batch_size=8, num_workers=4)


@pytest.fixture
def fills(monkeypatch):
    """Counts the row ranges a streamed plan fills, one per chunk or part of the first chunk
    (0: the run was not streamed)."""
    count = [0]
    real = engine_plan.PlanStream._fill

    def spy(self, lo, hi):
        count[0] += 1
        return real(self, lo, hi)

    monkeypatch.setattr(engine_plan.PlanStream, "_fill", spy)
    return count


def _equal_tree(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _same_run(streamed, whole):
    assert _equal_tree(streamed.params, whole.params)
    assert streamed.history.equals(whole.history)
    np.testing.assert_array_equal(streamed.train_loss, whole.train_loss)
    assert streamed.config == whole.config and streamed.status == whole.status


def _same_schedule(a: Schedule, b: Schedule):
    assert a.columns.keys() == b.columns.keys()
    for k in a.columns:
        np.testing.assert_array_equal(a.columns[k], b.columns[k], err_msg=k)
    np.testing.assert_array_equal(a.update_time, b.update_time)
    assert (a.meta, a.end_time, a.policy, a.cluster, a.seed) == (b.meta, b.end_time, b.policy, b.cluster, b.seed)


@pytest.mark.parametrize("policy", ["asp", "ssp:3", "softsync:2", "dssp:1:4"])
def test_a_streamed_simulate_is_bitwise_the_replay_of_the_finished_schedule(digits4, fills, policy):
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.2)
    r = st.simulate(digits4, policy, cluster, num_updates=150, lr=0.1, seed=1, eval_every=16)
    assert fills[0] == 10, "the run was not streamed"
    nbytes = st.engine.payload.payload_bytes(digits4, P.parse(policy))
    whole = st.simulate_schedule(policy, cluster, num_updates=150, seed=1, payload_bytes=nbytes[0],
                                 push_bytes=nbytes[1])
    _same_schedule(r.schedule, whole)
    _same_run(r, st.engine.replay(whole, digits4, lr=0.1, seed=1, eval_every=16))


def _streamable_specs() -> list[str]:
    """Every registered policy that streams with its defaults (from the registry: a new
    streamable policy is covered without editing this test), plus tighter parameters."""
    def streams(name):
        try:
            return P.parse(name).streamable(4) is not None
        except (ValueError, TypeError):   # a registered factory without defaults
            return False
    return [n for n in P.names() if streams(n)] + ["ssp:1", "softsync:2", "dssp:1:4"]


def test_the_ring_growth_cases_cover_every_streamable_policy():
    assert {"asp", "ssp", "dssp", "softsync"} <= set(_streamable_specs())
    assert all(P.parse(s).streamable(4) is not None for s in _streamable_specs())


@settings(max_examples=25, deadline=None)
@given(seed=hs.integers(0, 10_000), chunk=hs.integers(1, 40), n=hs.integers(1, 120),
       policy=hs.sampled_from(_streamable_specs()), jitter=hs.floats(0.0, 0.5),
       slow=hs.floats(1.0, 30.0), ring=hs.one_of(hs.none(), hs.integers(1, 6)))
def test_a_plan_filled_while_simulating_is_the_plan_of_the_finished_schedule(seed, chunk, n, policy, jitter, slow,
                                                                              ring):
    cluster = C.heterogeneous([1.0, 1.3, 2.6, slow]).jitter(jitter)
    stream = stream_schedule(policy, cluster, num_updates=n, seed=seed)
    feed = engine_plan.PlanStream(stream, chunk, P.parse(policy).streamable(4), ring=ring)
    rings = []
    for k in range(feed.plan.num_chunks):
        feed.fill(k)
        rings.append(feed.ring)
    whole = engine_plan.make_plan(stream.finish(), chunk)
    for name in ("worker", "iteration", "pull_version", "staleness", "mask", "update_time"):
        np.testing.assert_array_equal(getattr(feed.plan, name), getattr(whole, name), err_msg=name)
    # the replay's ring, modelled: version u written into slot write[u] at update u, then
    # every gradient reads its slot; a chunk's slots exist by the time it runs, and no
    # version is overwritten before its last gradient is applied
    plan, held = feed.plan, {}
    for u in range(n):
        r = rings[u // chunk]
        assert 0 <= plan.write[u] < r and (plan.slot[u][plan.mask[u]] < r).all()
        held[int(plan.write[u])] = u
        for c in np.flatnonzero(plan.mask[u]):
            v = int(plan.pull_version[u, c])
            assert held.get(int(plan.slot[u, c])) == v, f"update {u} reads version {v}, overwritten (ring {r})"
    if ring is None:
        assert rings[-1] == engine_plan.stream_ring(4, P.parse(policy).streamable(4)), "a policy outgrew its ring"


def test_a_ring_that_grows_mid_run_changes_no_bit(digits4, fills, monkeypatch):
    """A ring of 2 slots (4 workers need up to 7 live versions): rows that find no free
    slot add slots (the replay pads its ring and compiles once more) and the run goes on
    bitwise."""
    grown = []
    real = core.grow_ring
    monkeypatch.setattr(core, "grow_ring", lambda carry, ring: grown.append(ring) or real(carry, ring))
    monkeypatch.setattr(engine_plan, "stream_ring", lambda num_workers, slots: 2)
    cluster = C.heterogeneous([1.0, 1.0, 1.0, 20.0])
    r = st.simulate(digits4, "asp", cluster, num_updates=200, lr=0.1, seed=2, eval_every=8)
    assert fills[0] == 25 and grown == sorted(grown) and grown[0] > 2, "the ring never grew"
    _same_run(r, st.engine.replay(r.schedule, digits4, lr=0.1, seed=2, eval_every=8))


@pytest.mark.parametrize("n,every", [(700, 600), (300, 1000)])
def test_a_first_chunk_longer_than_the_lookahead_runs_in_parts_bitwise(digits4, fills, monkeypatch, n, every):
    """The first chunk has no chunk before it to overlap with: it runs in parts of
    `LOOKAHEAD` updates (in its own compiled program), each simulated while the one before
    runs; a run of one chunk shorter than its evaluation interval too. The same bits."""
    calls = []
    real = core.run_chunk
    monkeypatch.setattr(core, "run_chunk", lambda *a, **k: calls.append(int(a[2][-1])) or real(*a, **k))
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.2)
    r = st.simulate(digits4, "asp", cluster, num_updates=n, lr=0.1, seed=3, eval_every=every)
    parts = [256, 256, 88] if n == 700 else [256, 44]
    assert calls == parts + ([100] if n == 700 else []) and fills[0] == len(calls)
    assert np.isfinite(r.train_loss).all() and len(r.history) == (3 if n == 700 else 2)
    _same_run(r, st.engine.replay(r.schedule, digits4, lr=0.1, seed=3, eval_every=every))


def test_a_ring_that_grows_between_parts_of_the_first_chunk_changes_no_bit(digits4, monkeypatch):
    """The ring gains a slot (not needed) while the rows of the
    third part of the first chunk are written: the replay pads its ring between parts."""
    grown = []
    real, place = core.grow_ring, engine_plan.PlanStream._place
    monkeypatch.setattr(core, "grow_ring", lambda carry, ring: grown.append(ring) or real(carry, ring))

    def place_and_grow_at_32(self, lo, hi, *args):
        if lo == 32:
            self._grow(1)
        return place(self, lo, hi, *args)

    monkeypatch.setattr(engine_plan.PlanStream, "_place", place_and_grow_at_32)
    monkeypatch.setattr(st.engine.run, "LOOKAHEAD", 16)
    r = st.simulate(digits4, "asp", C.heterogeneous([1.0, 1.0, 1.0, 20.0]), num_updates=200, lr=0.1, seed=2,
                    eval_every=150)
    assert grown == [engine_plan.stream_ring(4, 1) + 1]
    _same_run(r, st.engine.replay(r.schedule, digits4, lr=0.1, seed=2, eval_every=150))


@pytest.mark.parametrize("case", ["failures", "max_time", "no fixed size", "bsp"])
def test_what_cannot_stream_replays_the_finished_schedule(digits4, fills, case, monkeypatch):
    cluster, policy, budget = C.heterogeneous([1.0, 1.0, 2.6, 2.6]), "asp", {"num_updates": 60}
    if case == "failures":
        cluster = cluster.failures([(3, 5.0, None)])
    elif case == "max_time":
        budget = {"max_time": 20.0}
    elif case == "no fixed size":
        monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
        policy = "user_policies:bounded_asp:2"
    else:
        policy = "bsp"
    r = st.simulate(digits4, policy, cluster, lr=0.1, seed=0, eval_every=10, **budget)
    assert fills[0] == 0
    _same_run(r, st.engine.replay(r.schedule, digits4, lr=0.1, seed=0, eval_every=10))
    sys.modules.pop("user_policies", None)


def test_a_streamed_run_that_diverges_carries_the_finished_schedule(digits4, fills):
    with pytest.raises(DivergenceError) as e:
        st.simulate(digits4, "asp", C.heterogeneous([1.0, 1.0, 2.6, 2.6]), num_updates=100, lr=1e9, seed=0,
                    eval_every=10)
    assert fills[0] >= 1
    sched = e.value.result.schedule
    assert isinstance(sched, Schedule) and sched.num_updates == 100


@dataclasses.dataclass(frozen=True)
class _Claims1(P.AllLive):
    """An aggregation that declares one gradient per update but waits for every live worker."""

    def fixed_size(self, num_workers):
        return 1


def test_an_aggregation_whose_fixed_size_is_wrong_is_named(digits4):
    policy = P.Policy(P.ClockBound(0), _Claims1(), "claims1")
    with pytest.raises(ValueError, match=r"update 0 holds 4 gradients.*'claims1' declares 1"):
        st.simulate(digits4, policy, C.heterogeneous([1.0, 1.0, 2.6, 2.6]), num_updates=20, lr=0.1, seed=0)


@pytest.mark.timeout(120)
def test_a_ctrl_c_while_the_schedule_is_simulated_stops_the_run_and_keeps_the_finished_schedule(digits4, fills,
                                                                                                 monkeypatch):
    """Ctrl-C lands while the rows of a later chunk are simulated (inside the simulator's event
    generator): the run stops after its last completed chunk and still gets the finished
    schedule. Before, the interrupt ended the generator halfway, and finishing the schedule
    then looped forever (`staleness compare` hung after Ctrl-C)."""
    real = st.engine.run.stream_schedule

    def interrupted(*args, **kwargs):
        stream = real(*args, **kwargs)
        events = stream._events

        def ctrl_c_at_event_450():
            for i in itertools.count():
                try:
                    next(events)
                except StopIteration as stop:
                    return stop.value
                if i == 450:
                    signal.raise_signal(signal.SIGINT)
                yield

        stream._events = ctrl_c_at_event_450()
        return stream

    monkeypatch.setattr(st.engine.run, "stream_schedule", interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a plain Python session
    try:
        cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6])
        r = st.simulate(digits4, "asp", cluster, num_updates=600, lr=0.1, seed=1, eval_every=50)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fills[0] >= 2 and r.status == "stopped" and 0 < np.isfinite(r.train_loss).sum() < 600
    nbytes = st.engine.payload.payload_bytes(digits4, P.parse("asp"))
    _same_schedule(r.schedule, st.simulate_schedule("asp", cluster, num_updates=600, seed=1, payload_bytes=nbytes[0],
                                                    push_bytes=nbytes[1]))


@pytest.mark.timeout(60)
def test_a_schedule_stream_whose_simulation_failed_says_so_instead_of_looping():
    stream = stream_schedule("asp", C.heterogeneous([1.0, 2.0]), num_updates=50, seed=0)

    def failing():
        yield
        raise ValueError("boom")

    stream._events = failing()
    with pytest.raises(ValueError, match="boom"):
        stream.advance(10)
    with pytest.raises(RuntimeError, match="simulation.*ended"):
        stream.finish()
