"""Shared pieces of the command line: errors, argument parsing, tables."""

from __future__ import annotations

import argparse
import sys

import math

__all__ = ["UsageError", "Parser", "print_table", "count", "natural", "positive", "nonnegative", "check_out"]


class UsageError(ValueError):
    """A bad command-line argument: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors (exit 2) that records each option's
    flag by its destination (`flags`), so a library's `checks.ArgumentError` about
    keyword argument `name` is shown with the flag it came from (`flag_of`)."""

    def __init__(self, *args, **kwargs):
        self.flags: dict[str, str] = {}   # destination -> its longest flag
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.option_strings:
            self.flags[action.dest] = max(action.option_strings, key=len)
        return action

    def flag_of(self, name: str) -> str:
        """The flag of keyword argument `name` ('max_time' -> '--max-time', 'num_updates'
        -> '--updates'); `name` itself when no option has it."""
        return self.flags.get(name) or self.flags.get(name.removeprefix("num_")) or name

    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _number(text: str, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def count(text: str) -> int:
    """argparse type: an integer >= 1 (updates, workers, batch sizes)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return value


def natural(text: str) -> int:
    """argparse type: an integer >= 0 (seeds)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def positive(text: str) -> float:
    """argparse type: a finite number > 0 (seconds, learning rates)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number > 0")
    return value


def nonnegative(text: str) -> float:
    """argparse type: a finite number >= 0 (tolerances, costs)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number >= 0")
    return value


def check_out(args, default=None):
    """--out as a validated Path (before any computation), or None: creatable,
    writable, not a file, and not existing staleness output unless --overwrite."""
    from staleness import files

    out = args.out if args.out is not None else default
    if out is None:
        return None
    return files.check_out(out, overwrite=bool(getattr(args, "overwrite", False)
                                               or getattr(args, "resume_compare", False)))


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


