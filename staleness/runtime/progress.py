"""Live progress of a real run: one line with updates/s, gradients/s, the server's
busy fraction, staleness and worker clocks."""

from __future__ import annotations

import math
import sys

__all__ = ["ProgressLine", "format_progress"]


def format_progress(info: dict, max_clocks: int = 16) -> str:
    """One status line from the server's progress dict."""
    clocks = info["clocks"]
    shown = " ".join(str(c) for c in clocks[:max_clocks]) + (" ..." if len(clocks) > max_clocks else "")
    stal = info["staleness_mean"]
    stal = "-" if math.isnan(stal) else f"{stal:.2f}"
    busy = info.get("server_busy")
    busy = "" if busy is None else f"server busy {busy:.0%}  "
    grads = info.get("gradients_per_s")
    grads = "" if grads is None else f"{grads:.1f} grad/s  "
    return (f"{info['updates']}/{info['num_updates']} upd  {info['time']:.1f} s  "
            f"{info['updates_per_s']:.1f} upd/s  {grads}{busy}staleness mean {stal} max {info['staleness_max']}  "
            f"live {info['live']}/{info['workers']}  clocks [{shown}]")


class ProgressLine:
    """A progress callback that rewrites one line on a terminal (or prints lines
    to a file or pipe). Call `close()` to end the line."""

    def __init__(self, file=None, prefix: str = ""):
        self.file = file or sys.stderr
        self.prefix = prefix
        self.tty = bool(getattr(self.file, "isatty", lambda: False)())
        self._width = 0

    def __call__(self, info: dict) -> None:
        line = self.prefix + format_progress(info)
        if self.tty:
            pad = max(0, self._width - len(line))
            self.file.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        if self.tty and self._width:
            self.file.write("\n")
            self.file.flush()
            self._width = 0
