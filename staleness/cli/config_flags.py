"""Command-line flags generated from a settings dataclass, and back.

A library's settings value (e.g. `staleness.runtime.spec.Settings`) describes each field's flag in its
metadata (`staleness.infra.settings.flag` / `no_flag`). The flags convert text to values only; the library
checks the values (once), and `staleness.cli.main` shows its `checks.ArgumentError` with the flag
(`Parser.flag_of`), since each flag's destination is its field's name.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, NamedTuple

__all__ = ["Flag", "flags_of", "add_flags", "flag_argv", "values_of", "check_values", "integer", "number"]


class Flag(NamedTuple):
    """One command-line option: `flag` ('--updates'), `dest` (the attribute of the parsed
    arguments), `kind` (an argparse type, or 'flag' for one that takes no value),
    `default` and `help`."""

    flag: str
    dest: str
    kind: Any
    default: Any
    help: str


def integer(text: str) -> int:
    """argparse type: text as an int (its range is the library's to check)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def number(text: str) -> float:
    """argparse type: text as a float (its range, finiteness included, is the library's to check)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


_KINDS = {int: integer, float: number, str: str, bool: "flag"}


def flags_of(cls, names=None, **overrides) -> list[Flag]:
    """The flags of dataclass `cls`'s fields that have one, in field order (a TypeError
    for a field whose metadata says nothing about the command line). `names`: only
    these fields, in this order (a command that offers some of them; a ValueError for
    one without a flag). `overrides`: field name -> dict of 'help' and/or 'default', what
    one command says or defaults to differently (e.g. `replay`: the recorded run's)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for f in fields.values():
        if "cli" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name}: its metadata has no 'cli' key (its flag, or None)")
    unknown = set(overrides) - set(fields) | set(names or ()) - set(fields)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    out = []
    for name in names if names is not None else fields:
        f = fields[name]
        cli = f.metadata["cli"]
        if cli is None:
            if names is not None:
                raise ValueError(f"{cls.__name__}.{name} has no flag ({f.metadata.get('no_flag', '')})")
            continue
        cli = {**cli, **overrides.get(name, {})}
        default = cli["default"] if "default" in cli else (None if f.default is dataclasses.MISSING else f.default)
        out.append(Flag(cli.get("flag", "--" + f.name.replace("_", "-")), f.name, _KINDS[cli["kind"]], default,
                        cli["help"]))
    return out


def add_flags(parser, flags: list[Flag]) -> None:
    """Add `flags` to an argparse parser."""
    for flag, dest, kind, default, help_ in flags:
        if kind == "flag":
            parser.add_argument(flag, dest=dest, action="store_true", help=help_)
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=default, help=help_,
                                metavar=flag.lstrip("-").replace("-", "_").upper())   # --updates UPDATES


def flag_argv(args, flags: list[Flag]) -> list[str]:
    """The arguments that give parsed `args` its values of `flags` (those not at their default)."""
    argv: list[str] = []
    for flag, dest, kind, default, _ in flags:
        value = getattr(args, dest)
        if kind == "flag":
            if value:
                argv.append(flag)
        elif value is not None and value != default:
            argv += [flag, str(value)]
    return argv


def values_of(args, cls, names=None) -> dict:
    """The values of `cls`'s flagged fields (or of those in `names`) in parsed `args`, by
    field name (keyword arguments for `cls` or the function it describes)."""
    return {f.dest: getattr(args, f.dest) for f in flags_of(cls, names)}


def check_values(args, cls, check, names=None, **fixed):
    """`check(cls(**fixed, **values))` of the settings given as flags (all of `cls`'s, or
    those in `names`): the library checks each value once, before JAX starts or a task is
    built, and its `checks.ArgumentError` is shown with the flag (exit 2)."""
    return check(cls(**fixed, **values_of(args, cls, names)))
