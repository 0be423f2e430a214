"""The real runtime in one process: 8 virtual CPU devices (tests/conftest.py),
a thread per worker, the same policy objects as the simulator.

Exact checks first (a recorded trace replays in the engine to bitwise the same
parameters on CPU), then the policies' invariants on recorded traces (the
simulator's own checks from test_sim.py), then faults: a worker that raises,
a worker that goes silent, the cluster's failure model, Ctrl-C, checkpoints.
Nothing here asserts on timings: injected delays only shape the schedules.
"""

import dataclasses
import signal
import threading

import jax
import numpy as np
import pytest

import staleness as st
import staleness.runtime as rt
from staleness import policies as P
from staleness.cli import main
from test_sim import check_invariants

CLUSTER = "1*4,2.6*4+jitter=0.2"   # 4 fast workers, 4 at 1/2.6 speed
SCALE = 0.002                       # real seconds per simulated second: 2.0 / 5.2 ms iterations
POLICIES = ["bsp", "asp", "ssp:3", "dssp:3:12", "softsync:4", "backup:1"]


@pytest.fixture(scope="module")
def digits8():
    return st.tasks.get("digits-mlp", num_workers=8, batch_size=16)


def _bitwise(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def test_eight_virtual_devices():
    assert len(jax.local_devices()) == 8  # tests/conftest.py sets XLA_FLAGS before JAX starts


@pytest.mark.timeout(240)
@pytest.mark.parametrize("spec", POLICIES)
def test_recorded_trace_keeps_policy_invariants(digits8, spec):
    res = rt.run(digits8, spec, CLUSTER, num_updates=200, time_scale=SCALE, lr=0.05, seed=1)
    sched = res.schedule
    assert res.status == "complete" and sched.num_updates == 200
    check_invariants(sched, P.parse(spec), 8)
    assert sched.policy.describe() == spec and sched.meta["recorded"] == "runtime"
    # one worker per device; the history is the simulator's, times are wall seconds
    assert res.config["devices"] == [str(d) for d in jax.local_devices()]
    assert list(res.history["update"])[0] == 0 and list(res.history["update"])[-1] == 200
    assert np.all(np.diff(res.history["time"]) >= 0) and res.history["time"].iloc[-1] <= sched.end_time
    assert np.isfinite(res.train_loss).all() and len(res.train_loss) == 200
    if spec == "dssp:3:12":
        assert len(sched.rstar) > 0  # the controller ran on real push timestamps


@pytest.mark.timeout(240)
@pytest.mark.parametrize("spec, lr_rule, optimizer", [
    ("asp", "per_gradient", "momentum:0.9"),    # one-gradient path, staleness-scaled
    ("bsp", "constant", "sgd"),                 # λ-slot combine
    ("backup:1", "per_update", "adam"),         # dropped gradients, padded slots
])
def test_trace_replays_bitwise(digits8, spec, lr_rule, optimizer):
    """The contract of a recorded trace: the engine's replay (slot_mode='map')
    reproduces the real run's final parameters bit for bit on CPU."""
    kw = dict(lr=0.05, lr_rule=lr_rule, optimizer=optimizer, seed=3)
    res = rt.run(digits8, spec, CLUSTER, num_updates=80, time_scale=SCALE, **kw)
    rep = st.engine.replay(res.schedule, digits8, slot_mode="map", **kw)
    assert _bitwise(res.params, rep.params)
    # per-gradient losses are the same numbers; the per-update mean is taken in float64
    # here and in float32 by the engine, hence the last-bit tolerance
    np.testing.assert_allclose(res.train_loss, rep.train_loss, rtol=1e-6)


@pytest.mark.timeout(120)
def test_no_recompilation_across_runs(digits8):
    from staleness.runtime import numerics

    rt.run(digits8, "asp", CLUSTER, num_updates=20, time_scale=SCALE)
    sizes = (numerics._gradient_jit._cache_size(), numerics._server_update_jit._cache_size())
    rt.run(digits8, "ssp:3", CLUSTER, num_updates=20, time_scale=SCALE, seed=5)
    assert (numerics._gradient_jit._cache_size(), numerics._server_update_jit._cache_size()) == sizes


@pytest.mark.timeout(120)
def test_workers_share_devices_and_run_without_a_cluster(digits8):
    res = rt.run(digits8, "asp", None, num_workers=4, devices=2, num_updates=40)
    assert res.config["devices"] == [str(d) for d in jax.local_devices()[:2]]
    assert res.schedule.num_workers == 4 and res.schedule.cluster == ""
    check_invariants(res.schedule, P.asp(), 4)


def _failing(task, worker=3, after=2):
    """`task` whose minibatch raises inside the compiled step for one worker."""
    def boom(w, i):
        if int(w) == worker and int(i) >= after:
            raise ValueError(f"boom in worker {int(w)} at iteration {int(i)}")
        return np.int32(0)

    def sample(data, key, w, i):
        z = jax.experimental.io_callback(boom, jax.ShapeDtypeStruct((), np.int32), w, i)
        batch = task.sample_fn(data, key, w, i)
        return dict(batch, index=batch["index"] + z)

    return dataclasses.replace(task, sample_fn=sample)


@pytest.mark.timeout(120)
def test_worker_exception_stops_the_run_with_its_message():
    task = _failing(st.tasks.get("quadratic", num_workers=4))
    with pytest.raises(rt.WorkerError) as info:
        rt.run(task, "ssp:2", "1*4", num_updates=500, time_scale=SCALE)
    err = info.value
    assert err.worker == 3 and "worker 3" in str(err) and "boom in worker 3 at iteration 2" in str(err)
    assert "Traceback" in err.message
    assert err.result.status == "stopped" and err.result.schedule.num_updates < 500
    check_invariants(err.result.schedule, P.ssp(2), 4, failures=True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spec", ["asp", "bsp"])
def test_silent_worker_is_lost_and_the_gates_count_live_workers(spec):
    """Worker 3 computes for 500 s (injected); after worker_timeout it is lost,
    its in-flight gradient is recorded as lost, and the run goes on without it.
    The timeout (4 s) is far above a healthy iteration (0.01 s injected) even with
    both cores busy, and far below the silent worker's 500 s."""
    task = st.tasks.get("quadratic", num_workers=4)
    n = 2000 if spec == "asp" else 200   # ASP must still be running when the timeout fires (>= 6 s)
    res = rt.run(task, spec, "1,1,1,50000", num_updates=n, time_scale=0.01, worker_timeout=4.0)
    f = res.schedule.columns
    assert res.status == "complete" and res.schedule.num_updates == n
    lost = np.flatnonzero(f["lost"])
    assert list(f["worker"][lost]) == [3] and not np.any((f["worker"] == 3) & ~f["lost"])
    check_invariants(res.schedule, P.parse(spec), 4, failures=True)
    if spec == "bsp":  # after the loss every round averages the 3 live workers
        sizes = np.bincount(f["apply_version"][res.schedule.applied])
        assert sizes[-1] == 3


@pytest.mark.timeout(120)
def test_silent_worker_stops_the_run_when_told():
    task = st.tasks.get("quadratic", num_workers=4)
    with pytest.raises(rt.WorkerLostError, match="worker 3 lost") as info:
        rt.run(task, "asp", "1,1,1,50000", num_updates=10_000_000, time_scale=0.01, worker_timeout=4.0,
               on_worker_failure="stop")
    assert info.value.result.status == "stopped"


@pytest.mark.timeout(120)
def test_cluster_failure_model_fails_and_rejoins_workers():
    task = st.tasks.get("quadratic", num_workers=4)
    res = rt.run(task, "ssp:2", "1*4+fail=1@5-15,2@8", num_updates=150, time_scale=0.01)
    f = res.schedule.columns
    check_invariants(res.schedule, P.ssp(2), 4, failures=True)
    assert set(f["worker"][f["lost"]]) <= {1, 2}
    pushes = {w: f["push_time"][(f["worker"] == w) & ~f["lost"]] for w in range(4)}
    # worker 2 failed at 8 simulated s (0.08 s real; the server notices within a tick) and
    # never came back; worker 1 failed at 0.05 s and rejoined at 0.15 s
    assert np.all(pushes[2] < 0.08) and np.any(pushes[1] > 0.15)
    assert not np.any((pushes[1] >= 0.05) & (pushes[1] < 0.15))
    rep = st.engine.replay(res.schedule, task, slot_mode="map", lr=0.05)
    assert _bitwise(res.params, rep.params)


@pytest.mark.timeout(120)
def test_sigint_stops_every_worker_and_returns_what_was_recorded():
    task = st.tasks.get("quadratic", num_workers=4)
    calls, sent = [], []

    def ctrl_c(info):  # runs in the server loop, i.e. the main thread
        calls.append(info)
        if info["updates"] >= 20 and not sent:
            sent.append(True)
            signal.raise_signal(signal.SIGINT)

    before = threading.active_count()
    res = rt.run(task, "ssp:3", "1*4", num_updates=1_000_000, time_scale=0.005, progress=ctrl_c)
    assert res.status == "stopped" and 20 <= res.schedule.num_updates < 1_000_000
    assert threading.active_count() == before  # every worker thread ended
    check_invariants(res.schedule, P.ssp(3), 4, failures=True)
    rep = st.engine.replay(res.schedule, task, slot_mode="map", lr=0.05)
    assert _bitwise(res.params, rep.params)
    assert {"clocks", "updates_per_s", "staleness_mean", "live"} <= set(calls[0])


@pytest.mark.timeout(120)
def test_stop_event_and_max_time():
    task = st.tasks.get("quadratic", num_workers=4)
    stop = threading.Event()
    stop.set()
    assert rt.run(task, "asp", "1*4", num_updates=10_000, stop_event=stop).status == "stopped"
    res = rt.run(task, "asp", "1*4", num_updates=1_000_000, time_scale=0.01, max_time=0.3)
    assert res.status == "complete" and res.schedule.num_updates < 1_000_000


@pytest.mark.timeout(180)
def test_checkpoint_then_resume_continues_one_replayable_trace(tmp_path):
    task = st.tasks.get("quadratic", num_workers=4)
    kw = dict(time_scale=SCALE, lr=0.05, optimizer="momentum:0.9", seed=2, checkpoint=tmp_path / "ckpt")
    first = rt.run(task, "ssp:2", "1*2,2.6*2", num_updates=70, checkpoint_every=30, **kw)
    assert (tmp_path / "ckpt" / "server.json").exists()   # the one checkpoint format (staleness.infra.checkpoint)
    res = rt.run(task, "ssp:2", "1*2,2.6*2", num_updates=100, resume=True, **kw)
    sched = res.schedule
    assert sched.num_updates == 100
    # the resumed trace starts with the first run's trace up to its last checkpoint
    # (taken right after the gradient that made update 60 arrived)
    f0, f1 = first.schedule.columns, sched.columns
    k = int(np.flatnonzero(f0["apply_version"] == 59)[-1]) + 1
    for name in f0:
        np.testing.assert_array_equal(f1[name][:k], f0[name][:k], err_msg=name)
    np.testing.assert_array_equal(sched.update_time[:60], first.schedule.update_time[:60])
    assert np.all(np.diff(sched.update_time) >= 0)
    check_invariants(sched, P.ssp(2), 4, failures=True)
    rep = st.engine.replay(sched, task, slot_mode="map", lr=0.05, optimizer="momentum:0.9", seed=2)
    assert _bitwise(res.params, rep.params)
    with pytest.raises(ValueError, match="another run"):
        rt.run(task, "asp", "1*2,2.6*2", num_updates=100, resume=True, **kw)
    # a resume with a smaller budget than the checkpoint holds ran on silently, recording the smaller one
    with pytest.raises(ValueError, match="the checkpoint holds 60 updates, more than num_updates = 50"):
        rt.run(task, "ssp:2", "1*2,2.6*2", num_updates=50, resume=True, **kw)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(policy="ssp:-1"), "staleness = -1"),
    (dict(time_scale=0), "time_scale = 0"),
    (dict(on_worker_failure="ignore"), "on_worker_failure"),
    (dict(checkpoint_every=5), "checkpoint_every needs"),
    (dict(resume=True), "resume=True needs"),
    (dict(num_updates=0), "num_updates = 0"),
    (dict(devices=99), "devices = 99"),
    (dict(worker_timeout=-1), "worker_timeout = -1"),
    (dict(num_workers=3), "num_workers = 3"),
    (dict(policy="softsync:9"), "n = 9"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, fragment):
    args = dict(task="quadratic", policy="asp", cluster="1*4", num_updates=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        rt.run(args.pop("task"), args.pop("policy"), args.pop("cluster"), **args)


@pytest.mark.timeout(240)
def test_cli_run_writes_a_result_that_replays_bitwise(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--task", "quadratic", "--policy", "softsync:2", "--cluster", "1,1,2.6,2.6",
                 "--updates", "40", "--time-scale", "0.002", "--lr-rule", "per_gradient", "--no-progress",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "softsync:2" in text and "staleness_mean" in text
    res = st.Result.load(out)
    assert res.status == "complete" and res.config["runtime"] == "real" and res.schedule.num_updates == 40
    code = main(["replay", str(out), "--check"])
    assert code == 0 and "bitwise equal" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--policy", "dssp:x", "--updates", "5"], "dssp:x"),
    (["run", "--time-scale", "-1", "--cluster", "1*2", "--updates", "5"], "--time-scale"),
    (["run", "--on-worker-failure", "maybe", "--updates", "5"], "--on-worker-failure = 'maybe' must be one of"),
    (["run", "--coordinator", "127.0.0.1:1"], "--num-processes"),
    (["launch", "--local", "0"], "--local = 0"),
    (["replay", "/nonexistent/trace"], "nonexistent"),
])
def test_cli_bad_input_one_line_exit_2(argv, fragment, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:") and fragment in lines[0], err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lr_rule", ["constant", "per_gradient"])
def test_multi_slot_trace_of_a_custom_jvp_task_replays_bitwise(lr_rule):
    """softsync:2 on the quadratic (a custom_jvp gradient): the replay's map mode used
    to compute slots in a lax.map, where XLA rounds the custom_jvp's matvec otherwise
    than in the worker's standalone call (max |difference| 6e-8..2e-7 before the fix)."""
    from staleness.runtime.replay import replay_trace

    task = st.tasks.get("quadratic", num_workers=4)
    res = rt.run(task, "softsync:2", "1,1,2.6,2.6", num_updates=40, time_scale=0.002, lr=0.1, lr_rule=lr_rule)
    assert replay_trace(res)[1].bitwise


@pytest.mark.timeout(120)
def test_global_norm_clipping_replays_within_its_stated_tolerance(digits8):
    """The one known exception to bitwise trace replays on CPU: optax's
    clip_by_global_norm sums squares over every parameter, and XLA compiles that
    reduction differently standalone (the server's update) and inside the replay's
    scan when it reads a worker's gradient directly (one gradient per update):
    the last bits differ. Stated tolerance: 1e-6 absolute on weights of order 0.1."""
    from staleness.runtime.replay import replay_trace

    res = rt.run(digits8, "asp", CLUSTER, num_updates=30, time_scale=SCALE, optimizer="adamw:lr=1e-3,clip=1")
    _, cmp = replay_trace(res)
    assert cmp.within(1e-6), cmp
    res = rt.run(digits8, "bsp", CLUSTER, num_updates=10, time_scale=SCALE, optimizer="adamw:lr=1e-3,clip=1")
    assert replay_trace(res)[1].bitwise   # aggregated updates: the same compiled reduction on both sides
