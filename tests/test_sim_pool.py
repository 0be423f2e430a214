"""The schedules of a sweep on every core (`staleness.sim.pool`): worker processes give the
very schedules of one process, a job that cannot go to another process (or a failing worker)
falls back to this one with one warning, and a sweep whose schedules went to workers equals
the same sweep simulated here."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

import staleness as st
from staleness.sim import pool as sim_pool
from staleness.cluster import layers
from staleness.engine import sweeps

CLUSTER = st.cluster.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.1).failures([(1, 5.0, 9.0)])


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.columns.keys() == y.columns.keys()
        for k in x.columns:
            np.testing.assert_array_equal(x.columns[k], y.columns[k], err_msg=k)
        np.testing.assert_array_equal(x.update_time, y.update_time)
        assert x.policy == y.policy and x.seed == y.seed and x.end_time == y.end_time


def _jobs():
    return [dict(policy=p, cluster=CLUSTER, num_updates=300, seed=s, payload_bytes=4000)
            for p in ("asp", "ssp:3", "dssp:2:8", "bsp") for s in (0, 1, 2)]


@pytest.mark.timeout(300)
def test_worker_processes_give_the_schedules_of_one_process():
    jobs = _jobs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no fallback: the workers did it
        got = sim_pool.simulate_schedules(jobs, processes=2, min_seconds=0.0)
    _same(got, [st.simulate_schedule(**job) for job in jobs])


def test_small_or_single_core_work_stays_here(monkeypatch):
    calls = []
    monkeypatch.setattr(sim_pool, "_workers", lambda n: calls.append(n))
    sim_pool.simulate_schedules(_jobs(), processes=2)          # estimated well under MIN_SECONDS
    sim_pool.simulate_schedules(_jobs(), processes=1, min_seconds=0.0)
    assert not calls
    assert sim_pool.estimate_seconds(dict(policy="bsp", cluster=CLUSTER, num_updates=150_000)) == pytest.approx(4.0)


@pytest.mark.timeout(300)
def test_what_cannot_go_to_a_worker_is_simulated_here_with_one_warning():
    @dataclasses.dataclass(frozen=True)
    class Slower:   # a user's cluster layer defined in a function: it does not pickle
        factor: float

        def describe(self):
            return f"slower={self.factor:g}"

        def wrap(self, inner, seed, stream):
            layer = layers.Layer(inner)
            below, f = inner.compute_time, self.factor
            layer.compute_time = lambda worker, it, start: below(worker, it, start) * f
            return layer

    jobs = _jobs()[:2]
    jobs[0] = dict(jobs[0], cluster=CLUSTER.with_modifier(Slower(2.0)))
    with pytest.warns(UserWarning, match="does not pickle"):
        got = sim_pool.simulate_schedules(jobs, processes=2, min_seconds=0.0)
    _same(got, [st.simulate_schedule(**job) for job in jobs])


@pytest.mark.timeout(300)
def test_a_failing_worker_falls_back_here_and_a_dead_one_is_replaced(monkeypatch):
    jobs = _jobs()[:4]
    want = [st.simulate_schedule(**job) for job in jobs]
    sim_pool.simulate_schedules(jobs, processes=2, min_seconds=0.0)   # the pool's workers now live
    for w in sim_pool._POOL:
        w.kill()
        w.proc.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(sim_pool.simulate_schedules(jobs, processes=2, min_seconds=0.0), want)   # started afresh
    for w in sim_pool._POOL:
        w.kill()
        w.proc.wait(10)
    monkeypatch.setattr(sim_pool.sys, "executable", "/bin/false")   # every new worker process fails
    with pytest.warns(UserWarning, match="worker process failed"):
        got = sim_pool.simulate_schedules(jobs, processes=2, min_seconds=0.0)
    _same(got, want)


@pytest.mark.timeout(300)
def test_a_sweep_prepared_on_workers_equals_one_prepared_here(monkeypatch):
    task = st.tasks.get("digits-mlp", num_workers=4)
    here = sweeps.prepare(task, ["asp", "ssp:3"], CLUSTER, seeds=[0, 1], num_updates=60)
    monkeypatch.setattr(sim_pool, "MIN_SECONDS", 0.0)
    there = sweeps.prepare(task, ["asp", "ssp:3"], CLUSTER, seeds=[0, 1], num_updates=60)
    _same(list(here.schedules.values()), list(there.schedules.values()))
    assert (here.ring, here.slots, here.chunk) == (there.ring, there.slots, there.chunk)
