"""A user's RL objective in its own file: CISPO (MiniMax-M1), a REINFORCE whose importance
weight is clipped and stopped, registered with its float64 reference so the bandit's exact
expected gradient covers it. `objective="user_objectives:cispo"` imports this module."""

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks.rl import objectives


def cispo(logp_new, logp_behav, logp_prox, mask, rewards, *, eps_high: float = 2.0, std_advantages: bool = False):
    """−mean over tokens of sg(min(ρ, 1 + eps_high)) · A · log π_θ, ρ = π_θ / π_behav."""
    del logp_prox
    adv = objectives.group_advantages(rewards, std_advantages)[..., None]
    ratio = jax.lax.stop_gradient(jnp.exp(logp_new - logp_behav))
    clipped = ratio > 1.0 + eps_high
    loss = -objectives.token_mean(jnp.minimum(ratio, 1.0 + eps_high) * adv * logp_new, mask)
    return loss, {"clip_fraction": objectives.token_mean(clipped.astype(mask.dtype), mask)}


def _check(params):
    if not params["eps_high"] > 0:
        raise ValueError(f"eps_high = {params['eps_high']!r} must be > 0")
    return params


def _reference(adv, rho, rho_prox, w, *, eps_high, **_):
    return np.minimum(rho, 1.0 + eps_high) * adv


objectives.register("cispo", cispo, {"eps_high": 2.0}, _check, _reference)
