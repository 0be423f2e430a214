"""Ctrl-C that is never lost.

Python's SIGINT handler raises KeyboardInterrupt in whatever Python code runs
next. When that code is a callback whose exceptions Python ignores (JAX's
garbage-collection callback, a weakref finalizer), the interrupt is printed as
"Exception ignored in ..." and lost: `staleness compare` interrupted under load
went on and exited 0. The command line installs `handler`, which also records the
signal, and the loops that promise to stop on Ctrl-C call `check()` at their
checkpoints (before each chunk, before each run), which raises the KeyboardInterrupt
again if it was swallowed. The swallowed one is not printed (Python reports it through
`sys.unraisablehook`, which `install` wraps): a command's Ctrl-C stays one line.
Without `install()` (the Python API) nothing changes.

`deferred()` holds a Ctrl-C until a block that must not stop halfway ends (a checkpoint save).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

__all__ = ["install", "check", "clear", "handler", "deferred"]

_pending = threading.Event()


def handler(signum, frame) -> None:
    """The SIGINT handler: record the interrupt, then raise KeyboardInterrupt."""
    _pending.set()
    raise KeyboardInterrupt


def install() -> None:
    """Make `handler` the SIGINT handler (from the main thread; elsewhere a no-op, as
    only the main thread receives signals), and keep the interrupts it records from
    being printed when a callback swallows them."""
    _pending.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        if not getattr(sys.unraisablehook, "_staleness", False):
            sys.unraisablehook = _quiet_hook(sys.unraisablehook)


def _quiet_hook(previous):
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _pending.is_set():
            return   # recorded: `check` raises it again
        previous(unraisable)

    hook._staleness = True
    return hook


def check() -> None:
    """Raise KeyboardInterrupt if a Ctrl-C arrived since `install()` or `clear()`."""
    if _pending.is_set():
        raise KeyboardInterrupt


def clear() -> None:
    _pending.clear()


@contextlib.contextmanager
def deferred():
    """Run the block to its end even if Ctrl-C arrives: the interrupt is held, then raised
    as KeyboardInterrupt when the block ends (recorded for `check` under `handler`). In the
    main thread under `handler` or Python's default handler; elsewhere nothing changes."""
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous not in (handler, signal.default_int_handler):
        yield
        return
    held = []

    def hold(signum, frame) -> None:
        if previous is handler:
            _pending.set()
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
