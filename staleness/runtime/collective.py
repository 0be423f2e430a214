"""Collective sync: a BSP round as one jitted step on the global mesh.

When the policy releases every worker at once on the same version and
averages all their gradients (BSP: `policy.collective`), a round needs no
parameter server: each device computes its workers' gradients, one `psum`
averages them and every device applies the same optimizer step to its replica
of the parameters, all in one compiled `shard_map` program. The serve loop does
not know this: `CollectiveLink` is its transport (a release of all λ workers
dispatches the round; its gradients "arrive" as λ pushes whose losses stay on
the devices, fetched in batches by `Server._settle`) and `CollectiveLink.update`
its update. The policy still decides: a round is dispatched when, and only
when, the driver has released every worker on the same version.

Numerics: the step applies `engine.update.apply` to (Σ_w scale(0)·g_w) / λ; the
server path takes the same mean with `aggregate`'s tensordot, in another order,
so the parameters agree with the parameter server's and with the replay of the
recorded trace within float32 rounding (tests state the tolerance), not bitwise.

Pipelined rounds (`RunAhead`; one process at the hardware's speed): while round
r runs, the waiter thread starts round r + 1 on r's outputs, the same step on the
same inputs, so the parameters are bitwise those of unpipelined rounds. It counts
only if the policy then releases exactly that round, and from that release on
(the trace's start); otherwise it is dropped. The serve loop's Python for round r
then overlaps the devices' round r + 1, as in a plain loop that dispatches its
next step before it waits for the last one (8 virtual CPU devices, digits-mlp:
0.74x -> 0.92x of such a loop's steps/s). At most one round runs ahead, none past
the run's last update and none across processes (every process must dispatch
the same rounds).

Lost workers: a round not complete `worker_timeout` seconds after its dispatch
loses every worker of the round (the run stops: `on_worker_failure` is 'stop'
under collectives). Within one process the devices that wait in the all-reduce
for a hung one have not finished either, so they cannot be told apart; a
per-worker host callback would tell them apart but takes the GIL on every device
each round (tried: several times slower). XLA's CPU all-reduce aborts the process
after 40 s in a rendezvous, so keep worker_timeout below that on CPU.

Across processes (`jax.distributed`; gloo on CPU) every process runs the same
serve loop, policy and link over one global mesh and dispatches the same rounds
(BSP's decisions do not depend on time); `StopAgreement` stops every process
after the same round and `Liveness` names a process that died. The serve loop
keeps this process's replica (`CollectiveMesh.local`), so evaluation and
checkpoints never enter a collective.
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
from staleness.runtime.messages import LateLoss, Push, RoundGradient, WorkerLost
from staleness.runtime.transport import Arrival, ServerLink

__all__ = ["CollectiveLink", "CollectiveMesh", "RoundStep", "RunAhead", "StopAgreement", "Liveness",
           "collective_step", "mesh_devices", "injected_round", "AXIS", "WAIT_SECONDS"]

AXIS = "workers"
WAIT_SECONDS = 2e-4   # shortest wait for a round on the devices
FETCH_GROUP = 64      # rounds' losses stacked per device call in `CollectiveLink.fetch`
_stack = jax.jit(lambda arrays: jnp.stack(arrays))


def mesh_devices(num_workers: int, devices) -> list:
    """The devices of the collective mesh: the most of `devices` (at most λ) that
    divide λ evenly, so every device computes λ / d workers' gradients. Devices of
    several processes: the same number k of each process's devices (in process
    order), the largest k with λ divisible by k · processes; every process takes
    part in every round."""
    by_process: dict[int, list] = {}
    for dev in devices:
        by_process.setdefault(dev.process_index, []).append(dev)
    if len(by_process) > 1:
        n = len(by_process)
        if num_workers % n:
            raise ValueError(f"num_workers = {num_workers} must be a multiple of the {n} processes under "
                             "sync='collective' (every process computes the same number of workers' gradients)")
        k = min(min(len(v) for v in by_process.values()), num_workers // n)
        while num_workers % (k * n):
            k -= 1
        return [dev for p in sorted(by_process) for dev in by_process[p][:k]]
    d = min(num_workers, len(devices))
    while num_workers % d:
        d -= 1
    return list(devices[:d])


@functools.lru_cache(maxsize=32)
def collective_step(tx, rule, num_workers: int, mesh: Mesh, across: bool = False):
    """The jitted step of one round: (params, opt_state, task, data_key, iteration,
    workers) -> (params, opt_state, iteration + 1, losses [λ]) with params and
    opt_state replicated and the workers split over `mesh` (λ / d per device, worker
    w on device w // (λ/d)). across (a mesh over several processes): the step takes a
    stop flag per device too, (..., workers, stop [d]) -> (..., losses, Σ stop), and
    the losses come back replicated (every process records every worker's). Cached:
    runs with the same optimizer, rule, λ and mesh share one compiled step."""
    d = mesh.devices.size
    k = num_workers // d
    scale = None if isinstance(rule, _lr.Constant) else rule.scale(
        jnp.zeros(num_workers, jnp.int32), jnp.ones(num_workers, bool)).astype(jnp.float32)

    def body(params, opt_state, task, data_key, iteration, workers, *stop):
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
        if not across:
            return params, opt_state, iteration + 1, jnp.stack(losses)
        # across processes every process records every worker's loss, and the stop flags
        # ride along (one more small collective)
        every = jax.lax.all_gather(jnp.stack(losses), AXIS, tiled=True)
        return params, opt_state, iteration + 1, every, jax.lax.psum(stop[0], AXIS)

    rep, split = PartitionSpec(), PartitionSpec(AXIS)
    extra = (split,) if across else ()
    fn = jax.shard_map(body, mesh=mesh, in_specs=(rep, rep, rep, rep, rep, split) + extra,
                       out_specs=(rep, rep, rep, rep if across else split) + (rep,) * across, check_vma=False)
    return jax.jit(fn)


class CollectiveMesh:
    """The mesh of a collective run and where its arrays live.

    Args:
      num_workers: λ; worker w computes on device w // (λ / d).
      devices: the mesh's d devices (`mesh_devices`; across processes the global
        mesh, the same list in every process).
    """

    def __init__(self, num_workers: int, devices):
        devices = list(devices)
        self.num_workers = num_workers
        self.devices = devices
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec(AXIS))
        self.across = len({d.process_index for d in devices}) > 1
        per_device = num_workers // len(devices)
        self.process_of = [devices[w // per_device].process_index for w in range(num_workers)]
        self.workers = self.split_array(np.arange(num_workers, dtype=np.int32))   # the step's worker ids

    def place(self, tree):
        """`tree` replicated over the mesh (where the step reads it); across processes
        from this process's copy (every process holds the same values)."""
        if not self.across:
            return jax.device_put(tree, self.replicated)
        sharding, me = self.replicated, jax.process_index()
        mine = [d for d in self.mesh.devices.flat if d.process_index == me]   # in the mesh's order

        def one(x):
            if isinstance(x, jax.Array) and x.sharding == sharding:
                return x
            x = jnp.asarray(x)
            return jax.make_array_from_single_device_arrays(x.shape, sharding, [jax.device_put(x, d) for d in mine])

        return jax.tree.map(one, tree)

    def local(self, tree):
        """This process's replica of a replicated `tree` (the tree itself within one
        process): what the serve loop keeps, evaluates and checkpoints, so none of
        that enters a collective."""
        if not self.across:
            return tree
        return jax.tree.map(lambda a: a.addressable_shards[0].data, tree)

    def split_array(self, host: np.ndarray):
        """A global array split over the mesh from the full `host` array (every process
        passes the same shape; each fills its own devices' parts)."""
        return jax.make_array_from_callback(host.shape, self.split, lambda index: host[index])


class RoundStep:
    """The compiled step of a round (`collective_step`) and the state the next round
    reads: the replicated parameters and optimizer state, and the iteration.

    Args:
      task, tx, rule: the run's task, optimizer transformation and lr rule.
      mesh: the run's `CollectiveMesh`.
      data_key: the run's minibatch key.
      opt_state: the optimizer state of version 0.
    """

    def __init__(self, task, tx, rule, mesh: CollectiveMesh, data_key, opt_state):
        self.mesh = mesh
        self._step = collective_step(tx, rule, mesh.num_workers, mesh.mesh, mesh.across)
        self._task, self._key = mesh.place((task, data_key))
        self.opt_state = mesh.place(opt_state)
        self.params = None                # the global parameters the next round reads (`set_state`)
        self._iteration = None            # (host value, device scalar) of the next round's iteration

    def set_state(self, params, opt_state):
        """Make replicated `params`, `opt_state` the state the next round reads;
        returns this process's replicas of them (for the serve loop)."""
        self.params, self.opt_state = params, opt_state
        return self.mesh.local(params), self.mesh.local(opt_state)

    def __call__(self, iteration: int, flag=None):
        """Dispatch the round of `iteration` on the current state (across processes with
        this process's stop `flag`); returns its outputs (not waited for)."""
        if self._iteration is None or self._iteration[0] != iteration:
            self._iteration = (iteration, self.mesh.place(np.int32(iteration)))
        args = (self.params, self.opt_state, self._task, self._key, self._iteration[1], self.mesh.workers)
        outputs = self._step(*args, flag) if self.mesh.across else self._step(*args)
        self._iteration = (iteration + 1, outputs[2])
        return outputs

    def after(self, outputs):
        """Dispatch the round after the one of `outputs`, on its outputs (within one process)."""
        return self._step(outputs[0], outputs[1], self._task, self._key, outputs[2], self.mesh.workers)

    def adopt(self, iteration: int, outputs) -> None:
        """The round of `iteration`, dispatched by `after`, is the one released: the next
        round's iteration is its output."""
        self._iteration = (iteration + 1, outputs[2])

    def warm_up(self, params, flag=None) -> list:
        """Compile the step before the clock starts (outputs discarded); returns its losses
        array (to compile the fetch too). Across processes every process must call it."""
        it = self.mesh.place(np.int32(0))
        args = (self.mesh.place(params), self.opt_state, self._task, self._key, it, self.mesh.workers)
        out = self._step(*args, flag) if self.mesh.across else self._step(*args)
        jax.block_until_ready(out)
        return out[3]


class StopAgreement:
    """Across processes every process stops after the same round: a process raises
    its flag in the round it dispatches after its stop request (`stop_event`), process
    0 also after its `max_time`; the step sums the flags, and the round that carries
    one is the last in every process.

    Args:
      mesh: the run's `CollectiveMesh` (over several processes).
      stop_event: this process's stop requests.
      max_time: process 0's wall-clock budget (seconds since the run's start), else None.
      clock: the serve loop's clock (seconds).
    """

    CODES = {None: 0, "stopped": 1, "complete": 2}

    def __init__(self, mesh: CollectiveMesh, stop_event: threading.Event, max_time: float | None,
                 clock=time.monotonic):
        me = jax.process_index()
        first = next(i for i, d in enumerate(mesh.devices) if d.process_index == me)

        def flag(code):
            host = np.zeros(len(mesh.devices), np.int32)
            host[first] = code
            return mesh.split_array(host)

        self._flags = {code: flag(code) for code in self.CODES.values()}
        self.stop_event = stop_event
        self.max_time = max_time
        self.clock = clock
        self.origin: float | None = None   # the run's start on the clock (`started`)

    def started(self, origin: float) -> None:
        self.origin = origin

    def _wants(self) -> str | None:
        if self.stop_event.is_set():
            return "stopped"
        if self.max_time is not None and self.origin is not None and self.clock() - self.origin >= self.max_time:
            return "complete"
        return None

    def flag(self):
        """(code, device flags) for the round dispatched now: 0, or this process's stop."""
        code = self.CODES[self._wants()]
        return code, self._flags[code]

    def idle(self):
        """Device flags that stop nothing (warm-up)."""
        return self._flags[0]

    @staticmethod
    def agreed(outputs) -> str | None:
        """The status every process stops with after the finished round of `outputs`, or None."""
        code = int(np.asarray(outputs[4])[0])   # finished: no wait
        return None if not code else {1: "stopped"}.get(code, "complete")


class Liveness:
    """Across processes: names the workers of a process that the coordination's
    liveness dropped (its peers' all-reduce fails at once; a collective cannot go on
    without them).

    Args:
      coord: this process's `runtime.coordination.Coordination` (or None: nothing is named).
      process_of: [λ] the process of each worker.
      wait: how long a failed round waits for liveness to name the process that died
        (seconds; about the heartbeat timeout).
      clock: the serve loop's clock (seconds).
    """

    def __init__(self, coord, process_of: list, wait: float, clock=time.monotonic):
        self.process_of = process_of
        self.wait = float(wait)
        self.clock = clock
        self._gone: dict[int, str] = {}       # process -> why liveness dropped it
        self._named: set[int] = set()
        if coord is not None:
            coord.on_lost(self._on_lost)

    def _on_lost(self, process: int, reason: str, _incarnation=None) -> None:
        """Liveness dropped `process` (called on the coordination's monitor thread)."""
        self._gone.setdefault(process, reason)

    def name_lost(self, until: float, lost: collections.deque) -> bool:
        """Add WorkerLost events for the workers of processes that liveness dropped to
        `lost`, waiting until `until` (clock) for one; True if one was named."""
        while True:
            new = [p for p in list(self._gone) if p not in self._named and p in self.process_of]
            for p in new:
                self._named.add(p)
                reason = (f"process {p} is gone ({self._gone[p]}); a collective cannot go on without its workers "
                          "(sync='server' with on_worker_failure='continue' tolerates lost workers)")
                lost.extend(WorkerLost(w, reason) for w, q in enumerate(self.process_of) if q == p)
            if new or self._named:
                return True
            if self.clock() >= until:
                return False
            time.sleep(0.05)


class _Round:
    __slots__ = ("index", "releases", "iteration", "version", "outputs", "dispatched", "done", "error", "finished",
                 "spans", "hold", "after", "since")

    def __init__(self, index, releases, iteration, version, outputs, dispatched, spans=None, hold=None, after=None):
        self.index, self.releases, self.iteration, self.version = index, releases, iteration, version
        self.outputs, self.dispatched = outputs, dispatched
        self.since = dispatched          # its worker_timeout runs from here (`RunAhead.since`)
        self.done = threading.Event()   # set by the waiter thread once the round finished
        self.error: BaseException | None = None
        self.finished = dispatched       # when it finished (the waiter's clock reading)
        self.spans = spans               # injected delays: [(start, end)] of each worker's computation
        self.hold = hold                 # injected delays: its gradients reach the serve loop at this time
        self.after = after               # computed ahead: the round whose outputs it starts from


class RunAhead:
    """Pipelined rounds (module docstring), started on the waiter thread.

    Args:
      step: the run's `RoundStep`.
      max_iteration: rounds of this iteration and later are never needed (None: no limit).
      clock: the serve loop's clock (seconds).
      stopped: set once the link stopped (no round is started ahead after that).
    """

    def __init__(self, step: RoundStep, max_iteration: int | None, clock, stopped: threading.Event):
        self.step = step
        self.max_iteration = max_iteration
        self.clock = clock
        self.stopped = stopped
        self.ahead: _Round | None = None     # the round computed ahead, not yet released
        self.current: _Round | None = None   # the round whose outputs are the current state
        self.count = 0                       # rounds computed ahead that the policy released

    def start_after(self, rnd: _Round) -> None:
        """On the waiter thread, before it waits for `rnd`: start the round after it on
        `rnd`'s outputs (the only round BSP can release next, and the same step on the
        same inputs as its dispatch at that release would be), unless no update needs it."""
        it = rnd.iteration + 1
        if self.stopped.is_set() or (self.max_iteration is not None and it >= self.max_iteration):
            return
        try:
            outputs = self.step.after(rnd.outputs)
        except Exception:  # noqa: BLE001 - the serve loop's own dispatch of that round reports it
            return
        self.ahead = _Round(None, None, it, rnd.version + 1, outputs, self.clock(), after=rnd)

    def take(self, iteration: int, version: int, index: int, now: float) -> _Round | None:
        """The round computed ahead if it is the one the policy released (iteration
        `iteration` on `version`, from the current state), now round `index` dispatched
        at `now`; None otherwise (it is dropped)."""
        ahead, self.ahead = self.ahead, None
        if (ahead is None or ahead.iteration != iteration or ahead.version != version
                or self.current is None or ahead.after is not self.current):
            return None
        ahead.since = self.since(ahead)   # its deadline: from when it could start, not from now
        ahead.index, ahead.dispatched, ahead.after = index, now, None
        self.count += 1
        self.step.adopt(iteration, ahead.outputs)
        return ahead

    def since(self, ahead: _Round) -> float:
        """When a round computed ahead could start on the devices: once the round it
        starts from finished (now, if that one has not)."""
        after = ahead.after
        return max(ahead.dispatched, after.finished if after.done.is_set() else self.clock())

    def quiet(self, worker_timeout: float) -> bool:
        """True once no round computed ahead is on the devices, after waiting for it
        (bounded by its deadline; not at all once stopped)."""
        ahead = self.ahead
        if ahead is None:
            return True
        deadline = self.clock() if self.stopped.is_set() else self.since(ahead) + worker_timeout
        while not ahead.outputs[3].is_ready():
            if self.clock() >= deadline:
                return False
            time.sleep(WAIT_SECONDS)
        return True


def injected_round(delays, iteration: int, num_workers: int, now: float):
    """([(start, end)] per worker, hold) of a round dispatched at `now` under injected
    delays (`runtime.worker.Delays`): worker w computes from now + its pull delay for
    its compute time, then its push delay passes; the all-reduce completes once the
    last worker's push has, as the parameter server's BSP update does."""
    spans, hold = [], now
    for w in range(num_workers):
        start = now + delays.pull(w, iteration)
        end = start + delays.compute(w, iteration, start)
        spans.append((start, end))
        hold = max(hold, end + delays.push(w, iteration))
    return spans, hold


def _waiter(rounds: "queue.SimpleQueue", clock, ahead=None) -> None:
    """Block on each dispatched round in turn and mark it done: `block_until_ready`
    takes no timeout, so it runs here (a daemon thread, abandoned if a round hangs)
    and the serve loop waits on `done` with one. `ahead(rnd)`, called before the
    wait, may start the round after `rnd` (pipelined rounds, `RunAhead`)."""
    while True:
        rnd = rounds.get()
        if rnd is None:
            return
        if ahead is not None:
            ahead(rnd)
        try:
            jax.block_until_ready(rnd.outputs)
        except BaseException as e:  # noqa: BLE001 - reported by the serve loop
            rnd.error = e
        rnd.finished = clock()
        rnd.done.set()


class CollectiveLink(ServerLink):
    """The serve loop's transport and update under collective sync (module docstring).

    Args:
      step: the run's `RoundStep` (its `mesh`: the run's `CollectiveMesh`).
      worker_timeout: seconds after its dispatch at which an unfinished round
        loses every worker of the round.
      max_iteration: rounds of this iteration and later are never dispatched, or None.
      pipelined: compute the next round while the serve loop handles this one (`RunAhead`).
      delays: the cluster's injected delays given the run's start on the clock
        (`RunSpec.delays`), or None.
      stop, liveness: across processes, the `StopAgreement` and the `Liveness` (else None).
      clock: the serve loop's clock (seconds).
    """

    times_rounds = True   # the serve loop leaves worker deadlines to the link (a round's, from its dispatch)

    def __init__(self, step: RoundStep, *, worker_timeout: float = 30.0, max_iteration: int | None = None,
                 pipelined: bool = False, delays=None, stop: StopAgreement | None = None,
                 liveness: Liveness | None = None, clock=time.monotonic):
        self.step = step
        self.num_workers = step.mesh.num_workers
        self.process_of = step.mesh.process_of
        self.worker_timeout = float(worker_timeout)
        self.max_iteration = max_iteration
        self.clock = clock
        self.stop_agreement = stop
        self.liveness = liveness
        self._delays_of = delays
        self._delays = None                   # runtime.worker.Delays, from the run's start (`started`)
        self._pending: dict[int, object] = {}   # worker -> Release of the round being released
        self._inflight: collections.deque[_Round] = collections.deque()
        self._events: collections.deque = collections.deque()
        self._lost: collections.deque = collections.deque()
        self._done: dict[int, _Round] = {}   # round index -> the finished round, until update applies it
        self._rounds = 0
        self.agreed_stop: str | None = None   # every process stops after the flagged round: its status
        self._over = False                    # the flagged round is dispatched (or a process died): no round after
        self._last_round: str | None = None   # the flagged round finished: the status to stop with
        self.stopped = threading.Event()
        self.ahead = RunAhead(step, max_iteration, clock, self.stopped) if pipelined else None
        self._to_wait: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_waiter, args=(self._to_wait, clock, self.ahead and self.ahead.start_after),
                         name="staleness-collective-waiter", daemon=True).start()

    @property
    def rounds_ahead(self) -> int:
        """Rounds computed ahead that the policy released (`RunAhead`)."""
        return self.ahead.count if self.ahead is not None else 0

    def started(self, origin: float) -> None:
        if self._delays_of is not None:
            self._delays = self._delays_of(origin)
        if self.stop_agreement is not None:
            self.stop_agreement.started(origin)

    def set_state(self, params, opt_state):
        """`RoundStep.set_state`, dropping the round computed ahead."""
        if self.ahead is not None:
            self.ahead.current = None
        return self.step.set_state(params, opt_state)

    def warm_up(self, params) -> None:
        """Compile the step and `fetch` before the clock starts (outputs discarded);
        across processes every process must call it."""
        flag = self.stop_agreement.idle() if self.stop_agreement is not None else None
        self.fetch([self.step.warm_up(params, flag)])

    def fetch(self, arrays: list) -> list:
        """Host copies of finished rounds' loss arrays (the serve loop's `_settle`):
        stacked on the devices FETCH_GROUP at a time by one compiled call, then one
        transfer each group (a transfer per array and device costs ~8x more: 8-9 ms vs 1 ms
        for 64 rounds on 8 CPU devices). Only while no round is on the devices (a round
        computed ahead is waited for, within its deadline): a program queued behind a
        hung round would never run, and the serve loop must stay free to time that round
        out; otherwise each array is copied as it is."""
        if self._inflight or (self.ahead is not None and not self.ahead.quiet(self.worker_timeout)):
            return jax.device_get(arrays)
        out = []
        for lo in range(0, len(arrays), FETCH_GROUP):
            group = arrays[lo:lo + FETCH_GROUP]
            n = len(group)
            host = np.asarray(_stack(group + [group[-1]] * (FETCH_GROUP - n)))
            out.extend(host[:n])
        return out

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
        it, version = its.pop(), versions.pop()
        if self._over or (self.max_iteration is not None and it >= self.max_iteration):
            return   # the job stops after the flagged round / no update needs this round
        rnd = self._dispatch(it, version)
        if rnd is None:
            return
        rnd.releases = rels
        if self._delays is not None:
            rnd.spans, rnd.hold = injected_round(self._delays, it, self.num_workers, rnd.dispatched)
        self._inflight.append(rnd)

    def _dispatch(self, it: int, version: int) -> "_Round | None":
        """Start the step of iteration `it` on version `version` (the current state);
        None if a process died."""
        t_dispatch = self.clock()   # the step's call can take a while on the CPU: it is part of the round
        rnd = self.ahead.take(it, version, self._rounds, t_dispatch) if self.ahead is not None else None
        if rnd is None:
            flag = None
            if self.stop_agreement is not None:
                code, flag = self.stop_agreement.flag()
                self._over = self._over or bool(code)
            try:
                outputs = self.step(it, flag)
            except Exception:  # noqa: BLE001 - across processes: the all-reduce failed with a process that died
                if self.liveness is not None and self.liveness.name_lost(self.clock() + self.liveness.wait,
                                                                         self._lost):
                    self._over = True   # the job is over: the serve loop reads the lost workers next
                    return None
                raise
            rnd = _Round(self._rounds, None, it, version, outputs, t_dispatch)
        self._rounds += 1
        self._to_wait.put(rnd)
        return rnd

    def _ready(self, rnd: _Round, deadline: float) -> bool:
        """Wait (bounded by `deadline` on the clock) until `rnd` finished on the devices."""
        if not rnd.done.wait(max(0.0, deadline - self.clock())):
            return False
        if rnd.error is not None:
            if self.liveness is not None and self.liveness.name_lost(self.clock() + self.liveness.wait, self._lost):
                return False   # a process died: its workers are lost (the all-reduce failed with it)
            from staleness.runtime.errors import RunFailure
            from staleness.runtime.worker import summary

            raise RunFailure(f"the collective step of iteration {rnd.releases[0].iteration} failed: "
                             f"{summary(rnd.error)}") from rnd.error
        return True

    def poll(self, timeout: float):
        if self.liveness is not None:
            self.liveness.name_lost(0.0, self._lost)
        if self._lost:
            return self._lost.popleft()
        if self._events:
            return self._next_event()
        if not self._inflight:
            if timeout > 0:
                self.stopped.wait(timeout)
            return self._lost.popleft() if self._lost else None
        # a round's pushes reach the driver once it finished on the devices
        rnd = self._inflight[0]
        if not self._wait_round(rnd, timeout):
            return self._lost.popleft() if self._lost else None
        if rnd.hold is not None and self.clock() < rnd.hold:   # injected delays: not over yet
            self.stopped.wait(min(rnd.hold - self.clock(), max(timeout, 0.0)))
            if self.clock() < rnd.hold:
                return None
        self._inflight.popleft()
        if self.stop_agreement is not None:
            status = self.stop_agreement.agreed(rnd.outputs)
            if status is not None:   # every process stops after this round: none starts another
                self._over = True
                self._last_round = status
        self._arrivals(rnd)
        return self._next_event()

    def _arrivals(self, rnd: _Round) -> None:
        """The finished round's gradients, one `Arrival` per worker, for the serve loop."""
        now = self.clock()
        since_recv = max(0.0, now - rnd.dispatched)
        losses = rnd.outputs[3]
        grad = RoundGradient(rnd.index)   # the same for every worker of the round
        for k, rel in enumerate(rnd.releases):
            start, end = rnd.spans[k] if rnd.spans is not None else (rnd.dispatched, rnd.finished)
            end = max(end, rnd.finished)
            since_start = min(since_recv, max(0.0, now - start))
            since_end = min(since_start, max(0.0, now - end))
            self._events.append(Arrival(Push(rel.worker, rel.iteration, rel.version, rel.epoch, since_recv,
                                             since_start, since_end), LateLoss(losses, k), grad))
        self._done[rnd.index] = rnd

    def _next_event(self):
        ev = self._events.popleft()
        if not self._events and self._last_round is not None:   # the flagged round's last gradient
            self.agreed_stop = self._last_round
        return ev

    def _wait_round(self, rnd: _Round, timeout: float) -> bool:
        """True once `rnd` finished; False after `timeout` seconds, or after its deadline
        (then every worker of the round is lost)."""
        deadline = rnd.since + self.worker_timeout
        if self._ready(rnd, min(deadline, self.clock() + max(timeout, WAIT_SECONDS))):
            return True
        if self._lost:
            return False
        if self.clock() >= deadline:   # every worker of the round (module docstring)
            missing = list(range(self.num_workers))
            names = ", ".join(str(w) for w in missing)
            reason = (f"the collective step of iteration {rnd.releases[0].iteration} did not finish "
                      f"{self.clock() - rnd.since:.1f} s after it started (worker_timeout = "
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
    def update(self, params, opt_state, grads: list, staleness: list[int], update: int, zeros=None, workers=None,
               iterations=None):
        """The parameters the round's step computed (this process's replicas): `grads`
        are the round's `RoundGradient`s (one per worker), all of one round, every
        worker's, staleness 0 (`workers`, `iterations`: as `Numerics.update`'s; a round
        weighs none and has no fragments)."""
        rounds = {g.round for g in grads}
        if len(rounds) != 1 or len(grads) != self.num_workers or any(staleness):
            raise RuntimeError(f"collective sync: update {update} of {len(grads)} gradients of rounds "
                               f"{sorted(rounds)} with staleness {sorted(set(staleness))}; a collective update "
                               f"averages all {self.num_workers} workers' gradients of one round, staleness 0")
        rnd = self._done.pop(rounds.pop())
        out = self.set_state(*rnd.outputs[:2])
        if self.ahead is not None:
            self.ahead.current = rnd
        return out

    def finish(self) -> WorkerLost | None:
        """Wait (each round bounded by `worker_timeout`) for the rounds still on the
        devices; returns the first lost worker's event if one did not finish, else None."""
        for rnd in list(self._inflight):
            while not self._wait_round(rnd, 0.05):
                if self._lost:
                    return self._lost.popleft()
        return None
