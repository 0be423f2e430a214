"""Child processes of one multi-process test: one deadline, output collected, hard kill.

Each process runs in its own session (a hung JAX process ignores SIGTERM, so it is
stopped with SIGKILL to its group and to every descendant, e.g. the coordination
service a process 0 starts). Every wait is bounded by the test's one deadline and
ends in `pytest.fail` with the processes' output.
"""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from staleness.infra.procs import descendants  # noqa: F401 - the tests import it from here

ROOT = Path(__file__).resolve().parents[1]


def child_env(devices: int | None = 1) -> dict:
    """The environment of a child process: CPU JAX with `devices` virtual devices
    (None: JAX's default of one, with no XLA_FLAGS), this checkout on the path,
    unbuffered output."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Procs:
    """Processes of one test, each in its own session, with collected output.

    Args:
      deadline: seconds from now by which everything the test waits on must be done.
      env: the children's environment (default `child_env()`).
    """

    def __init__(self, deadline: float, env: dict | None = None):
        self.procs, self.out, self.readers = [], [], []
        self.env = child_env() if env is None else env
        self.deadline = time.monotonic() + deadline   # one budget for everything the test waits on

    def left(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def spawn(self, argv) -> subprocess.Popen:
        p = subprocess.Popen(argv, cwd=ROOT, env=self.env, start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
        reader.start()
        self.procs.append(p)
        self.out.append(lines)
        self.readers.append(reader)
        return p

    def text(self, i: int | None = None) -> str:
        """Process i's output, or (i None) the tail of every process's, labelled."""
        if i is not None:
            return "".join(self.out[i])
        return "\n".join(f"--- process {k} ---\n" + "".join(o)[-3000:] for k, o in enumerate(self.out))

    def wait_for(self, i: int, predicate, timeout: float | None = None) -> None:
        """Until a line of process i's output satisfies `predicate` (else kill all and fail)."""
        deadline = time.monotonic() + (self.left() if timeout is None else min(timeout, self.left()))
        while time.monotonic() < deadline:
            if any(predicate(line) for line in list(self.out[i])):
                return
            if self.procs[i].poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"process {i} never printed the expected line:\n{self.text(i)[-3000:]}")

    def finish(self, timeout: float | None = None) -> list[int]:
        """The exit codes once every process ended (else kill all and fail, with their output)."""
        deadline = time.monotonic() + (self.left() if timeout is None else min(timeout, self.left()))
        try:
            for p in self.procs:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("processes did not finish before the deadline:\n" + self.text())
        for r in self.readers:  # the pipes close when the processes exit: read them to the end
            r.join(timeout=10)
        return [p.returncode for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            for pid in [*descendants(p.pid), p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
