"""The compiled replay: a loop over the updates of one evaluation chunk.

Per update (unbatched code): write the current version into its slot of a ring of R
versions and read each gradient's version from its slot (`plan.Plan`), compute each slot's
loss and gradient on its minibatch, a pure function of (key, worker, iteration), then one
server update (`engine.update`). No Python runs per event: the host calls one compiled
function per chunk; the learning rate lives in the optimizer state, so a sweep varies it
per configuration, and every configuration of a sweep runs through the same `_chunk` with
its own static settings (`Variant`): its numbers are bitwise those of its own replay.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from staleness.engine import local as _local
from staleness.engine import update as _update
from staleness.tasks.optim import Optimizer, set_lr
from staleness.engine.rollout import SEGMENT_VERSION

__all__ = ["Carry", "Static", "Setup", "Variant", "keys", "init_carry", "grow_ring", "init_carry_batched", "gradient",
           "fragment_of", "run_chunk",
           "pad_chunk", "MIN_ROWS", "chunk_batched", "run_chunk_batched", "evaluate"]


class Carry(NamedTuple):
    params: Any      # pytree: the current version
    opt_state: Any   # optax state of the server's (outer) optimizer
    ring: Any        # params pytree with a leading [R] axis: the versions still to be read (`plan.Plan`)
    local: Any = ()  # local-update methods: the workers' inner-optimizer states, leaves [λ, ...]


class Static(NamedTuple):
    """The static (compiled-in) settings of a replay step."""

    opt: Any             # the optimizer's optax transformation
    rules: tuple         # the lr rules a `consts['rule']` index picks from
    slot_mode: str       # 'vmap' or 'map' (see `_chunk`)
    local: Any           # an `engine.local.Local` for a local-update method, else None
    padded: bool = True  # some update may have no real slot (see `_update_from`)


class Setup(NamedTuple):
    """One configuration's replay, resolved once (`engine.run.configure`) for `replay` and
    for each configuration of a sweep alike: its optimizers, its inner steps per worker
    and the static settings it compiles."""

    opt: Optimizer                 # the server (outer) optimizer, with the rate to start from
    inner: Optimizer | None        # a local-update method's inner optimizer
    steps: Any                     # [λ] int32 inner steps per iteration (local-update methods), else None
    static: Static


# Columns of the packed per-update input (one int32 array [K, 6, C] per chunk, so
# the scan slices one array per step instead of six): SLOT is the ring slot of the
# gradient's version, WRITE the slot the update's own version goes to (in every column).
WORKER, ITERATION, SLOT, STALENESS, MASK, WRITE = range(6)


def keys(seed):
    """(init_key, data_key) of a run: one global key for the initial
    parameters, one for every minibatch (folded with worker, iteration)."""
    return tuple(jax.random.split(jax.random.key(seed)))


def _state(task, seed, opt: Optimizer, inner: Optimizer | None, num_workers: int, layout: str | None):
    """(params, opt_state, local) of version 0: see `init_carry`."""
    init_key, _ = keys(seed)
    params = task.init_params(init_key)
    opt_state = opt.init(params)
    local = () if inner is None else _local.init_states(inner, params, num_workers, layout)
    if layout in ("streaming", "anchored"):   # Streaming DiLoCo: the workers' own parameters persist too,
        # starting at version 0 (anchored: and the fragments each last merged, version 0's too)
        own = lambda: jax.tree.map(lambda a: jnp.broadcast_to(a, (num_workers,) + a.shape).copy(), params)  # noqa
        local = (local, own() if layout == "streaming" else (own(), own()))
    return params, opt_state, local


def init_carry(task, seed, opt: Optimizer, ring: int, inner: Optimizer | None = None,
               num_workers: int = 0, layout: str | None = None) -> Carry:
    """Initial parameters (from the run's init key), optimizer state (with the
    optimizer's learning rate) and an empty ring of `ring` versions; with an
    `inner` optimizer (a local-update method) also `num_workers` fresh inner
    states (`layout`: `engine.local.Local.layout`). Eager: the task's own jitted init does the
    work, so nothing large is compiled here."""
    params, opt_state, local = _state(task, seed, opt, inner, num_workers, layout)
    # the ring's zeros made on the host and placed (an eager `jnp.zeros` compiles a program per shape and ring size)
    zeros = jax.device_put(jax.tree.map(lambda p: np.zeros((ring,) + np.shape(p), p.dtype), params))
    return _distinct(Carry(params, opt_state, zeros, local))


def grow_ring(carry: Carry, ring: int) -> Carry:
    """`carry` with a ring of `ring` (> its own) slots: the new ones are added after the
    others, which keep their versions (a `plan.PlanStream` that found no free slot; the
    replay goes on bitwise). On the host: it is rare."""
    old = jax.device_get(carry.ring)
    return carry._replace(ring=jax.device_put(jax.tree.map(
        lambda a: np.concatenate([np.asarray(a), np.zeros((ring - a.shape[0],) + a.shape[1:], a.dtype)]), old)))


def _distinct(tree):
    """`tree` with no array appearing twice (the replay donates its carry; one buffer
    in two places, e.g. a learning rate set into several optimizer states, would be
    donated twice)."""
    seen = set()

    def once(a):
        if id(a) in seen:
            return jnp.array(a, copy=True)
        seen.add(id(a))
        return a

    return jax.tree.map(once, tree)


def init_carry_batched(task, members, ring: int, num_workers: int = 0) -> Carry:
    """`init_carry` of several configurations, stacked on a leading configuration axis (the
    ring too: [B, R, ...]). members: one (seed, opt, inner, layout) per configuration, as
    `init_carry` takes them. Stacked on the host and placed once (eager stacks compiled a
    program per leaf shape, about a second for a small MLP's carry)."""
    cache = {}
    states = []
    for seed, opt, inner, layout in members:
        key = (seed, id(opt.tx), None if inner is None else id(inner.tx), layout)
        if key not in cache:
            cache[key] = jax.device_get(_state(task, seed, dataclasses.replace(opt, lr=None), inner, num_workers,
                                               layout))
        p, o, loc = cache[key]
        states.append((p, o if opt.lr is None else set_lr(o, opt.lr, host=True), loc))
    params, opt_state, local = jax.tree.map(lambda *xs: np.stack(xs), *states)
    ring_zeros = jax.tree.map(lambda p: np.zeros((p.shape[0], ring) + p.shape[1:], p.dtype), params)
    return Carry(*jax.device_put((params, opt_state, ring_zeros, local)))


def gradient(task, params, data_key, worker, iteration, index=None):
    """(loss, grad) of `worker`'s minibatch for its `iteration` at `params`.

    index: the minibatch's training indices ([μ] int32, from `task.host_indices`)
    for `indexed` tasks, so the batch is a gather like in a plain training loop;
    None draws them with `task.minibatch` (the same examples).
    The per-gradient function shared by the engine and the real runtime: a
    trace replayed with `slot_mode='map'` computes every gradient with it."""
    if index is None:
        batch = task.minibatch(data_key, worker, iteration)
    else:
        batch = task.batch(index, data_key, worker, iteration)
    return jax.value_and_grad(task.loss)(params, batch)


def _unrolled(one, args, c: int):
    """`one` of each of the c slots of `args` ([C, ...] leaves), stacked: one standalone call
    per slot, unrolled (not a lax.map: XLA compiles some ops, e.g. a custom_jvp's matvec,
    with other rounding inside a loop body than in a standalone call)."""
    outs = [one(jax.tree.map(lambda a, k=k: a[k], args)) for k in range(c)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)


def _slots(task, local, slot_mode: str, consts, params, stale, worker, iteration, index, inner):
    """(losses [C], grads) of one update's C slots: minibatch gradients, or for a
    local-update method the deltas of each slot's inner steps (and the new inner
    states [C, ...] in `inner`'s place). (Asynchronous RL's learner: `_update_from`.)"""
    data_key = consts["data_key"]
    c = worker.shape[0]
    if local is not None and local.streaming:
        states, own = inner

        def one(args):
            p, q, s, w, i = args
            loss, delta, s, q = _local.streaming_delta(task, local, p, q, s, data_key, w, i)
            return loss, delta, (s, q)

        mine = (stale, jax.tree.map(lambda a: a[worker], own), jax.tree.map(lambda a: a[worker], states), worker,
                iteration)
        return _unrolled(one, mine, c) if slot_mode == "map" or c == 1 else jax.vmap(one)(mine)
    if local is not None:
        steps = consts["steps"][worker]

        def one(args):
            p, w, i, s, h = args
            return _local.local_delta(task, local, p, s, data_key, w, i, h)

        mine = jax.tree.map(lambda a: a[worker], inner)                  # [C, ...] each slot's worker's state
        if c == 1:
            loss, delta, new = one(jax.tree.map(lambda a: a[0], (stale, worker, iteration, mine, steps)))
            return loss[None], delta, jax.tree.map(lambda a: a[None], new)
        args = (stale, worker, iteration, mine, steps)
        return _unrolled(one, args, c) if slot_mode == "map" else jax.vmap(one)(args)
    if c == 1:
        # one gradient per update (ASP, SSP, DSSP): no vmap, so a one-worker ASP
        # replay runs exactly the ops of plain training.
        loss, grads = gradient(task, jax.tree.map(lambda a: a[0], stale), data_key, worker[0], iteration[0],
                               None if index is None else index[0])
        return loss[None], grads, None

    def one(args):
        p, w, i, ix = args
        return gradient(task, p, data_key, w, i, ix)

    args = (stale, worker, iteration, index)
    losses, grads = _unrolled(one, args, c) if slot_mode == "map" else jax.vmap(one)(args)
    return losses, grads, None


def _update_from(task, static: Static, consts, params, opt_state, inner, stale, update, x, index):
    """Gradients (or local-update deltas) of one update's C slots on their `stale` params
    ([C, ...] leaves) and minibatch indices ([C, μ], or None), then one server update
    (`engine.update.server_update`). static.padded False promises every update has a real
    slot, which drops the per-update select of `server_update` (the same values).
    Returns (params, opt_state, inner, losses [C], diag)."""
    opt, rules, local = static.opt, static.rules, static.local
    worker, iteration, staleness = x[WORKER], x[ITERATION], x[STALENESS]
    mask = x[MASK] > 0
    if local is not None and local.learner:   # asynchronous RL: the learner's version (`rollout.learner_update`)
        params, opt_state, losses, diag = local.update(task, static, consts, params, opt_state, stale,
                                                       (worker, iteration, staleness, mask), index)
        return params, opt_state, inner, jnp.where(mask, losses, jnp.nan), diag
    losses, grads, new_inner = _slots(task, local, static.slot_mode, consts, params, stale, worker, iteration, index,
                                      inner)
    streaming = local is not None and local.streaming
    extra = {"fragment": fragment_of(iteration, mask, local.fragments)} if streaming else {}
    tokens = consts["steps"][worker] if local is not None and local.weighted else None   # ∝ tokens processed
    if local is not None:   # the update's share of a round (`optim.clocked_nesterov`)
        ones = jnp.ones_like(consts["steps"])
        extra["share"] = (_update.round_share(tokens, mask, consts["steps"]) if tokens is not None
                          else _update.round_share(ones[worker], mask, ones))
    if static.padded:
        params, opt_state = _update.server_update(opt, rules, params, opt_state, grads, staleness, mask,
                                                  consts["rule"], tokens, **extra)
    else:   # = server_update with mask.any() known True
        grad = _update.aggregate(grads, staleness, mask, rules, consts["rule"], tokens)
        params, opt_state = _update.apply(opt, params, opt_state, grad, True, **extra)
    if new_inner is not None:   # write back the workers' states of the real slots only: a padding slot
        # names worker 0 too, and of two writes to one index the last wins (it undid worker 0's new state)
        into = jnp.where(mask, worker, jax.tree.leaves(inner)[0].shape[0])   # out of range: dropped
        inner = jax.tree.map(lambda a, v: a.at[into].set(v, mode="drop"), inner, new_inner)
    return params, opt_state, inner, jnp.where(mask, losses, jnp.nan), {}


def fragment_of(iteration, mask, fragments: int):
    """The fragment one update of a fragmented method synchronizes: its merged iterations' mod P
    (every real slot's is the same: in lockstep all are the round, and Decoupled DiLoCo's windows
    merge one fragment each; `staleness.driver.SyncWindow`). `iteration`, `mask`: [C] of its slots."""
    return jnp.max(jnp.where(mask, iteration, 0)) % fragments


def _step(task, static: Static, consts, carry: Carry, x):
    params, opt_state, ring, inner = carry
    r = jax.tree.leaves(ring)[0].shape[0]
    update, x, index = x
    # Store the current version first and read stale versions from the result:
    # every read then depends on the in-place write, so XLA never copies the ring
    # (reading first and writing last made it copy [R, ...] per step). One ring
    # per leaf: measured faster than one flat [R, P] ring (no concat/split).
    ring = jax.tree.map(lambda a, p: lax.dynamic_update_index_in_dim(a, p, x[WRITE, 0], 0), ring, params)
    slots = x[SLOT]
    if static.local is not None and static.local.inflight:   # one version per in-flight segment: [C, S, ...]
        seg = index[:, SEGMENT_VERSION] % r   # (such plans are `make_plan`'s: version v in slot v % R)
        stale = jax.tree.map(lambda a: a[seg], ring)
    elif slots.shape[0] == 1:
        stale = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, slots[0], keepdims=True), ring)
    else:
        stale = jax.tree.map(lambda a: a[slots], ring)
    params, opt_state, inner, losses, diag = _update_from(task, static, consts, params, opt_state, inner, stale,
                                                          update, x, index)
    return Carry(params, opt_state, ring, inner), (losses, diag)


def _chunk(task, carry: Carry, xs, consts, *, opt, rules: tuple, slot_mode: str = "vmap", local=None,
           padded: bool = True):
    """Replay the first `n` updates of one chunk. xs: (update [L] int32, packed [L, 6, C]
    int32, index [L, C, μ] int32 or None: the minibatch indices of every slot, n: int32
    scalar), the inputs padded to L >= n rows (`pad_chunk`): the number of updates is an
    input, not a shape, so runs of other lengths (other evaluation intervals up to L)
    share one compiled program. opt, rules, slot_mode, local, padded: the fields of `Static`
    (slot_mode 'map': each slot as one standalone `gradient` call, for bitwise parity with
    real-run traces; padded False: `Plan.padded_updates` of the whole plan is False).
    Returns (carry, (losses [L, C], diag {name: [L]})); losses are NaN on padded slots and
    past n, diag (an RL learner's per-update diagnostics, `engine.rollout.DIAGNOSTICS`; empty
    for other work) NaN past n."""
    *inputs, n = xs
    inputs = tuple(inputs)
    step = functools.partial(_step, task, Static(opt, rules, slot_mode, local, padded), consts)
    at = lambda i: jax.tree.map(lambda a: a[i], inputs)   # noqa: E731 - update i's inputs
    out = jax.eval_shape(lambda c, x: step(c, x)[1], carry, at(0))     # (losses [C], diag {name: []})
    rows = inputs[0].shape[0]

    def body(i, state):
        carry, bufs = state
        carry, got = step(carry, at(i))
        return carry, jax.tree.map(lambda b, v: lax.dynamic_update_index_in_dim(b, v, i, 0), bufs, got)

    bufs = jax.tree.map(lambda o: jnp.full((rows,) + o.shape, jnp.nan, o.dtype), out)
    return lax.fori_loop(0, n, body, (carry, bufs))


MIN_ROWS = 256
"""Chunk inputs are padded to at least this many updates (`pad_chunk`): evaluation
intervals up to it share one compiled replay."""


def pad_chunk(xs, n: int, length: int | None = None) -> tuple:
    """Chunk inputs (update [K], packed [K, 6, C], index or None) padded to L = max(MIN_ROWS,
    the next power of two >= K) rows, with the number of updates to run, `n` <= K.
    `length` >= K: pad as for a chunk of that many updates (a part of a chunk runs in the
    chunk's compiled program)."""
    k = xs[0].shape[0]
    rows = max(MIN_ROWS, 1 << max(0, (length or k) - 1).bit_length())
    pad = lambda a: None if a is None else np.concatenate(   # noqa: E731
        [a, np.zeros((rows - k,) + a.shape[1:], a.dtype)])
    return (*[pad(a) for a in xs], np.int32(n))


run_chunk = jax.jit(_chunk, static_argnames=("opt", "rules", "slot_mode", "local", "padded"), donate_argnums=(1,))


class Variant(NamedTuple):
    """What one configuration of a batched replay compiles (`chunk_batched`): the `Static`
    of its own replay, its own number of gradient slots C and in-flight segments S (None:
    none). A batch's inputs are padded to the largest; each configuration runs on its own."""

    static: Static
    slots: int
    segments: int | None = None
    index: bool = False   # whether its replay takes the `index` input (minibatch indices or segments)


def chunk_batched(task, carry, xs, consts, *, variants: tuple):
    """B configurations, each replayed by `_chunk` with its own `Variant` (`consts['variant']`
    picks it), one after the other (`lax.map`), on its own shapes: its numbers are bitwise
    those of its own replay whatever else is in the batch (a `vmap` over configurations let
    XLA choose other kernels, with other rounding, for the batched shapes).

    carry: leaves [B, ...] (the ring [B, R, ...]); xs = (update [L], packed [B, L, 6, C],
    index [B, L, C, ...] or None, n [B]): each configuration's `pad_chunk` inputs, padded to
    the largest C (and S); consts: leaves [B] ('data_key', 'rule', 'variant', and 'steps'
    [B, λ] for local-update methods). Not jitted: the per-device body of a sharded sweep
    (`engine.grid`); `run_chunk_batched` is its jitted form. Returns (carry, (losses [B, L, C],
    diag {name: [B, L]}))."""
    update, packed, index, n = xs
    width = packed.shape[-1]

    def branch(v: Variant):
        def run(c, x, k):
            p, ix, m = x
            ix = None if not v.index else ix[:, :v.slots] if v.segments is None else ix[:, :v.slots, :, :v.segments]
            c, (losses, diag) = _chunk(task, c, (update, p[:, :, :v.slots], ix, m), k, opt=v.static.opt,
                                       rules=v.static.rules, slot_mode=v.static.slot_mode, local=v.static.local,
                                       padded=v.static.padded)
            return c, (jnp.pad(losses, ((0, 0), (0, width - v.slots)), constant_values=jnp.nan), diag)
        return run

    fns = [branch(v) for v in variants]

    def one(args):
        c, p, ix, m, k = args
        if len(fns) == 1:
            return fns[0](c, (p, ix, m), k)
        return lax.switch(k["variant"], fns, c, (p, ix, m), k)

    return lax.map(one, (carry, packed, index, n, consts))


run_chunk_batched = jax.jit(chunk_batched, static_argnames=("variants",), donate_argnums=(1,))
evaluate = jax.jit(lambda task, params: task.evaluate(params))
