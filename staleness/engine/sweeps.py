"""Sweeps: many configurations replayed in one compiled call per chunk, on one device or a mesh.

    results = sweep(task, ["asp", "ssp:3"], cluster, seeds=range(4), lrs=[0.03, 0.1], num_updates=2000)
    results = sweep(..., devices=4)          # the configuration axis sharded over 4 local devices

A sweep is prepared once on the host (`prepare`: every schedule, the padding
shared by all configurations, the optimizer) and replayed by
`replay_grid(grid, indices, devices)`: the configurations `indices` (default:
all) batched under `vmap`, the batch sharded over `devices` with
`jax.shard_map` (each device runs the unchanged batched replay on its slice;
no collective inside). Configurations are independent, so any split of the
grid (over devices here, over processes in `staleness.engine.distributed`)
computes every configuration with the same per-configuration program.

Padding is pinned up front: `ring=` (parameter versions kept, >= the largest
staleness + 1) and `slots=` (gradients per update, >= the largest update) fix
the compiled shapes, so grids of different policies or budgets share one
compiled replay. Compilation time is measured apart (JAX's own compile-event
durations) and reported as `config['compile_s']`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from staleness import lr as _lr
from staleness import policies as _policies
from staleness.engine import chunks as _chunks
from staleness.engine import core
from staleness.engine.plan import Plan, make_plan
from staleness.sim import simulate_schedule

__all__ = ["Grid", "prepare", "replay_grid", "sweep", "resolve_devices", "compile_seconds"]

AXIS = "configs"


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
@dataclasses.dataclass(frozen=True, eq=False)
class Grid:
    """A prepared sweep: configurations, their schedules and padded plans, the optimizer."""

    task: Any
    configs: list            # [(policy, seed, rule, lr or None)] in product order
    schedules: dict          # {(policy, seed): Schedule}
    plans: list              # [Plan] one per configuration, all of the same shapes
    chunk: int               # updates per compiled call
    ring: int                # R: parameter versions kept
    slots: int               # C: gradient slots per update
    opt: Any                 # engine.optim.Optimizer (server / outer)
    rules: tuple             # distinct lr rules (static)
    local: Any               # engine.local.Local or None
    inner_opt: Any
    steps: np.ndarray | None  # [B, λ] inner steps of local-update methods
    num_workers: int

    def __len__(self) -> int:
        return len(self.configs)


def _check_pin(name: str, value, need: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1")
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


def pad_plan(schedule, chunk: int, *, ring: int | None, slots: int | None, num_updates: int | None = None) -> Plan:
    """`make_plan` with the ring pinned to exactly `ring` (when given) and `slots` slots."""
    need_ring, need_slots = needs(schedule)
    ring = _check_pin("ring", ring, need_ring)
    slots = _check_pin("slots", slots, need_slots)
    plan = make_plan(schedule, chunk, slots=slots, num_updates=num_updates)
    return plan if ring is None else dataclasses.replace(plan, ring=ring)


def prepare(task, policies, cluster, *, seeds=(0,), lr_rules=("constant",), lrs=(None,),
            num_updates: int | None = None, max_time: float | None = None, optimizer=None,
            inner_optimizer=None, eval_every: int | None = None, num_evals: int = 20,
            batch_size: int | None = None, ring: int | None = None, slots: int | None = None) -> Grid:
    """Simulate every schedule and pad every plan to one shape (see `sweep` for the arguments)."""
    from staleness.engine import run as _run

    pols = [_policies.parse(p) if isinstance(p, str) else p for p in policies]
    rules_in = [_lr.get(r) if isinstance(r, str) else r for r in lr_rules]
    lrs = [_run._check_lr(v, allow_none=True) for v in lrs]
    seeds = [int(s) for s in seeds]
    if not pols or not seeds or not rules_in or not lrs:
        raise ValueError("sweep: policies, seeds, lr_rules and lrs must each be non-empty")
    schedules = {(p, s): simulate_schedule(p, cluster, num_updates=num_updates, max_time=max_time, seed=s)
                 for p in pols for s in seeds}
    configs = list(itertools.product(pols, seeds, rules_in, lrs))
    first = next(iter(schedules.values()))
    task = _run.resolve_task(task, first.num_workers, batch_size)
    u_max = max(s.num_updates for s in schedules.values())
    chunk = _chunks.chunk_length(u_max, eval_every, num_evals)
    need = [needs(s) for s in schedules.values()]
    need_ring, need_slots = max(r for r, _ in need), max(c for _, c in need)
    slots = _check_pin("slots", slots, need_slots) or need_slots
    if ring is None:   # a power of two: grids whose largest staleness differs a little share one compile
        ring = max(make_plan(s, chunk).ring for s in schedules.values())
    ring = _check_pin("ring", ring, need_ring)
    plans = [pad_plan(schedules[(p, s)], chunk, ring=ring, slots=slots, num_updates=u_max)
             for p, s, _, _ in configs]
    if optimizer is None:   # the policies' own (outer) optimizer, if they agree on one
        own = {p.optimizer for p in pols}
        if len(own) > 1:
            raise ValueError(f"sweep: the policies are defined with different optimizers {sorted(map(str, own))}; "
                             "pass optimizer= to compare them with one")
        optimizer = own.pop()
    set_lrs = [v for v in lrs if v is not None]
    opt = _run.resolve_optimizer(optimizer, set_lrs[0] if set_lrs else None, u_max, task)
    local, inner_opt, steps = _run.local_setup([schedules[(p, s)] for p, s, _, _ in configs], task,
                                               inner_optimizer)
    opt = _run.streaming_outer(opt, local)
    return Grid(task, configs, schedules, plans, chunk, ring, slots, opt, tuple(dict.fromkeys(rules_in)), local,
                inner_opt, steps, first.num_workers)


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


def _specs(carry, consts, xs_index):
    carry_spec = core.Carry(P(AXIS), P(AXIS), P(None, AXIS), P(AXIS))
    consts_spec = {k: P(AXIS) for k in consts}
    xs_spec = (P(), P(None, AXIS), None if xs_index is None else P(None, AXIS))
    return carry_spec, consts_spec, xs_spec


@functools.lru_cache(maxsize=32)
def _sharded_fns(mesh: Mesh, opt, rules, local, has_index: bool, const_keys: tuple):
    """(chunk, evaluate) of the batched replay under `shard_map` over `mesh`'s configuration axis."""
    carry_spec = core.Carry(P(AXIS), P(AXIS), P(None, AXIS), P(AXIS))
    consts_spec = {k: P(AXIS) for k in const_keys}
    xs_spec = (P(), P(None, AXIS), P(None, AXIS) if has_index else None)

    def chunk(task, carry, xs, consts):
        return core._chunk_batched(task, carry, xs, consts, opt=opt, rules=rules, local=local)

    sharded = jax.shard_map(chunk, mesh=mesh, in_specs=(P(), carry_spec, xs_spec, consts_spec),
                            out_specs=(carry_spec, P(None, AXIS)), check_vma=False)
    evaluate = jax.shard_map(_evaluate_each, mesh=mesh, in_specs=(P(), P(AXIS)), out_specs=P(AXIS),
                             check_vma=False)
    return jax.jit(sharded, donate_argnums=(1,)), jax.jit(evaluate)


def _evaluate_each(task, params):
    """Metrics of each configuration's params (leaves [B, ...]), one after the other: a
    batched evaluation's rounding depends on B, this one's does not."""
    return jax.lax.map(task.evaluate, params)


_evaluate_each_jit = jax.jit(_evaluate_each)


def _place(tree, mesh, spec_tree):
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), spec_tree, is_leaf=lambda x: isinstance(x, P))
    return jax.device_put(tree, shardings)


# -- the replay of a grid --------------------------------------------------------------
def replay_grid(grid: Grid, indices=None, *, devices=None, progress: bool = False) -> list:
    """Replay configurations `indices` of `grid` (default: all) in one batched, compiled
    call per chunk, sharded over `devices` (see `resolve_devices`). Returns their Results
    in the order of `indices`."""
    from tqdm.auto import tqdm

    from staleness.engine import run as _run

    indices = list(range(len(grid))) if indices is None else [int(i) for i in indices]
    if not indices:
        return []
    devs = resolve_devices(devices)
    n_dev = len(devs) if devs else 1
    # Pad the batch by repeating the last configuration: to a multiple of the device count,
    # and to at least 2 per device (XLA compiles a batch of one as other ops, with other
    # rounding; from 2 on, a configuration's numbers do not depend on the batch it is in).
    per_device = max(2, -(-len(indices) // n_dev))
    padded = indices + [indices[-1]] * (per_device * n_dev - len(indices))
    compile0 = compile_seconds()
    t_start = time.perf_counter()
    configs = [grid.configs[i] for i in padded]
    plans = [grid.plans[i] for i in padded]
    task, chunk = grid.task, grid.chunk
    seed_arr = jnp.asarray([s for _, s, _, _ in configs], jnp.int32)
    consts = {"data_key": jax.vmap(lambda s: core.keys(s)[1])(seed_arr),
              "rule": jnp.asarray([grid.rules.index(r) for _, _, r, _ in configs], jnp.int32)}
    if grid.local is not None:
        consts["steps"] = jnp.asarray(grid.steps[padded])        # [B, λ]
    carry = core.init_carry_batched(task, [s for _, s, _, _ in configs], grid.opt, grid.ring,
                                    lrs=[v for *_, v in configs], inner=grid.inner_opt,
                                    num_workers=grid.num_workers,
                                    streaming=grid.local is not None and grid.local.streaming)
    rates = [v if v is not None else _run.learning_rate(grid.opt, jax.tree.map(lambda a, i=i: a[i], carry.opt_state))
             for i, (*_, v) in enumerate(configs)]
    data_keys = [core.keys(s)[1] for _, s, _, _ in configs]

    def inputs(k):
        parts = [_run.chunk_inputs(task, p, k, key) for p, key in zip(plans, data_keys)]
        index = None if parts[0][2] is None else np.stack([x[2] for x in parts], axis=1)   # [K, B, C, μ]
        return parts[0][0], np.stack([x[1] for x in parts], axis=1), index                # packed [K, B, 5, C]

    if devs is None:
        def step(carry, xs):
            return core.run_chunk_batched(task, carry, xs, consts, opt=grid.opt.tx, rules=grid.rules,
                                          local=grid.local)

        def evaluate(params):
            return _evaluate_each_jit(task, params)
        mesh_names = [str(jax.local_devices()[0])]
    else:
        mesh = Mesh(np.asarray(devs), (AXIS,))
        first = inputs(0)
        chunk_fn, eval_fn = _sharded_fns(mesh, grid.opt.tx, grid.rules, grid.local, first[2] is not None,
                                         tuple(sorted(consts)))
        carry_spec, consts_spec, _ = _specs(carry, consts, first[2])
        carry = _place(carry, mesh, carry_spec)
        consts = _place(consts, mesh, consts_spec)
        task_rep = jax.device_put(task, NamedSharding(mesh, P()))

        def step(carry, xs):
            return chunk_fn(task_rep, carry, xs, consts)

        def evaluate(params):
            return eval_fn(task_rep, params)
        mesh_names = [str(d) for d in devs]

    n = len(indices)
    metrics0 = jax.device_get(evaluate(carry.params))
    params0 = jax.device_get(carry.params)
    hists = []
    for i in range(n):
        h = _chunks.History(plans[i].num_updates,
                            _run._history_row(0, plans[i], math.nan, {k: v[i] for k, v in metrics0.items()}))
        h.params = jax.tree.map(lambda a, i=i: a[i], params0)
        hists.append(h)

    def record(k, carry, losses, _wall):
        losses = np.swapaxes(losses, 0, 1)     # [B, K, C]
        metrics = jax.device_get(evaluate(carry.params))
        params_host = jax.device_get(carry.params)
        lo = k * chunk
        for i, (p, h) in enumerate(zip(plans[:n], hists)):
            if not h.active or lo >= p.num_updates:
                continue
            hi = min(lo + chunk, p.num_updates)
            view = p.chunk_view(k)
            per_update = _chunks.update_losses(losses[i], view["mask"])[: hi - lo]
            h.losses(lo, per_update)
            bad = _chunks.first_nonfinite(losses[i], view["mask"])
            if bad is not None:
                row, slot = int(bad[0]), int(bad[1])
                h.diverge(_chunks.Divergence(lo + row, int(view["worker"][row, slot]),
                                             int(view["staleness"][row, slot]),
                                             f"iteration {int(view['iteration'][row, slot])}"), rates[i])
                continue
            h.add(_run._history_row(hi, p, float(np.mean(per_update)), {m: v[i] for m, v in metrics.items()}),
                  jax.tree.map(lambda a, i=i: a[i], params_host))
        return True

    bar = tqdm(total=plans[0].num_chunks * chunk, unit="upd", disable=not progress, desc=f"sweep x{n}",
               leave=False)
    _, status, wall = _chunks.run(step, carry, num_chunks=plans[0].num_chunks, inputs=inputs, record=record,
                                  histories=hists, bar=bar, bar_step=lambda k: chunk)
    compile_s = compile_seconds() - compile0
    total_s = time.perf_counter() - t_start
    results = []
    task_config = task.config()
    for i, idx in enumerate(indices):
        pol, s, rule, _ = grid.configs[idx]
        sched = grid.schedules[(pol, s)]
        cfg = dict(task_config, lr=rates[i], lr_rule=rule.describe(), optimizer=grid.opt.describe(), seed=s,
                   policy=sched.policy, cluster=sched.cluster, workers=sched.num_workers, eval_every=chunk,
                   sweep=True, sweep_index=idx, sweep_size=len(grid), ring=grid.ring, slots=grid.slots,
                   devices=mesh_names, compile_s=compile_s, sweep_s=total_s)
        if grid.local is not None:
            cfg.update(inner_optimizer=grid.inner_opt.describe(), local_steps=[int(h) for h in grid.steps[idx]])
        results.append(hists[i].result(sched, cfg))
    return results


def sweep(task, policies, cluster, *, seeds=(0,), lr_rules=("constant",), lrs=(None,),
          num_updates: int | None = None, max_time: float | None = None, optimizer=None,
          inner_optimizer=None, eval_every: int | None = None, num_evals: int = 20,
          batch_size: int | None = None, progress: bool = False, ring: int | None = None,
          slots: int | None = None, devices=None) -> list:
    """Replay many configurations in one compiled, vmapped call per chunk.

    Configurations are the product policies × seeds × lr_rules × lrs (in that
    order); every schedule is padded to the same number of updates, gradient
    slots and ring size. Returns one Result per configuration; each equals
    the corresponding `simulate` up to float rounding (vmap reorders sums).
    A diverging configuration gets status 'diverged', its history stops at the
    last finite chunk and `config['divergence']` names the update, worker and
    staleness (as `replay`'s DivergenceError does).

    Args:
      ring: parameter versions kept (>= the largest staleness + 1; default the
        next power of two); slots: gradient slots per update (>= the largest
        update). Pin both to compile once for several grids.
      devices: shard the configuration axis over local devices: True (all), a
        count, or a list of devices; the Results are bitwise those of one device.
    Each Result's config holds ring, slots, devices, compile_s (seconds spent
    compiling during the sweep) and sweep_s (the sweep's wall time).
    """
    grid = prepare(task, policies, cluster, seeds=seeds, lr_rules=lr_rules, lrs=lrs, num_updates=num_updates,
                   max_time=max_time, optimizer=optimizer, inner_optimizer=inner_optimizer, eval_every=eval_every,
                   num_evals=num_evals, batch_size=batch_size, ring=ring, slots=slots)
    return replay_grid(grid, devices=devices, progress=progress)
