"""Multi-process runs: 2-4 local processes joined through `jax.distributed` on
127.0.0.1 (a free port per test), tensors through `jax.experimental.transfer`,
control messages and liveness through the coordination service.

Every process runs under a hard kill: each test's processes are in their own
sessions and are SIGKILLed (a hung JAX process ignores SIGTERM) when the test's
deadline passes. Nothing here asserts on timings.

Run as a script, this file is the child process of the worker-exception test.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 150  # seconds: hard limit for the processes of one test


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Procs:
    """Processes of one test, each in its own session, with collected output."""

    def __init__(self):
        self.procs = []
        self.out = []

    def spawn(self, argv):
        p = subprocess.Popen(argv, cwd=ROOT, env=_env(), start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        lines = []
        threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True).start()
        self.procs.append(p)
        self.out.append(lines)
        return p

    def text(self, i):
        return "".join(self.out[i])

    def wait_for(self, i, predicate, timeout=DEADLINE):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(line) for line in list(self.out[i])):
                return
            if self.procs[i].poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"process {i} never printed the expected line:\n{self.text(i)[-3000:]}")

    def finish(self, timeout=DEADLINE):
        deadline = time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("processes did not finish in time:\n" + "\n---\n".join(
                self.text(i)[-2000:] for i in range(len(self.procs))))
        time.sleep(0.1)  # let the reader threads drain the pipes
        return [p.returncode for p in self.procs]

    def kill(self):
        for p in self.procs:
            for pid in [*_descendants(p.pid), p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _descendants(pid):
    """Child processes of `pid` (from /proc), e.g. the processes a launcher started."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


@pytest.fixture
def procs():
    p = Procs()
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
    through the coordination service (heartbeat timeout 2 s) and either goes on
    with the other 4 workers or stops with an error naming the lost worker."""
    out = tmp_path / "out"
    _job(procs, 3, ["--task", "quadratic", "--policy", "asp", "--cluster", "1*6", "--time-scale", "0.05",
                    "--updates", "700", "--lr", "0.01", "--worker-timeout", "2", "--on-worker-failure", mode,
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
    children = _descendants(launcher.pid)
    launcher.send_signal(signal.SIGINT)
    codes = procs.finish()
    assert codes == [130], procs.text(0)[-3000:]
    for pid in children:  # every process of the job has exited
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    res = _check_result(out, "ssp:2", 4, failures=True)
    assert res.status == "stopped" and 30 <= res.schedule.num_updates < 1_000_000


if __name__ == "__main__":
    if sys.argv[1] == "fail":
        sys.exit(_child_failing_worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
