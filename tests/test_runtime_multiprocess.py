"""Multi-process runs: 2-4 local processes joined through `jax.distributed` on
127.0.0.1 (a free port per test), tensors through `jax.experimental.transfer`,
control messages and liveness through the coordination service.

Every process runs under a hard kill: each test's processes are in their own
sessions and are SIGKILLed (a hung JAX process ignores SIGTERM) when the test's
deadline passes. Nothing here asserts on timings.

Run as a script, this file is the child process of the worker-exception test.
"""

import math
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _jobs import ROOT, Procs, descendants

DEADLINE = 150  # seconds: hard limit for the processes of one test
# Failure detection with margins for a loaded machine: a healthy process's heartbeats
# and gradients may be held up for seconds when other jobs compete for the cores (a
# 1 s heartbeat, which --worker-timeout 2 implies, is not enough); a killed process is
# still seen within the heartbeat timeout.
SLACK = ["--worker-timeout", "10", "--heartbeat-timeout", "3"]


@pytest.fixture
def procs():
    p = Procs(DEADLINE)
    yield p
    p.kill()


def _job(procs, n, run_args):
    from staleness.runtime.multiprocess import free_port

    port = free_port()
    for i in range(n):
        procs.spawn([sys.executable, "-m", "staleness", "run", "--coordinator", f"127.0.0.1:{port}",
                     "--num-processes", str(n), "--process-id", str(i), *run_args])


def _check_result(out, policy, workers, failures=False):
    import jax

    import staleness as st
    from test_sim import check_invariants

    res = st.Result.load(out)
    check_invariants(res.schedule, st.policies.parse(policy), workers, failures=failures)
    task = st.tasks.get(res.config["task"], num_workers=workers, batch_size=res.config["batch_size"])
    rep = st.engine.replay(res.schedule, task, slot_mode="map", lr=res.config["lr"], seed=res.config["seed"],
                           lr_rule=res.config["lr_rule"], optimizer=res.config["optimizer"])
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(rep.params)))
    return res


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("n, policy", [(2, "bsp"), (2, "asp"), (2, "ssp:3"), (4, "bsp"), (4, "asp"), (4, "ssp:3")])
def test_local_processes_run_policies_and_traces_replay_bitwise(procs, tmp_path, n, policy):
    out = tmp_path / "out"
    _job(procs, n, ["--task", "quadratic", "--policy", policy, "--cluster", "1*4,2.6*4", "--time-scale", "0.002",
                    "--updates", "60", "--lr-rule", "per_gradient", "--no-progress", "--out", str(out)])
    codes = procs.finish()
    assert codes == [0] * n, procs.text(0)[-3000:]
    res = _check_result(out, policy, 8)
    assert res.status == "complete" and res.schedule.num_updates == 60
    assert res.config["processes"] == n
    # worker w ran in process w % n: every process pushed gradients
    assert set(np.unique(res.schedule.columns["worker"] % n)) == set(range(n))


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("mode", ["continue", "stop"])
def test_killed_worker_process_is_detected_and_handled_as_configured(procs, tmp_path, mode):
    """Process 2 of 3 (workers 2 and 5) is SIGKILLed mid-run; process 0 notices
    through the coordination service (heartbeat timeout 3 s) and either goes on
    with the other 4 workers or stops with an error naming the lost worker."""
    out = tmp_path / "out"
    _job(procs, 3, ["--task", "quadratic", "--policy", "asp", "--cluster", "1*6", "--time-scale", "0.05",
                    "--updates", "700", "--lr", "0.01", *SLACK, "--on-worker-failure", mode,
                    "--out", str(out)])
    procs.wait_for(0, lambda line: line.split("/", 1)[0].strip().isdigit() and int(line.split("/")[0]) >= 60)
    os.killpg(procs.procs[2].pid, signal.SIGKILL)
    codes = procs.finish()
    text = procs.text(0)
    assert codes[2] == -signal.SIGKILL and codes[1] == 0, procs.text(1)[-2000:]
    if mode == "continue":
        assert codes[0] == 0, text[-3000:]
        res = _check_result(out, "asp", 6, failures=True)
        f = res.schedule.columns
        assert res.status == "complete" and res.schedule.num_updates == 700
        lost = f["lost"]
        assert set(f["worker"][lost]) <= {2, 5}
        for w in (2, 5):  # nothing from the dead process after its loss was recorded
            t_lost = f["end"][lost & (f["worker"] == w)]
            if len(t_lost):
                assert not np.any((f["worker"] == w) & ~lost & (f["push_time"] > t_lost[0]))
        assert np.sum(np.isin(f["worker"], [0, 1, 3, 4]) & (f["push_time"] > np.nanmax(f["end"][lost]))) > 0
    else:
        assert codes[0] == 1, text[-3000:]
        # detected by the heartbeat (names the process) or by worker_timeout (no gradient)
        error = [line for line in text.splitlines() if line.startswith("staleness: error:")]
        assert len(error) == 1 and ("worker 2 lost" in error[0] or "worker 5 lost" in error[0]), text[-3000:]
        import staleness as st

        assert st.Result.load(out).status == "stopped"


@pytest.mark.timeout(DEADLINE + 30)
def test_collective_bsp_across_processes_equals_the_one_process_run_and_replays(procs, tmp_path):
    """sync='collective' over 2 processes x 2 CPU devices (gloo all-reduce across the
    processes) == the one-process collective run on 4 devices, within float32
    rounding (gloo adds in another order; observed max |diff| 3e-8 on digits-mlp),
    and its trace, recorded by process 0, replays within the same tolerance."""
    import jax

    import staleness as st
    from _jobs import child_env

    procs.env = child_env(None)   # --cpu-devices decides
    one, two = tmp_path / "one", tmp_path / "two"
    args = ["--task", "quadratic", "--policy", "bsp", "--sync", "collective", "--updates", "40", "--lr", "0.01",
            "--lr-rule", "per_gradient", *SLACK, "--no-progress"]
    procs.spawn([sys.executable, "-m", "staleness", "run", "--cpu-devices", "4", *args, "--out", str(one)])
    _job(procs, 2, [*args, "--cpu-devices", "2", "--out", str(two)])
    codes = procs.finish()
    assert codes == [0, 0, 0], procs.text()
    a, b = st.Result.load(one), st.Result.load(two)
    assert b.status == "complete" and b.schedule.num_updates == 40
    assert b.config["processes"] == 2 and b.config["sync"] == "collective"
    assert [d.split(":")[0] for d in b.config["devices"]] == ["p0", "p0", "p1", "p1"], b.config["devices"]
    for col in ("worker", "iteration", "pull_version", "apply_version"):
        assert np.array_equal(a.schedule.columns[col], b.schedule.columns[col]), col
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.train_loss, a.train_loss, rtol=1e-5, atol=1e-6)
    task = st.tasks.get("quadratic", num_workers=4, batch_size=b.config["batch_size"])
    rep = st.engine.replay(b.schedule, task, slot_mode="map", lr=b.config["lr"], seed=b.config["seed"],
                           lr_rule=b.config["lr_rule"], optimizer=b.config["optimizer"])
    for x, y in zip(jax.tree.leaves(rep.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(DEADLINE + 30)
def test_a_collective_job_resumes_from_its_checkpoint_bitwise(procs, tmp_path):
    """A 2-process collective job checkpoints at update 20 (process 0 writes; every
    process reads it on resume) and a new job resumes it to 50: bitwise the job that ran
    to 50 at once (the same rounds, the same all-reduce order)."""
    import jax

    import staleness as st

    ck, whole, resumed = tmp_path / "ck", tmp_path / "whole", tmp_path / "resumed"
    base = ["--task", "quadratic", "--policy", "bsp", "--sync", "collective", "--lr", "0.01", "--optimizer",
            "momentum:0.9", *SLACK, "--no-progress"]
    _job(procs, 2, [*base, "--updates", "50", "--out", str(whole)])
    _job(procs, 2, [*base, "--updates", "30", "--checkpoint", str(ck), "--checkpoint-every", "20"])
    assert procs.finish() == [0] * 4, procs.text()
    _job(procs, 2, [*base, "--updates", "50", "--checkpoint", str(ck), "--resume", "--out", str(resumed)])
    assert procs.finish() == [0] * 6, procs.text()
    a, b = st.Result.load(whole), st.Result.load(resumed)
    assert b.status == "complete" and b.schedule.num_updates == 50 and b.config["processes"] == 2
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    np.testing.assert_array_equal(b.train_loss, a.train_loss)


@pytest.mark.timeout(DEADLINE + 30)
def test_a_collective_job_stops_in_every_process_after_the_same_round_at_max_time(procs, tmp_path):
    """--max-time under collectives across processes: process 0 flags the round it
    starts after its budget and every process stops after that round (none waits in
    a round the others never start): all exit 0 and the Result is complete."""
    import staleness as st

    out = tmp_path / "out"
    t0 = time.monotonic()
    _job(procs, 2, ["--task", "quadratic", "--policy", "bsp", "--sync", "collective", "--updates", "1000000",
                    "--max-time", "2", "--lr", "0.01", *SLACK, "--no-progress", "--out", str(out)])
    codes = procs.finish()
    assert codes == [0, 0], procs.text()
    assert not [line for line in procs.text(1).splitlines() if "error" in line.lower()], procs.text(1)[-3000:]
    res = st.Result.load(out)
    assert res.status == "complete" and 0 < res.schedule.num_updates < 1000000
    assert res.schedule.end_time >= 2.0
    print(f"{res.schedule.num_updates} updates in {res.schedule.end_time:.2f} s; job {time.monotonic() - t0:.1f} s")


@pytest.mark.timeout(DEADLINE + 30)
def test_a_killed_process_stops_a_collective_job_naming_its_workers(procs, tmp_path):
    """Process 1 of 3 (worker 1) is SIGKILLed during a collective job: the others'
    all-reduce fails with it, liveness names it within the heartbeat timeout (3 s),
    and both print one line naming its worker and exit 1; process 0 writes the Result
    recorded so far (status 'stopped')."""
    import staleness as st

    out = tmp_path / "out"
    _job(procs, 3, ["--task", "quadratic", "--policy", "bsp", "--sync", "collective", "--updates", "1000000",
                    "--lr", "0.01", *SLACK, "--out", str(out)])
    procs.wait_for(0, _progress_at_least(60))
    os.killpg(procs.procs[1].pid, signal.SIGKILL)
    t_kill = time.monotonic()
    codes = procs.finish()
    detected = time.monotonic() - t_kill
    assert codes == [1, -signal.SIGKILL, 1], procs.text()
    for i in (0, 2):
        text = procs.text(i)
        errors = [line for line in text.splitlines() if line.startswith("staleness: error:")]
        assert len(errors) == 1 and errors[0].startswith("staleness: error: worker 1 lost: process 1 is gone"), \
            text[-3000:]
    res = st.Result.load(out)
    assert res.status == "stopped" and res.schedule.num_updates >= 60
    assert detected < 3 + 20, detected   # the heartbeat timeout, with margin for a loaded machine
    print(f"process 1 killed: the others exited {detected:.1f} s later")


def _progress_at_least(n):
    """A predicate on output lines: the live progress line shows >= n updates."""
    def ok(line):
        head = line.split("/", 1)[0].strip().split("\r")[-1].strip()
        return head.isdigit() and int(head) >= n
    return ok


@pytest.mark.timeout(DEADLINE + 30)
def test_a_killed_process_0_ends_the_others_with_one_line_and_status_1(procs):
    """Process 0 (the server, and the parent of the coordination service) is
    SIGKILLed: the others see it leave, print one `staleness: error:` line and
    exit 1 (JAX would abort them with SIGABRT if the service died with process 0),
    and the service process goes away once they have left."""
    _job(procs, 3, ["--task", "quadratic", "--policy", "asp", "--cluster", "1*6", "--time-scale", "0.05",
                    "--updates", "100000", "--lr", "0.01", *SLACK])
    procs.wait_for(0, _progress_at_least(60))
    service = descendants(procs.procs[0].pid)
    assert len(service) == 1, service  # the coordination service's process
    os.killpg(procs.procs[0].pid, signal.SIGKILL)
    t_kill = time.monotonic()
    codes = procs.finish()
    detected = time.monotonic() - t_kill
    assert codes == [-signal.SIGKILL, 1, 1], procs.text(1)[-3000:]
    for i in (1, 2):
        text = procs.text(i)
        errors = [line for line in text.splitlines() if line.startswith("staleness: error:")]
        assert errors == [f"staleness: error: process {i}: lost the server (process 0): process left the job "
                          "(died or shut down; heartbeat timeout or disconnect)"], text[-3000:]
        assert "Check failure" not in text and "Terminating process" not in text, text[-3000:]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{service[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{service[0]}").exists(), "the coordination service outlived the job"
    print(f"process 0 killed: the others exited {detected:.1f} s later")


@pytest.mark.timeout(DEADLINE + 30)
def test_a_restarted_worker_process_rejoins_the_running_job(procs, tmp_path):
    """Process 2 of 3 (workers 2 and 5) is SIGKILLed and started again with the
    same arguments: it rejoins (a new incarnation on fresh channels), the server
    lets workers 2 and 5 back in with policy.join, they push again, the run
    completes and its trace replays bitwise."""
    from staleness.runtime.multiprocess import free_port

    out = tmp_path / "out"
    port = free_port()
    args = ["--task", "quadratic", "--policy", "asp", "--cluster", "1*6", "--time-scale", "0.05",
            "--updates", "2500", "--lr", "0.01", *SLACK, "--lr-rule", "per_gradient"]

    def argv(i):
        return [sys.executable, "-m", "staleness", "run", "--coordinator", f"127.0.0.1:{port}", "--num-processes",
                "3", "--process-id", str(i), *args, *(["--out", str(out)] if i == 0 else ["--no-progress"])]

    for i in range(3):
        procs.spawn(argv(i))
    procs.wait_for(0, _progress_at_least(150))
    os.killpg(procs.procs[2].pid, signal.SIGKILL)
    procs.spawn(argv(2))  # procs.procs[3]: process 2, second incarnation
    codes = procs.finish()
    assert codes == [0, 0, -signal.SIGKILL, 0], procs.text(0)[-3000:] + procs.text(3)[-3000:]
    res = _check_result(out, "asp", 6, failures=True)
    f = res.schedule.columns
    assert res.status == "complete" and res.schedule.num_updates == 2500
    for w in (2, 5):
        lost = f["lost"] & (f["worker"] == w)
        assert lost.sum() <= 1, "a worker is lost once (its process died once)"
        t_lost = f["end"][lost][0] if lost.any() else None
        back = (f["worker"] == w) & ~f["lost"]
        if t_lost is not None:
            back &= f["push_time"] > t_lost
        assert back.sum() > 0, f"worker {w} never pushed after its process rejoined"


def _child_failing_worker(port, n, pid):
    """A process of a job whose worker 1 raises at iteration 3 (inside its compiled step)."""
    import dataclasses

    import jax

    import staleness as st
    from staleness.runtime import WorkerError, run_process

    def boom(w, i):
        if int(w) == 1 and int(i) >= 3:
            raise ValueError(f"boom in worker {int(w)} at iteration {int(i)}")
        return np.int32(0)

    def build():  # called by run_process after jax.distributed is initialized
        base = st.tasks.get("quadratic", num_workers=4)

        def sample(data, key, w, i):
            z = jax.experimental.io_callback(boom, jax.ShapeDtypeStruct((), np.int32), w, i)
            batch = base.sample_fn(data, key, w, i)
            return dict(batch, index=batch["index"] + z)

        return dataclasses.replace(base, sample_fn=sample)

    try:
        result = run_process(build, "asp", "1*4", coordinator=f"127.0.0.1:{port}", num_processes=n,
                             process_id=pid, num_updates=10_000, time_scale=0.002, init_timeout=60)
    except WorkerError as e:
        print(f"WorkerError worker={e.worker}: {e}", flush=True)
        return 3
    return 0 if result is None else 4


@pytest.mark.timeout(DEADLINE + 30)
def test_worker_exception_in_another_process_surfaces_with_its_message(procs):
    from staleness.runtime.multiprocess import free_port

    port = free_port()
    for i in range(2):
        procs.spawn([sys.executable, __file__, "fail", str(port), "2", str(i)])
    codes = procs.finish()
    text = procs.text(0)
    assert codes == [3, 0], text[-3000:] + procs.text(1)[-2000:]
    assert "WorkerError worker=1: worker 1 failed:" in text and "boom in worker 1 at iteration 3" in text


@pytest.mark.timeout(DEADLINE + 30)
def test_ctrl_c_on_the_launcher_stops_every_process_and_writes_the_result(procs, tmp_path):
    out = tmp_path / "out"
    launcher = procs.spawn([sys.executable, "-m", "staleness", "launch", "--local", "2", "--timeout", str(DEADLINE),
                            "--task", "quadratic", "--policy", "ssp:2", "--cluster", "1*4", "--time-scale", "0.01",
                            "--updates", "1000000", "--out", str(out)])
    procs.wait_for(0, lambda line: line.split("/", 1)[0].strip().isdigit() and int(line.split("/")[0]) >= 30)
    children = descendants(launcher.pid)
    launcher.send_signal(signal.SIGINT)
    codes = procs.finish()
    assert codes == [130], procs.text(0)[-3000:]
    for pid in children:  # every process of the job has exited
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    res = _check_result(out, "ssp:2", 4, failures=True)
    assert res.status == "stopped" and 30 <= res.schedule.num_updates < 1_000_000


# -- a peer whose arrays cannot be fetched (no processes: a fake coordination) ------------------
class _Unfetchable:
    """Stands for an array pulled from a peer that died mid-transfer: the pull
    returned it, but materializing it fails (as `jax.experimental.transfer` does)."""

    def block_until_ready(self):
        raise RuntimeError("INTERNAL: -1 = recv() failed errno: 107 Transport endpoint is not connected")

    def __float__(self):
        self.block_until_ready()

    def __array__(self, *args, **kwargs):
        self.block_until_ready()


class _FakeCoord:
    """Just enough of `coordination.Coordination` for a DistributedServerLink:
    a dict as key-value store (pushes are put there in advance) and a transfer
    'server' whose pulls return the prepared payloads."""

    process_id = 0
    incarnation = 1

    def __init__(self, messages, payloads):
        self.kv = dict(messages)
        self.payloads = payloads
        self.transfer = self
        self.listeners = []

    def get(self, name, timeout_ms=200):
        if name in self.kv:
            return self.kv.pop(name)
        time.sleep(0.01)
        return None

    def try_get(self, name):
        return None

    def set(self, name, value, overwrite=False):
        self.kv[name] = value

    def delete(self, name):
        pass

    def on_lost(self, callback):
        self.listeners.append(callback)

    def is_live(self, process):
        return True

    def address(self, *args):
        return "fake:0"

    def new_id(self):
        return 99

    def connect(self, address):
        return self

    def pull(self, handle, avals):
        return self.payloads[handle]

    def await_pull(self, handle, arrays):
        pass


def _drain(link, timeout=10.0):
    events, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = link.poll(0.05)
        if ev is not None:
            events.append(ev)
        elif len(events) >= 3:
            break
    return events


@pytest.mark.timeout(60)
def test_a_pull_that_fails_after_returning_loses_the_process_and_never_reaches_the_server():
    """Regression (killed-worker test on a loaded machine): a gradient pulled from
    a process that died mid-transfer was handed to the server as lazy arrays, and
    `build_result` crashed fetching its loss long after. The receiving thread now
    materializes every pull: the good push arrives with a float loss and the
    gradient on the server's device; the failed one loses that process's workers
    (1 and 3) and never reaches the server."""
    import jax
    import jax.numpy as jnp

    from staleness.runtime.coordination import DistributedServerLink, _msg_key
    from staleness.runtime.messages import Push, WorkerLost
    from staleness.runtime.transport import Arrival

    device = jax.local_devices()[0]
    shape = {"theta": jnp.zeros((3,), jnp.float32)}
    good = (jnp.float32(0.5), {"theta": jnp.ones((3,), jnp.float32)})
    bad = (_Unfetchable(), {"theta": _Unfetchable()})
    messages = {_msg_key("push", 1, 1, 0): Push(1, 0, 0, 0, handle=1).to_json(),
                _msg_key("push", 1, 1, 1): Push(3, 0, 0, 0, handle=2).to_json()}
    coord = _FakeCoord(messages, {1: good, 2: bad})
    link = DistributedServerLink(coord, [0, 1, 0, 1], device, shape)
    try:
        events = _drain(link)
    finally:
        link.stop()
    arrivals = [e for e in events if isinstance(e, Arrival)]
    assert [a.push.worker for a in arrivals] == [1], events
    assert type(arrivals[0].loss) is float and arrivals[0].loss == 0.5
    assert arrivals[0].grad["theta"].is_ready()
    lost = sorted(e.worker for e in events if isinstance(e, WorkerLost))
    assert lost == [1, 3], events
    assert all("pull failed" in e.reason and "errno: 107" in e.reason for e in events if isinstance(e, WorkerLost))


def test_the_recorder_holds_floats_only():
    import jax.numpy as jnp

    from staleness.driver import InFlight, Recorder

    rec = Recorder()
    f = InFlight(0, 0, 0.0, 0.0, 0)
    rec.add(0, f, 0.0, 1.0, 1.0, False, False, jnp.float32(2.5))
    rec.add(1, f, 0.0, 1.0, 1.0, False, False, 1.25)
    rec.add(2, f, 0.0, 1.0, math.nan, False, True, None)
    assert [type(x) for x in rec.losses] == [float, float, float]
    assert rec.losses[:2] == [2.5, 1.25] and math.isnan(rec.losses[2])


def _child_dies_mid_transfer(port, pid, out):
    """A process of a 2-process job whose worker 1 (process 1) announces its third
    gradient without ever offering its arrays and is SIGKILLed right after: the
    server's pull of that gradient returns (lazily, as pulls do) and can only fail,
    however the two processes happen to be scheduled. (Offering the arrays before the
    kill let a loaded machine finish the transfer first: then nothing failed, and the
    run could end before the heartbeat noticed the dead process.)"""
    import dataclasses

    from staleness.runtime import coordination, run_process

    if pid == 1:
        push = coordination.DistributedWorkerLink.push

        def push_then_die(self, msg, loss, grad):
            if msg.iteration < 2:
                return push(self, msg, loss, grad)
            self._send(dataclasses.replace(msg, handle=self.coord.new_id()))
            os.kill(os.getpid(), signal.SIGKILL)

        coordination.DistributedWorkerLink.push = push_then_die
    # time_scale 0.05: worker 0 still has more than 2 s of iterations to run when worker 1
    # dies (the loss is recorded on the failed pull, well within that)
    result = run_process(_padded_quadratic, "asp", "1,4", coordinator=f"127.0.0.1:{port}", num_processes=2,
                         process_id=pid, num_updates=60, time_scale=0.05, lr=0.05, worker_timeout=20,
                         init_timeout=60)
    if pid == 0:
        result.save(out)
        print(f"RESULT {result.status} {result.schedule.num_updates}", flush=True)
    return 0


PAD = 1_000_000  # float32 entries of an unused parameter: every gradient is 4 MB (a transfer takes a while)


def _padded_quadratic():
    """The quadratic task with a large unused parameter (its gradient is zero)."""
    import dataclasses

    import jax.numpy as jnp

    import staleness as st

    base = st.tasks.get("quadratic", num_workers=2)
    return dataclasses.replace(base, init_fn=lambda key: dict(base.init_fn(key), pad=jnp.zeros((PAD,), jnp.float32)))


@pytest.mark.timeout(DEADLINE + 30)
def test_a_worker_process_dying_mid_transfer_is_lost_and_the_result_replays(procs, tmp_path):
    import jax

    import staleness as st
    from staleness.runtime.multiprocess import free_port

    out = tmp_path / "out"
    port = free_port()
    for i in range(2):
        procs.spawn([sys.executable, __file__, "midpull", str(port), str(i), str(out)])
    codes = procs.finish()
    text = procs.text(0)
    assert codes == [0, -signal.SIGKILL], text[-3000:]
    assert "RESULT complete 60" in text, text[-3000:]
    res = st.Result.load(out)
    f = res.schedule.columns
    assert np.any(f["lost"] & (f["worker"] == 1)), "worker 1 was never recorded lost"
    assert np.all(np.isfinite(res.train_loss))  # every loss was fetched on arrival
    rep = st.engine.replay(res.schedule, _padded_quadratic(), slot_mode="map", lr=res.config["lr"],
                           seed=res.config["seed"], lr_rule=res.config["lr_rule"], optimizer=res.config["optimizer"])
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(res.params), jax.tree.leaves(rep.params)))


if __name__ == "__main__":
    if sys.argv[1] == "fail":
        sys.exit(_child_failing_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    if sys.argv[1] == "midpull":
        sys.exit(_child_dies_mid_transfer(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))


@pytest.mark.timeout(DEADLINE + 30)
def test_decoupled_diloco_across_processes_replays_bitwise(procs, tmp_path):
    """Decoupled DiLoCo's synchronizer window (quorum 2, a grace) in the server of process 0,
    its learners in 2 processes: every merge holds >= 2 learners and the trace replays bitwise."""
    import staleness as st
    from staleness.runtime.replay import replay_trace

    out = tmp_path / "out"
    policy = "decoupled_diloco:3:quorum=2:grace=0.5"
    _job(procs, 2, ["--task", "quadratic", "--policy", policy, "--cluster", "1,1.5,2,3", "--time-scale", "0.01",
                    "--updates", "8", "--inner-optimizer", "adamw:lr=0.01", "--no-progress", "--out", str(out),
                    *SLACK])
    codes = procs.finish()
    assert codes == [0, 0], procs.text(0)[-3000:]
    sched = st.Result.load(out).schedule
    sizes = np.bincount(sched.columns["apply_version"][sched.applied], minlength=sched.num_updates)
    assert sched.num_updates == 8 and sizes.min() >= 2
    assert replay_trace(str(out))[1].bitwise
