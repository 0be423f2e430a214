"""RL objectives: losses over one fixed-shape rollout, to minimise with any optax optimizer.

Every objective reads the same arrays of a rollout of B prompts × G completions × T positions:

    logp_new    [B, G, T]  log π_θ(token): the learner's current params θ (version u); differentiated
    logp_behav  [B, G, T]  log π_behav(token): recorded by the actor that sampled it (version v <= u)
    logp_prox   [B, G, T]  log π_prox(token): the learner's params before this update (decoupled_ppo
                           only; None means π_prox = π_behav)
    mask        [B, G, T]  1.0 on generated tokens, 0.0 on padding
    rewards     [B, G]     one scalar reward per completion

and return −(Σ mask · objective) / Σ mask: a token-level mean over the whole rollout (DAPO-style,
so a long completion weighs as many tokens as it has). The group-baseline advantage of a
completion is shared by all its tokens:

    A[b, g] = r[b, g] − mean_g' r[b, g']          (std_advantages: divided by std_g' r[b, g'] + 1e-6)

Per token, with ρ = π_θ / π_behav and clip_ε(x) = clip(x, 1 − ε, 1 + ε):

    reinforce      A · log π_θ                                  (REINFORCE / GRPO-style, no correction)
    ppo            min(ρ A, clip_ε(ρ) A)                        (PPO clip against the behavior policy)
    decoupled_ppo  w · min(ρ' A, clip_ε(ρ') A),  w = π_prox / π_behav (no gradient), ρ' = π_θ / π_prox
                                                                (AReaL; equals ppo when π_prox = π_behav)
    tis            sg(min(ρ, c)) · A · log π_θ                  (truncated importance sampling, cap c)

Expected gradients (what the bandit's float64 reference checks): on-policy (θ = behav = prox)
all four have the same gradient, and a group-mean baseline that includes the sample itself
scales it by (1 − 1/G): E[∇ loss] = −(1 − 1/G) · E_π[r ∇log π] per prompt (the mean's own
term is correlated with the sample; the others are independent and E_π[∇log π] = 0).

    obj = objectives.make("decoupled_ppo", eps=0.2)
    loss = obj.loss(logp_new, logp_behav, logp_prox, mask, rewards)     # scalar
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["OBJECTIVES", "DEFAULTS", "ADV_EPS", "Objective", "make", "check_params", "group_advantages",
           "token_mean", "reinforce", "ppo", "decoupled_ppo", "tis", "diagnostics"]

OBJECTIVES = ("reinforce", "ppo", "decoupled_ppo", "tis")
"""The objective names `make` (and the RL tasks' `objective=`) accept."""

DEFAULTS: dict[str, dict[str, Any]] = {
    "reinforce": {"std_advantages": False},
    "ppo": {"eps": 0.2, "std_advantages": False},
    "decoupled_ppo": {"eps": 0.2, "std_advantages": False},
    "tis": {"c": 2.0, "std_advantages": False},
}
"""The parameters each objective takes, with their defaults."""

ADV_EPS = 1e-6
"""Added to the group's reward std before dividing (std_advantages): a group of equal rewards
has advantage 0, not NaN."""


def group_advantages(rewards: jax.Array, std_advantages: bool = False) -> jax.Array:
    """Group-baseline advantages [B, G] of rewards [B, G]: reward − its group's mean (over G),
    divided by the group's population std + ADV_EPS when `std_advantages`."""
    adv = rewards - jnp.mean(rewards, axis=-1, keepdims=True)
    if std_advantages:
        adv = adv / (jnp.std(rewards, axis=-1, keepdims=True) + ADV_EPS)
    return adv


def token_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Σ values · mask / Σ mask over all axes (0 for an empty mask, not NaN)."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _clipped(ratio: jax.Array, adv: jax.Array, eps: float) -> jax.Array:
    return jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - eps, 1.0 + eps) * adv)


def reinforce(logp_new, logp_behav, logp_prox, mask, rewards, *, std_advantages: bool = False) -> jax.Array:
    """−mean over tokens of A · log π_θ: the on-policy policy gradient with a group baseline; stale
    data enter uncorrected (logp_behav and logp_prox are not read)."""
    del logp_behav, logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    return -token_mean(adv * logp_new, mask)


def ppo(logp_new, logp_behav, logp_prox, mask, rewards, *, eps: float = 0.2,
        std_advantages: bool = False) -> jax.Array:
    """−mean over tokens of min(ρ A, clip(ρ, 1 − eps, 1 + eps) A), ρ = π_θ / π_behav (naive PPO: the
    trust region is around the behavior policy, however stale; logp_prox is not read)."""
    del logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    ratio = jnp.exp(logp_new - logp_behav)                            # [B, G, T]
    return -token_mean(_clipped(ratio, adv, eps), mask)


def decoupled_ppo(logp_new, logp_behav, logp_prox, mask, rewards, *, eps: float = 0.2,
                  std_advantages: bool = False) -> jax.Array:
    """−mean over tokens of w · min(ρ' A, clip(ρ', 1 − eps, 1 + eps) A) (AReaL's decoupled PPO):
    w = π_prox / π_behav corrects for staleness without gradient, ρ' = π_θ / π_prox is clipped
    around the learner's own previous params. logp_prox None: π_prox = π_behav (then w = 1 exactly
    and the loss is `ppo`'s, bit for bit)."""
    prox = logp_behav if logp_prox is None else jax.lax.stop_gradient(logp_prox)
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    weight = jnp.exp(prox - logp_behav)                               # [B, G, T], no gradient
    ratio = jnp.exp(logp_new - prox)                                  # [B, G, T]
    return -token_mean(weight * _clipped(ratio, adv, eps), mask)


def tis(logp_new, logp_behav, logp_prox, mask, rewards, *, c: float = 2.0,
        std_advantages: bool = False) -> jax.Array:
    """−mean over tokens of sg(min(ρ, c)) · A · log π_θ, ρ = π_θ / π_behav: truncated importance
    sampling (the gradient is min(ρ, c) A ∇log π_θ; logp_prox is not read)."""
    del logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    weight = jax.lax.stop_gradient(jnp.minimum(jnp.exp(logp_new - logp_behav), c))   # [B, G, T]
    return -token_mean(weight * adv * logp_new, mask)


_LOSSES: dict[str, Callable[..., jax.Array]] = {
    "reinforce": reinforce, "ppo": ppo, "decoupled_ppo": decoupled_ppo, "tis": tis}


class Objective(NamedTuple):
    """A validated objective: its name, its parameters ((key, value), ...) and its loss
    (logp_new, logp_behav, logp_prox, mask, rewards) -> scalar with them bound."""

    name: str
    params: tuple
    loss: Callable[..., jax.Array]

    def describe(self) -> str:
        """E.g. "decoupled_ppo(eps=0.2, std_advantages=False)"."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.params)})"


def check_params(objective: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of `objective` with defaults filled in; ValueError naming the argument for an
    unknown objective, a parameter it does not take, or a value out of range."""
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(f"objective = {objective!r} is not an RL objective; valid: {', '.join(OBJECTIVES)}")
    allowed = DEFAULTS[objective]
    for key in params:
        if key not in allowed:
            takes = [o for o in OBJECTIVES if key in DEFAULTS[o]]
            where = f" (it applies to {', '.join(takes)})" if takes else ""
            raise ValueError(f"{key} = {params[key]!r} is not a parameter of objective = {objective!r}{where}; "
                             f"{objective} takes {', '.join(allowed)}")
    out = {**allowed, **params}
    if "eps" in out:
        eps = out["eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < float(eps) < 1.0:
            raise ValueError(f"eps = {eps!r} is out of range: the PPO clip range must be a number in (0, 1) "
                             "(ratios are clipped to [1 - eps, 1 + eps]; 0.2 is usual)")
        out["eps"] = float(eps)
    if "c" in out:
        c = out["c"]
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (math.isfinite(c) and c >= 1.0):
            raise ValueError(f"c = {c!r} is out of range: the truncated-IS cap must be a finite number >= 1 "
                             "(weights are min(pi_theta / pi_behav, c), and on-policy weights are 1; 2.0 is usual)")
        out["c"] = float(c)
    if not isinstance(out["std_advantages"], bool):
        raise ValueError(f"std_advantages = {out['std_advantages']!r} must be a bool (divide advantages by "
                         "the group's reward std)")
    return out


@functools.lru_cache(maxsize=None)
def _make(objective: str, params: tuple) -> Objective:
    # Cached: tasks built with the same objective share one loss function, so jitted code that
    # closes over it (keyed by the function) compiles once per process.
    return Objective(objective, params, functools.partial(_LOSSES[objective], **dict(params)))


def make(objective: str = "decoupled_ppo", **params: Any) -> Objective:
    """The `Objective` `objective` (one of OBJECTIVES) with `params` (see DEFAULTS: eps in (0, 1)
    for ppo and decoupled_ppo, c >= 1 for tis, std_advantages for all)."""
    checked = check_params(objective, params)
    return _make(objective, tuple(sorted(checked.items())))


def diagnostics(logp_new, logp_behav, logp_prox, mask, *, eps: float = 0.2) -> dict[str, jax.Array]:
    """Token-level means over the mask of what staleness does to a rollout: `ratio` π_θ/π_behav,
    `clip_fraction` (|ρ' − 1| > eps, ρ' = π_θ/π_prox), `behav_weight` π_prox/π_behav, and
    `behav_kl` ≈ KL(π_behav ‖ π_θ) (the k1 estimate, mean of log π_behav − log π_θ)."""
    prox = logp_behav if logp_prox is None else logp_prox
    ratio = jnp.exp(logp_new - prox)
    return {"ratio": token_mean(jnp.exp(logp_new - logp_behav), mask),
            "clip_fraction": token_mean((jnp.abs(ratio - 1.0) > eps).astype(mask.dtype), mask),
            "behav_weight": token_mean(jnp.exp(prox - logp_behav), mask),
            "behav_kl": token_mean(logp_behav - logp_new, mask)}
