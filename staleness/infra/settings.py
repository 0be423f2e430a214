"""Settings values whose fields describe their command-line flags.

A kind of run is configured by one frozen dataclass (`staleness.engine.settings.Settings`
for the simulator, `staleness.runtime.spec.Settings` for real runs), built once at the
entry point, checked once, and passed down whole. Each field says in its metadata how
the command line offers it: `flag(...)` (its help, the text-to-value conversion, and
where they differ from the library's, the flag's name and default) or `no_flag(why)`.
`staleness.cli.config_flags` generates the commands' flags from these; the values are
checked by the settings' own check function only, never by the flags.

Pure Python: nothing here imports JAX.
"""

from __future__ import annotations

__all__ = ["flag", "no_flag"]


def flag(help_: str, kind=str, **more) -> dict:
    """Field metadata of a setting the command line offers: `help_`, `kind` (the
    text-to-value conversion: int, float, str, or bool for a flag that takes no value),
    and in `more` the flag where it is not '--' + the name with dashes (`flag=`) and the
    default where the command line's differs from the library's (`default=`)."""
    return {"cli": dict(help=help_, kind=kind, **more)}


def no_flag(why: str) -> dict:
    """Field metadata of a setting the command line does not offer (`why`: what sets it)."""
    return {"cli": None, "no_flag": why}
