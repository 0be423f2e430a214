"""Settings values whose fields describe their command-line flags.

A kind of run is configured by one frozen dataclass, built once at the entry point (`merge`), checked
once and passed down whole (ARCHITECTURE.md, "a run's settings"). Each field says in its metadata how the
command line offers it (`flag`, `no_flag`); `staleness.cli.config_flags` generates the flags from these.

Pure Python: nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses

__all__ = ["flag", "no_flag", "merge"]


def flag(help_: str, kind=str, **more) -> dict:
    """Field metadata of a setting the command line offers: `help_`, `kind` (the
    text-to-value conversion: int, float, str, or bool for a flag that takes no value),
    and in `more` the flag where it is not '--' + the name with dashes (`flag=`) and the
    default where the command line's differs from the library's (`default=`)."""
    return {"cli": dict(help=help_, kind=kind, **more)}


def no_flag(why: str) -> dict:
    """Field metadata of a setting the command line does not offer (`why`: what sets it)."""
    return {"cli": None, "no_flag": why}


def merge(kind, settings, overrides: dict, entry: str, *, exclude: tuple[str, ...] = (), given: dict | None = None):
    """The settings an entry point runs with: `settings` (a `kind` value given whole; default:
    `kind`'s defaults) with the entry point's own arguments `given` and the keyword `overrides`
    of the other fields put in, so no field is copied by hand. A TypeError names an unknown
    keyword (or a field `entry` does not take, `exclude`) and lists the valid ones; the values
    are checked by the kind's own check, after this."""
    if settings is not None and not isinstance(settings, kind):
        raise TypeError(f"{entry}: settings = {settings!r} must be a {kind.__module__}.{kind.__name__} or None")
    given = dict(given or {})
    fields = {f.name: f for f in dataclasses.fields(kind)}
    names = [n for n in fields if n not in exclude and n not in given]
    for key in overrides:
        if key not in names:
            raise TypeError(f"{entry}() got an unexpected keyword argument {key!r}; it takes settings= and "
                            f"{', '.join(names)}")
    if settings is None:
        missing = [n for n, f in fields.items() if n not in given and n not in overrides
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise TypeError(f"{entry}() needs {', '.join(missing)} (or settings=)")
        return kind(**given, **overrides)
    for key in exclude:
        if getattr(settings, key) != fields[key].default:
            raise TypeError(f"{entry}: settings.{key} = {getattr(settings, key)!r} does not apply here")
    return dataclasses.replace(settings, **given, **overrides)
