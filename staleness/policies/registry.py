"""Policies by name: the built-in ones, the user's `register`ed ones, and
'package.module:factory' references; `parse` turns a spec string into a `Policy`.

    st.policies.register("bounded_asp", bounded_asp)     # def bounded_asp(tau: int = 4) -> Policy
    st.policies.parse("bounded_asp:8")                   # bounded_asp(tau=8), spec 'bounded_asp:8'
    st.policies.parse("my_policies:bounded_asp:tau=8")   # imports my_policies (on the Python path)

Spec grammar (`staleness.infra.specs`): NAME[:ARG...], positional ARGs bind to the
factory's parameters in order (for the built-ins, the ones in `_BUILTIN`),
KEY=VALUE to any parameter, a bare word sets a boolean (`nocap`). Every
omitted number takes the factory's default (`ssp` is `ssp(3)`). A registered
or referenced policy's spec is the string it was named by, so it parses back
to the same policy wherever its factory can be found.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

from staleness.infra import specs
from staleness.policies import factories as F
from staleness.policies.policy import Policy

__all__ = ["parse", "resolve", "register", "names", "factory", "spec_help", "recorded"]

# spec name -> (factory, the parameters positional values bind to); aliases map to the same factory.
_BUILTIN: dict[str, tuple[Callable[..., Policy], tuple[str, ...]]] = {
    "bsp": (F.bsp, ()),
    "asp": (F.asp, ()),
    "ssp": (F.ssp, ("staleness",)),
    "dssp": (F.dssp, ("s_low", "r_max")),
    "softsync": (F.softsync, ("n",)),
    "backup": (F.backup_workers, ("b",)),
    "local_sgd": (F.local_sgd, ("steps",)),
    "diloco": (F.diloco, ("steps",)),
    "async_diloco": (F.async_diloco, ("steps",)),
    "streaming_diloco": (F.streaming_diloco, ("steps",)),
    "decoupled_diloco": (F.decoupled_diloco, ("steps",)),
    "rl_sync": (F.rl_sync, ()),
    "rl_one_step_off": (F.rl_one_step_off, ()),
    "rl_async": (F.rl_async, ("eta",)),
    "rl_inflight": (F.rl_inflight, ("eta",)),
    "rl_partial": (F.rl_partial, ("eta",)),
}
_ALIASES = {"hardsync": "bsp", "backup_workers": "backup"}
_REGISTERED: dict[str, tuple[Callable[..., Policy], tuple[str, ...] | None]] = {}


def register(name: str, factory: Callable[..., Policy] | None = None, *, positional: tuple[str, ...] | None = None,
             overwrite: bool = False):
    """Make `parse(name[:ARGS])` (and `--policy NAME[:ARGS]` on every command of this
    process) build policies with `factory(**kwargs) -> Policy`.

    positional: the parameters positional spec values bind to, in order (default:
    all of the factory's). A built-in name cannot be replaced; a registered one only
    with overwrite=True. Returns the factory, so it also works as a decorator:
    `@st.policies.register("bounded_asp")`.
    """
    if not isinstance(name, str) or not name.strip() or not name.replace("_", "").isalnum():
        raise ValueError(f"register: name = {name!r} must be a non-empty word of letters, digits and '_' "
                         "(':' separates a policy's arguments)")
    name = name.lower()
    if factory is None:
        return lambda f: register(name, f, positional=positional, overwrite=overwrite)
    if not callable(factory):
        raise TypeError(f"register: factory = {factory!r} must be a callable returning a staleness.policies.Policy")
    if name in _BUILTIN or name in _ALIASES:
        raise ValueError(f"register: policy {name!r} is built in; register yours under another name")
    if name in _REGISTERED and not overwrite and _REGISTERED[name][0] is not factory:
        raise ValueError(f"register: policy {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTERED[name] = (factory, None if positional is None else tuple(positional))
    return factory


def names() -> list[str]:
    """The policy names `parse` knows: the built-ins, then the registered ones."""
    return [*_BUILTIN, *_REGISTERED]


def factory(name: str) -> Callable[..., Policy]:
    """The factory `parse(name)` calls: a built-in (or alias) or a registered name; ValueError
    naming the valid ones."""
    key = _ALIASES.get(name, name)
    if key in _BUILTIN:
        return _BUILTIN[key][0]
    if key in _REGISTERED:
        return _REGISTERED[key][0]
    raise ValueError(f"factory: name = {name!r} is not a policy name; valid: {', '.join(names())}")


def _usage(name: str, factory: Callable, positional: tuple[str, ...] | None) -> str:
    """'dssp[:S_LOW[:R_MAX]][:nocap]' from the factory's signature."""
    params = [p for p in inspect.signature(factory).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    order = list(positional) if positional is not None else [p.name for p in params]
    out = name + "".join(f"[:{k.upper()}" for k in order) + "]" * len(order)
    for p in params:
        if p.name in order:
            continue
        if isinstance(p.default, bool):
            out += f"[:{'no' if p.default else ''}{p.name}]"
        else:
            out += f"[:{p.name}={p.name.upper()}]"
    return out


def spec_help() -> str:
    """Every policy `parse` knows, with its arguments (for --help and error messages)."""
    parts = [_usage(n, f, pos) for n, (f, pos) in _BUILTIN.items()]
    parts += [_usage(n, f, pos) for n, (f, pos) in _REGISTERED.items()]
    return ", ".join(parts) + ", or package.module:factory[:ARGS]"


def _reference(text: str) -> tuple[str, str, str] | None:
    """(module, factory, args) of a 'package.module:factory[:ARGS]' spec, else None.
    A first part that is a known name is a policy name; otherwise a first part
    with a '.' or followed by an identifier (not a value) is a module."""
    module, colon, rest = text.partition(":")
    key = module.strip().lower().replace("-", "_")
    if not colon or key in _BUILTIN or key in _ALIASES or key in _REGISTERED:
        return None
    attr, _, args = rest.partition(":")
    attr = attr.strip()
    if "." in module or (attr.isidentifier() and "=" not in attr):
        return module.strip(), attr, args
    return None


def _import(text: str, module: str, attr: str) -> Callable[..., Policy]:
    if not module or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise specs.SpecError(f"policy = {text!r} must have the form 'package.module:factory[:ARGS]' (a module "
                              "on the Python path and a function in it that returns a Policy)")
    obj = specs.import_user_module(module, f"policy = {text!r}", specs.SpecError,
                                   "; or an unknown policy: valid: " + spec_help())
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise specs.SpecError(f"policy = {text!r}: module {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise specs.SpecError(f"policy = {text!r}: {attr!r} in {module!r} is not callable (a factory returning "
                              "a Policy is)")
    return obj


def _checked(policy, text: str, spec: str | None) -> Policy:
    if not isinstance(policy, Policy):
        raise specs.SpecError(f"policy = {text!r}: its factory returned {policy!r}, not a staleness.policies.Policy")
    return policy if spec is None or policy.spec == spec else dataclasses.replace(policy, spec=spec)


def resolve(policy) -> Policy:
    """A Policy given as a value or a spec string (parsed here, once, at an entry point); a
    TypeError names the argument for anything else."""
    if isinstance(policy, str):
        return parse(policy)
    if isinstance(policy, Policy):
        return policy
    raise TypeError(f"policy = {policy!r} must be a staleness.policies.Policy or a spec string such as 'ssp:3' "
                    f"(valid: {spec_help()})")


def parse(spec) -> Policy:
    """The `Policy` of a spec such as 'bsp', 'ssp:3', 'dssp:3:12', 'dssp:3:12:nocap',
    'dssp:s_low=3,r_max=12', 'softsync:4', 'backup:2', a registered name, or
    'package.module:factory[:ARGS]' (a Policy passes through unchanged).

    Raises `staleness.infra.specs.SpecError` (a ValueError) naming the bad part and listing
    the valid policies.
    """
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str):
        ref = _reference(spec.strip())
        if ref is not None:
            text = spec.strip()
            module, attr, args = ref
            factory = _import(text, module, attr)
            main, mods = specs.split(f"{attr}:{args}" if args else attr, "policy")
            if mods:
                raise specs.SpecError(f"policy = {spec!r}: a policy takes no '+' modifiers")
            return _checked(specs.call(main, factory, "policy", spec), text, text)
    main, mods = specs.split(spec, "policy")
    name = _ALIASES.get(main.name, main.name)
    if name in _BUILTIN:
        factory, positional = _BUILTIN[name]
        own = None
    elif name in _REGISTERED:
        factory, positional = _REGISTERED[name]
        own = spec.strip()
    else:
        raise specs.SpecError(f"policy = {spec!r}: unknown policy {main.name!r}; valid: {spec_help()}")
    if mods:
        raise specs.SpecError(f"policy = {spec!r}: a policy takes no '+' modifiers; valid: {spec_help()}")
    return _checked(specs.call(main, factory, "policy", spec, positional=positional), spec, own)


def recorded(spec) -> Policy:
    """The policy a schedule or trace names (its saved spec, or a Policy): `parse`d,
    or, for a spec this build cannot rebuild (a hand-written schedule, a policy
    defined in a module that is not importable here), a `Policy` of `Unknown`
    parts that replays as data and refuses to drive a simulation."""
    from staleness.policies.policy import Unknown

    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise TypeError(f"policy = {spec!r} must be a staleness.policies.Policy or its spec string")
    try:
        return parse(spec)
    except ValueError:
        return Policy(Unknown(spec), Unknown(spec), spec)
