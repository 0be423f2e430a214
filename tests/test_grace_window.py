"""async_diloco(grace=...): the asyncdiloco notebook's synchronization window, against its clock.

The reference below is the notebook's virtual clock written again from its code
(google-deepmind/asyncdiloco, AsyncLocalSGDToyExample.ipynb: `AsyncExperiment.run`,
`get_next_sync_worker`, `synchronizable`, `synchronize`, `train`): every worker's round ends
H steps after its start; the earliest-finishing worker is synchronized next (lowest index on
ties); its arrival opens a window of `max_wait_time` in which every other worker that
finishes is synchronized too, one outer step each; the idle workers then all restart at the
time of the window's last synchronization, on the newest model. Its sync times, the version
each round started from and each round's start time must be the simulator's, row for row.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.sim.scheduler import simulate_schedule


def notebook_clock(sec_per_step, steps: int, max_wait: float, num_syncs: int) -> list[tuple]:
    """[(worker, sync time, model id its round started from, its round's start), ...] in sync order."""
    n = len(sec_per_step)
    finish = [0.0] * n          # training_finished_time
    started = [0.0] * n
    model_of = [0] * n
    busy = [False] * n          # w.future is not None
    model_id, time_now, sync_start = 0, 0.0, None
    out = []

    def train():
        for w in range(n):
            if not busy[w]:
                busy[w], model_of[w], started[w] = True, model_id, finish[w]
                finish[w] += steps * sec_per_step[w]

    train()
    while len(out) < num_syncs:
        nxt = None
        if any(busy):
            nxt = min((w for w in range(n) if busy[w]), key=lambda w: (finish[w], w))
            if sync_start is not None and finish[nxt] - sync_start > max_wait:
                nxt = None
        if nxt is not None:
            time_now = max(time_now, finish[nxt])
        if nxt is not None and (sync_start is None or time_now - sync_start <= max_wait):
            sync_start = time_now if sync_start is None else sync_start
            out.append((nxt, time_now, model_of[nxt], started[nxt]))
            model_id += 1
            busy[nxt] = False
            for w in range(n):
                if not busy[w]:
                    finish[w] = time_now
        else:
            sync_start = None
            train()
    return out


def _rows(sched):
    c = sched.columns
    order = np.argsort(c["apply_version"], kind="stable")
    return [(int(c["worker"][r]), float(c["push_time"][r]), int(c["pull_version"][r]), float(c["start"][r]))
            for r in order]


def _same(ours, ref):
    assert [r[0] for r in ours] == [r[0] for r in ref]
    np.testing.assert_allclose([r[1] for r in ours], [r[1] for r in ref], rtol=0, atol=1e-9)
    assert [r[2] for r in ours] == [r[2] for r in ref]
    np.testing.assert_allclose([r[3] for r in ours], [r[3] for r in ref], rtol=0, atol=1e-9)


def test_the_papers_toy_setting_matches_the_notebooks_clock():
    """Liu et al.'s four workers (0.58, 0.75, 1.51, 3.33 s per step), H = 10, a 0.5 s window:
    at 15.0 s worker 1 arrives and worker 2 (15.1 s) falls in its window; both restart at 15.1."""
    speeds, h = [0.58, 0.75, 1.51, 3.33], 10
    sched = simulate_schedule(P.async_diloco(h, grace=0.5), C.heterogeneous(speeds), num_updates=40, seed=0)
    ours, ref = _rows(sched), notebook_clock(speeds, h, 0.5, 40)
    _same(ours, ref)
    by_update = {r: row for r, row in enumerate(ours)}
    assert by_update[3][:3] == (1, pytest.approx(15.0), 2) and by_update[4][:3] == (2, pytest.approx(15.1), 0)
    c = sched.columns
    later = [r for r in range(sched.num_gradients) if c["pull_time"][r] == pytest.approx(15.1)]
    assert sorted(int(c["worker"][r]) for r in later) == [1, 2]   # both restarted at the window's last sync
    assert all(c["pull_version"][r] == 5 for r in later)           # on the model after both updates


@settings(max_examples=60, deadline=None)
@given(speeds=hst.lists(hst.floats(0.2, 4.0), min_size=1, max_size=5), h=hst.integers(1, 30),
       grace=hst.floats(0.01, 20.0))
def test_any_window_matches_the_notebooks_clock(speeds, h, grace):
    speeds = [round(s, 3) for s in speeds]
    sched = simulate_schedule(P.async_diloco(h, grace=grace), C.heterogeneous(speeds), num_updates=30, seed=0)
    ours = _rows(sched)
    ref = notebook_clock(speeds, h, grace, 30)
    times = [r[1] for r in ref]
    if len(set(np.round(times, 9))) < len(times):
        return   # simultaneous arrivals: the notebook syncs the lowest index first, the simulator its heap order
    _same(ours, ref)


def test_grace_zero_is_async_diloco():
    assert P.async_diloco(20, grace=0) == P.async_diloco(20) == st.policies.parse("async_diloco:20")
    a = simulate_schedule("async_diloco:20", C.heterogeneous([0.58, 0.75, 1.51, 3.33]).jitter(0.2), num_updates=50)
    b = simulate_schedule(P.async_diloco(20, grace=0.0), C.heterogeneous([0.58, 0.75, 1.51, 3.33]).jitter(0.2),
                          num_updates=50)
    assert a.equals(b)
    w = simulate_schedule("async_diloco:20:grace=5", C.heterogeneous([0.58, 0.75, 1.51, 3.33]).jitter(0.2),
                          num_updates=50)
    assert not a.equals(w)   # a window changes the schedule (the comparison can fail)


def test_spec_replay_and_refusals():
    p = st.policies.parse("async_diloco:20:grace=0.5")
    assert p.grace == 0.5 and p.describe() == "async_diloco:20:grace=0.5" and st.policies.parse(p.describe()) == p
    for bad in (-1, float("inf"), "x"):
        with pytest.raises(ValueError, match="async_diloco: grace"):
            P.async_diloco(10, grace=bad)
    r = st.simulate("quadratic", "async_diloco:5:grace=0.5", "0.58,0.75,1.51,3.33", num_updates=8, num_evals=1)
    assert r.status == "complete" and np.isfinite(r.final["loss"])
    real = st.runtime.run("quadratic", "async_diloco:5:grace=0.5", "1,2", num_updates=2, time_scale=0.01)
    assert real.status == "complete"   # the window for real: tests/test_decoupled_diloco.py replays it bitwise
    with pytest.raises(ValueError, match="has a synchronization window"):
        simulate_schedule("async_diloco:5:grace=0.5", "1,2+server=1mbps", num_updates=2, payload_bytes=1000)


def test_the_notebooks_printed_clock_is_reproduced():
    """The notebook's saved output (max_wait_time 0.5, H = 20, 4 workers, evaluation every
    800 local steps = every 40 synchronizations): 'step 800 | time 209.00', ..., 'step 8000 |
    time 1998.60'. The simulator's update times at those synchronizations are the same."""
    printed = [209.00, 406.40, 603.80, 801.40, 999.00, 1207.80, 1404.20, 1600.60, 1800.20, 1998.60]
    sched = simulate_schedule("async_diloco:20:grace=0.5", "0.58,0.75,1.51,3.33", num_updates=400, seed=0)
    np.testing.assert_allclose(sched.update_time[39::40], printed, rtol=0, atol=1e-9)
    without = simulate_schedule("async_diloco:20", "0.58,0.75,1.51,3.33", num_updates=400, seed=0)
    assert np.abs(without.update_time[39::40] - printed).max() > 1.0   # the window is what makes it match
