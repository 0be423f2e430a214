"""RL objectives: losses over one fixed-shape rollout, to minimise with any optax optimizer.

Every objective reads the same arrays of a rollout of B prompts × G completions × T positions:

    logp_new    [B, G, T]  log π_θ(token): the learner's current params θ; differentiated
    logp_behav  [B, G, T]  log π_behav(token): recorded by the actor that sampled it (version v,
                           in the actor's precision: training–inference mismatch)
    logp_prox   [B, G, T]  log π_prox(token): the learner's params of this version before its
                           first step (AReaL's recomputed log-probs; None means π_prox = π_behav)
    mask        [B, G, T]  1.0 on generated tokens, 0.0 on padding
    rewards     [B, G]     one scalar reward per completion

and return −(Σ mask · objective) / Σ mask: a token-level mean over the whole rollout (DAPO-style,
so a long completion weighs as many tokens as it has; a token an objective masks out counts 0
in the sum and still 1 in the denominator, as AReaL's `ppo_actor_loss_fn` divides by the loss
mask's count). The group-baseline advantage of a completion is shared by all its tokens:

    A[b, g] = r[b, g] − mean_g' r[b, g']          (std_advantages: divided by std_g' r[b, g'] + 1e-6;
                                                   a group of equal rewards has A = 0 exactly)

The per-token terms of the built-ins are in their docstrings (`reinforce`, `ppo`,
`decoupled_ppo`, `tis`, `mis`; ρ = π_θ / π_behav, sg: no gradient).

level="sequence" (decoupled_ppo, tis, mis): the ratios are a completion's, not a token's, GSPO's
exp(mean over its tokens of the log-ratio), shared by all its tokens (a masked sequence is
masked whole). Objectives are open: `register` adds one (an `ObjectiveSpec`); a task's
`objective="package.module:name"` imports the module that registers it (`spec`).

    obj = objectives.make("decoupled_ppo", eps=0.2, cap=5.0)
    loss = obj.loss(logp_new, logp_behav, logp_prox, mask, rewards)           # scalar
    loss, aux = obj.loss_aux(logp_new, logp_behav, logp_prox, mask, rewards)  # aux: clip/masked fractions
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from staleness.infra import specs

__all__ = ["OBJECTIVES", "DEFAULTS", "ADV_EPS", "LEVELS", "Objective", "ObjectiveSpec", "make", "register", "spec",
           "names", "param_names", "check_params", "group_advantages", "token_mean", "reinforce", "ppo",
           "decoupled_ppo", "tis", "mis", "diagnostics", "AUX"]

ADV_EPS = 1e-6
"""Added to the group's reward std before dividing (std_advantages)."""

LEVELS = ("token", "sequence")
"""Where decoupled_ppo, tis and mis take their ratios: per token, or per completion (GSPO)."""

AUX = ("clip_fraction", "masked_fraction")
"""What `Objective.loss_aux` reports beside the loss, as token fractions over the mask:
clip_fraction, where a ratio is clipped (PPO's clipped branch taken; tis: a weight truncated
at c); masked_fraction, where a token is masked out (decoupled_ppo's cap, mis); 0 where an
objective has neither."""


# -- shared terms ----------------------------------------------------------------------------
def group_advantages(rewards: jax.Array, std_advantages: bool = False) -> jax.Array:
    """Group-baseline advantages [B, G] of rewards [B, G]: reward − its group's mean (over G),
    divided by the group's population std + ADV_EPS when `std_advantages`.

    The mean is taken of the rewards less the group's first one (and added back), so a group
    of equal rewards has advantage 0 exactly: the float32 mean of equal values that are not
    representable (k/L) can differ from them in the last bit, which std_advantages then divided
    by a std of 1e-8 (+0.056 for eight rewards 2/3)."""
    base = rewards[..., :1]
    shifted = rewards - base                                            # 0 exactly where equal
    adv = shifted - jnp.mean(shifted, axis=-1, keepdims=True)
    if std_advantages:
        adv = adv / (jnp.sqrt(jnp.mean(jnp.square(adv), axis=-1, keepdims=True)) + ADV_EPS)
    return adv


def token_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Σ values · mask / Σ mask over all axes (0 for an empty mask, not NaN)."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _clipped(ratio: jax.Array, adv: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """(min(ρA, clip_ε(ρ)A), where the clipped branch is taken: PPO's clip fraction)."""
    unclipped, clipped = ratio * adv, jnp.clip(ratio, 1.0 - eps, 1.0 + eps) * adv
    return jnp.minimum(unclipped, clipped), clipped < unclipped


def _log_ratio(num: jax.Array, den: jax.Array, mask: jax.Array, level: str) -> jax.Array:
    """log(π_num / π_den) per token, or (level 'sequence') the mean over each completion's
    tokens, broadcast to its tokens [B, G, T] (GSPO)."""
    diff = (num - den) * mask
    if level == "token":
        return diff
    per_seq = jnp.sum(diff, axis=-1, keepdims=True) / jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
    return jnp.broadcast_to(per_seq, num.shape)


def _aux(mask, clip=None, masked=None) -> dict[str, jax.Array]:
    zero = jnp.zeros((), jnp.float32)
    return {"clip_fraction": zero if clip is None else token_mean(clip.astype(mask.dtype), mask),
            "masked_fraction": zero if masked is None else token_mean(masked.astype(mask.dtype), mask)}


# -- the built-in losses (each returns (loss, aux)) ------------------------------------------
def reinforce(logp_new, logp_behav, logp_prox, mask, rewards, *, std_advantages: bool = False):
    """−mean over tokens of A · log π_θ: the on-policy policy gradient with a group baseline; stale
    data enter uncorrected (logp_behav and logp_prox are not read)."""
    del logp_behav, logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    return -token_mean(adv * logp_new, mask), _aux(mask)


def ppo(logp_new, logp_behav, logp_prox, mask, rewards, *, eps: float = 0.2, std_advantages: bool = False):
    """−mean over tokens of min(ρ A, clip(ρ, 1 − eps, 1 + eps) A), ρ = π_θ / π_behav (naive PPO: the
    trust region is around the behavior policy, however stale; logp_prox is not read)."""
    del logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    surrogate, clip = _clipped(jnp.exp(logp_new - logp_behav), adv, eps)
    return -token_mean(surrogate, mask), _aux(mask, clip)


def decoupled_ppo(logp_new, logp_behav, logp_prox, mask, rewards, *, eps: float = 0.2, cap: float | None = None,
                  level: str = "token", std_advantages: bool = False):
    """−mean over tokens of w · min(ρ' A, clip(ρ', 1 − eps, 1 + eps) A) (AReaL's decoupled PPO):
    w = π_prox / π_behav corrects for staleness and mismatch without gradient, ρ' = π_θ / π_prox
    is clipped around the learner's own params at the start of this version. cap: a token whose
    w exceeds it is masked out (AReaL's `behav_imp_weight_cap`; None: none). logp_prox None:
    π_prox = π_behav (then w = 1 exactly and, at level 'token' without a cap, the loss is `ppo`'s,
    bit for bit)."""
    prox = logp_behav if logp_prox is None else jax.lax.stop_gradient(logp_prox)
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    if level == "token" and logp_prox is None and cap is None:        # `ppo` exactly
        return ppo(logp_new, logp_behav, None, mask, rewards, eps=eps, std_advantages=std_advantages)
    weight = jnp.exp(_log_ratio(prox, logp_behav, mask, level))      # [B, G, T], no gradient
    surrogate, clip = _clipped(jnp.exp(_log_ratio(logp_new, prox, mask, level)), adv, eps)
    masked = None
    if cap is not None:
        masked = weight > cap
        weight = jnp.where(masked, 0.0, weight)
    return -token_mean(weight * surrogate, mask), _aux(mask, clip, masked)


def tis(logp_new, logp_behav, logp_prox, mask, rewards, *, c: float = 2.0, level: str = "token",
        std_advantages: bool = False):
    """−mean over tokens of sg(min(ρ, c)) · A · log π_θ, ρ = π_θ / π_behav: truncated importance
    sampling (the gradient is min(ρ, c) A ∇log π_θ; logp_prox is not read)."""
    del logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    ratio = jnp.exp(_log_ratio(logp_new, logp_behav, mask, level))
    weight = jax.lax.stop_gradient(jnp.minimum(ratio, c))             # [B, G, T]
    return -token_mean(weight * adv * logp_new, mask), _aux(mask, clip=jax.lax.stop_gradient(ratio) > c)


def mis(logp_new, logp_behav, logp_prox, mask, rewards, *, lo: float = 0.5, hi: float = 5.0, level: str = "token",
        std_advantages: bool = False):
    """−mean over tokens of sg(ρ · 1[lo <= ρ <= hi]) · A · log π_θ, ρ = π_θ / π_behav: masked
    importance sampling (IcePop): a token (level 'sequence': a completion) whose ratio leaves
    [lo, hi] is dropped from the gradient; the others keep their importance weight. The
    defaults [0.5, 5] are IcePop's (and OpenRLHF's, NeMo-RL's and verl's); a dropped token
    still counts in the token mean's denominator (verl's current rule)."""
    del logp_prox
    adv = group_advantages(rewards, std_advantages)[..., None]        # [B, G, 1]
    ratio = jax.lax.stop_gradient(jnp.exp(_log_ratio(logp_new, logp_behav, mask, level)))
    masked = (ratio < lo) | (ratio > hi)
    weight = jnp.where(masked, 0.0, ratio)
    return -token_mean(weight * adv * logp_new, mask), _aux(mask, masked=masked)


# -- checks of the parameters ------------------------------------------------------------------
def _number(name: str, value, low: float, high: float = math.inf, *, open_low: bool = False, what: str = "") -> float:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer))
          and math.isfinite(value) and (value > low if open_low else value >= low) and value <= high)
    if not ok:
        lo = f"> {low:g}" if open_low else f">= {low:g}"
        rng = lo if high == math.inf else f"in {'(' if open_low else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} = {value!r} is out of range: it must be a finite number {rng}{what}")
    return float(value)


def _check_eps(p: dict) -> None:
    eps = p["eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < float(eps) < 1.0:
        raise ValueError(f"eps = {eps!r} is out of range: the PPO clip range must be a number in (0, 1) "
                         "(ratios are clipped to [1 - eps, 1 + eps]; 0.2 is usual)")
    p["eps"] = float(eps)


def _check_level(p: dict) -> None:
    if p["level"] not in LEVELS:
        raise ValueError(f"level = {p['level']!r} must be one of {', '.join(LEVELS)} (per token, or GSPO's "
                         "per-completion ratio)")


def _check_decoupled(p: dict) -> dict:
    _check_eps(p)
    _check_level(p)
    if p["cap"] is not None:
        p["cap"] = _number("cap", p["cap"], 1.0, what=" (tokens whose behaviour weight pi_prox / pi_behav exceeds "
                           "it are masked; AReaL's behav_imp_weight_cap, e.g. 5), or None")
    return p


def _check_tis(p: dict) -> dict:
    _check_level(p)
    p["c"] = _number("c", p["c"], 1.0, what=" (the truncated-IS cap: weights are min(pi_theta / pi_behav, c), "
                     "and on-policy weights are 1; 2.0 is usual)")
    return p


def _check_mis(p: dict) -> dict:
    _check_level(p)
    p["lo"] = _number("lo", p["lo"], 0.0, 1.0, open_low=True, what=" (the lowest kept ratio pi_theta / pi_behav)")
    p["hi"] = _number("hi", p["hi"], 1.0, what=" (the highest kept ratio pi_theta / pi_behav)")
    return p


# -- float64 references of one sample's gradient coefficient (the bandit, T = 1) ---------------
def _active(ratio: np.ndarray, adv: np.ndarray, eps: float) -> np.ndarray:
    """Where min(ρA, clip(ρ)A) takes its unclipped branch (its gradient is A ∇ρ there, 0 elsewhere)."""
    return ~(((adv > 0) & (ratio >= 1 + eps)) | ((adv < 0) & (ratio <= 1 - eps)))


def _ref_reinforce(adv, rho, rho_prox, w, **_):
    return adv


def _ref_ppo(adv, rho, rho_prox, w, *, eps, **_):
    return adv * rho * _active(rho, adv, eps)


def _ref_decoupled(adv, rho, rho_prox, w, *, eps, cap, **_):
    keep = np.ones_like(w, bool) if cap is None else w <= cap
    return w * adv * rho_prox * _active(rho_prox, adv, eps) * keep


def _ref_tis(adv, rho, rho_prox, w, *, c, **_):
    return np.minimum(rho, c) * adv


def _ref_mis(adv, rho, rho_prox, w, *, lo, hi, **_):
    return rho * adv * ((rho >= lo) & (rho <= hi))


# -- the registry ------------------------------------------------------------------------------
class ObjectiveSpec(NamedTuple):
    """An objective as one value: its loss, its parameters with their defaults, a check of
    them, and its float64 reference.

    loss: (logp_new, logp_behav, logp_prox, mask, rewards, **params) -> scalar, or
      (scalar, aux) with aux a dict of some of `AUX` (jax scalars).
    defaults: {parameter: default} (std_advantages is added to every objective).
    check: params -> params (the defaults filled in), raising ValueError naming a bad one;
      None: no check beyond the names.
    reference: (adv, rho, rho_prox, w, **params) -> the coefficient of one sample's
      gradient x ⊗ (e_a − π_θ) (float64 NumPy arrays [M, G]; T = 1); None: no reference.
    """

    name: str
    loss: Callable[..., Any]
    defaults: dict
    check: Callable[[dict], dict] | None = None
    reference: Callable[..., np.ndarray] | None = None


_BUILTIN = ("reinforce", "ppo", "decoupled_ppo", "tis", "mis")
_REGISTRY: dict[str, ObjectiveSpec] = {}


def register(name: str, loss: Callable[..., Any], defaults: dict | None = None, check: Callable | None = None,
             reference: Callable | None = None, *, overwrite: bool = False) -> ObjectiveSpec:
    """Make `make(name, **params)` (and a task's `objective=name`) use `loss` with `defaults`.

    See `ObjectiveSpec` for the arguments. A built-in name cannot be replaced; a registered one
    only with overwrite=True. Returns the `ObjectiveSpec`."""
    if not isinstance(name, str) or not name.strip() or not name.replace("_", "").isalnum():
        raise ValueError(f"register: name = {name!r} must be a non-empty word of letters, digits and '_'")
    if not callable(loss):
        raise TypeError(f"register: loss = {loss!r} must be a function (logp_new, logp_behav, logp_prox, mask, "
                        "rewards, **params) -> loss")
    if name in _REGISTRY and name in _BUILTIN and _REGISTRY[name].loss is not loss:
        raise ValueError(f"register: objective {name!r} is built in; register yours under another name")
    if name in _REGISTRY and not overwrite and _REGISTRY[name].loss is not loss:
        raise ValueError(f"register: objective {name!r} is already registered; pass overwrite=True to replace it")
    defaults = dict(defaults or {})
    defaults.setdefault("std_advantages", False)
    entry = ObjectiveSpec(name, loss, defaults, check, reference)
    _REGISTRY[name] = entry
    return entry


register("reinforce", reinforce, {}, None, _ref_reinforce)
register("ppo", ppo, {"eps": 0.2}, lambda p: (_check_eps(p), p)[1], _ref_ppo)
register("decoupled_ppo", decoupled_ppo, {"eps": 0.2, "cap": None, "level": "token"}, _check_decoupled,
         _ref_decoupled)
register("tis", tis, {"c": 2.0, "level": "token"}, _check_tis, _ref_tis)
register("mis", mis, {"lo": 0.5, "hi": 5.0, "level": "token"}, _check_mis, _ref_mis)

OBJECTIVES = _BUILTIN
"""The built-in objective names (`names()` adds the registered ones)."""


def names() -> tuple[str, ...]:
    """Every objective `make` knows: the built-ins, then the registered ones."""
    return tuple(_REGISTRY)


def param_names() -> list[str]:
    """Every parameter some objective takes (sorted)."""
    return sorted({k for e in _REGISTRY.values() for k in e.defaults})


def __getattr__(name: str):
    if name == "DEFAULTS":   # {objective: its defaults}, of every registered objective
        return {n: dict(e.defaults) for n, e in _REGISTRY.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(objective: str) -> ObjectiveSpec:
    """The `ObjectiveSpec` of `objective`: a registered name, or 'package.module:name' (the module
    is imported, and must register `name`). ValueError naming the valid ones."""
    if isinstance(objective, str) and ":" in objective:
        module, _, name = objective.partition(":")
        specs.import_user_module(module, f"objective = {objective!r}")
        if name not in _REGISTRY:
            raise ValueError(f"objective = {objective!r}: importing {module!r} registered no objective {name!r} "
                             "(call staleness.tasks.rl.objectives.register(name, loss, defaults) in it)")
        return _REGISTRY[name]._replace(name=objective)
    if not isinstance(objective, str) or objective not in _REGISTRY:
        raise ValueError(f"objective = {objective!r} is not an RL objective; valid: {', '.join(_REGISTRY)}, or "
                         "package.module:name of one your module registers")
    return _REGISTRY[objective]


def check_params(objective: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of `objective` with defaults filled in; ValueError naming the argument for an
    unknown objective, a parameter it does not take, or a value out of range."""
    entry = spec(objective)
    allowed = entry.defaults
    for key in params:
        if key not in allowed:
            takes = [n for n, e in _REGISTRY.items() if key in e.defaults]
            where = f" (it applies to {', '.join(takes)})" if takes else ""
            raise ValueError(f"{key} = {params[key]!r} is not a parameter of objective = {objective!r}{where}; "
                             f"{objective} takes {', '.join(allowed)}")
    out = {**allowed, **params}
    if not isinstance(out["std_advantages"], bool):
        raise ValueError(f"std_advantages = {out['std_advantages']!r} must be a bool (divide advantages by "
                         "the group's reward std)")
    return entry.check(out) if entry.check is not None else out


class Objective(NamedTuple):
    """A validated objective: its name, its parameters ((key, value), ...) and its loss
    (logp_new, logp_behav, logp_prox, mask, rewards) -> scalar with them bound."""

    name: str
    params: tuple
    loss_aux: Callable[..., tuple]   # -> (loss, aux): aux holds every name of AUX
    reference: Callable | None = None

    def loss(self, logp_new, logp_behav, logp_prox, mask, rewards) -> jax.Array:
        """The scalar loss (see the module docstring)."""
        return self.loss_aux(logp_new, logp_behav, logp_prox, mask, rewards)[0]

    def describe(self) -> str:
        """E.g. "decoupled_ppo(eps=0.2, cap=None, level='token', std_advantages=False)"."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.params)})"


def _with_aux(loss: Callable, params: dict):
    def loss_aux(logp_new, logp_behav, logp_prox, mask, rewards):
        out = loss(logp_new, logp_behav, logp_prox, mask, rewards, **params)
        value, aux = out if isinstance(out, tuple) else (out, {})
        full = _aux(mask)
        full.update({k: jnp.asarray(v, jnp.float32) for k, v in dict(aux).items() if k in AUX})
        return value, full
    return loss_aux


@functools.lru_cache(maxsize=None)
def _make(objective: str, params: tuple, loss: Callable) -> Objective:
    # Cached: tasks built with the same objective share one loss function, so jitted code that
    # closes over it (keyed by the function) compiles once per process.
    entry = spec(objective)
    return Objective(objective, params, _with_aux(loss, dict(params)), entry.reference)


def make(objective: str = "decoupled_ppo", **params: Any) -> Objective:
    """The `Objective` `objective` (a registered name or 'package.module:name') with `params`
    (its defaults filled in, checked: eps in (0, 1) for ppo and decoupled_ppo, cap >= 1 or None,
    c >= 1 for tis, 0 < lo <= 1 <= hi for mis, level 'token' or 'sequence', std_advantages)."""
    checked = check_params(objective, params)
    return _make(objective, tuple(sorted(checked.items())), spec(objective).loss)


# -- diagnostics -------------------------------------------------------------------------------
def diagnostics(logp_new, logp_behav, mask, entropy=None) -> dict[str, jax.Array]:
    """What RL systems log per step, over the real tokens of a rollout (means over the mask):

    kl_behav        the k3 estimate of KL(π_behav ‖ π_θ): mean of ρ − 1 − log ρ, ρ = π_θ / π_behav
                    (tokens sampled from π_behav; >= 0 per token)
    is_weight_mean  mean of ρ;  is_weight_max: its largest value over real tokens
    ess             effective sample size of the token weights, (Σρ)² / (n Σρ²), as a fraction of
                    the n real tokens (1: on-policy)
    entropy         mean token entropy of π_θ (given as `entropy` [B, G, T]; NaN without it)
    """
    log_ratio = (logp_new - logp_behav) * mask
    ratio = jnp.exp(log_ratio)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    live = mask > 0
    w = jnp.where(live, ratio, 0.0)
    return {"kl_behav": token_mean(ratio - 1.0 - log_ratio, mask),
            "is_weight_mean": token_mean(ratio, mask),
            "is_weight_max": jnp.max(jnp.where(live, ratio, -jnp.inf)),
            "ess": jnp.square(jnp.sum(w)) / jnp.maximum(n * jnp.sum(jnp.square(w)), 1e-30),
            "entropy": jnp.full((), jnp.nan, jnp.float32) if entropy is None else token_mean(entropy, mask)}
