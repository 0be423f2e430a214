"""The server's optimizer: an optax direction, a base learning rate and a schedule.

The server update of version u is

    g      = (1/c) Σ_l scale(τ_l) · g_l           (lr rule over the c real slots)
    d, s'  = direction.update(g, s)               (identity, momentum trace, Adam, ...)
    θ_u+1  = θ_u − α0 · shape(u) · d

With `sgd` this is Rudra's θ ← θ − (1/c) Σ α(τ_l) g_l with α(τ) = α0·scale(τ);
with momentum it equals `optax.sgd(α0·shape(u), momentum)`; with Adam,
`optax.adam(α0·shape(u))` (the lr rule then reweights gradients inside the
average, which is all a staleness rule can mean for Adam). α0 is kept out of
the optax state so a sweep can vary it per configuration without recompiling.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax

__all__ = ["ServerOptimizer", "get", "NAMES", "SCHEDULES"]

NAMES = ("sgd", "momentum", "nesterov", "adam")
SCHEDULES = ("constant", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
    """Server optimizer (immutable, hashable: it is a static argument of the replay).

    name: one of NAMES. momentum: the trace decay of momentum/nesterov.
    schedule: one of SCHEDULES, over `horizon` updates (cosine/linear decay to 0).
    """

    name: str = "sgd"
    momentum: float = 0.9
    schedule: str = "constant"
    horizon: int = 0

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"optimizer = {self.name!r} is not known; valid: {', '.join(NAMES)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"lr schedule = {self.schedule!r} is not known; valid: {', '.join(SCHEDULES)}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum = {self.momentum!r} must be in [0, 1)")

    def direction(self) -> optax.GradientTransformation:
        if self.name == "sgd":
            return optax.identity()
        if self.name in ("momentum", "nesterov"):
            return optax.trace(decay=self.momentum, nesterov=self.name == "nesterov")
        return optax.scale_by_adam()

    def shape(self, update):
        """Learning-rate multiplier of update `update` (traced int)."""
        if self.schedule == "constant":
            return jnp.float32(1.0)
        if self.horizon < 1:
            raise ValueError(f"lr schedule {self.schedule!r} has no horizon; call with_horizon(updates) first")
        frac = jnp.clip(update.astype(jnp.float32) / self.horizon, 0.0, 1.0)
        if self.schedule == "cosine":
            return 0.5 * (1.0 + jnp.cos(jnp.pi * frac))
        return 1.0 - frac

    def with_horizon(self, horizon: int) -> "ServerOptimizer":
        """This optimizer with its schedule stretched over `horizon` updates (the run's length)."""
        if self.schedule == "constant":
            return self
        if int(horizon) < 1:
            raise ValueError(f"lr schedule {self.schedule!r} needs a horizon >= 1 updates; got {horizon!r}")
        return dataclasses.replace(self, horizon=int(horizon))

    def describe(self) -> str:
        out = self.name + (f":{self.momentum:g}" if self.name in ("momentum", "nesterov") else "")
        return out + ("" if self.schedule == "constant" else f"+{self.schedule}")


def get(spec) -> ServerOptimizer:
    """Parse 'sgd', 'momentum', 'momentum:0.9', 'nesterov:0.9', 'adam', with an
    optional '+cosine' / '+linear' learning-rate schedule (grammar: `staleness.specs`)."""
    from staleness import specs

    if isinstance(spec, ServerOptimizer):
        return spec
    main, mods = specs.split(spec, "optimizer")
    if main.name not in NAMES:
        raise specs.SpecError(f"optimizer = {spec!r}: unknown optimizer {main.name!r}; valid: {', '.join(NAMES)}")
    if len(mods) > 1 or any(m.name not in SCHEDULES or m.args or m.kwargs for m in mods):
        raise specs.SpecError(f"optimizer = {spec!r}: the schedule must be one of "
                              f"{', '.join('+' + s for s in SCHEDULES)}")

    def make(momentum: float = 0.9):
        return ServerOptimizer(name=main.name, momentum=momentum, schedule=mods[0].name if mods else "constant")

    if main.name in ("sgd", "adam"):
        if main.args or main.kwargs:
            raise specs.SpecError(f"optimizer = {spec!r}: {main.name!r} takes no arguments")
        return make()
    return specs.call(main, make, "optimizer", spec)
