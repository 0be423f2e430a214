"""Optimizers: optax transformations everywhere, spec strings for the command line.

Any `optax.GradientTransformation` is a server (or inner, or outer) optimizer; it carries its
own learning rate, nothing multiplies it again. `resolve(optimizer, lr, horizon)` turns what a
caller passes into an `Optimizer`:

- an optax transformation: used as it is; `lr=` replaces the `learning_rate` its state holds
  (`optax.inject_hyperparams`: how a sweep varies it in one compiled program), else is an error.
- a spec string (the CLI's), grammar `staleness.infra.specs`:

      NAME[:ARGS][+SCHEDULE]
      sgd | momentum[:MOMENTUM] | nesterov[:MOMENTUM] | adam | adamw | delayed_nesterov[:N]
        | clocked_nesterov[:MOMENTUM] | muon
      ARGS as KEY=VALUE: lr, wd (weight decay), clip (global norm), warmup (updates),
      b1, b2, eps (adam, adamw), momentum (momentum, nesterov, delayed_nesterov, clocked_nesterov),
      c (delayed_nesterov: the momentum activation, default 0); muon is `optax.contrib.muon`
      (Newton-Schulz orthogonalized momentum on 2-D weights, AdamW on the others)
      SCHEDULE: constant (default) | cosine | linear  (decay to 0 over the run)

  e.g. `adamw:lr=1e-3,wd=0.1,clip=1,warmup=100+cosine`. A spec builds
  `chain([clip], direction, [weight decay], [schedule], learning rate)` with the learning rate
  in the state, so a sweep over learning rates compiles once; `adamw:lr=1e-3` gives exactly
  the updates of `optax.adamw(1e-3)`.

Built transformations are cached per (spec, horizon): the replay's compiled
program is keyed by the transformation object, so equal specs share it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["OptimizerSpec", "Optimizer", "NAMES", "SCHEDULES", "DEFAULT_LR", "TASK_OPTAX", "get", "resolve", "has_lr"]

NAMES = ("sgd", "momentum", "nesterov", "adam", "adamw", "delayed_nesterov", "clocked_nesterov", "muon")
SCHEDULES = ("constant", "cosine", "linear")
DEFAULT_LR = 0.05   # the learning rate of a spec that names none, when lr= is not given either


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """A parsed optimizer spec (immutable, hashable). `build(horizon)` makes the optax
    transformation; `describe()` writes the spec back (parseable by `get`)."""

    name: str = "sgd"
    lr: float | None = None
    momentum: float = 0.9
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    wd: float | None = None      # weight decay (adamw default: optax's 1e-4; others: none)
    clip: float | None = None    # clip_by_global_norm
    warmup: int = 0              # linear warmup from 0, in updates
    schedule: str = "constant"
    period: int = 4              # delayed_nesterov: N, arrivals per momentum step
    c: float = 0.0               # delayed_nesterov: momentum activation in [0, 1/N]

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"optimizer = {self.name!r} is not known; valid: {', '.join(NAMES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"lr schedule = {self.schedule!r} is not known; valid: {', '.join(SCHEDULES)}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum = {self.momentum!r} must be in [0, 1)")
        for key, low, high in (("b1", 0.0, 1.0), ("b2", 0.0, 1.0)):
            if not low <= getattr(self, key) < high:
                raise ValueError(f"{key} = {getattr(self, key)!r} must be in [{low:g}, {high:g})")
        if not self.eps > 0:
            raise ValueError(f"eps = {self.eps!r} must be > 0")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr = {self.lr!r} must be a finite number > 0")
        if self.wd is not None and not (math.isfinite(self.wd) and self.wd >= 0):
            raise ValueError(f"wd = {self.wd!r} must be a finite number >= 0")
        if self.clip is not None and not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip = {self.clip!r} must be a finite number > 0 (a global norm)")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup = {self.warmup!r} must be an integer >= 0 (updates)")
        if isinstance(self.period, bool) or not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"period = {self.period!r} must be an integer >= 1 (arrivals per momentum step)")
        if not 0.0 <= self.c <= 1.0 / self.period:
            raise ValueError(f"c = {self.c!r} must be in [0, 1/N] = [0, {1.0 / self.period:g}]")

    def shape(self, horizon: int | None):
        """The learning-rate multiplier as an optax schedule of the update count, or None (constant)."""
        if self.schedule == "constant" and not self.warmup:
            return None
        if horizon is None or int(horizon) < 1:
            raise ValueError(f"lr schedule {self.describe()!r} needs the run's length: a horizon >= 1 updates; "
                             f"got {horizon!r}")
        horizon = int(horizon)
        if self.warmup >= horizon and self.schedule != "constant":
            raise ValueError(f"warmup = {self.warmup} must be shorter than the run ({horizon} updates)")
        decay = {"constant": lambda n: optax.constant_schedule(1.0),
                 "cosine": lambda n: optax.cosine_decay_schedule(1.0, n),
                 "linear": lambda n: optax.linear_schedule(1.0, 0.0, n)}[self.schedule](max(1, horizon - self.warmup))
        if not self.warmup:
            return decay
        return optax.join_schedules([optax.linear_schedule(0.0, 1.0, self.warmup), decay], [self.warmup])

    def build(self, horizon: int | None = None) -> optax.GradientTransformation:
        """The optax transformation (learning rate 1.0 in its state: `Optimizer.init` sets it)."""
        # the rate is not part of the transformation (its state holds it): specs that differ
        # only in lr= share one object, so their replays share one compiled program
        return _build(dataclasses.replace(self, lr=None), None if self.shape(horizon) is None else int(horizon))

    def describe(self) -> str:
        defaults = OptimizerSpec(name=self.name)
        parts = []
        if self.name in ("momentum", "nesterov", "clocked_nesterov"):
            parts.append(f"{self.momentum:g}")
        if self.name == "delayed_nesterov":
            parts.append(str(self.period))
            if self.momentum != 0.9:
                parts.append(f"momentum={self.momentum:g}")
            if self.c:
                parts.append(f"c={self.c:g}")
        for key in ("lr", "b1", "b2", "eps", "wd", "clip", "warmup"):
            value = getattr(self, key)
            if value != getattr(defaults, key) and not (key in ("b1", "b2", "eps") and self.name not in
                                                        ("adam", "adamw")):
                parts.append(f"{key}={value:g}")
        text = self.name + (":" + ",".join(parts) if parts else "")
        return text + ("" if self.schedule == "constant" else f"+{self.schedule}")


@functools.lru_cache(maxsize=256)
def _build(spec: OptimizerSpec, horizon: int | None) -> optax.GradientTransformation:
    parts = []
    if spec.clip is not None:
        parts.append(optax.clip_by_global_norm(spec.clip))
    if spec.name in ("momentum", "nesterov"):
        parts.append(optax.trace(decay=spec.momentum, nesterov=spec.name == "nesterov"))
    elif spec.name == "delayed_nesterov":
        parts.append(delayed_nesterov(spec.momentum, spec.period, spec.c))
    elif spec.name == "clocked_nesterov":
        parts.append(clocked_nesterov(spec.momentum))
    elif spec.name in ("adam", "adamw"):
        parts.append(optax.scale_by_adam(b1=spec.b1, b2=spec.b2, eps=spec.eps))
    elif spec.name == "muon":   # its own learning rate (in the state) and weight decay; a schedule scales after it
        parts.append(optax.inject_hyperparams(optax.contrib.muon)(learning_rate=1.0, weight_decay=spec.wd or 0.0))
        shape = spec.shape(horizon)
        return optax.chain(*parts, *([] if shape is None else [optax.scale_by_schedule(shape)]))
    wd = spec.wd if spec.wd is not None else (1e-4 if spec.name == "adamw" else 0.0)
    if wd:
        parts.append(optax.add_decayed_weights(wd))
    shape = spec.shape(horizon)
    if shape is not None:
        parts.append(optax.scale_by_schedule(shape))
    parts.append(optax.inject_hyperparams(optax.scale_by_learning_rate)(learning_rate=1.0))
    return optax.chain(*parts)


class DelayedNesterovState(NamedTuple):
    count: jax.Array     # arrivals so far
    momentum: Any        # m
    buffer: Any          # Δ: the sum of the arrivals since the last momentum step


def delayed_nesterov(momentum: float = 0.9, period: int = 4, c: float = 0.0) -> optax.GradientTransformation:
    """Delayed Nesterov (Liu et al. 2024, Algorithm 3), the direction before the learning rate.

    For asynchronous outer steps: every arrival g is applied at once as g/N (plus c·β·m); every
    N-th arrival also folds the mean of the buffered arrivals into the momentum m ← β·m + Δ/N and
    applies (1 − cN + c)·β·m + g/N. With N = the number of workers and synchronous arrivals, N
    arrivals add up to one Nesterov step on their mean (what DiLoCo does synchronously). Chain it
    with a learning rate (`delayed_nesterov:N,lr=0.7` as a spec).
    """
    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return DelayedNesterovState(jnp.zeros((), jnp.int32), zeros, jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        buffer = jax.tree.map(jnp.add, state.buffer, updates)
        fire = (state.count + 1) % period == 0
        m_new = jax.tree.map(lambda m, b: jnp.where(fire, momentum * m + b / period, m), state.momentum, buffer)
        out = jax.tree.map(
            lambda m, g: jnp.where(fire, (1.0 - c * period + c) * momentum * m, c * momentum * m) + g / period,
            m_new, updates)
        buffer = jax.tree.map(lambda b: jnp.where(fire, jnp.zeros_like(b), b), buffer)
        return out, DelayedNesterovState(state.count + 1, m_new, buffer)

    return optax.GradientTransformation(init, update)


class ClockedNesterovState(NamedTuple):
    clock: jax.Array     # tokens merged since the last momentum step (int32, < a round's after a step)
    momentum: Any        # m
    buffer: Any          # Σ s·g since the last momentum step


def clocked_nesterov(momentum: float = 0.9) -> optax.GradientTransformationExtraArgs:
    """Delayed Nesterov clocked by tokens, for a synchronizer whose merges take any number of
    learners (Decoupled DiLoCo): `update(g, state, params, share=(merged, round))`, g the
    merge's (token-weighted) mean delta, `merged` the tokens it took and `round` the tokens of
    every learner's one iteration (`engine.update.round_share`), s = merged / round. The merge
    is applied at once as s·g; once a round's tokens have been merged since the last momentum
    step, the momentum folds their sum, m ← β·m + Σ s·g, and that update also moves by β·m (the
    excess tokens count toward the next). So the outer steps per second do not grow with the
    number of merges: merges of every learner (s = 1) are Nesterov's steps (`optax.trace`,
    nesterov) to the bit, merges of one learner of N equal ones are `delayed_nesterov:N`'s: to the
    bit when N is a power of two, else up to float32 rounding (s·g where it divides, g/N).
    The round is every learner's, live or not: after a failure a merge of the live learners
    is less than a round (the step shrinks with the tokens merged). Liu et al.'s
    Delayed Nesterov counts arrivals; a window merges 1 to λ of them."""
    def init(params):
        zeros = lambda: jax.tree.map(jnp.zeros_like, params)   # noqa: E731
        return ClockedNesterovState(jnp.zeros((), jnp.int32), zeros(), zeros())

    def update(updates, state, params=None, *, share=None, **extra):
        del params, extra
        if share is None:
            raise ValueError("clocked_nesterov: the update's share of a round was not given (share=): it is the "
                             "outer optimizer of local-update merges (decoupled_diloco)")
        merged, whole = (jnp.asarray(x, jnp.int32) for x in share)
        s = merged.astype(jnp.float32) / whole.astype(jnp.float32)
        part = jax.tree.map(lambda g: (s * g).astype(g.dtype), updates)
        buffer = jax.tree.map(jnp.add, state.buffer, part)
        clock = state.clock + merged
        fire = clock >= whole
        m_new = jax.tree.map(lambda m, b: jnp.where(fire, b + momentum * m, m), state.momentum, buffer)
        out = jax.tree.map(lambda m, g: jnp.where(fire, g + momentum * m, g), m_new, part)
        buffer = jax.tree.map(lambda b: jnp.where(fire, jnp.zeros_like(b), b), buffer)
        return out, ClockedNesterovState(jnp.where(fire, clock - whole, clock), m_new, buffer)

    return optax.GradientTransformationExtraArgs(init, update)


def refuse_share(opt: "Optimizer", what: str) -> None:
    """A clocked outer step (`clocked_nesterov`) reads each merge's share of a round, which
    only local-update merges give: refuse it for `what` (which has none) before computing."""
    if opt.name.split(":")[0] == "clocked_nesterov":
        raise ValueError(f"optimizer = {opt.name!r} is the outer step of local-update merges (decoupled_diloco, "
                         f"diloco, async_diloco, local_sgd); {what} has none")


def has_lr(tx: optax.GradientTransformation, params) -> bool:
    """Whether `tx`'s state holds a `learning_rate` that `Optimizer.init` can set."""
    return get_lr(jax.eval_shape(tx.init, params)) is not None


@dataclasses.dataclass(frozen=True, eq=False)
class Optimizer:
    """An optax transformation with its description and the learning rate to start from.

    tx: the transformation (a static argument of compiled programs: hashable by identity).
    name: what a Result's config records (a spec string, 'optax' for a user's object,
      `TASK_OPTAX` for the task's own).
    lr: the learning rate `init` writes into the state's `learning_rate`, or None
      (keep the transformation's own).
    """

    tx: Any
    name: str
    lr: float | None = None

    def init(self, params):
        """Optimizer state for `params`, with `lr` in it when given."""
        state = self.tx.init(params)
        return state if self.lr is None else set_lr(state, self.lr)

    def describe(self) -> str:
        return self.name


TASK_OPTAX = "optax:task"
"""What a Result's config records for the task's own optax object (`Task.optimizer`, used
when no optimizer is given): a replay that rebuilds the task uses the task's again."""


def get_lr(state):
    """The `learning_rate` held in an optimizer state (the first, if several fragments
    each hold one), or None."""
    found = optax.tree_utils.tree_get_all_with_path(state, "learning_rate")
    return found[0][1] if found else None


def set_lr(state, lr, host: bool = False):
    """`state` with every `learning_rate` in it replaced by `lr` (a float or a traced scalar);
    host=True: a NumPy value (for a state fetched to the host)."""
    xp = np if host else jnp
    return optax.tree_utils.tree_set(state, learning_rate=xp.asarray(lr, xp.asarray(get_lr(state)).dtype))


def get(spec, what: str = "optimizer") -> OptimizerSpec:
    """Parse an optimizer spec string (see the module docstring) into an OptimizerSpec;
    `what` names the argument in errors."""
    from staleness.infra import specs

    if isinstance(spec, OptimizerSpec):
        return spec
    main, mods = specs.split(spec, what)
    if main.name not in NAMES:
        raise specs.SpecError(f"{what} = {spec!r}: unknown optimizer {main.name!r}; valid: {', '.join(NAMES)} "
                              "(or pass any optax transformation from Python)")
    if len(mods) > 1 or any(m.name not in SCHEDULES or m.args or m.kwargs for m in mods):
        raise specs.SpecError(f"{what} = {spec!r}: the schedule must be one of "
                              f"{', '.join('+' + s for s in SCHEDULES)}")
    schedule = mods[0].name if mods else "constant"
    name = main.name

    def make(momentum: float = 0.9, lr: float | None = None, b1: float = 0.9, b2: float = 0.999,
             eps: float = 1e-8, wd: float | None = None, clip: float | None = None, warmup: int = 0,
             period: int = 4, c: float = 0.0):
        return OptimizerSpec(name=name, lr=lr, momentum=momentum, b1=b1, b2=b2, eps=eps, wd=wd, clip=clip,
                             warmup=warmup, schedule=schedule, period=period, c=c)

    keys = {k for k, _ in main.kwargs}
    allowed = {"lr", "learning_rate", "wd", "weight_decay", "clip", "warmup"}
    allowed |= {"momentum"} if name in ("momentum", "nesterov", "delayed_nesterov", "clocked_nesterov") else set()
    allowed |= {"period", "c"} if name == "delayed_nesterov" else set()
    allowed |= {"b1", "b2", "eps"} if name in ("adam", "adamw") else set()
    if keys - allowed:
        raise specs.SpecError(f"{what} = {spec!r}: {name!r} takes no {sorted(keys - allowed)[0]!r}; its "
                              f"arguments are {', '.join(sorted(allowed - {'learning_rate', 'weight_decay'}))}")
    positional = ("momentum",) if name in ("momentum", "nesterov", "clocked_nesterov") else ("period",) if name == "delayed_nesterov" \
        else ()
    if main.args and not positional:
        raise specs.SpecError(f"{what} = {spec!r}: {name!r} takes only KEY=VALUE arguments "
                              f"({', '.join(sorted(allowed - {'learning_rate', 'weight_decay'}))})")
    return specs.call(main, make, what, spec, positional=positional,
                      renames={"weight_decay": "wd", "learning_rate": "lr"})


def resolve(optimizer, lr: float | None = None, horizon: int | None = None, params=None) -> Optimizer:
    """An `Optimizer` from an optax transformation, a spec string or an OptimizerSpec.

    lr: the learning rate (a spec's lr= wins if it names one and lr is None; a spec
      naming none takes lr, else DEFAULT_LR). For an optax transformation, lr must
      be None unless its state holds a learning_rate (`params` is needed to check).
    horizon: updates of the run (for '+cosine', '+linear', warmup).
    """
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr)
                           or lr <= 0):
        raise ValueError(f"lr = {lr!r} must be a finite number > 0 (the learning rate)")
    if isinstance(optimizer, Optimizer):
        return optimizer if lr is None else dataclasses.replace(optimizer, lr=float(lr))
    if isinstance(optimizer, (optax.GradientTransformation, optax.GradientTransformationExtraArgs)):
        if lr is not None and params is not None and not has_lr(optimizer, params):
            raise ValueError(
                f"lr = {lr!r} cannot be applied to this optax optimizer: its state has no learning_rate. "
                "Give the learning rate to the optimizer itself, or build it with "
                "optax.inject_hyperparams(optax.adamw)(learning_rate=...) to set or sweep it from here")
        return Optimizer(optimizer, "optax", None if lr is None else float(lr))
    spec = get(optimizer)
    if spec.lr is not None and lr is not None and spec.lr != lr:
        raise ValueError(f"optimizer = {spec.describe()!r} names lr={spec.lr:g} and lr = {lr!r} was given too; "
                         "give one")
    rate = spec.lr if spec.lr is not None else (lr if lr is not None else DEFAULT_LR)
    return Optimizer(spec.build(horizon), spec.describe(), float(rate))
