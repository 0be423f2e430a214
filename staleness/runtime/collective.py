"""Collective sync: a BSP round as one jitted step on the global mesh.

When the policy releases every worker at once on the same version and
averages all of their gradients (BSP: `spec.collective_capable`), a round
needs no parameter server: each device computes its workers' gradients of
the round's minibatches, one `psum` over the mesh averages them, and every
device applies the same optimizer step to its replica of the parameters,
all inside one compiled `shard_map` program, as a plain data-parallel
training loop does.

The serve loop does not know this: `CollectiveLink` is its transport (a
release of all λ workers dispatches the round's step; the round's gradients
"arrive" as λ pushes whose losses are still on the devices) and
`CollectiveLink.update` its update (it hands back the parameters the step
computed). The policy object still decides: a round is dispatched when, and
only when, the driver has released every worker on the same version.

Numerics: the per-gradient function is `engine.core.gradient` and the step
is `engine.update.apply` of (Σ_w scale(0)·g_w) / λ, where the server path
computes the same mean with `aggregate`'s tensordot over stacked slots; the
sums are taken in another order, so the parameters agree with the parameter
server's and with the engine's replay of the recorded trace within float32
rounding (tests state the tolerance), not bitwise.

Times: a waiter thread blocks on each dispatched round and notes when it
finished; the round's pushes reach the driver then (start = its dispatch,
end = its completion, on the serve loop's clock), so one round is on the
devices at a time, as the policy says (its next round is released by the
update this one makes; many un-awaited collective programs in a row can also
hang XLA's CPU all-reduce rendezvous, DESIGN.md). Losses stay on the devices
and are fetched in batches (`Server._settle`), never one scalar at a time.

Lost workers: a collective cannot go on without one of its members. A round
not complete `worker_timeout` seconds after its dispatch turns into
`WorkerLost` for the workers of the devices whose part of the step has not
finished (the serve loop then stops the run naming them: `on_worker_failure`
is 'stop' under collectives). Inside one process the devices that wait in the
all-reduce for a hung one have not finished either, so every worker of the
round is named; a per-worker host callback in the step would tell them apart
but takes the GIL on every device each round (tried: several times slower on
the benchmark). Across processes (not built yet) the heartbeat names the lost
process. XLA's CPU all-reduce aborts the process after 40 s in a rendezvous,
so keep worker_timeout below that under collectives on CPU.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from staleness import lr as _lr
from staleness.engine import core
from staleness.engine import update as _update
from staleness.runtime.messages import Push, WorkerLost
from staleness.runtime.transport import Arrival, ServerLink

__all__ = ["CollectiveLink", "collective_step", "mesh_devices", "AXIS", "WAIT_SECONDS"]

AXIS = "workers"
WAIT_SECONDS = 2e-4   # shortest wait for a round on the devices


def mesh_devices(num_workers: int, devices) -> list:
    """The devices of the collective mesh: the most of `devices` (at most λ) that
    divide λ evenly, so every device computes λ / d workers' gradients."""
    d = min(num_workers, len(devices))
    while num_workers % d:
        d -= 1
    return list(devices[:d])


@functools.lru_cache(maxsize=32)
def collective_step(tx, rule, num_workers: int, mesh: Mesh):
    """The jitted step of one round: (params, opt_state, task, data_key, iteration,
    workers) -> (params, opt_state, iteration + 1, losses [λ]) with params and
    opt_state replicated and the workers split over `mesh` (λ / d per device, worker
    w on device w // (λ/d)). Cached: runs with the same optimizer, rule, λ and mesh
    share one compiled step."""
    d = mesh.devices.size
    k = num_workers // d
    scale = None if isinstance(rule, _lr.Constant) else rule.scale(
        jnp.zeros(num_workers, jnp.int32), jnp.ones(num_workers, bool)).astype(jnp.float32)

    def body(params, opt_state, task, data_key, iteration, workers):
        # workers: [k] the ids of this device's workers
        total, losses = None, []
        for j in range(k):
            w = workers[j]
            loss, g = core.gradient(task, params, data_key, w, iteration)
            if scale is not None:
                g = jax.tree.map(lambda x: x * scale[w], g)
            total = g if total is None else jax.tree.map(jnp.add, total, g)
            losses.append(loss)
        mean = jax.tree.map(lambda x: jax.lax.psum(x, AXIS) / num_workers, total)
        params, opt_state = _update.apply(tx, params, opt_state, mean)
        return params, opt_state, iteration + 1, jnp.stack(losses)

    rep, split = PartitionSpec(), PartitionSpec(AXIS)
    fn = jax.shard_map(body, mesh=mesh, in_specs=(rep, rep, rep, rep, rep, split),
                       out_specs=(rep, rep, rep, split), check_vma=False)
    return jax.jit(fn)


class _Round:
    __slots__ = ("index", "releases", "version", "outputs", "dispatched", "done", "error", "finished")

    def __init__(self, index, releases, version, outputs, dispatched):
        self.index, self.releases, self.version = index, releases, version
        self.outputs, self.dispatched = outputs, dispatched
        self.done = threading.Event()   # set by the waiter thread once the round finished
        self.error: BaseException | None = None
        self.finished = dispatched       # when it finished (the waiter's clock reading)


def _waiter(rounds: "queue.SimpleQueue", clock) -> None:
    """Block on each dispatched round in turn and mark it done: `block_until_ready`
    takes no timeout, so it runs here (a daemon thread, abandoned if a round hangs)
    and the serve loop waits on `done` with one."""
    while True:
        rnd = rounds.get()
        if rnd is None:
            return
        try:
            jax.block_until_ready(rnd.outputs)
        except BaseException as e:  # noqa: BLE001 - reported by the serve loop
            rnd.error = e
        rnd.finished = clock()
        rnd.done.set()


class CollectiveLink(ServerLink):
    """The serve loop's transport and update under collective sync (module docstring).

    Args:
      task, tx, rule, num_workers, devices: the run's task, optimizer transformation,
        lr rule, λ and the mesh's devices (`mesh_devices`).
      data_key: the run's minibatch key.
      opt_state: the optimizer state of version 0 (or the checkpoint's).
      worker_timeout: seconds after its dispatch at which an unfinished round
        loses the workers of its unfinished devices.
      clock: the serve loop's clock (seconds).
    """

    def __init__(self, task, tx, rule, num_workers: int, devices, data_key, opt_state, *,
                 worker_timeout: float = 30.0, clock=time.monotonic):
        self.num_workers = num_workers
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.worker_timeout = float(worker_timeout)
        self.clock = clock
        self._per_device = num_workers // len(devices)
        self._step = collective_step(tx, rule, num_workers, self.mesh)
        self._task, self._key = jax.device_put((task, data_key), self.replicated)
        self._workers = jax.device_put(np.arange(num_workers, dtype=np.int32),
                                       NamedSharding(self.mesh, PartitionSpec(AXIS)))
        self.opt_state = jax.device_put(opt_state, self.replicated)
        self._iteration = None            # (host value, device scalar) of the next round's iteration
        self._pending: dict[int, object] = {}   # worker -> Release of the round being released
        self._inflight: collections.deque[_Round] = collections.deque()
        self._events: collections.deque = collections.deque()
        self._lost: collections.deque = collections.deque()
        self._done: dict[int, tuple] = {}   # round index -> (params, opt_state) applied by update
        self._rounds = 0
        self.waited = 0.0                  # seconds spent waiting for the devices (not busy)
        self._to_wait: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_waiter, args=(self._to_wait, clock), name="staleness-collective-waiter",
                         daemon=True).start()
        self.stopped = threading.Event()

    def place(self, params):
        """`params` replicated over the mesh (where the step reads them)."""
        return jax.device_put(params, self.replicated)

    def warm_up(self, params) -> None:
        """Compile the step before the clock starts (its outputs are discarded)."""
        it = jax.device_put(np.int32(0), self.replicated)
        out = self._step(self.place(params), self.opt_state, self._task, self._key, it, self._workers)
        jax.block_until_ready(out)

    # -- transport (server end) ------------------------------------------------------
    def release(self, msg, params) -> None:
        self._pending[msg.worker] = msg
        if len(self._pending) < self.num_workers:
            return
        rels = [self._pending[w] for w in range(self.num_workers)]
        self._pending = {}
        its = {r.iteration for r in rels}
        versions = {r.version for r in rels}
        if len(its) != 1 or len(versions) != 1:
            raise RuntimeError(f"collective sync: the policy released the workers on iterations {sorted(its)} and "
                               f"versions {sorted(versions)}; a collective round needs one of each")
        it = its.pop()
        if self._iteration is None or self._iteration[0] != it:
            self._iteration = (it, jax.device_put(np.int32(it), self.replicated))
        params, opt_state, nxt, losses = self._step(params, self.opt_state, self._task, self._key,
                                                    self._iteration[1], self._workers)
        self._iteration = (it + 1, nxt)
        rnd = _Round(self._rounds, rels, versions.pop(), (params, opt_state, losses), self.clock())
        self._to_wait.put(rnd)
        self._inflight.append(rnd)
        self._rounds += 1

    def _ready(self, rnd: _Round, deadline: float) -> bool:
        """Wait (bounded by `deadline` on the clock) until `rnd` finished on the devices."""
        if not rnd.done.wait(max(0.0, deadline - self.clock())):
            return False
        if rnd.error is not None:
            from staleness.runtime.errors import RunFailure
            from staleness.runtime.worker import summary

            raise RunFailure(f"the collective step of iteration {rnd.releases[0].iteration} failed: "
                             f"{summary(rnd.error)}") from rnd.error
        return True

    def poll(self, timeout: float):
        if self._lost:
            return self._lost.popleft()
        if self._events:
            return self._events.popleft()
        if not self._inflight:
            if timeout > 0:
                self.stopped.wait(timeout)
            return self._lost.popleft() if self._lost else None
        # a round's pushes reach the driver once it finished on the devices
        rnd = self._inflight[0]
        if not self._wait_round(rnd, timeout):
            return self._lost.popleft() if self._lost else None
        self._inflight.popleft()
        now = self.clock()
        since_start = max(0.0, now - rnd.dispatched)
        since_end = min(since_start, max(0.0, now - rnd.finished))
        losses = rnd.outputs[2]
        for k, rel in enumerate(rnd.releases):
            self._events.append(Arrival(Push(rel.worker, rel.iteration, rel.version, rel.epoch, since_start,
                                             since_start, since_end), (losses, k), rnd.index))
        self._done[rnd.index] = rnd.outputs[:2]
        return self._events.popleft()

    def _wait_round(self, rnd: _Round, timeout: float) -> bool:
        """True once `rnd` finished; False after `timeout` seconds, or after its deadline
        (then the workers of its unfinished devices are lost)."""
        deadline = rnd.dispatched + self.worker_timeout
        if self._ready(rnd, min(deadline, self.clock() + max(timeout, WAIT_SECONDS))):
            return True
        if self.clock() >= deadline:
            # the workers of the devices whose part of the step did not finish (a device
            # that waits in the all-reduce for a hung one has not finished either)
            k = self._per_device
            shards = sorted(rnd.outputs[2].addressable_shards, key=lambda sh: sh.index[0].start or 0)
            missing = [w for i, sh in enumerate(shards) if not sh.data.is_ready() for w in range(i * k, i * k + k)]
            missing = missing or list(range(self.num_workers))
            names = ", ".join(str(w) for w in missing)
            reason = (f"the collective step of iteration {rnd.releases[0].iteration} did not finish "
                      f"{self.clock() - rnd.dispatched:.1f} s after it started (worker_timeout = "
                      f"{self.worker_timeout:g} s) on the devices of workers {names}; a collective cannot go "
                      "on without it (sync='server' with on_worker_failure='continue' tolerates lost workers)")
            for w in missing:
                self._lost.append(WorkerLost(w, reason))
        return False

    def stop(self) -> None:
        if not self.stopped.is_set():
            self._to_wait.put(None)   # the waiter ends after the rounds queued before
        self.stopped.set()

    def lose(self, worker: int, reason: str) -> None:
        """Report `worker` as lost (fault injection)."""
        self._lost.append(WorkerLost(worker, reason))

    # -- the serve loop's update ------------------------------------------------------
    def update(self, params, opt_state, grads: list, staleness: list[int], update: int, zeros=None):
        """The parameters the round's step computed: `grads` are the round's tokens (one
        per worker), all of one round, every worker's, staleness 0."""
        rounds = set(grads)
        if len(rounds) != 1 or len(grads) != self.num_workers or any(staleness):
            raise RuntimeError(f"collective sync: update {update} of {len(grads)} gradients of rounds "
                               f"{sorted(rounds)} with staleness {sorted(set(staleness))}; a collective update "
                               f"averages all {self.num_workers} workers' gradients of one round, staleness 0")
        new_params, new_state = self._done.pop(rounds.pop())
        self.opt_state = new_state
        return new_params, new_state

    def finish(self) -> WorkerLost | None:
        """Wait (each round bounded by `worker_timeout`) for the rounds still on the
        devices; returns the first lost worker's event if one did not finish, else None."""
        for rnd in list(self._inflight):
            while not self._wait_round(rnd, 0.05):
                if self._lost:
                    return self._lost.popleft()
        return None
