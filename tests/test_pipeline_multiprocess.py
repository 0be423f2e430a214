"""Pipelines across processes (`staleness pipeline --launch-local K`): one stage per process,
joined by `jax.distributed` on 127.0.0.1 (a free port per launch), transfers through gloo.

Differential: the K-process run and the single-process run on K virtual devices
(`--devices`) execute the same SPMD program, so their parameters and histories are
compared bitwise. Liveness: a stage process killed with SIGKILL is reported by the
launcher. Every process runs in its own session and is SIGKILLed when the test's
deadline passes (a hung JAX process ignores SIGTERM); nothing asserts on timings but
the report of a killed stage, which must come within the heartbeat timeout.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from staleness.cli import main
from staleness.engine.result import Result

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 400   # seconds: hard limit for the processes of one test (compiles on a loaded 2-core machine)
HEARTBEAT = 5    # seconds: --heartbeat-timeout of the kill test


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Proc:
    """One command in its own session; its output collected line by line; killed at the deadline."""

    def __init__(self, argv, env, deadline):
        self.deadline = deadline
        self.p = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        self.lines = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.p.stdout.readline, "")), daemon=True).start()

    def text(self):
        return "".join(self.lines)

    def wait(self):
        try:
            return self.p.wait(timeout=max(0.1, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.p.args[3:5]} did not finish before the deadline:\n{self.text()[-3000:]}")

    def wait_for(self, pattern):
        rx = re.compile(pattern)
        while time.monotonic() < self.deadline and self.p.poll() is None:
            for line in list(self.lines):
                m = rx.search(line)
                if m:
                    return m
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"never printed {pattern!r}:\n{self.text()[-3000:]}")

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.p.wait(timeout=10)


def _pipeline(*args):
    return [sys.executable, "-m", "staleness", "pipeline", *args]


@pytest.mark.parametrize("k, schedule", [(2, "dsp"), (4, "ddg")])
def test_k_processes_equal_the_single_process_device_run(tmp_path, k, schedule):
    deadline = time.monotonic() + DEADLINE
    common = ["--schedule", schedule, "--stages", str(k), "--batches", "10", "--batch-size", "8",
              "--eval-every", "5", "--no-progress"]
    ref = Proc(_pipeline(*common, "--devices", "--out", str(tmp_path / "ref")), _env(k), deadline)
    assert ref.wait() == 0, ref.text()[-3000:]
    mp = Proc(_pipeline(*common, "--launch-local", str(k), "--out", str(tmp_path / "mp"),
                        "--launch-timeout", str(DEADLINE - 30), "--log", f"tensorboard:{tmp_path / 'tb'}"),
              _env(1), deadline)
    assert mp.wait() == 0, mp.text()[-3000:]
    assert f"{k} processes (one stage each)" in mp.text()
    runs = list((tmp_path / "tb").iterdir())   # process 0 logged the run's evaluations, the others nothing
    assert len(runs) == 1 and len(list(runs[0].glob("events.out.tfevents.*"))) == 1, runs
    a, b = Result.load(tmp_path / "ref"), Result.load(tmp_path / "mp")
    assert b.config["engine"] == "processes" and b.config["processes"] == k
    assert b.status == a.status == "complete"
    for name in ("update", "tick", "train_loss", "loss", "accuracy"):
        np.testing.assert_array_equal(b.history[name].to_numpy(), a.history[name].to_numpy(), err_msg=name)
    np.testing.assert_array_equal(b.train_loss, a.train_loss)
    pa, pb = np.load(tmp_path / "ref" / "params.npz"), np.load(tmp_path / "mp" / "params.npz")
    assert sorted(pa.files) == sorted(pb.files)
    for key in pa.files:
        np.testing.assert_array_equal(pb[key], pa[key], err_msg=key)   # bitwise


def test_a_killed_stage_process_is_reported(tmp_path):
    deadline = time.monotonic() + DEADLINE
    mp = Proc(_pipeline("--schedule", "dsp", "--stages", "2", "--batches", "100000", "--batch-size", "8",
                        "--eval-every", "20", "--launch-local", "2", "--heartbeat-timeout", str(HEARTBEAT),
                        "--launch-timeout", str(DEADLINE - 30)), _env(1), deadline)
    try:
        pid = int(mp.wait_for(r"stage 1: process (\d+)").group(1))
        stage0 = int(mp.wait_for(r"stage 0: process (\d+)").group(1))
        mp.wait_for(r"stage 1: ticks \d+/")          # stage 1 is running its chunks
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert mp.wait() == 1
        took = time.monotonic() - killed
        assert f"stage 1 (process {pid}) died: killed by signal 9 (SIGKILL)" in mp.text()
        assert took < HEARTBEAT + 15, took          # reported at once; the survivor stopped within the grace
        with pytest.raises(ProcessLookupError):      # the other stage does not outlive the launcher
            os.kill(stage0, 0)
    finally:
        mp.kill()


@pytest.mark.parametrize("argv, match", [
    (["--launch-local", "2", "--devices"], "drop --devices"),
    (["--launch-local", "2", "--stages", "3"], "give the same number"),
    (["--launch-local", "3", "--delays", "1,0"], "the schedule has 2 stages"),
    (["--coordinator", "127.0.0.1:1", "--num-processes", "2"], "together"),
    (["--coordinator", "127.0.0.1:1", "--num-processes", "3", "--process-id", "0", "--stages", "2"],
     "one process per stage"),
])
def test_bad_process_options(argv, match, capsys):
    assert main(["pipeline", "--batches", "2", *argv]) == 2
    assert match in capsys.readouterr().err


def test_exit_descriptions():
    from staleness.pipeline.multiprocess import _describe_exit

    assert _describe_exit(-9) == "killed by signal 9 (SIGKILL)"
    assert _describe_exit(3) == "exited with status 3"


def test_the_stage_killed_by_a_signal_is_reported_when_its_peer_died_of_it_first():
    """Seen in CI: stage 1 was SIGKILLed and stage 0 exited with status 2 ("connection
    reset by peer") before the launcher's next poll; the report named stage 0."""
    from staleness.pipeline.multiprocess import first_death

    assert first_death([2, -9]) == 1
    assert first_death([None, -9, 1]) == 1
    assert first_death([0, 2, None]) == 1
    assert first_death([0, None, 0]) is None
