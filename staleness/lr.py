"""Staleness-aware learning-rate rules.

A rule turns the staleness of the gradients of one server update into
dimensionless multipliers: the learning rate of gradient l is
``alpha0 * scale[l]``. Rules are small immutable values with one pure method,

    rule.scale(staleness, mask) -> multipliers

vectorized over arrays shaped ``[..., c]``: the last axis holds the c gradient
slots of one update (padded to a fixed c, so shapes stay static under
``jax.jit``), ``mask`` (bool, same shape) marks real gradients. Real slots get a
factor in (0, 1]; padded slots get exactly 0. Staleness tau is measured in
server updates (version applied minus version computed on), so it is a count
>= 0.

Rules (Rudra: Gupta et al. ICDM 2016, Zhang et al. IJCAI 2016; see PAPERS.md):

- ``constant``: 1 (plain SGD).
- ``per_gradient`` (alias ``tau``): 1/tau per gradient, 1 when tau == 0, i.e.
  ``1 / max(tau, 1)``: alpha0/tau of the IJCAI paper. Never 1/(tau+1).
- ``per_update`` (alias ``mean_tau``): ``1 / max(<tau>, 1)`` for every real
  slot of an update, <tau> the mean staleness of its real slots: alpha0/<tau>
  of the ICDM paper.
- ``delay_adaptive:N``: ``min(1, N / tau)`` (1 when tau == 0), N = number of
  workers: full steps up to tau = N, then 1/tau decay (not one of the seed
  papers' rules; a common baseline since tau of about N is normal for
  asynchronous SGD with N workers).

``per_update`` uses ``max(<tau>, 1)``: the ICDM rule alpha0/<tau> is written for
n-softsync where <tau> is about n >= 1; clamping at 1 keeps the factor in
(0, 1] when an update's gradients are fresher than one step on average (e.g.
<tau> = 0.5 would otherwise *double* the learning rate, and <tau> = 0 divide
by zero). An update with no real slot gets all zeros.

Array namespace: the result is a NumPy array for NumPy (or list) input and a
``jax.Array`` for JAX input (including tracers: rules work inside
``jax.jit``, ``vmap`` and ``lax.scan``); the namespace is picked from the
input, and this module does not import JAX itself. Negative staleness in a
real slot raises ValueError for NumPy input; it cannot be checked on traced
JAX values, so under ``jit`` it is the caller's contract (factors still stay
in [0, 1] there, but mean nothing). Shapes are static, so they are checked for
both.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

__all__ = [
    "ALIASES",
    "NAMES",
    "Constant",
    "DelayAdaptive",
    "LrRule",
    "PerGradient",
    "PerUpdate",
    "constant",
    "delay_adaptive",
    "get",
    "per_gradient",
    "per_update",
]


class LrRule(Protocol):
    """What every rule provides."""

    name: ClassVar[str]

    def scale(self, staleness: Any, mask: Any = None) -> Any: ...

    def describe(self) -> str: ...


def _namespace(x: Any):
    """jax.numpy for JAX arrays and tracers, else numpy (without importing JAX)."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(x, jax.Array):
        import jax.numpy as jnp

        return jnp
    return np


def _prepare(fn: str, staleness: Any, mask: Any):
    """(xp, tau as float, mask as bool), shape- and (NumPy only) value-checked."""
    xp = _namespace(staleness)
    if xp is np and mask is not None:
        xp = _namespace(mask)
    tau = xp.asarray(staleness)
    if tau.ndim < 1:
        raise ValueError(f"{fn}: staleness has shape {tau.shape}; need [..., c] "
                         f"with the c gradient slots of an update on the last axis")
    if mask is None:
        m = xp.ones(tau.shape, dtype=bool)
    else:
        m = xp.asarray(mask)
        if m.shape != tau.shape:
            raise ValueError(f"{fn}: mask has shape {m.shape} but staleness has shape "
                             f"{tau.shape}; they must be equal")
        if m.dtype != bool:
            m = m != 0
    if xp is np:
        if not (np.issubdtype(tau.dtype, np.integer) or np.issubdtype(tau.dtype, np.floating)
                or tau.dtype == bool):
            raise ValueError(f"{fn}: staleness has dtype {tau.dtype}; need numbers")
        real = tau[m]
        if real.size and not (np.all(np.isfinite(real)) and real.min() >= 0):
            bad = real[~(np.isfinite(real) & (real >= 0))][0].item()
            raise ValueError(f"{fn}: staleness = {bad!r} in a real (masked) slot; "
                             f"staleness must be a finite count >= 0")
        ftype = np.float64
    else:
        ftype = xp.result_type(float)  # float32 unless jax_enable_x64
    return xp, tau.astype(ftype), m


@dataclass(frozen=True)
class Constant:
    """Factor 1 for every real gradient (staleness-unaware SGD)."""

    name: ClassVar[str] = "constant"

    def scale(self, staleness: Any, mask: Any = None) -> Any:
        """[..., c] factors: 1 on real slots, 0 on padding."""
        xp, tau, m = _prepare("constant.scale", staleness, mask)
        return xp.where(m, xp.ones_like(tau), xp.zeros_like(tau))

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class PerGradient:
    """alpha0 / tau per gradient (Rudra, IJCAI 2016); alpha0 when tau == 0."""

    name: ClassVar[str] = "per_gradient"

    def scale(self, staleness: Any, mask: Any = None) -> Any:
        """[..., c] factors 1 / max(tau, 1) on real slots, 0 on padding."""
        xp, tau, m = _prepare("per_gradient.scale", staleness, mask)
        return xp.where(m, 1.0 / xp.maximum(tau, 1.0), xp.zeros_like(tau))

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class PerUpdate:
    """alpha0 / <tau> for a whole update (Rudra, ICDM 2016), <tau> clamped at 1.

    <tau> is the mean staleness over the real slots of the update (last axis).
    """

    name: ClassVar[str] = "per_update"

    def scale(self, staleness: Any, mask: Any = None) -> Any:
        """[..., c] factors: 1 / max(mean real tau, 1) on real slots, 0 on padding."""
        xp, tau, m = _prepare("per_update.scale", staleness, mask)
        zero = xp.zeros_like(tau)
        total = xp.sum(xp.where(m, tau, zero), axis=-1, keepdims=True)
        count = xp.sum(m, axis=-1, keepdims=True).astype(tau.dtype)
        mean = total / xp.maximum(count, 1.0)
        factor = 1.0 / xp.maximum(mean, 1.0)
        return xp.where(m, xp.broadcast_to(factor, tau.shape), zero)

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class DelayAdaptive:
    """min(1, num_workers / tau): full step up to tau = num_workers, then 1/tau decay."""

    num_workers: int
    name: ClassVar[str] = "delay_adaptive"

    def __post_init__(self):
        try:
            if isinstance(self.num_workers, bool):
                raise TypeError
            n = operator.index(self.num_workers)
        except TypeError:
            n = None
        if n is None or n < 1:
            raise ValueError(f"delay_adaptive: num_workers = {self.num_workers!r} must be "
                             f"an integer >= 1")
        object.__setattr__(self, "num_workers", n)

    def scale(self, staleness: Any, mask: Any = None) -> Any:
        """[..., c] factors N / max(tau, N) on real slots, 0 on padding."""
        xp, tau, m = _prepare("delay_adaptive.scale", staleness, mask)
        n = float(self.num_workers)
        return xp.where(m, n / xp.maximum(tau, n), xp.zeros_like(tau))

    def describe(self) -> str:
        return f"{self.name}:{self.num_workers}"


def constant() -> Constant:
    """Factor 1: plain SGD, staleness ignored."""
    return Constant()


def per_gradient() -> PerGradient:
    """alpha0 / tau per gradient, alpha0 at tau = 0 (Rudra, IJCAI 2016)."""
    return PerGradient()


def per_update() -> PerUpdate:
    """alpha0 / max(<tau>, 1) for all gradients of an update (Rudra, ICDM 2016)."""
    return PerUpdate()


def delay_adaptive(num_workers: int) -> DelayAdaptive:
    """min(1, num_workers / tau); num_workers an integer >= 1."""
    return DelayAdaptive(num_workers)


#: Canonical rule names accepted by :func:`get`.
NAMES = ("constant", "per_gradient", "per_update", "delay_adaptive")
#: Alternative spellings accepted by :func:`get`.
ALIASES = {"tau": "per_gradient", "mean_tau": "per_update"}


_FACTORIES = {"constant": constant, "per_gradient": per_gradient, "per_update": per_update,
              "delay_adaptive": delay_adaptive}


def get(spec: str | LrRule) -> LrRule:
    """A rule from its spec: ``constant``, ``per_gradient`` (alias ``tau``),
    ``per_update`` (alias ``mean_tau``) or ``delay_adaptive:N`` (N workers;
    grammar: `staleness.infra.specs`).

    Case and '-' vs '_' are ignored. A rule object is returned unchanged.
    ``get(rule.describe()) == rule`` for every rule. Raises
    `staleness.infra.specs.SpecError` (a ValueError) naming the bad part.
    """
    from staleness.infra import specs

    if isinstance(spec, (Constant, PerGradient, PerUpdate, DelayAdaptive)):
        return spec
    valid = ("constant, per_gradient (alias tau), per_update (alias mean_tau), "
             "delay_adaptive:NUM_WORKERS")
    main, mods = specs.split(spec, "lr_rule")
    key = ALIASES.get(main.name, main.name)
    if key not in _FACTORIES or mods:
        raise specs.SpecError(f"lr_rule = {spec!r} is not a learning-rate rule; valid: {valid}")
    return specs.call(main, _FACTORIES[key], "lr_rule", spec)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
