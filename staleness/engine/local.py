"""Local updates: a worker's inner steps and the delta it pushes (Local SGD, DiLoCo).

A worker of a local-update method (`policies.LocalSteps`) pulls the global parameters θ,
takes H inner steps of its inner optimizer on its own minibatches, and pushes the delta

    Δ = θ − θ_H        (an "outer gradient": θ − Δ is the worker's end point)

which the server aggregates like gradients and applies with its outer optimizer
(`engine.update.server_update`): outer SGD with learning rate 1 averages the workers'
parameters (Local SGD); Nesterov SGD (0.7, 0.9) is DiLoCo. The inner optimizer's state is
the worker's and persists across its rounds. Inner step h of round r of worker w uses the
minibatch of (w, r·H_max + h) (H_max: the largest number of steps of any worker; Dynamic
Local Updates give slower workers fewer, the rest of the scan is masked). `local_delta` is
shared by the compiled replay and the real runtime's workers.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from staleness.policies.payload import fragment_keys   # noqa: F401 (public here too)

__all__ = ["Local", "NUMERICS", "configure", "local_delta", "compress", "streaming_delta", "init_states",
           "fragment_keys",
           "fragmented", "quantize"]


class Local(NamedTuple):
    """Static configuration of a local-update replay (hashable: a jit static argument)."""

    inner: Any                # the inner optimizer's optax transformation
    max_steps: int            # H_max
    masked: bool              # workers take different numbers of steps (a step mask is applied)
    fragments: int = 1        # Streaming DiLoCo: P fragments, the top-level modules of each in `fragment_keys`
    overlap: int = 0          # τ, inner steps before the merge
    alpha: float = 0.0        # the local weight of the merge
    bits: int = 32            # of the sent outer gradients (32: not quantized)
    fragment_keys: tuple = ()
    weighted: bool = False    # an update's deltas weighted by their workers' inner steps (tokens)
    topk: float = 1.0         # compressed pushes: the fraction of each tensor's values sent (by magnitude)
    qbits: int = 32           # ... quantized to these bits (`quantize`)
    ef: bool = False          # ... with error feedback: each worker's carry holds what compression left out
    anchored: bool = False    # fragments merged by a quorum (Decoupled DiLoCo): a fragment's outer gradient is
    #                           taken from the global fragment its worker last merged (`streaming_delta`)

    @property
    def streaming(self) -> bool:
        return bool(self.fragment_keys)

    @property
    def layout(self) -> str | None:
        """What the per-worker carry holds besides the inner states: 'streaming' (the workers' own
        parameters), 'anchored' (the workers' own parameters and the global fragments they last
        merged), 'feedback' (the error-feedback buffers) or None."""
        if self.streaming:
            return "anchored" if self.anchored else "streaming"
        return "feedback" if self.ef else None

    learner = False   # not asynchronous RL's learner step (`engine.rollout.Learner`)
    inflight = False  # no in-flight segments


def _learner(options, inner_tx, max_steps, masked):
    from staleness.engine import rollout

    return rollout.Learner(**options)


NUMERICS = {
    "gradient": lambda options, inner_tx, max_steps, masked: None,
    "local": lambda options, inner_tx, max_steps, masked: Local(
        **{"inner": inner_tx, "max_steps": max_steps, "masked": masked, **options}),
    "learner": _learner,
}
"""The engine's per-worker steps by the name a work declares (`Work.numerics`): a maker of
(the work's `numerics_options(shapes)`, the inner optimizer's transformation, H_max, masked)
-> the step's static configuration (None: one gradient; `Local`: local steps;
`engine.rollout.Learner`: asynchronous RL's learner). A new kind of numerics adds its maker."""


def configure(work, inner_tx=None, max_steps: int = 0, masked: bool = False, shapes=None):
    """The static configuration of `work`'s per-worker step (`NUMERICS[work.numerics]`);
    `shapes` (the parameter pytree's shapes) is needed by works whose options depend on it
    (Streaming DiLoCo's fragments)."""
    kind = getattr(work, "numerics", None)
    if kind not in NUMERICS:
        raise ValueError(f"work {work.describe()!r}: numerics = {kind!r} is not one of the engine's per-worker "
                         f"steps ({', '.join(NUMERICS)})")
    return NUMERICS[kind](work.numerics_options(shapes), inner_tx, max_steps, masked)


def local_delta(task, local: Local, params, inner_state, data_key, worker, round_, steps):
    """H inner steps from `params`: returns (mean inner loss, Δ = params − θ_H, inner state).

    steps: this worker's number of steps (<= local.max_steps; traced).
    """
    inner, h_max = local.inner, local.max_steps
    base = round_ * h_max

    def step(carry, h):
        p, s, total = carry
        loss, g = jax.value_and_grad(task.loss)(p, task.minibatch(data_key, worker, base + h))
        updates, s_new = inner.update(g, s, p)
        p_new = optax.apply_updates(p, updates)
        if local.masked:
            on = h < steps
            p_new = jax.tree.map(lambda a, b: jnp.where(on, a, b), p_new, p)
            s_new = jax.tree.map(lambda a, b: jnp.where(on, a, b), s_new, s)
            loss = jnp.where(on, loss, 0.0)
        return (p_new, s_new, total + loss), None

    error = None
    if local.ef:
        inner_state, error = inner_state
    (end, state, total), _ = lax.scan(step, (params, inner_state, jnp.zeros((), jnp.float32)),
                                      jnp.arange(h_max, dtype=jnp.int32))
    delta = jax.tree.map(lambda a, b: a - b, params, end)
    count = steps if local.masked else h_max
    if local.topk < 1.0 or local.qbits < 32:   # SparseLoCo: send the compressed delta (plus the error left over)
        target = delta if error is None else jax.tree.map(jnp.add, delta, error)
        delta = jax.tree.map(lambda x: compress(x, local.topk, local.qbits), target)
        if error is not None:
            state = (state, jax.tree.map(jnp.subtract, target, delta))
    return total / jnp.asarray(count, jnp.float32), delta, state


def compress(x, topk: float, bits: int):
    """`x` with all but its ceil(topk · size) largest-magnitude values zeroed (topk = 1: all
    kept), then quantized to `bits` (`quantize`, scaled by the largest kept magnitude)."""
    if topk < 1.0 and x.size:
        flat = x.reshape(-1)
        k = max(1, math.ceil(topk * flat.size))
        _, idx = lax.top_k(jnp.abs(flat), k)
        x = jnp.zeros_like(flat).at[idx].set(flat[idx]).reshape(x.shape)
    return quantize(x, bits)


def quantize(x, bits: int):
    """`x` rounded to a sign and a (bits−1)-bit exponent per value (an E(bits−1)M0
    float), scaled by the tensor's largest magnitude: magnitudes m·2^−k for
    k = 0..2^(bits−1)−2 and 0 (rounded in the log domain). bits=32: x unchanged."""
    if bits >= 32:
        return x
    levels = 2 ** (bits - 1) - 1                      # exponents 0, −1, ..., −(levels − 1), plus zero
    scale = jnp.max(jnp.abs(x))
    mag = jnp.abs(x) / jnp.where(scale > 0, scale, 1.0)
    e = jnp.round(jnp.log2(jnp.where(mag > 0, mag, 1.0)))
    keep = (mag > 0) & (e > -levels)
    return jnp.where(keep, jnp.sign(x) * scale * jnp.exp2(jnp.maximum(e, -(levels - 1))), 0.0).astype(x.dtype)


def fragmented(tx, frag_keys: tuple) -> optax.GradientTransformationExtraArgs:
    """`tx` applied to one fragment of the parameters per update (its own state per
    fragment: the paper's outer momentum per fragment); `update(..., fragment=p)`
    returns updates that are zero outside fragment p."""
    def sub(tree, p):
        return {k: tree[k] for k in frag_keys[p]}

    def init(params):
        return tuple(tx.init(sub(params, p)) for p in range(len(frag_keys)))

    inner = optax.with_extra_args_support(tx)

    def update(updates, state, params=None, *, fragment=0, **extra):
        # other arguments (a merge's `share` of a round) go to the fragment's own `tx`

        def branch(p):
            def f(operands):
                updates, state, params = operands
                u, s = inner.update(sub(updates, p), state[p], sub(params, p), **extra)
                full = {k: (u[k] if k in u else jax.tree.map(jnp.zeros_like, updates[k])) for k in updates}
                return full, state[:p] + (s,) + state[p + 1:]
            return f

        return lax.switch(fragment, [branch(p) for p in range(len(frag_keys))], (updates, state, params))

    return optax.GradientTransformationExtraArgs(init, update)


def streaming_delta(task, local: Local, pulled, own, inner_state, data_key, worker, round_):
    """One Streaming DiLoCo iteration of a worker: H/P inner steps on its own parameters
    `own`, merging fragment (round − 1) mod P from the `pulled` global parameters τ steps
    in (own_p ← α·own_p + (1−α)·pulled_p; not in round 0), then the outer gradient of
    fragment round mod P, pulled_p − own_p (zero elsewhere), quantized to `local.bits`.
    Returns (mean inner loss, Δ, inner state, own parameters).

    `local.anchored` (Decoupled DiLoCo's fragments, merged by a quorum): `own` is (own
    parameters, anchor), the anchor holding each fragment as the worker last merged it
    (anchor_p ← pulled_p at the merge), and the outer gradient is anchor_p − own_p. Other
    learners' merges move the global fragment between two of this worker's, and pulled_p −
    own_p would undo them; in lockstep (Streaming DiLoCo) anchor_p is pulled_p, bitwise."""
    inner, steps, p_count = local.inner, local.max_steps, local.fragments
    now, prev = round_ % p_count, (round_ - 1) % p_count
    merge_on = round_ >= 1
    base = round_ * steps
    anchor = None
    if local.anchored:
        own, anchor = own

    def merge(own):
        out = dict(own)
        for p, keys in enumerate(local.fragment_keys):
            on = merge_on & (prev == p)
            for k in keys:
                out[k] = jax.tree.map(lambda a, g: jnp.where(on, local.alpha * a + (1.0 - local.alpha) * g, a),
                                      own[k], pulled[k])
        return out

    def step(carry, h):
        p, s, total = carry
        p = lax.cond(h == local.overlap, merge, lambda q: q, p)
        loss, g = jax.value_and_grad(task.loss)(p, task.minibatch(data_key, worker, base + h))
        updates, s = inner.update(g, s, p)
        return (optax.apply_updates(p, updates), s, total + loss), None

    (own, state, total), _ = lax.scan(step, (own, inner_state, jnp.zeros((), jnp.float32)),
                                      jnp.arange(steps, dtype=jnp.int32))
    if anchor is not None:   # the fragment merged this iteration is anchored at its pulled value
        merged = {k: merge_on & (prev == p) for p, keys in enumerate(local.fragment_keys) for k in keys}
        anchor = {k: jax.tree.map(lambda a, g, on=merged[k]: jnp.where(on, g, a), anchor[k], pulled[k])
                  for k in pulled}
    base_of = pulled if anchor is None else anchor
    delta = {}
    for p, keys in enumerate(local.fragment_keys):
        for k in keys:
            delta[k] = jax.tree.map(lambda g, a: jnp.where(now == p, quantize(g - a, local.bits), jnp.zeros_like(a)),
                                    base_of[k], own[k])
    return total / steps, {k: delta[k] for k in pulled}, state, (own if anchor is None else (own, anchor))


def init_states(inner_opt, params, num_workers: int, layout: str | None = None):
    """[λ] stacked fresh inner-optimizer states (each with the inner learning rate); with the
    'feedback' layout paired with [λ] zero error-feedback buffers."""
    one = inner_opt.init(params)
    if layout == "feedback":
        one = (one, jax.tree.map(jnp.zeros_like, params))
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + jnp.shape(a)).copy(), one)
