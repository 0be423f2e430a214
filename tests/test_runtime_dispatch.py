"""The parameter server at the hardware's speed: no worker threads.

Without a cluster (nothing to sleep), the serve loop's thread dispatches every
worker's pull, gradient and push (`staleness.runtime.dispatch`). Exact checks:
the recorded trace replays bitwise on CPU for every policy family, a resumed run
continues one replayable trace; the run starts no thread; a step that raises on
its device stops the run with the worker's message. Nothing asserts on timings.
"""

import dataclasses
import threading

import jax
import numpy as np
import pytest

import staleness as st
import staleness.runtime as rt
from staleness import policies as P
from test_runtime import _bitwise, digits8  # noqa: F401 - digits8 is a fixture
from test_sim import check_invariants


@pytest.mark.timeout(240)
@pytest.mark.parametrize("spec, kw", [
    ("asp", dict(lr_rule="per_gradient", optimizer="momentum:0.9")),
    ("ssp:3", dict(optimizer="adam")),
    ("dssp:3:12", {}),
    ("softsync:4", dict(lr_rule="per_update")),
    ("backup:1", dict(sync="server")),
    ("bsp", dict(sync="server", optimizer="adam")),
])
def test_a_run_without_a_cluster_starts_no_thread_and_replays_bitwise(digits8, spec, kw):
    threads = []
    kw = dict(lr=0.05, seed=3, **kw)
    res = rt.run(digits8, spec, None, num_updates=60, progress=lambda info: threads.append(threading.active_count()),
                 **kw)
    assert res.status == "complete" and res.config["transport"] == "dispatch"
    assert threads and set(threads) == {threading.active_count()}   # no worker thread ran beside the loop
    check_invariants(res.schedule, P.parse(spec), 8)
    rep = st.engine.replay(res.schedule, digits8, slot_mode="map", **{k: v for k, v in kw.items() if k != "sync"})
    assert _bitwise(res.params, rep.params)
    np.testing.assert_allclose(res.train_loss, rep.train_loss, rtol=1e-6)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("policy, inner", [("diloco:3", "adamw:lr=1e-3"),
                                           ("async_diloco:2:bound=1", "momentum:0.9,lr=0.1"),
                                           ("streaming_diloco:4:fragments=2:overlap=1:alpha=0.5", "sgd:lr=0.1")])
def test_local_update_methods_without_a_cluster_replay_bitwise(policy, inner):
    from staleness.runtime.replay import replay_trace

    task = st.tasks.get("digits-mlp", num_workers=4, batch_size=16)
    res = rt.run(task, policy, None, num_updates=8, num_workers=4, inner_optimizer=inner, seed=1)
    assert res.status == "complete" and res.config["transport"] == "dispatch"
    assert replay_trace(res)[1].bitwise


def _failing(task, worker=3, after=2):
    """`task` whose minibatch gather raises on the device for `worker` from `after` on."""
    def boom(w, i):
        if int(w) == worker and int(i) >= after:
            raise ValueError(f"boom in worker {int(w)} at iteration {int(i)}")
        return np.int32(0)

    def gather(data, index, key, w, i):
        z = jax.experimental.io_callback(boom, jax.ShapeDtypeStruct((), np.int32), w, i)
        return task.gather_fn(data, index + z, key, w, i)

    return dataclasses.replace(task, gather_fn=gather)


@pytest.mark.timeout(120)
def test_a_step_that_raises_stops_the_run_with_the_workers_message():
    task = _failing(st.tasks.get("digits-mlp", num_workers=4, batch_size=16))
    with pytest.raises(rt.WorkerError) as info:
        rt.run(task, "ssp:2", None, num_updates=500, num_workers=4, lr=0.05)
    err = info.value
    assert err.worker == 3 and "boom in worker 3 at iteration 2" in str(err) and "Traceback" in err.message
    assert err.result.status == "stopped" and err.result.schedule.num_updates < 500
    assert err.result.config["transport"] == "dispatch"
    check_invariants(err.result.schedule, P.ssp(2), 4, failures=True)


@pytest.mark.timeout(180)
def test_checkpoint_then_resume_without_a_cluster_continues_one_replayable_trace(tmp_path):
    task = st.tasks.get("digits-mlp", num_workers=4, batch_size=16)
    kw = dict(lr=0.05, optimizer="momentum:0.9", seed=2, num_workers=4, checkpoint=tmp_path / "ckpt")
    first = rt.run(task, "ssp:2", None, num_updates=70, checkpoint_every=30, **kw)
    res = rt.run(task, "ssp:2", None, num_updates=100, resume=True, **kw)
    f0, f1 = first.schedule.columns, res.schedule.columns
    k = int(np.flatnonzero(f0["apply_version"] == 59)[-1]) + 1   # rows up to the checkpoint at update 60
    for name in f0:
        np.testing.assert_array_equal(f1[name][:k], f0[name][:k], err_msg=name)
    check_invariants(res.schedule, P.ssp(2), 4, failures=True)
    rep = st.engine.replay(res.schedule, task, slot_mode="map", lr=0.05, optimizer="momentum:0.9", seed=2)
    assert _bitwise(res.params, rep.params)


def test_minibatch_indices_come_in_blocks_and_are_the_engines():
    """Numerics computes a worker's indices for INDEX_BLOCK iterations in one host call;
    every iteration's indices are still exactly `host_indices`' (what the replay uses),
    in any order, across block boundaries and back."""
    from staleness.engine import core
    from staleness.runtime.numerics import INDEX_BLOCK, Numerics
    from staleness.runtime.spec import make_spec

    task = st.tasks.get("digits-mlp", num_workers=4, batch_size=16)
    spec = make_spec(task, "asp", None, num_updates=1, num_workers=4)
    key = core.keys(0)[1]
    num = Numerics(spec.task, spec.opt, spec.rule, 1, key)
    for w, i in [(0, 0), (0, INDEX_BLOCK - 1), (0, INDEX_BLOCK), (3, 7), (0, 5), (3, 10 * INDEX_BLOCK + 3), (3, 6)]:
        got = num._index(w, i)
        assert got.dtype == np.int32 and np.array_equal(got, task.host_indices(key, w, i)), (w, i)


@pytest.mark.timeout(60)
def test_time_the_serve_loop_spends_blocked_does_not_make_workers_late():
    """A release that blocks the serve loop (as a step XLA runs inline in the
    dispatching thread does) for longer than worker_timeout: the gradients that arrived
    meanwhile are not late, so no worker is lost, and a worker that is really silent
    afterwards still is."""
    import collections
    import time

    from staleness.runtime.messages import Push
    from staleness.runtime.serve import Server
    from staleness.runtime.spec import make_spec
    from staleness.runtime.transport import Arrival, ServerLink

    class Blocking(ServerLink):
        def __init__(self):
            self.q = collections.deque()

        def release(self, msg, params):
            if msg.worker == 3 and msg.iteration == 2:
                time.sleep(1.5)   # three worker timeouts inside the serve loop's thread
            if not (msg.worker == 2 and msg.iteration >= 30):   # worker 2 goes silent later
                self.q.append(msg)

        def poll(self, timeout):
            if not self.q:
                time.sleep(timeout)
                return None
            time.sleep(0.002)   # a gradient every 2 ms: the run outlasts worker 2's timeout
            m = self.q.popleft()
            return Arrival(Push(m.worker, m.iteration, m.version, m.epoch, 1e-4, 1e-4, 0.0), 0.5, None)

        def stop(self):
            pass

    def update(params, opt_state, grads, staleness, v, zeros, workers):
        return params, opt_state

    spec = make_spec(st.tasks.get("quadratic", num_workers=4), P.asp(), None, num_updates=1000, num_workers=4,
                     eval_every=1, worker_timeout=0.5)
    server = Server(spec, link=Blocking(), update=update, params=np.zeros(1), opt_state=())
    server.start()
    assert server.serve() == "complete"
    f = server.driver.to_schedule(policy="asp", cluster="", seed=0, end_time=server.end_time, meta={}).columns
    assert list(f["worker"][f["lost"]]) == [2]   # only the silent worker, not those that pushed meanwhile
