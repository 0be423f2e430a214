"""The jitted functions a real run executes, built from the engine's shared numerics.

The server applies `engine.update.server_update`'s ops, the very function the
compiled replay calls per update, so that on CPU a recorded trace replays to
bitwise the same parameters. With one gradient slot per update (ASP, SSP, DSSP)
the gradient is passed unstacked, as the engine passes it.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np

from staleness.engine import core
from staleness.engine import local as _local
from staleness.engine import rollout as _rollout
from staleness.engine import update as _update
from staleness.tasks.optim import Optimizer

__all__ = ["Numerics", "INDEX_BLOCK"]

INDEX_BLOCK = 64  # iterations of one worker whose minibatch indices are computed in one host call


def _gradient(task, params, data_key, worker, iteration, index):
    return core.gradient(task, params, data_key, worker, iteration, index)


def _stack(*grads):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *grads)


def _server_update(params, opt_state, grads, staleness, mask, fragment, weights=None, counts=None, round_counts=None,
                   *, tx, rule):
    # `server_update` without its padding select: every update of a real run has a
    # real gradient, and the engine's replay of a trace whose plan has no padding
    # update compiles these very ops (`engine.core._update_from`, padded=False); the
    # select changes how XLA fuses Adam's step (last-bit differences, multi-slot).
    extra = {} if fragment is None else {"fragment": fragment}
    if counts is not None:   # a local-update merge's share of a round, as the replay's (`engine.core`)
        extra["share"] = _update.round_share(counts, mask, round_counts)
    grad = _update.aggregate(grads, staleness, mask, (rule,), 0, weights)
    return _update.apply(tx, params, opt_state, grad, True, **extra)


def _local_delta(task, params, inner_state, data_key, worker, round_, steps, *, local):
    return _local.local_delta(task, local, params, inner_state, data_key, worker, round_, steps)


def _streaming_delta(task, pulled, own, inner_state, data_key, worker, round_, *, local):
    return _local.streaming_delta(task, local, pulled, own, inner_state, data_key, worker, round_)


def _generate(task, params, data_key, worker, iteration, starts=None, keep_cache=True):
    rollout = _rollout.generate_rollout(task, params, data_key, worker, iteration, starts, keep_cache)
    return _rollout.behavior_loss(task, rollout), rollout


def _learner_update(task, params, opt_state, rollouts, staleness, mask, *, tx, rule, minibatches, many):
    # the compiled replay's learner step itself (`engine.rollout.learner_update`, padded=False
    # as a trace's plan): π_prox at `params`, then `minibatches` optimizer steps
    params, opt_state, _, _ = _rollout.learner_update(task, tx, (rule,), 0, params, opt_state, rollouts, staleness,
                                                      mask, minibatches, False, many)
    return params, opt_state


_gradient_jit = jax.jit(_gradient)
_generate_jit = jax.jit(_generate, static_argnames=("keep_cache",))
_learner_update_jit = jax.jit(_learner_update, static_argnames=("tx", "rule", "minibatches", "many"))
_local_delta_jit = jax.jit(_local_delta, static_argnames=("local",))
_streaming_delta_jit = jax.jit(_streaming_delta, static_argnames=("local",))
_stack_jit = jax.jit(_stack)
_server_update_jit = jax.jit(_server_update, static_argnames=("tx", "rule"))


class Numerics:
    """Per-gradient and per-update functions of one run.

    Args:
      task: the Task (a `jit` argument, so its data are device inputs, not constants).
      opt: the server `Optimizer` (its transformation is a static argument).
      rule: the lr rule.
      slots: gradient slots per update (the policy's largest); 1: the one-gradient path.
      data_key: the run's minibatch key (`engine.core.keys(seed)[1]`).
      local: an `engine.local.Local` (local-update methods), an `engine.rollout.Learner`
        (asynchronous RL: workers are actors that push rollouts; `update` is the
        learner's), or None.
    """

    def __init__(self, task, opt: Optimizer, rule, slots: int, data_key, local=None, inner=None,
                 local_steps=None):
        self.task = task
        self.opt = opt
        self.rule = rule
        self.slots = int(slots)
        self.data_key = data_key
        self.learner = local if local is not None and local.learner else None
        self.local = None if self.learner is not None else local
        self.inner, self.local_steps = inner, local_steps
        self._inner_states: dict[int, object] = {}   # worker -> its inner-optimizer state (its thread's)
        self._inner_after: dict[int, dict[int, object]] = {}   # worker -> {iteration: the state after it}, the
        #                                                        last two (`inner_at`: what a checkpoint keeps)
        self._scalar = None        # sharding of the update's small inputs (None: NumPy, placed by jit)
        self._tau: dict[int, object] = {}   # staleness -> its [1] int32 input, placed once
        self._one = np.ones(1, bool)
        self._placed: dict = {}   # device -> (task, data_key) committed to it
        self._indices: dict[int, tuple[int, np.ndarray]] = {}   # worker -> (first iteration, [INDEX_BLOCK, μ])
        self._lock = threading.Lock()

    def on(self, device):
        """(task, data_key) on `device`, placed once: an uncommitted task would be
        copied to the worker's device on every call (its data are jit inputs)."""
        placed = self._placed.get(device)
        if placed is None:
            with self._lock:
                placed = self._placed.get(device)
                if placed is None:
                    placed = self._placed[device] = jax.device_put((self.task, self.data_key), device)
        return placed

    def gradient(self, params, worker: int, iteration: int, device):
        """(loss, grad) of `worker`'s minibatch for `iteration`; params are on `device`.
        For a local-update method: (mean inner loss, delta) of the worker's inner steps,
        its inner-optimizer state kept here between its iterations."""
        task, key = self.on(device)
        if self.learner is not None:   # an actor: (its behavior loss, its rollout)
            return _generate_jit(task, params, key, np.int32(worker), np.int32(iteration))
        if self.local is not None:
            state = self._inner_states.get(worker)
            if state is None:   # a fresh inner state (and for Streaming DiLoCo own parameters: version 0)
                state = jax.device_put(self.inner_template(params), device)
            if self.local.streaming:
                loss, delta, inner, own = _streaming_delta_jit(task, params, state[1], state[0], key, np.int32(worker),
                                                               np.int32(iteration), local=self.local)
                state = (inner, own)
            else:
                loss, delta, state = _local_delta_jit(task, params, state, key, np.int32(worker),
                                                      np.int32(iteration), np.int32(self.local_steps[worker]),
                                                      local=self.local)
            self._inner_states[worker] = state
            after = self._inner_after.setdefault(worker, {})   # only this worker's thread writes it
            after[int(iteration)] = state
            for old in [k for k in after if k < iteration - 1]:
                del after[old]
            return loss, delta
        index = self._index(worker, iteration) if self.task.indexed else None
        return _gradient_jit(task, params, key, np.int32(worker), np.int32(iteration), index)

    def inner_at(self, last: dict[int, int]) -> dict[int, tuple[int, object]]:
        """What a checkpoint keeps of a local-update method's workers (their inner-optimizer
        states, Streaming DiLoCo's own parameters, error-feedback buffers): {worker: (iteration,
        its state after it)} at the newest iteration <= `last[worker]`, the worker's last
        recorded push (a worker in flight at the checkpoint has already computed the next
        one: a resumed run restarts that one, from the state before it). Workers without a
        recorded push are left out (they start fresh)."""
        out = {}
        for w, it in last.items():
            after = dict(self._inner_after.get(w, {}))
            done = [k for k in after if k <= it]
            if done:
                out[w] = (max(done), after[max(done)])
        return out

    def inner_template(self, params):
        """The structure of one worker's inner state (`inner_at`'s states), for a checkpoint's
        arrays to be read back into."""
        state = self.inner.init(params)
        if self.local.layout is not None:   # Streaming DiLoCo's own parameters, or an error-feedback buffer
            layout = self.local.layout
            state = (state, params if layout == "streaming" else (params, params) if layout == "anchored"
                     else jax.tree.map(jnp.zeros_like, params))
        return state

    def restore_inner(self, states: dict[int, tuple[int, object]], devices: dict) -> None:
        """Continue from a checkpoint's `inner_at` states, each placed on its worker's device."""
        for w, (it, state) in states.items():
            state = jax.device_put(state, devices[w])
            self._inner_states[w] = state
            self._inner_after[w] = {int(it): state}

    def generate(self, versions: list, tokens: list, worker: int, iteration: int, device):
        """(behavior loss, rollout) of an actor's rollout whose tokens come from several
        versions (in-flight weight updates): `versions` [n] params on `device`, one per
        segment, the segment of `versions[j]` starting at decoded token `tokens[j]` (in the
        simulator's size units, prefill included; tokens[0] = 0). The segments are padded to
        a power of two with the last version, as the replay pads them (`engine.plan`), and
        generated by the replay's `decode.sample(starts=)`."""
        from staleness.engine.plan import NO_SEGMENT, positions

        task, key = self.on(device)
        n = len(versions)
        s = 1 << (n - 1).bit_length()
        starts = positions(np.asarray(list(tokens) + [NO_SEGMENT] * (s - n), np.int64), task.prefill)
        stacked = _stack_jit(*versions, *([versions[-1]] * (s - n)))
        return _generate_jit(task, stacked, key, np.int32(worker), np.int32(iteration), starts.astype(np.int32),
                             keep_cache=not self.learner.reprefill)

    def _index(self, worker: int, iteration: int) -> np.ndarray:
        """[μ] minibatch indices of `worker`'s `iteration`, on the host, as the engine's
        replay computes them; a block of `INDEX_BLOCK` iterations per host call (one
        call costs about what one iteration's costs). Each worker reads only its own
        entry, so worker threads need no lock."""
        first, block = self._indices.get(worker, (-1, None))
        if block is None or not first <= iteration < first + INDEX_BLOCK:
            first = iteration
            block = self.task.host_indices(self.data_key, np.full(INDEX_BLOCK, worker),
                                           np.arange(first, first + INDEX_BLOCK))
            self._indices[worker] = (first, block)
        return block[iteration - first]

    def place_inputs(self, scalar_sharding) -> None:
        """Keep the update's small inputs (staleness, mask) on `scalar_sharding`, made
        once per value: a NumPy input costs a host-to-device copy on every update."""
        self._scalar = scalar_sharding
        self._tau = {}
        self._one = jax.device_put(np.ones(1, bool), scalar_sharding)

    def _tau1(self, s: int):
        tau = self._tau.get(s)
        if tau is None:
            tau = np.asarray([s], np.int32)
            if self._scalar is not None:
                tau = jax.device_put(tau, self._scalar)
            if len(self._tau) < 4096:
                self._tau[s] = tau
        return tau

    def update(self, params, opt_state, grads: list, staleness: list[int], update: int, zeros=None, workers=None,
               iterations=None):
        """Apply one server update from `grads` (1..slots gradients, in push order).

        staleness: [c] of the gradients; update: the update index (version before it).
        zeros: a params-shaped zero pytree used to pad to `slots` (needed when c < slots).
        workers: [c] the gradients' workers: a local-update method whose deltas are weighted
          by tokens (`Local.weighted`, Decoupled DiLoCo) weights them by their inner steps.
        iterations: [c] the gradients' iterations: a fragmented method's update synchronizes
          fragment iteration mod P (`engine.core.fragment_of`; None: `update` mod P, lockstep).
        Returns (params, opt_state).
        """
        if self.learner is not None:   # the pushes are rollouts: the learner's version on them
            return self._learner_update(params, opt_state, grads, staleness, update, zeros)
        weights = counts = round_counts = None
        if self.local is not None:   # tokens (∝ inner steps) or one per delta
            if self.local.weighted and workers is None:
                raise ValueError("Numerics.update: a token-weighted update needs its gradients' workers")
            pad = self.slots - len(grads)
            steps = self.local_steps if self.local.weighted else [1] * len(self.local_steps)
            real = [steps[w] for w in workers] if self.local.weighted else [1] * len(grads)
            counts = np.asarray(real + [0] * pad, np.int32)
            round_counts = np.asarray(steps, np.int32)
            weights = counts if self.local.weighted else None   # as the replay's (`engine.core`)
        if self.slots == 1:
            return _server_update_jit(params, opt_state, grads[0], self._tau1(staleness[0]), self._one,
                                      self._fragment(update, iterations), weights, counts, round_counts,
                                      tx=self.opt.tx, rule=self.rule)
        pad, tau, mask = self._padded(staleness, update, "gradients")
        stacked = _stack_jit(*grads, *([zeros] * pad))
        return _server_update_jit(params, opt_state, stacked, tau, mask, self._fragment(update, iterations), weights,
                                  counts, round_counts, tx=self.opt.tx, rule=self.rule)

    def _learner_update(self, params, opt_state, rollouts: list, staleness: list[int], update: int, zeros=None):
        """The learner's version on the pushed `rollouts` (padded to `slots` with empty
        rollouts, masked out), as the replay computes it."""
        task, _ = self.on(next(iter(jax.tree.leaves(params)[0].devices())))
        kw = dict(tx=self.opt.tx, rule=self.rule, minibatches=self.learner.minibatches, many=self.slots > 1)
        if self.slots == 1:
            return _learner_update_jit(task, params, opt_state, rollouts[0], self._tau1(staleness[0]), self._one, **kw)
        pad, tau, mask = self._padded(staleness, update, "rollouts")
        empty = [] if not pad else [_empty_rollout(rollouts[0])] * pad
        return _learner_update_jit(task, params, opt_state, _stack_jit(*rollouts, *empty), tau, mask, **kw)

    def _padded(self, staleness: list[int], update: int, what: str):
        """(pad, tau [slots], mask [slots]) of an update of len(staleness) `what` (gradients, rollouts)."""
        c = len(staleness)
        if c > self.slots:
            raise ValueError(f"update {update}: {c} {what} exceed the {self.slots} slots")
        pad = self.slots - c
        return pad, np.asarray(list(staleness) + [0] * pad, np.int32), np.asarray([True] * c + [False] * pad)

    def _fragment(self, update: int, iterations=None):
        """Streaming DiLoCo: the fragment an update synchronizes, its iterations' mod P (`engine.core.fragment_of`;
        else None)."""
        if self.local is None or not self.local.streaming:
            return None
        return np.int32((update if iterations is None else max(iterations)) % self.local.fragments)

    def push_shape(self, params_shape):
        """What a worker pushes beside its loss, as ShapeDtypeStructs (a transport that
        pulls pushes by shape needs it): a params-shaped gradient or delta, or an actor's
        rollout (asynchronous RL: tokens, behavior log-probs, mask, rewards, lengths,
        prompt indices). params_shape: a params-shaped pytree (arrays or ShapeDtypeStructs)."""
        if self.learner is None:
            return params_shape
        return jax.eval_shape(_generate, self.task, params_shape, self.data_key, np.int32(0), np.int32(0))[1]

    def init_state(self, params):
        """The optimizer state of `params` (with the run's learning rate)."""
        return self.opt.init(params)

    def warm_up(self, params, devices, server_device=None) -> None:
        """Compile the gradient on every device in `devices` and, given a
        `server_device` (a device, or a `sharding.ServerPlacement`), the update
        there, before the run's clock starts (the results are discarded)."""
        outs = []
        for d in dict.fromkeys(devices):
            outs.append(self.gradient(jax.device_put(params, d), 0, 0, d))
            if self.learner is not None and self.learner.inflight:   # rollouts of 1, 2 and 4 segments
                placed = jax.device_put(params, d)
                outs += [self.generate([placed] * n, list(range(n)), 0, 0, d) for n in (1, 2, 3)]
            self._inner_states.clear()   # a warm-up's inner steps are not the run's
            self._inner_after.clear()
        if server_device is not None:
            put = server_device.put if hasattr(server_device, "put") else (
                lambda tree: jax.device_put(tree, server_device))
            server_params = put(params)
            grad = jax.tree.map(jnp.zeros_like, server_params)
            opt_state = self.init_state(server_params)
            pushed = [grad] if self.learner is None else [put(outs[0][1])]   # a gradient, or a rollout
            outs.append(self.update(server_params, opt_state, pushed, [0], 0, grad, [0]))
        jax.block_until_ready(outs)


@jax.jit
def _empty_rollout(rollout):
    """A rollout like `rollout` with nothing in it (a padding slot: masked out of the update)."""
    return jax.tree.map(jnp.zeros_like, rollout)


@functools.cache
def _zeros_like_jit():
    return jax.jit(lambda tree: jax.tree.map(jnp.zeros_like, tree))


def zeros_like(tree):
    """A zero pytree shaped like `tree`, on its device."""
    return _zeros_like_jit()(tree)
