"""In-flight weight updates (`rl_inflight`) and partial rollouts (`rl_partial`) run for real.

The server publishes every version it completes; an actor decoding for its injected time
fetches each one through the transport and takes it at the token the simulator's rule
(`staleness.sim.inflight.Decode`) gives; it generates with one version per segment and pushes
the switches, which the trace keeps. Checked here: the switches obey the schedule's
invariants (versions after the pull and at most the applying version, tokens inside the
rollout), a partial rollout's decode lasts at least its injected time plus a pause per
interruption, and the trace replays bit for bit on CPU (the replay regenerates every rollout
from its segments' versions in the ring). Then the refusals and the pieces: the version board
of the thread transport, and a checkpoint's recorder keeping the switches.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

import staleness as st
from staleness import cluster as C
from staleness.driver import Recorder
from staleness.engine import core
from staleness.engine import plan as engine_plan
from staleness.sim.inflight import Decode
from staleness.runtime.replay import replay_trace
from staleness.runtime.spec import make_spec
from staleness.runtime.transport import LocalTransport
from staleness.tasks import rl

CLUSTER = "1,1,1.5,3"
SCALE = 0.002   # real seconds per simulated second: a token takes 2-6 ms here
UPDATES = 12


@pytest.fixture(scope="module")
def digits():
    # rl-digits at its smallest (no warm start, one narrow layer): compiles in seconds
    return rl.get("rl-digits", num_workers=4, objective="decoupled_ppo", warm_start_steps=0, num_layers=1,
                  d_model=16, num_heads=2)


def _run(task, policy):
    return st.runtime.run(task, policy, C.parse(CLUSTER), num_workers=4, num_updates=UPDATES, lr=1e-3,
                          time_scale=SCALE, seed=0)


def _check_switches(res, task):
    """The recorded switches: versions in (pull, apply] ascending, tokens ascending inside the
    rollout; returns {row: switches}."""
    sched = res.schedule
    lists = engine_plan.segment_lists(sched)   # validates (row, token, version) against the columns
    assert lists, "no version reached an actor mid-rollout: nothing was tested"
    sizes = task.rollout_sizes(core.keys(0)[1])
    f = sched.columns
    for row, switches in lists.items():
        toks = [k for k, _ in switches]
        vers = [v for _, v in switches]
        assert toks == sorted(toks) and vers == sorted(vers) and len(set(vers)) == len(vers), switches
        assert 0 <= toks[0] and toks[-1] < sizes(int(f["worker"][row]), int(f["iteration"][row])), switches
    return lists


@pytest.mark.timeout(300)
def test_inflight_real_run_records_segments_and_replays_bitwise(digits):
    res = _run(digits, "rl_inflight:2")
    assert res.status == "complete" and res.schedule.num_updates == UPDATES
    lists = _check_switches(res, digits)
    sched = res.schedule
    assert sched.staleness[sched.applied].max() <= 2   # η bounds the oldest tokens, as rl_async
    rep, same = replay_trace(res)
    assert same.bitwise, same
    # without its switches the same trace replays to other parameters: they were used
    bare = dataclasses.replace(sched, policy=st.policies.parse("rl_async:2"),
                               meta={k: v for k, v in sched.meta.items() if k != "segments"})
    _, other = replay_trace(dataclasses.replace(res, schedule=bare))
    assert not other.bitwise and other.max_abs_diff > 0.0, (len(lists), other)


@pytest.mark.timeout(300)
def test_partial_real_run_pauses_at_each_interruption_and_replays_bitwise(digits):
    res = _run(digits, "rl_partial:2")
    assert res.status == "complete"
    lists = _check_switches(res, digits)
    sched, f = res.schedule, res.schedule.columns
    sizes = digits.rollout_sizes(core.keys(0)[1])
    sampler = C.parse(CLUSTER).sampler(0)
    paused = 0
    for row, switches in lists.items():
        w, it = int(f["worker"][row]), int(f["iteration"][row])
        tau = sampler.compute_time(w, it, 0.0) * SCALE          # seconds per token (no network: no transfer)
        pauses = len({k for k, _ in switches if k > 0})          # at least one pause (refill = 1 token) per token
        took = float(f["end"][row] - f["start"][row])            # the actor's own clock: decode + generation
        assert took >= (sizes(w, it) + pauses * 1.0) * tau * (1 - 1e-9), (row, switches, took, tau)
        paused += pauses
    assert paused > 0
    rep, same = replay_trace(res)
    assert same.bitwise, same


def test_a_real_run_without_a_cluster_is_refused_in_one_line():
    bandit = rl.get("rl-bandit", num_workers=2, objective="reinforce")
    for policy in ("rl_inflight:2", "rl_partial:2"):
        with pytest.raises(ValueError, match="need a cluster") as e:
            st.runtime.run(bandit, policy, num_workers=2, num_updates=2)
        assert "\n" not in str(e.value) and policy in str(e.value)
        spec = make_spec(bandit, policy, C.parse("1,2"), num_updates=2, processes=2)   # across processes: built
        assert spec.inflight and spec.delays(0.0).inflight
        assert spec.delays(0.0).refill == (1.0 if policy.startswith("rl_partial") else None)


def test_the_thread_transport_hands_actors_the_newest_published_version():
    link = LocalTransport(None, [None, None])
    t = time.monotonic()
    assert link.newer(0, -1, 0.05) is None and time.monotonic() - t >= 0.04   # nothing published: it waits
    link.publish(1, "p1", [0, 1])
    link.publish(2, "p2", [0, 1])
    assert link.newer(0, 0, 1.0) == (2, "p2") and link.newer(1, 1, 1.0) == (2, "p2")   # the newest, to every actor
    assert link.newer(0, 2, 0.0) is None
    got = []
    waiter = threading.Thread(target=lambda: got.append(link.newer(1, 2, 10.0)))
    waiter.start()
    time.sleep(0.05)
    link.publish(3, "p3", [1])   # wakes a waiting actor at once
    waiter.join(5.0)
    assert got == [(3, "p3")]
    waiter = threading.Thread(target=lambda: got.append(link.newer(1, 3, 10.0)))
    t = time.monotonic()
    waiter.start()
    link.stop()             # and so does a stop
    waiter.join(5.0)
    assert got[-1] is None and time.monotonic() - t < 5.0


def test_a_checkpoint_keeps_the_switches():
    rec = Recorder()
    rec.segments = {3: [(0, 2), (5, 4)], 7: [(2, 9)]}
    back = Recorder.from_state(rec.state())
    assert back.segments == rec.segments
    assert Recorder.from_state(Recorder().state()).segments is None


def test_the_decode_rule_in_flight_and_partial():
    # in flight: 10 tokens over [0, 10); versions at 2.5 and 2.7 take token 3 (the newer one), 12.0 is too late
    d = Decode(0.0, 10.0, 10)
    assert not d.arrive(-1.0, 1) and not d.arrive(2.5, 2) and not d.arrive(2.7, 3) and not d.arrive(12.0, 4)
    assert d.switches == [(0, 1), (3, 3)] and d.end == 10.0
    # partial: each interruption pauses 1 s; tokens after it are counted on the decode's own clock
    d = Decode(0.0, 10.0, 10, pause=1.0)
    assert d.arrive(2.5, 2) and d.end == 11.0
    assert d.arrive(6.5, 3) and d.switches == [(3, 2), (6, 3)] and d.end == 12.0   # 6.5 − 1 pause = token 5.5 → 6
    assert not d.arrive(12.0, 4)
