"""The replay of a prepared sweep (`replay_grid`): blocks of configurations, one block per
device per compiled call (`jax.shard_map` over the devices; no collective inside), each
configuration running the ops of its own `replay` (`core.chunk_batched`), so its numbers
are bitwise its `simulate`'s on CPU whatever the grid, block, devices or processes (see
`engine.sweeps`). Pinned padding (`ring`, `slots`) fixes the inputs' shapes, so grids
whose configurations compile alike share one compiled replay; compilation time is
measured apart (`compile_seconds`) and reported as `config['compile_s']`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import threading
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from staleness.infra import checks
from staleness.engine import core
from staleness.engine import runner as _runner
from staleness.engine.plan import Plan, chunk_inputs, make_plan
from staleness.engine.settings import SweepSettings

__all__ = ["Grid", "Settings", "replay_grid", "grid_block", "resolve_devices", "compile_seconds", "needs",
           "padding", "pad_plan"]

AXIS = "configs"
DEFAULT_BLOCK = 8   # configurations per device per compiled call


# -- compile time ----------------------------------------------------------------------
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_compile_lock = threading.Lock()
_compile_total = [0.0]
_listening = [False]


def _on_duration(event: str, duration: float, **_kw) -> None:
    if event in _COMPILE_EVENTS:
        with _compile_lock:
            _compile_total[0] += float(duration)


def compile_seconds() -> float:
    """Seconds this process has spent tracing, lowering and compiling JAX programs since
    the first call (JAX's compile-event durations; all threads)."""
    if not _listening[0]:
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening[0] = True
    with _compile_lock:
        return _compile_total[0]


# -- the grid --------------------------------------------------------------------------
Settings = SweepSettings   # a sweep's settings (`engine.settings.SweepSettings`), by its old name


@dataclasses.dataclass(frozen=True, eq=False)
class Grid:
    """A prepared sweep: configurations, their schedules and padded plans, and each
    configuration's own replay settings (`core.Setup`, the same as its `replay`'s) with
    the distinct compiled variants they need."""

    task: Any
    configs: list            # [(policy, seed, rule, lr or None)] in product order
    schedules: dict          # {(policy, seed): Schedule}
    plans: list              # [Plan] one per configuration, all of the same shapes
    chunk: int               # updates per compiled call
    ring: int                # R: parameter versions kept
    slots: int               # C: gradient slots per update (the inputs'; each configuration runs on its own)
    setups: list             # [core.Setup] one per configuration
    variants: tuple          # the distinct core.Variant of the configurations (static: one compiled program)
    variant_of: list         # [int] each configuration's index into `variants`
    num_workers: int

    def __len__(self) -> int:
        return len(self.configs)


def _check_pin(name: str, value, need: int) -> int | None:
    """A pinned ring or slot count (an int >= 1, `settings.check_sweep`) against what the
    schedules need."""
    if value is None:
        return None
    if value < need:
        what = "the largest staleness + 1" if name == "ring" else "the largest update's gradient count"
        raise ValueError(f"{name} = {value} is too small for these schedules: they need {need} ({what}); "
                         f"pass {name}={need} or more, or leave it unset")
    return int(value)


def needs(schedule) -> tuple[int, int]:
    """(ring, slots) a schedule needs at least: largest staleness + 1, largest update."""
    ring = int(schedule.staleness[schedule.applied].max()) + 1 if schedule.applied.any() else 1
    counts = np.bincount(schedule.columns["apply_version"][schedule.applied], minlength=1)
    return ring, max(1, int(counts.max()) if len(counts) else 1)


def padding(schedules, chunk: int, ring: int | None, slots: int | None) -> tuple[int, int]:
    """(ring, slots) shared by `schedules`: the pinned values (checked against what they
    need), else the largest need, the ring rounded up to a power of two (grids whose
    largest staleness differs a little share one compile)."""
    need = [needs(s) for s in schedules]
    need_ring, need_slots = max(r for r, _ in need), max(c for _, c in need)
    slots = _check_pin("slots", slots, need_slots) or need_slots
    if ring is None:
        ring = max(make_plan(s, chunk).ring for s in schedules)
    return _check_pin("ring", ring, need_ring), slots


def pad_plan(schedule, chunk: int, *, ring: int | None, slots: int | None, num_updates: int | None = None,
             segments: int | None = None) -> Plan:
    """`make_plan` with the ring pinned to exactly `ring` (when given: version v in slot
    v % ring, as every plan of the sweep lays it), `slots` slots and at least `segments`
    in-flight segments per rollout."""
    need_ring, need_slots = needs(schedule)
    ring = _check_pin("ring", ring, need_ring)
    slots = _check_pin("slots", slots, need_slots)
    return make_plan(schedule, chunk, slots=slots, ring=ring, num_updates=num_updates, segments=segments)


# -- devices ---------------------------------------------------------------------------
def resolve_devices(devices) -> list | None:
    """None/False/1: one device (no mesh); True: every local device; an int n: the first
    n local devices; or a list of devices."""
    if devices is None or devices is False:
        return None
    local = jax.local_devices()
    if devices is True:
        devs = list(local)
    elif isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"devices = {devices} must be in 1..{len(local)} (this process's local devices; "
                             "more CPU devices: jax.config.update('jax_num_cpu_devices', N) before JAX starts)")
        devs = list(local[: int(devices)])
    elif isinstance(devices, (list, tuple)) and devices and all(isinstance(d, jax.Device) for d in devices):
        devs = list(devices)
    else:
        raise ValueError(f"devices = {devices!r} must be True, a number of local devices or a list of jax devices")
    return devs if len(devs) > 1 else None


def grid_block(grid: Grid, block: int | None, devices=None, size: int | None = None) -> int:
    """Configurations per device per call: `block`, else min(DEFAULT_BLOCK, ⌈size / lanes⌉),
    size the configurations replayed (default: the grid's) and lanes the calls that run at
    once: the devices, or on one CPU device its cores (`_layout`'s threads). A grid of 8 on
    2 cores then runs as 2 calls of 4 side by side, not one call of 8 on one core (the
    numbers do not depend on the block)."""
    if block is None:
        devs = resolve_devices(devices) or [jax.local_devices()[0]]
        lanes = len(devs) if len(devs) > 1 else _threads(devs[0], 1 << 30)
        return max(1, min(DEFAULT_BLOCK, blocks_of(len(grid) if size is None else size, lanes)))
    return checks.at_least("block", block, 1, what=" (configurations per device per call)")


def _threads(device, rounds: int) -> int:
    """Host threads that run one device's calls side by side: its cores on a CPU device, else 1."""
    return min(rounds, os.cpu_count() or 1) if device.platform == "cpu" else 1


def blocks_of(num: int, block: int) -> int:
    return -(-num // block)


@functools.lru_cache(maxsize=32)
def _sharded_fns(mesh: Mesh, variants: tuple, has_index: bool, const_keys: tuple):
    """(chunk, evaluate) of the batched replay under `shard_map` over `mesh`'s configuration axis."""
    consts_spec = {k: P(AXIS) for k in const_keys}
    xs_spec = (P(), P(AXIS), P(AXIS) if has_index else None, P(AXIS))

    def chunk(task, carry, xs, consts):
        return core.chunk_batched(task, carry, xs, consts, variants=variants)

    sharded = jax.shard_map(chunk, mesh=mesh, in_specs=(P(), P(AXIS), xs_spec, consts_spec),
                            out_specs=(P(AXIS), P(AXIS)), check_vma=False)
    evaluate = jax.shard_map(_evaluate_each, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS),
                             check_vma=False)
    return jax.jit(sharded, donate_argnums=(1,)), jax.jit(evaluate)


def _evaluate_each(task, params):
    """Metrics of each configuration's params (leaves [B, ...]), one after the other: a
    vmapped evaluation over the test set rounded differently on 1 and on 4 devices
    (observed on CPU); one evaluation per configuration does not."""
    return jax.lax.map(task.evaluate, params)


_evaluate_each_jit = jax.jit(_evaluate_each)


def _place(tree, mesh, spec_tree):
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), spec_tree, is_leaf=lambda x: isinstance(x, P))
    return jax.device_put(tree, shardings)


# -- the replay of a grid --------------------------------------------------------------
class _Layout(NamedTuple):
    """Where the configurations of one replay_grid call run."""

    devices: list      # the devices (one per block of a call)
    mesh: Mesh
    padded: list       # grid indices, the last repeated to fill every call: [calls * devices * block]
    spans: list        # [calls] the positions in `padded` of each call's configurations
    threads: int = 1   # host threads that run a chunk's calls side by side (one CPU device)


def _layout(grid: Grid, indices: list, devices, block: int) -> _Layout:
    devs = resolve_devices(devices) or [jax.local_devices()[0]]
    rounds = blocks_of(blocks_of(len(indices), block), len(devs))   # calls per chunk: one block per device
    width = len(devs) * block
    padded = indices + [indices[-1]] * (rounds * width - len(indices))
    spans = [list(range(r * width, (r + 1) * width)) for r in range(rounds)]
    threads = _threads(devs[0], rounds) if len(devs) == 1 else 1
    return _Layout(devs, Mesh(np.asarray(devs), (AXIS,)), padded, spans, threads)


@functools.lru_cache(maxsize=None)
def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """Threads that run the calls of one chunk at once: XLA's CPU client runs executions of
    several host threads in parallel (one thread per call leaves the other cores idle: the
    small ops of a replay run single-threaded). The calls' blocks are the same with and
    without them, so the numbers are too."""
    return concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="staleness-sweep")


def _const_keys(grid: Grid) -> tuple:
    local = grid.setups[0].static.local
    return (("data_key", "rule", "variant") + (("steps",) if grid.setups[0].steps is not None else ())
            + (("probe",) if local is not None and local.learner else ()))


def _compiled(grid: Grid, lay: _Layout, has_index: bool):
    """(chunk, evaluate, task placed) of the batched replay on `lay`'s devices."""
    task = grid.task
    if len(lay.devices) > 1:
        chunk_fn, eval_fn = _sharded_fns(lay.mesh, grid.variants, has_index, _const_keys(grid))
        return chunk_fn, eval_fn, jax.device_put(task, NamedSharding(lay.mesh, P()))
    # one device: the engine's own batched replay (the per-device program of the sharded one)
    chunk_fn = functools.partial(core.run_chunk_batched, variants=grid.variants)
    return chunk_fn, _evaluate_each_jit, jax.device_put(task, lay.devices[0])


def _init_call(grid: Grid, lay: _Layout, sel: list, data_keys: list):
    """(carry, consts, learning rates) of one call's configurations `sel` (positions in
    `lay.padded`), placed on the mesh."""
    idx = [lay.padded[i] for i in sel]
    setups = [grid.setups[i] for i in idx]
    # the configurations' minibatch keys, stacked on the host (a vmapped `keys` compiles)
    cs = {"data_key": jax.random.wrap_key_data(np.stack([np.asarray(jax.random.key_data(data_keys[i]))
                                                         for i in sel])),
          "rule": np.zeros(len(idx), np.int32),   # each variant has its one rule
          "variant": np.asarray([grid.variant_of[i] for i in idx], np.int32)}
    if setups[0].steps is not None:
        cs["steps"] = np.stack([np.asarray(u.steps, np.int32) for u in setups])        # [W, λ]
    layouts = [None if u.static.local is None or u.static.local.learner else u.static.local.layout for u in setups]
    c = core.init_carry_batched(grid.task, [(grid.configs[i][1], u.opt, u.inner, layout)
                                            for i, u, layout in zip(idx, setups, layouts)],
                                grid.ring, num_workers=grid.num_workers)
    if setups[0].static.local is not None and setups[0].static.local.learner:   # each run's probe set
        cs["probe"] = jax.tree.map(lambda *xs: np.stack(xs), *[jax.device_get(grid.task.probe(
            jax.tree.map(lambda a, j=j: a[j], c.params))) for j in range(len(idx))])
    rates = [u.opt.lr if u.opt.lr is not None
             else _runner.learning_rate(u.opt, jax.tree.map(lambda a, j=j: a[j], c.opt_state))
             for j, u in enumerate(setups)]
    return (_place(c, lay.mesh, jax.tree.map(lambda _: P(AXIS), c)), _place(cs, lay.mesh, {k: P(AXIS) for k in cs}),
            rates)


def _feed(task, plans: list, data_keys: list, sel: list):
    """k -> the scan inputs of one call's configurations `sel` for chunk k: each its own
    `pad_chunk` inputs (the updates of chunk k it has), stacked."""
    def inputs(k):
        parts = []
        for i in sel:
            plan = plans[i]
            n = min(plan.chunk, max(0, plan.num_updates - k * plan.chunk))
            parts.append(core.pad_chunk(chunk_inputs(task, plan, k, data_keys[i]), n))
        index = None if parts[0][2] is None else np.stack([x[2] for x in parts])   # [W, L, C, ...]
        return (parts[0][0], np.stack([x[1] for x in parts]), index,               # packed [W, L, 6, C]
                np.asarray([x[3] for x in parts], np.int32))
    return inputs


def _losses(chunk: int, n: int, outs):
    """([B, K, C] losses, [B] dicts of [K] diagnostics) of one chunk's calls' outputs."""
    losses = np.concatenate([o[0] for o in outs])[:, :chunk]
    diag = {k: np.concatenate([o[1][k] for o in outs])[:, :chunk] for k in outs[0][1]}
    return losses, [{k: v[i] for k, v in diag.items()} for i in range(len(losses))]


def _program(grid: Grid, lay: _Layout, n: int):
    """(runner.Program, carries [calls], learning rates [padded]) of the first `n`
    configurations of `lay` (the rest repeat the last to fill every call)."""
    plans = [grid.plans[i] for i in lay.padded]
    data_keys = [np.asarray(jax.random.key_data(core.keys(grid.configs[i][1])[1])) for i in lay.padded]
    has_index = chunk_inputs(grid.task, plans[0], 0, data_keys[0])[2] is not None
    chunk_fn, eval_fn, task_rep = _compiled(grid, lay, has_index)
    feeds = [_feed(grid.task, plans, data_keys, sel) for sel in lay.spans]
    calls = [_init_call(grid, lay, sel, data_keys) for sel in lay.spans]
    consts = [c[1] for c in calls]

    def one(args):
        c, x, k = args
        return jax.block_until_ready(chunk_fn(task_rep, c, x, k))

    def step(carries, xs):
        args = list(zip(carries, xs, consts))
        if len(args) > 1 and lay.threads > 1:   # one CPU device: its calls run side by side on the cores
            outs = list(_pool(lay.threads).map(one, args))
        else:
            outs = [chunk_fn(task_rep, *a) for a in args]
        return [o[0] for o in outs], [o[1] for o in outs]

    def metrics(carries):
        parts = jax.device_get([eval_fn(task_rep, c.params) for c in carries])
        both = {m: np.concatenate([p[m] for p in parts]) for m in parts[0]}
        return [{m: v[i] for m, v in both.items()} for i in range(n)]

    def params(carries):
        host = jax.tree.map(lambda *xs: np.concatenate(xs), *jax.device_get([c.params for c in carries]))
        return [jax.tree.map(lambda a, i=i: a[i], host) for i in range(n)]

    program = _runner.Program(step=step, inputs=lambda k: [f(k) for f in feeds],
                              losses=functools.partial(_losses, grid.chunk, n),
                              metrics=metrics, params=params)
    return program, [c[0] for c in calls], [r for c in calls for r in c[2]]


def replay_grid(grid: Grid, indices=None, *, devices=None, progress: bool = False, block: int | None = None,
                callbacks: tuple = ()) -> list:
    """Replay configurations `indices` of `grid` (default: all), `block` configurations per
    device per compiled call, over `devices` (see `resolve_devices`). Returns their Results
    in the order of `indices`.

    Every device runs the same program on a block of exactly `block` configurations
    (the last block padded by repeating its last configuration), so every placement is
    one compiled program; each configuration runs its own replay's ops in it, so its
    numbers depend neither on the block nor on the devices, processes or neighbours."""
    indices = list(range(len(grid))) if indices is None else [int(i) for i in indices]
    if not indices:
        return []
    block = grid_block(grid, block, devices, len(indices))
    lay = _layout(grid, indices, devices, block)
    compile0, t_start = compile_seconds(), time.perf_counter()
    program, carries, rates = _program(grid, lay, len(indices))
    layout = {"sweep": True, "sweep_size": len(grid), "ring": grid.ring, "slots": grid.slots, "block": block,
              "devices": [str(d) for d in lay.devices]}
    members = []
    for i, idx in enumerate(indices):
        pol, seed, rule, _ = grid.configs[idx]
        members.append(_runner.Member(grid.schedules[(pol, seed)], grid.plans[idx], seed, rule, rates[i],
                                      grid.setups[idx].steps, {**layout, "sweep_index": idx}))
    first = grid.setups[indices[0]]
    options = _runner.Options(grid.chunk, grid.task.config(), first.opt.describe(),
                              None if first.inner is None else first.inner.describe(), on_divergence="mark",
                              progress=progress, desc=f"sweep x{len(indices)}", callbacks=tuple(callbacks))
    results = _runner.run(program, carries, members, options)
    timing = {"compile_s": compile_seconds() - compile0, "sweep_s": time.perf_counter() - t_start}
    for r in results:
        r.config.update(timing)
    return results
