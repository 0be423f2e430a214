"""The spec grammar of the command line: one parser for policies, lr rules and optimizers.

    NAME[:ARG[:ARG...]][+MODIFIER[+MODIFIER...]]

An ARG is a value (positional, in the factory's parameter order) or
KEY=VALUE; ',' separates arguments as well as ':' (`dssp:3:12`,
`dssp:3,12` and `dssp:s_low=3,r_max=12` are the same policy). A boolean
parameter is also set by a bare word anywhere in the list: `nocap` sets
cap=False, `dynamic` sets dynamic=True. A MODIFIER has the same form (`adam:lr=1e-3+cosine`).

Omitted arguments take the defaults of the Python factory the spec names; one without a default must be
given. Every error is a `SpecError` (a ValueError) that quotes the whole spec, names the bad part and says
what is valid. The cluster grammar is a different language (`staleness.cluster.parse`).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from staleness.infra.checks import format_number

__all__ = ["Spec", "SpecError", "split", "call", "format_args", "import_user_module"]

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class SpecError(ValueError):
    """A malformed spec string (one line: what was given, what is valid)."""


class Spec(NamedTuple):
    """One parsed `NAME:ARGS` part of a spec string."""

    name: str                        # lower-case, '-' read as '_'
    args: tuple[str, ...]            # positional values, in order
    kwargs: tuple[tuple[str, str], ...]   # KEY=VALUE pairs, in order (keys lower-case)


def _part(text: str, what: str, whole: str) -> Spec:
    name, _, rest = text.partition(":")
    name = name.strip().lower().replace("-", "_")
    if not name:
        raise SpecError(f"{what} = {whole!r}: the name is empty")
    args, kwargs = [], []
    if _:
        tokens = [t.strip() for t in rest.replace(",", ":").split(":")]
        if any(not t for t in tokens):
            raise SpecError(f"{what} = {whole!r}: an argument of {name!r} is empty")
        for t in tokens:
            key, eq, value = t.partition("=")
            if eq:
                key = key.strip().lower().replace("-", "_")
                if not key or not value.strip():
                    raise SpecError(f"{what} = {whole!r}: {t!r} must look like KEY=VALUE")
                if key in dict(kwargs):
                    raise SpecError(f"{what} = {whole!r}: {key!r} is given twice")
                kwargs.append((key, value.strip()))
            elif kwargs and not t.replace("_", "").isalpha():
                raise SpecError(f"{what} = {whole!r}: positional {t!r} after KEY=VALUE arguments")
            else:
                args.append(t)   # a value, or a flag (a bare word: allowed anywhere)
    return Spec(name, tuple(args), tuple(kwargs))


def split(text: Any, what: str) -> tuple[Spec, tuple[Spec, ...]]:
    """`text` -> (its main part, its '+' modifiers). `what` names the argument in errors."""
    if not isinstance(text, str):
        raise SpecError(f"{what} = {text!r} must be a spec string")
    if not text.strip():
        raise SpecError(f"{what} = {text!r} is empty")
    parts = text.split("+")
    if any(not p.strip() for p in parts):
        raise SpecError(f"{what} = {text!r}: an empty part between '+' signs")
    main, *mods = (_part(p.strip(), what, text) for p in parts)
    return main, tuple(mods)


def _convert(value: str, default: Any, annotation: Any, key: str, name: str, what: str, whole: str):
    kind = type(default) if default is not inspect.Parameter.empty and default is not None else None
    if kind is None and isinstance(annotation, str):
        kind = {"int": int, "float": float, "bool": bool, "str": str}.get(annotation.split("|")[0].strip())
    try:
        if kind is bool:
            low = value.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError
        if kind is int:
            return int(value)
        if kind is float:
            x = float(value)
            if not math.isfinite(x):
                raise ValueError
            return x
    except ValueError:
        if isinstance(annotation, str) and "str" in (a.strip() for a in annotation.split("|")):
            return value   # e.g. `float | str`: a word the factory checks (grace='adaptive')
        want = {bool: "true or false", int: "an integer", float: "a finite number"}[kind]
        raise SpecError(f"{what} = {whole!r}: {name} {key} = {value!r} must be {want}") from None
    return value


def call(spec: Spec, factory: Callable, what: str, whole: str, *, positional: tuple[str, ...] | None = None,
         renames: Mapping[str, str] | None = None):
    """Call `factory` with the arguments of `spec`, converted to the types of its defaults.

    positional: the parameter names positional values bind to, in order
    (default: every parameter of the factory). renames: spec keys that are
    short names of factory parameters (e.g. {"wd": "weight_decay"}).
    Raises SpecError for unknown keys, too many values, bad numbers, or a
    required parameter left out; a ValueError of the factory (a value out of
    range) is re-raised as a SpecError quoting the spec.
    """
    params = {p.name: p for p in inspect.signature(factory).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    order = list(positional if positional is not None else params)
    renames = dict(renames or {})
    valid = ", ".join(order + [k for k in params if k not in order]) or "none"
    bools = [k for k, p in params.items() if isinstance(p.default, bool)]
    kwargs: dict[str, Any] = {}
    args = list(spec.args)
    slot = 0
    for a in args:
        low = a.lower()
        flag = next((k for k in bools if low in (k, f"no{k}", f"no_{k}")), None)
        if flag is not None:
            kwargs[flag] = low == flag
            continue
        if slot >= len(order):
            if not order:
                raise SpecError(f"{what} = {whole!r}: {spec.name!r} takes no positional value ({a!r}); give its "
                                f"arguments as KEY=VALUE: {valid}")
            raise SpecError(f"{what} = {whole!r}: too many positional values for {spec.name!r} (it takes "
                            f"{len(order)}: {', '.join(order)}); give the others as KEY=VALUE: {valid}")
        key = order[slot]
        slot += 1
        kwargs[key] = _convert(a, params[key].default, params[key].annotation, key, spec.name, what, whole)
    for key, value in spec.kwargs:
        key = renames.get(key, key)
        if key not in params:
            raise SpecError(f"{what} = {whole!r}: {spec.name!r} has no argument {key!r}; its arguments are {valid}")
        if key in kwargs:
            raise SpecError(f"{what} = {whole!r}: {key!r} is given twice")
        kwargs[key] = _convert(value, params[key].default, params[key].annotation, key, spec.name, what, whole)
    missing = [k for k, p in params.items() if p.default is inspect.Parameter.empty and k not in kwargs]
    if missing:
        raise SpecError(f"{what} = {whole!r}: {spec.name!r} needs {', '.join(missing)} "
                        f"(e.g. '{spec.name}:{':'.join('N' for _ in missing)}')")
    try:
        return factory(**kwargs)
    except SpecError:
        raise
    except (ValueError, TypeError) as e:
        raise SpecError(f"{what} = {whole!r}: {str(e).splitlines()[0]}") from None


def format_args(values: list[tuple[str, Any]]) -> str:
    """':'-joined values for `describe()` methods ("3:12"); floats in shortest form."""
    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        return format_number(v) if isinstance(v, float) else str(v)

    return ":".join(fmt(v) for _, v in values)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports


def import_user_module(module: str, what: str, error: type[Exception] = ValueError, hint: str = ""):
    """Import the user's module a spec names (`what`: the spec, e.g. "policy = 'm:f'"): one
    that is not on the path, or that fails to import, is an `error` naming it (`hint` follows
    the not-found message)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):
            raise error(f"{what}: no module named {module!r} (is its directory on PYTHONPATH?){hint}") from None
        raise error(f"{what}: importing {module!r} failed: {e}") from e
    except ImportError as e:
        raise error(f"{what}: importing {module!r} failed: {e}") from e
