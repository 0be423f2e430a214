"""The last steps of a run, the same for every builder: start, serve, stop, Result (`execute`)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Callable

from staleness.engine.result import DivergenceError, Result
from staleness.runtime.errors import RunFailure, WorkerLostError
from staleness.runtime.progress import ProgressLine
from staleness.runtime.result import build_result
from staleness.runtime.serve import Diverged
from staleness.runtime.spec import RunSpec

__all__ = ["execute", "serve", "sigint_stops", "make_progress", "JOIN_SECONDS"]

JOIN_SECONDS = 10.0  # how long stopping waits for worker threads (a hung step cannot be interrupted)


@contextlib.contextmanager
def sigint_stops(stop_event: threading.Event):
    """While active (main thread only), the first Ctrl-C sets `stop_event` (the run
    stops cleanly at the next check); a second one raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if stop_event.is_set():
            raise KeyboardInterrupt
        stop_event.set()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def make_progress(progress, spec: RunSpec | None = None):
    """(callback or None, closer): progress=True prints a live line on stderr, after the
    estimate of a long RL run of `spec` (`RLTask.estimate_note`)."""
    if progress is True and spec is not None and hasattr(spec.task, "estimate_note"):
        note = spec.task.estimate_note(spec.num_updates)
        if note:
            print(note, file=sys.stderr, flush=True)
    if progress is True:
        line = ProgressLine()
        return line, line.close
    if progress in (False, None):
        return None, lambda: None
    if callable(progress):
        return progress, lambda: None
    raise ValueError(f"progress = {progress!r} must be True, False or a callable(dict)")


def serve(built, spec: RunSpec) -> Result:
    """Run the built server; turn its faults into errors that carry the Result."""
    server = built.server
    try:
        status = server.serve()
    except Diverged as e:
        raise DivergenceError(str(e), build_result(server, spec, built.config, "diverged", built.evaluate)) from None
    except RunFailure as e:
        # a collective step that hung holds every device: nothing more can be computed there
        hung = spec.sync == "collective" and isinstance(e, WorkerLostError)
        e.result = build_result(server, spec, built.config, "stopped", None if hung else built.evaluate)
        raise
    return build_result(server, spec, built.config, status, built.evaluate)


def execute(built, spec: RunSpec, stop_event: threading.Event, close_progress: Callable[[], None] = lambda: None,
            *, ready: Callable[[], bool] | None = None, main: Callable | None = None):
    """Start `built` (a `runtime.build.Built`), run `main(built, spec)` (default `serve`)
    and return what it returns; stop everything at the end, whatever happened.

    ready: called first (before Ctrl-C is caught: it may block, e.g. a barrier with
      the other processes); False ends here, returning None.
    """
    server, link = built.server, built.worker_link
    threads = []
    try:
        if ready is not None and not ready():
            return None
        with sigint_stops(stop_event):
            if server is not None:
                server.start()
            t0 = server.t0 - server.t_offset if server is not None else time.monotonic()
            delays = spec.delays(t0)
            for w, target, args in built.workers:
                t = threading.Thread(target=target, args=(*args, delays), name=f"staleness-worker-{w}", daemon=True)
                t.start()
                threads.append(t)
            return (main or serve)(built, spec)
    finally:
        if server is not None:
            server.link.stop()
        if link is not None:
            link.stopped.set()
        close_progress()
        deadline = time.monotonic() + JOIN_SECONDS
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
