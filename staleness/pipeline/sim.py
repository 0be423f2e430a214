"""The one-device engine: all K stages in one compiled `lax.scan` over ticks.

Per tick: the forward halves of stages 0..K-1 in order, then the backward
halves of stages K-1..0 (`staleness.pipeline.stage`). A link of delay d > 0 is
a ring of d messages (read slot t mod d, then write it after the sweep); a link
of delay 0 hands the message straight to the next stage in the same tick. The
numbers are those of K stages on K devices (same per-stage code, same order of
each stage's operations); only wall-clock time differs, which is why time in
the simulated path comes from `staleness.pipeline.timing`, not from here.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from staleness.tasks.optim import Optimizer
from staleness.pipeline import stage as S
from staleness.pipeline.plan import TickPlan

__all__ = ["SimCarry", "compile_chunk", "configs", "init", "run_chunk", "scan_chunk", "stage_params",
           "stored_bytes"]


class SimCarry(NamedTuple):
    stages: tuple          # [K] StageState
    fwd_links: tuple       # [K-1] rings [f_k, *out_k] of activations in flight (() if f_k = 0)
    bwd_links: tuple       # [K-1] rings [b_k, *out_k] of gradients in flight (() if b_k = 0)


def shapes(ptask, plan: TickPlan, params) -> list[jax.ShapeDtypeStruct]:
    """[K + 1] shapes: the stage-0 input (one micro-batch) and every stage's output."""
    m = plan.microbatches
    if ptask.batch_size % m:
        divisors = [d for d in range(1, ptask.batch_size + 1) if ptask.batch_size % d == 0]
        raise ValueError(f"microbatches = {m} does not divide batch_size = {ptask.batch_size}; valid "
                         f"microbatches: {', '.join(map(str, divisors))}")
    if ptask.num_stages != plan.num_stages:
        raise ValueError(f"the plan has {plan.num_stages} stages but the model has {ptask.num_stages}")
    x = jax.eval_shape(lambda: ptask.minibatch(jax.random.key(0), 0)["x"])
    out = [jax.ShapeDtypeStruct((ptask.batch_size // m, *x.shape[1:]), x.dtype)]
    for k in range(plan.num_stages):
        out.append(jax.eval_shape(functools.partial(ptask.apply, k), params[k], out[-1]))
    return out


def configs(ptask, plan: TickPlan, params) -> tuple[S.StageConfig, ...]:
    """Static per-stage configuration of `plan` on `ptask`."""
    sh = shapes(ptask, plan, params)
    m = plan.microbatches
    return tuple(
        S.StageConfig(index=k, num_stages=plan.num_stages, lag=plan.lags[k], backward=plan.schedule.backward,
                      microbatches=m, microbatch_size=ptask.batch_size // m, in_shape=tuple(sh[k].shape),
                      in_dtype=jax.numpy.dtype(sh[k].dtype).name)
        for k in range(plan.num_stages))


def init(ptask, plan: TickPlan, opt: Optimizer, params, ctx: S.Context) -> tuple[tuple, SimCarry]:
    """(configs, carry) for training `params` (a tuple of per-stage params) along `plan`."""
    params = jax.tree.map(jnp.array, params)  # the carry is donated; keep the caller's arrays
    cfgs = configs(ptask, plan, params)
    sh = shapes(ptask, plan, params)
    states = tuple(S.init_state(c, ctx, opt, p) for c, p in zip(cfgs, params, strict=True))

    def ring(d, s):
        return jnp.zeros((d, *s.shape), s.dtype) if d > 0 else ()

    k = plan.num_stages
    fwd_links = tuple(ring(plan.forward_delays[i], sh[i + 1]) for i in range(k - 1))
    bwd_links = tuple(ring(plan.backward_delays[i], sh[i + 1]) for i in range(k - 1))
    return cfgs, SimCarry(states, fwd_links, bwd_links)


def _read(ring, t, d):
    return lax.dynamic_index_in_dim(ring, t % d, keepdims=False)


def _write(ring, t, d, v):
    return lax.dynamic_update_index_in_dim(ring, v, t % d, 0)


def _tick(cfgs, fdel, bdel, opt, ctx, carry: SimCarry, x):
    t, fwd, bwd, upd = x["tick"], x["fwd"], x["bwd"], x["update"]
    k_all = len(cfgs)
    states = list(carry.stages)
    outs, pend, loss = [None] * k_all, [None] * k_all, None
    for k in range(k_all):
        if k == 0:
            x_in = None
        elif fdel[k - 1] == 0:
            x_in = outs[k - 1]
        else:
            x_in = _read(carry.fwd_links[k - 1], t, fdel[k - 1])
        states[k], outs[k], pend[k], lk = S.forward(cfgs[k], ctx, states[k], x_in, t, fwd[k], fwd[k] >= 0)
        if k == k_all - 1:
            loss = jnp.where(fwd[k] >= 0, lk, jnp.nan)
    fwd_links = tuple(_write(r, t, fdel[i], outs[i]) if fdel[i] > 0 else r for i, r in enumerate(carry.fwd_links))
    gxs = [None] * k_all
    for k in reversed(range(k_all)):
        if k == k_all - 1:
            g_in = None
        elif bdel[k] == 0:
            g_in = gxs[k + 1]
        else:
            g_in = _read(carry.bwd_links[k], t, bdel[k])
        states[k], gxs[k] = S.backward(cfgs[k], ctx, opt, states[k], pend[k], g_in, bwd[k] >= 0, upd[k])
    bwd_links = tuple(_write(r, t, bdel[i], gxs[i + 1]) if bdel[i] > 0 else r for i, r in enumerate(carry.bwd_links))
    return SimCarry(tuple(states), fwd_links, bwd_links), loss


def scan_chunk(cfgs, fdel, bdel, opt, ctx, carry, xs):
    """The ticks in `xs` as one `lax.scan`, not compiled (`run_chunk` jits it; `staleness.pipeline.sweep`
    vmaps it): cfgs from `init`, fdel/bdel the plan's forward/backward delays; returns (carry, loss per tick)."""
    return lax.scan(functools.partial(_tick, cfgs, fdel, bdel, opt, ctx), carry, xs)


_run_chunk = jax.jit(scan_chunk, static_argnums=(0, 1, 2, 3), donate_argnums=(5,))


def run_chunk(cfgs, plan: TickPlan, opt: Optimizer, ctx: S.Context, carry: SimCarry, xs: dict[str, Any]):
    """Run the ticks in `xs` (from `plan.xs`): returns (carry, loss per tick [L], NaN where none)."""
    return _run_chunk(cfgs, plan.forward_delays, plan.backward_delays, opt, ctx, carry, xs)


def compile_chunk(cfgs, plan: TickPlan, opt: Optimizer, ctx: S.Context, carry: SimCarry, xs: dict[str, Any]):
    """Compile `run_chunk` ahead of time for chunks shaped like `xs`; returns `fn(carry, xs) -> (carry, loss)`."""
    compiled = _run_chunk.lower(cfgs, plan.forward_delays, plan.backward_delays, opt, ctx, carry, xs).compile()
    return lambda carry, xs: compiled(ctx, carry, xs)


def stored_bytes(carry: SimCarry) -> list[int]:
    """[K] bytes of each stage's queue (stored inputs, stashed weights or stored graphs)."""
    return [int(sum(leaf.nbytes for leaf in jax.tree.leaves(s.store))) for s in carry.stages]


def stage_params(carry: SimCarry) -> tuple:
    """Per-stage params (device arrays) of a carry."""
    return tuple(s.params for s in carry.stages)
