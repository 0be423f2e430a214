"""Shared pieces of the command line: errors, argument parsing, tables."""

from __future__ import annotations

import argparse
import sys

__all__ = ["UsageError", "print_table"]


class UsageError(ValueError):
    """A bad command-line argument: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_table(rows: list[dict], file=None) -> None:
    """Print dicts as an aligned text table (columns = keys of the first row)."""
    file = file or sys.stdout
    if not rows:
        return
    keys = list(rows[0])
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, width)), file=file)
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, width)), file=file)


