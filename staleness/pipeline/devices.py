"""The K-device engine: stage k on device k, `shard_map` + `ppermute` in a `lax.scan` over ticks.

One SPMD program runs on a 1-D mesh (axis "stage"); device k executes stage
k's own code as branch k of `lax.switch` on `lax.axis_index`, so stages may
differ in parameters and activation shapes (a ResNet split into blocks as
well as a stack of identical blocks). Values that differ in shape between
stages (stage state, stored inputs, activations) travel as flat per-dtype
buffers padded to the largest stage (`staleness.pipeline.packing`).

A tick on the devices:
  forward, in sub-steps p = 0..P_f-1: the stages whose forward phase is p run
    their forward half; every device then sends its output one stage on
    (`ppermute` k -> k+1). A link of delay 0 delivers within the tick (the
    receiver's phase is one higher); a link of delay d > 0 lands in the
    receiver's ring of d messages and is read d ticks later. With every
    inter-stage delay >= 1 (DSP, GPipe) P_f = 1: all stages compute at once.
  backward, likewise in sub-steps with `ppermute` k+1 -> k.
The numbers are the one-device engine's (`staleness.pipeline.sim`), up to floating-point reassociation.

Carries created inside the body are made device-varying (`stage.match_varying`) so their types match what
the scan returns (JAX >= 0.7's varying-manual-axes typing; checked with JAX 0.10.2).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from staleness.tasks.optim import Optimizer
from staleness.pipeline import packing, sim
from staleness.pipeline import stage as S
from staleness.pipeline.plan import TickPlan

__all__ = ["AXIS", "DeviceCarry", "DeviceEngine", "check_devices", "put"]

AXIS = "stage"


def check_devices(num_stages: int, devices=None) -> list:
    """The first `num_stages` devices (of `devices` or jax.devices()), or a ValueError saying how to get more."""
    devs = list(jax.devices() if devices is None else devices)
    if len(devs) < num_stages:
        raise ValueError(
            f"devices: the pipeline has {num_stages} stages but only {len(devs)} device(s) are available "
            f"({devs[0].platform if devs else 'none'}); use --stages <= {len(devs)}, or on CPU start with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={num_stages} (or "
            f"jax.config.update('jax_num_cpu_devices', {num_stages}) before JAX starts)")
    return devs[:num_stages]


def put(tree, sharding):
    """`jax.device_put(tree, sharding)`, also for a mesh spanning several processes
    (`staleness.pipeline.multiprocess`): there every process holds the same host
    values and places the shards of its own devices (`make_array_from_callback`);
    PRNG key arrays travel as their key data."""
    if sharding.is_fully_addressable:
        return jax.device_put(tree, sharding)

    def one(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            data = one(jax.random.key_data(x))
            return jax.jit(lambda d: jax.random.wrap_key_data(d, impl=jax.random.key_impl(x)),
                           out_shardings=sharding)(data)
        host = np.asarray(jax.device_get(x))
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
    return jax.tree.map(one, tree)


def _first(buffers: dict):
    return buffers[next(iter(buffers))]


def _head(state: S.StageState) -> tuple:
    """The state without its queue: (params, opt_state, count, acc)."""
    return tuple(state[:4])


class DeviceCarry(NamedTuple):
    state: dict       # dtype -> [K, S] packed StageState per device
    fwd_fifo: dict    # dtype -> [K, Df, Msg] activations in flight on links of delay > 0
    bwd_fifo: dict    # dtype -> [K, Db, Msg] gradients in flight


class DeviceEngine:
    """Compiled K-device execution of one plan on one pipeline task.

    engine = DeviceEngine(ptask, plan, opt, params, ctx, devices)
    carry = engine.init_carry()
    carry, loss = engine.run_chunk(carry, plan.xs(start, length))   # loss [length] (NaN where none)
    engine.stage_params(carry)                                     # per-stage params (NumPy)
    """

    def __init__(self, ptask, plan: TickPlan, opt: Optimizer, params, ctx: S.Context, devices=None):
        k = plan.num_stages
        self.plan, self.opt, self.num_stages = plan, opt, k
        self.devices = check_devices(k, devices)
        self.mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
        self.cfgs = sim.configs(ptask, plan, params)
        sh = sim.shapes(ptask, plan, params)
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(AXIS))
        self.ctx = put(ctx, self.replicated)
        self.in_layouts = [packing.Layout.of(sh[j]) for j in range(k)]      # input of stage j
        self.out_layouts = [packing.Layout.of(sh[j + 1]) for j in range(k)]  # output of stage j
        self.msg_sizes = packing.union_sizes([self.out_layouts[j] for j in range(max(k - 1, 1))])
        # The state is (params, opt_state, count, acc, store): packed per dtype in that
        # order, so its head (no store) has the same offsets whatever the store holds.
        heads = [_head(S.init_state(c, ctx, opt, p, with_store=False)) for c, p in zip(self.cfgs, params, strict=True)]
        self.head_layouts = [packing.Layout.of(h) for h in heads]
        self._heads = heads
        self.state_layouts, self.pend_layouts = self._probe_layouts()
        self.state_sizes = packing.union_sizes(self.state_layouts)
        self.pend_sizes = packing.union_sizes(self.pend_layouts)
        f, b = plan.forward_delays, plan.backward_delays
        self.in_delay = np.array([0] + [f[j - 1] for j in range(1, k)], np.int32)      # into stage j
        self.grad_delay = np.array([b[j] for j in range(k - 1)] + [0], np.int32)       # into stage j
        self.fphase, self.bphase = np.array(plan.forward_phases), np.array(plan.backward_phases)
        self.depth_f = max(1, int(self.in_delay.max()))
        self.depth_b = max(1, int(self.grad_delay.max()))
        self._run = self._build()

    def _probe_layouts(self):
        """Layouts of each stage's state and pending values as traced *inside* `shard_map`.

        A stored autodiff graph (DDG) can hold more residuals there than in a plain
        trace (constants become per-device values), so these layouts are taken from
        a trace of the real context; nothing is compiled or run."""
        head_sizes = packing.union_sizes(self.head_layouts)
        packed = {d: jnp.stack([lay.pack(h, head_sizes)[d] for lay, h in zip(self.head_layouts, self._heads)])
                  for d in head_sizes}
        packed = put(packed, self.sharded)
        states, pends = [None] * self.num_stages, [None] * self.num_stages

        def probe(ctx, packed):
            buf = {d: a[0] for d, a in packed.items()}
            ref = _first(buf)
            t = jnp.int32(0)
            mb = S.match_varying(jnp.int32(0), ref)
            for j, cfg in enumerate(self.cfgs):
                params = self.head_layouts[j].unpack(buf)[0]
                st = jax.eval_shape(lambda p, cfg=cfg: S.init_state(cfg, ctx, self.opt, p), params)
                states[j] = packing.Layout.of(st)
                x_in = None if j == 0 else S.match_varying(
                    jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self.in_layouts[j].unpack(
                        packing.zeros(self.in_layouts[j].sizes))), ref)

                def pend(p, x, cfg=cfg):
                    state = S.match_varying(S.init_state(cfg, ctx, self.opt, p), ref)
                    return S.forward(cfg, ctx, state, x, t, mb, mb >= 0)[2]
                pends[j] = packing.Layout.of(jax.eval_shape(pend, params, x_in))
            return ref[None]

        jax.jit(jax.shard_map(probe, mesh=self.mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS))).lower(
            self.ctx, packed)
        return states, pends

    # -- carry ---------------------------------------------------------------------
    def init_carry(self) -> DeviceCarry:
        """Initial state: the engine's params on their devices, empty queues and links."""
        packed = [lay.pack(h, self.state_sizes) for lay, h in zip(self.head_layouts, self._heads)]
        state = {d: jnp.stack([b[d] for b in packed]) for d in self.state_sizes}
        k = self.num_stages
        return put(DeviceCarry(state, packing.zeros(self.msg_sizes, (k, self.depth_f)),
                               packing.zeros(self.msg_sizes, (k, self.depth_b))), self.sharded)

    def stage_params(self, carry: DeviceCarry) -> tuple:
        """Per-stage params (NumPy) of a carry."""
        return self.unpack_params(jax.device_get(carry.state))

    def unpack_params(self, state: dict) -> tuple:
        """Per-stage params (NumPy) of a carry's packed state on the host (dtype -> [K, S]),
        e.g. gathered from every process of a job."""
        return tuple(self.head_layouts[j].unpack({d: np.asarray(v[j]) for d, v in state.items()})[0]
                     for j in range(self.num_stages))

    def _put_xs(self, xs):
        cols = NamedSharding(self.mesh, P(None, AXIS))
        return {"tick": put(xs["tick"], self.replicated), **{n: put(xs[n], cols) for n in ("fwd", "bwd", "update")}}

    def run_chunk(self, carry: DeviceCarry, xs: dict[str, np.ndarray]):
        """Run the ticks in `xs` (from `plan.xs`); returns (carry, loss per tick [L], NaN where none)."""
        carry, loss = self._run(self.ctx, carry, self._put_xs(xs))
        return carry, loss[:, -1]

    def compile_chunk(self, carry: DeviceCarry, xs: dict[str, np.ndarray]):
        """Compile `run_chunk` ahead of time for chunks shaped like `xs`; returns `fn(carry, xs)`."""
        program = self.compile_program(carry, xs)

        def run(carry, xs):
            carry, loss = program(carry, xs)
            return carry, loss[:, -1]
        return run

    def compile_program(self, carry: DeviceCarry, xs: dict[str, np.ndarray]):
        """Compile the SPMD program ahead of time for chunks shaped like `xs`; returns
        `fn(carry, xs) -> (carry, loss [L, K])`: column k is device k's (NaN but at the last
        stage's forward ticks), a global array also where the mesh spans several processes."""
        compiled = self._run.lower(self.ctx, carry, self._put_xs(xs)).compile()
        return lambda carry, xs: compiled(self.ctx, carry, self._put_xs(xs))

    # -- the SPMD program ------------------------------------------------------------
    def _build(self):
        k_all = self.num_stages
        cfgs, opt = self.cfgs, self.opt
        fphase, bphase = self.fphase, self.bphase
        n_fph, n_bph = int(fphase.max()) + 1, int(bphase.max()) + 1
        state_sizes, msg_sizes, pend_sizes = self.state_sizes, self.msg_sizes, self.pend_sizes
        fwd_pairs = [(j, j + 1) for j in range(k_all - 1)]
        bwd_pairs = [(j + 1, j) for j in range(k_all - 1)]

        def fwd_branch(j, p):
            cfg = cfgs[j]

            def run(ctx, state, msg, pending, loss, t, mb):
                if fphase[j] != p:
                    return state, S.match_varying(packing.zeros(msg_sizes), _first(state)), pending, loss
                st = self.state_layouts[j].unpack(state)
                x_in = None if j == 0 else self.in_layouts[j].unpack(msg)
                st, y, pend, lk = S.forward(cfg, ctx, st, x_in, t, mb, mb >= 0)
                out = (self.out_layouts[j].pack(y, msg_sizes) if j < k_all - 1 else packing.zeros(msg_sizes))
                return S.match_varying((self.state_layouts[j].pack(st, state_sizes), out,
                                        self.pend_layouts[j].pack(pend, pend_sizes), lk), _first(state))
            return run

        def bwd_branch(j, p):
            cfg = cfgs[j]

            def run(ctx, state, pending, g_msg, valid, upd):
                if bphase[j] != p:
                    return state, S.match_varying(packing.zeros(msg_sizes), _first(state))
                st = self.state_layouts[j].unpack(state)
                pend = self.pend_layouts[j].unpack(pending)
                g_in = None if j == k_all - 1 else self.out_layouts[j].unpack(g_msg)
                st, g_x = S.backward(cfg, ctx, opt, st, pend, g_in, valid, upd)
                out = self.in_layouts[j].pack(g_x, msg_sizes) if j > 0 else packing.zeros(msg_sizes)
                return S.match_varying((self.state_layouts[j].pack(st, state_sizes), out), _first(state))
            return run

        fwd_branches = [[fwd_branch(j, p) for j in range(k_all)] for p in range(n_fph)]
        bwd_branches = [[bwd_branch(j, p) for j in range(k_all)] for p in range(n_bph)]
        in_delay, grad_delay = jnp.asarray(self.in_delay), jnp.asarray(self.grad_delay)
        # stage j's forward sender is j-1 (phase of the sender), its gradient sender j+1
        sender_fphase = np.concatenate([[-1], fphase[:-1]])
        sender_bphase = np.concatenate([bphase[1:], [-1]])

        def tick(ctx, carry, x):
            state, fifo_f, fifo_b = carry
            kk = lax.axis_index(AXIS)
            ref = _first(state)
            vary = functools.partial(S.match_varying, ref=ref)
            t = x["tick"]
            mb_f, mb_b, upd = x["fwd"][0], x["bwd"][0], x["update"][0]
            d_in, d_g = in_delay[kk], grad_delay[kk]
            slot_f, slot_b = t % jnp.maximum(d_in, 1), t % jnp.maximum(d_g, 1)
            from_fifo = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, slot_f, keepdims=False), fifo_f)
            received = vary(packing.zeros(msg_sizes))
            arrived = received
            pending = vary(packing.zeros(pend_sizes))
            loss = vary(jnp.zeros((), jnp.float32))
            s_ph = jnp.asarray(sender_fphase)[kk]
            for p in range(n_fph):
                msg = from_fifo if p == 0 else received
                state, out, pending, loss = lax.switch(kk, fwd_branches[p], ctx, state, msg, pending, loss, t, mb_f)
                received = jax.tree.map(lambda a: lax.ppermute(a, AXIS, fwd_pairs), out) if fwd_pairs else out
                arrived = jax.tree.map(lambda r, a: jnp.where(s_ph == p, r, a), received, arrived)
            fifo_f = jax.tree.map(
                lambda f, a: jnp.where(d_in > 0, lax.dynamic_update_index_in_dim(f, a, slot_f, 0), f), fifo_f, arrived)
            from_fifo = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, slot_b, keepdims=False), fifo_b)
            received = vary(packing.zeros(msg_sizes))
            arrived = received
            s_ph = jnp.asarray(sender_bphase)[kk]
            for p in range(n_bph):
                g_msg = from_fifo if p == 0 else received
                state, out = lax.switch(kk, bwd_branches[p], ctx, state, pending, g_msg, mb_b >= 0, upd)
                received = jax.tree.map(lambda a: lax.ppermute(a, AXIS, bwd_pairs), out) if bwd_pairs else out
                arrived = jax.tree.map(lambda r, a: jnp.where(s_ph == p, r, a), received, arrived)
            fifo_b = jax.tree.map(
                lambda f, a: jnp.where(d_g > 0, lax.dynamic_update_index_in_dim(f, a, slot_b, 0), f), fifo_b, arrived)
            loss = jnp.where((kk == k_all - 1) & (mb_f >= 0), loss, jnp.nan)
            return DeviceCarry(state, fifo_f, fifo_b), loss[None]

        def body(ctx, carry, xs):
            carry = jax.tree.map(lambda a: a[0], carry)
            carry, loss = lax.scan(functools.partial(tick, ctx), carry, xs)
            return jax.tree.map(lambda a: a[None], carry), loss

        carry_spec = DeviceCarry(P(AXIS), P(AXIS), P(AXIS))
        xs_spec = {"tick": P(), "fwd": P(None, AXIS), "bwd": P(None, AXIS), "update": P(None, AXIS)}
        fn = jax.shard_map(body, mesh=self.mesh, in_specs=(P(), carry_spec, xs_spec),
                           out_specs=(carry_spec, P(None, AXIS)))
        return jax.jit(fn, donate_argnums=(1,))
