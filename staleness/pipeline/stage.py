"""One pipeline stage per tick: the per-block algorithm of DSP, shared by both engines.

Stage k, tick t (PAPERS.md, DSP section; the numbering and the queue are our reading):

    forward:  x = this tick's input (stage 0: its micro-batch from the task)
              y = F_k(x; w_k) with the current weights; send y to stage k+1
              (last stage: loss and dL/dy of y, kept with x)
              push x on the queue of m_k stored inputs, pop the one from tick t - m_k
    backward: g = dL/dy for that popped micro-batch, from stage k+1 (or the loss)
              recompute F_k(x_old; w_k) with the *current* weights, (g_w, g_x) = vjp(g)
              send g_x to stage k-1; momentum-SGD step on w_k with g_w

The queue is a ring of m_k slots indexed by t mod m_k: the forward reads the
slot (the input stored m_k ticks ago) before writing this tick's input into
it, so between ticks the stage holds exactly m_k inputs. With m_k = 0 nothing
is stored and the backward uses the forward's own autodiff residuals (no
recompute: the weights have not changed in between), which is ordinary
backpropagation.

Other schedules change only what the queue holds (`StageConfig.kind`, `_item`; the backward
modes of `staleness.pipeline.schedules`). With micro-batches (GPipe) weight gradients are summed
and applied as their mean when the plan says so.

Everything here is unbatched, per-stage code with static configuration; the
one-device engine calls it for k = 0..K-1 in turn, the K-device engine runs
stage k's copy on device k (a branch of `lax.switch`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from staleness.tasks.optim import Optimizer
from staleness.engine.update import apply as apply_update

__all__ = ["Context", "StageConfig", "StageState", "backward", "forward", "init_state", "match_varying"]


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """Static description of stage `index` in one run.

    lag: m_k (ticks between its forward and backward of a micro-batch).
    backward: the schedule's backward mode ("recompute", "stash", "graph").
    microbatches: M; microbatch_size: examples per micro-batch.
    in_shape, in_dtype: the stage's input (stage 0: the task's x).
    """

    index: int
    num_stages: int
    lag: int
    backward: str
    microbatches: int
    microbatch_size: int
    in_shape: tuple[int, ...]
    in_dtype: str

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.num_stages - 1

    @property
    def kind(self) -> str:
        """What the queue stores: with m_k = 0 the forward's residuals are used at once."""
        return "graph" if self.lag == 0 else self.backward

    @property
    def accumulates(self) -> bool:
        return self.microbatches > 1


class Context(NamedTuple):
    """Traced values every stage reads."""

    ptask: Any            # PipelineTask (a pytree: its data are leaves)
    data_key: jax.Array   # the run's minibatch key


class StageState(NamedTuple):
    params: Any       # the stage's weights (one copy)
    opt_state: Any    # optax state of the stage's optimizer (its learning rate included)
    count: jax.Array  # int32: updates applied
    acc: Any          # Σ weight gradients since the last update (GPipe), else ()
    store: Any        # queue: pytree of [m_k, ...] rings (see StageConfig.kind), else ()


# -- varying-ness under shard_map ----------------------------------------------------
def _varying_axes(x) -> frozenset:
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))


def match_varying(tree, ref):
    """`tree` with every leaf made device-varying over the mesh axes `ref` varies over.

    Outside `shard_map` (no manual axes) this is the identity. Inside, values
    built from replicated data (zeros, a sampled batch) must have the same type
    as the per-device weights where they meet in `lax.cond`, a scan carry or a
    stored autodiff graph."""
    want = _varying_axes(ref)

    def one(x):
        missing = tuple(sorted(want - _varying_axes(x)))
        return lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(one, tree) if want else tree


def _ref(state: StageState):
    return jax.tree.leaves(state.params)[0]


def _zeros(shapes, ref):
    return match_varying(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), ref)


# -- pieces ------------------------------------------------------------------------
def _apply(cfg: StageConfig, ctx: Context):
    return lambda params, x: ctx.ptask.apply(cfg.index, params, x)


def _sample(cfg: StageConfig, ctx: Context, mb):
    """(x, y) of micro-batch `mb` (batch mb // M, slice mb % M)."""
    m = cfg.microbatches
    batch = ctx.ptask.minibatch(ctx.data_key, mb // m)
    x, y = batch["x"], batch["y"]
    if m > 1:
        start = (mb % m) * cfg.microbatch_size
        x = lax.dynamic_slice_in_dim(x, start, cfg.microbatch_size, 0)
        y = lax.dynamic_slice_in_dim(y, start, cfg.microbatch_size, 0)
    return x, y


def _item(cfg: StageConfig, params, x, vjp_fn):
    """What the queue keeps of one forward."""
    if cfg.kind == "recompute":
        return {"x": x}
    if cfg.kind == "stash":
        return {"x": x, "w": params}
    return {"res": jax.tree.leaves(vjp_fn)}


def _vjp_treedef(cfg: StageConfig, ctx: Context, params):
    """The pytree structure of this stage's autodiff graph (VJP object), traced
    here so its types match the stored residuals of the same trace."""
    ref = jax.tree.leaves(params)[0]

    def build(p):
        x = match_varying(jnp.zeros(cfg.in_shape, cfg.in_dtype), ref)
        return jax.vjp(_apply(cfg, ctx), p, x)[1]

    return jax.tree.structure(jax.eval_shape(build, params))


# -- state -------------------------------------------------------------------------
def init_state(cfg: StageConfig, ctx: Context, opt: Optimizer, params, *, with_store: bool = True
               ) -> StageState:
    """A fresh stage: given weights, a fresh optimizer state, empty queue (() if not `with_store`)."""
    opt_state = opt.init(params)
    acc = jax.tree.map(jnp.zeros_like, params) if cfg.accumulates else ()
    store = ()
    if cfg.lag > 0 and with_store:
        x = jax.ShapeDtypeStruct(cfg.in_shape, cfg.in_dtype)
        item = jax.eval_shape(lambda p, x: _forward_compute(cfg, ctx, p, x, 0)[1], params, x)
        store = jax.tree.map(lambda s: jnp.zeros((cfg.lag, *s.shape), s.dtype), item)
    return StageState(params, opt_state, jnp.zeros((), jnp.int32), acc, store)


def _forward_compute(cfg: StageConfig, ctx: Context, params, x_in, mb):
    apply = _apply(cfg, ctx)
    ref = jax.tree.leaves(params)[0]
    if cfg.first or cfg.last:
        x_data, labels = _sample(cfg, ctx, mb)
    x = match_varying(x_data if cfg.first else x_in, ref)
    y, vjp_fn = jax.vjp(apply, params, x)
    item = _item(cfg, params, x, vjp_fn)
    loss = jnp.zeros((), jnp.float32)
    if cfg.last:
        loss, dy = jax.value_and_grad(ctx.ptask.output_loss)(y, labels)
        item["dy"] = dy
    return y, item, match_varying(loss, ref)


# -- the two halves of a tick ---------------------------------------------------------
def forward(cfg: StageConfig, ctx: Context, state: StageState, x_in, tick, mb, valid):
    """Forward half of stage k's tick.

    Args:
      x_in: the input from stage k-1 (ignored by stage 0, which samples micro-batch `mb`).
      tick: the tick (int32); mb: the micro-batch id forwarded; valid: whether it forwards at all.
    Returns:
      (state, y, pending, loss): y is the output for stage k+1 (logits on the
      last stage); pending is what this tick's backward needs (the queue item
      of the micro-batch m_k ticks older, or this one's if m_k = 0); loss is the
      last stage's loss of `mb` (0 elsewhere or when not valid).
    """
    ref = _ref(state)
    x_in = None if cfg.first else x_in

    def compute(params, x_in):
        return _forward_compute(cfg, ctx, params, x_in, mb)

    def skip(params, x_in):
        return _zeros(jax.eval_shape(compute, params, x_in), ref)

    y, item, loss = lax.cond(valid, compute, skip, state.params, x_in)
    if cfg.lag == 0:
        return state, y, item, loss
    slot = tick % cfg.lag
    pending = jax.tree.map(lambda ring: lax.dynamic_index_in_dim(ring, slot, keepdims=False), state.store)
    store = jax.tree.map(lambda ring, v: lax.dynamic_update_index_in_dim(ring, v.astype(ring.dtype), slot, 0),
                         state.store, item)
    return state._replace(store=store), y, pending, loss


def backward(cfg: StageConfig, ctx: Context, opt: Optimizer, state: StageState, pending, g_in,
             valid, update):
    """Backward half of stage k's tick: gradient of the popped micro-batch, then the update.

    Args:
      pending: from `forward` of the same tick.
      g_in: dL/d(output) of that micro-batch from stage k+1 (ignored by the last
        stage, whose gradient came from the loss and is in `pending`).
      valid: whether it backpropagates; update: whether it applies an update after.
    Returns: (state, g_x): g_x is dL/d(input) for stage k-1 (zeros on stage 0 or when not valid).
    """
    apply = _apply(cfg, ctx)
    ref = _ref(state)
    g_in = None if cfg.last else g_in

    def compute(state, pending, g_in):
        g = pending["dy"] if cfg.last else g_in
        if cfg.kind == "recompute":
            _, vjp_fn = jax.vjp(apply, state.params, pending["x"])
        elif cfg.kind == "stash":
            _, vjp_fn = jax.vjp(apply, pending["w"], pending["x"])
        else:
            vjp_fn = jax.tree.unflatten(_vjp_treedef(cfg, ctx, state.params), pending["res"])
        g_w, g_x = vjp_fn(match_varying(g, ref))
        if cfg.first:
            g_x = jnp.zeros((), jnp.float32)
        if cfg.accumulates:
            acc = jax.tree.map(jnp.add, state.acc, g_w)
            mean = jax.tree.map(lambda a: a / cfg.microbatches, acc)
            params, opt_state = apply_update(opt.tx, state.params, state.opt_state, mean, update)
            acc = jax.tree.map(lambda a: jnp.where(update, jnp.zeros_like(a), a), acc)
        else:
            params, opt_state = apply_update(opt.tx, state.params, state.opt_state, g_w, update)
            acc = state.acc
        count = state.count + update.astype(jnp.int32)
        return StageState(params, opt_state, count, acc, state.store), match_varying(g_x, ref)

    def skip(state, pending, g_in):
        g_x = jax.eval_shape(compute, state, pending, g_in)[1]
        return state, _zeros(g_x, ref)

    return lax.cond(valid, compute, skip, state, pending, g_in)
