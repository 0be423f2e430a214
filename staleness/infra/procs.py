"""Stopping child processes that run in their own sessions (`start_new_session=True`).

A hung JAX process ignores SIGTERM, so every launcher (`staleness sweep
--launch-local`, `staleness pipeline --launch-local`, `staleness.runtime.multiprocess`)
stops its processes the same way: SIGKILL to each one's process group, then wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

__all__ = ["descendants", "kill_groups"]


def kill_groups(procs, grace: float = 0.0, wait: float = 10.0) -> None:
    """SIGKILL the process group of every process of `procs` still running, then reap them.

    Args:
      procs: `subprocess.Popen`s started with `start_new_session=True` (pid = their group).
      grace: seconds to give them to end on their own first (polled every 0.1 s).
      wait: seconds to wait for each one after the kill.
    """
    end = time.monotonic() + grace
    while time.monotonic() < end and any(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):   # already gone, or its group was reused
                pass
    for p in procs:
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children, ...), read from /proc;
    e.g. the coordination service a process 0 starts, or a launcher's processes."""
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


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
