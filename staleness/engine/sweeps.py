"""Sweeps: many configurations replayed in one compiled call per chunk, on one device or a mesh.

    results = sweep(task, ["asp", "ssp:3"], cluster, seeds=range(4), lrs=[0.03, 0.1], num_updates=2000)
    results = sweep(..., devices=4)          # the configuration axis sharded over 4 local devices

A sweep is prepared once on the host (`prepare`: every schedule, the padding
shared by all configurations, the optimizer) and replayed by
`replay_grid(grid, indices, devices)`: the configurations `indices` (default:
all) in blocks of `block` configurations batched under `vmap`, one block per
device per call (`jax.shard_map` over the devices; no collective inside).
Every block, wherever it runs, is the same compiled program on the same
shapes, so any split of the grid (over devices here, over processes in
`staleness.engine.distributed`) gives every configuration the same bits.

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
from staleness.engine import optim as _optim
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
    own = {p.optimizer for p in pols}
    if optimizer is None and len(own) == 1 and any(v is not None for v in lrs):
        # the policies' own spec (DiLoCo's 'nesterov:0.9,lr=0.7'): swept rates replace its lr, and
        # a None rate (the optimizer's own) is that lr
        default = own.pop()
        spec = _optim.get(default) if isinstance(default, str) else None
        if spec is not None and spec.lr is not None:
            optimizer = dataclasses.replace(spec, lr=None)
            lrs = [spec.lr if v is None else v for v in lrs]
    from staleness import cluster as _cluster
    from staleness.engine import payload as _payload

    if isinstance(cluster, str):
        cluster = _cluster.parse(cluster)
    task = _run.resolve_task(task, cluster.num_workers, batch_size)
    # as `simulate` does: transfers carry the bytes of the task's pytree (the method's payload)
    payload = {p: _payload.payload_bytes(task, p) for p in pols}
    schedules = {(p, s): simulate_schedule(p, cluster, num_updates=num_updates, max_time=max_time, seed=s,
                                           payload_bytes=payload[p][0], push_bytes=payload[p][1])
                 for p in pols for s in seeds}
    configs = list(itertools.product(pols, seeds, rules_in, lrs))
    first = next(iter(schedules.values()))
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
    set_lrs = list(dict.fromkeys(v for v in lrs if v is not None))
    opt = _run.resolve_optimizer(optimizer, set_lrs[0] if set_lrs else None, u_max, task)
    for v in set_lrs[1:]:   # every rate, not only the first, must agree with an lr= the optimizer names
        _run.resolve_optimizer(optimizer, v, u_max, task)
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
    vmapped evaluation over the test set rounded differently on 1 and on 4 devices
    (observed on CPU); one evaluation per configuration does not."""
    return jax.lax.map(task.evaluate, params)


_evaluate_each_jit = jax.jit(_evaluate_each)


def _one_device_chunk(task, carry, xs, consts, *, opt, rules, local):
    return core.run_chunk_batched(task, carry, xs, consts, opt=opt, rules=rules, local=local)


def _place(tree, mesh, spec_tree):
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), spec_tree, is_leaf=lambda x: isinstance(x, P))
    return jax.device_put(tree, shardings)


# -- the replay of a grid --------------------------------------------------------------
DEFAULT_BLOCK = 8   # configurations per device per compiled call


def blocks_of(num: int, block: int) -> int:
    return -(-num // block)


def replay_grid(grid: Grid, indices=None, *, devices=None, progress: bool = False, block: int | None = None) -> list:
    """Replay configurations `indices` of `grid` (default: all), `block` configurations per
    device per compiled call, over `devices` (see `resolve_devices`). Returns their Results
    in the order of `indices`.

    Every device runs the same program on a block of exactly `block` configurations
    (the last block padded by repeating its last configuration), so a configuration's
    numbers do not depend on the device count, the process count or the grid's size
    beyond the block: XLA picks other kernels, with other rounding, for other batch
    sizes, and a fixed block makes every placement one compiled program."""
    from tqdm.auto import tqdm

    from staleness.engine import run as _run

    indices = list(range(len(grid))) if indices is None else [int(i) for i in indices]
    if not indices:
        return []
    block = grid_block(grid, block)
    devs = resolve_devices(devices) or [jax.local_devices()[0]]
    n_dev = len(devs)
    nb = blocks_of(len(indices), block)
    rounds = blocks_of(nb, n_dev)   # calls per chunk: each puts one block on every device
    width = n_dev * block
    padded = indices + [indices[-1]] * (rounds * width - len(indices))
    compile0 = compile_seconds()
    t_start = time.perf_counter()
    configs = [grid.configs[i] for i in padded]
    plans = [grid.plans[i] for i in padded]
    task, chunk = grid.task, grid.chunk
    mesh = Mesh(np.asarray(devs), (AXIS,))
    data_keys = [core.keys(s)[1] for _, s, _, _ in configs]

    def inputs_of(sel):
        def inputs(k):
            parts = [_run.chunk_inputs(task, plans[i], k, data_keys[i]) for i in sel]
            index = None if parts[0][2] is None else np.stack([x[2] for x in parts], axis=1)   # [K, W, C, μ]
            return parts[0][0], np.stack([x[1] for x in parts], axis=1), index                # packed [K, W, 5, C]
        return inputs

    spans = [list(range(r * width, (r + 1) * width)) for r in range(rounds)]
    feeds = [inputs_of(sel) for sel in spans]
    has_index = task.indexed
    const_keys = ("data_key", "rule") + (("steps",) if grid.local is not None else ())
    if n_dev > 1:
        chunk_fn, eval_fn = _sharded_fns(mesh, grid.opt.tx, grid.rules, grid.local, has_index, const_keys)
        task_rep = jax.device_put(task, NamedSharding(mesh, P()))
    else:   # one device: the engine's own batched replay (the per-device program of the sharded one)
        chunk_fn = functools.partial(_one_device_chunk, opt=grid.opt.tx, rules=grid.rules, local=grid.local)
        eval_fn, task_rep = _evaluate_each_jit, jax.device_put(task, devs[0])
    carry_spec = core.Carry(P(AXIS), P(AXIS), P(None, AXIS), P(AXIS))
    carries, consts, rates = [], [], []
    for sel in spans:
        cfgs = [configs[i] for i in sel]
        # the configurations' minibatch keys, stacked on the host (a vmapped `keys` compiles)
        cs = {"data_key": jax.random.wrap_key_data(np.stack([np.asarray(jax.random.key_data(data_keys[i]))
                                                             for i in sel])),
              "rule": jnp.asarray([grid.rules.index(r) for _, _, r, _ in cfgs], jnp.int32)}
        if grid.local is not None:
            cs["steps"] = jnp.asarray(grid.steps[[padded[i] for i in sel]])        # [W, λ]
        c = core.init_carry_batched(task, [s for _, s, _, _ in cfgs], grid.opt, grid.ring,
                                    lrs=[v for *_, v in cfgs], inner=grid.inner_opt, num_workers=grid.num_workers,
                                    streaming=grid.local is not None and grid.local.streaming)
        rates += [v if v is not None else _run.learning_rate(grid.opt, jax.tree.map(lambda a, i=i: a[i], c.opt_state))
                  for i, (*_, v) in enumerate(cfgs)]
        carries.append(_place(c, mesh, carry_spec))
        consts.append(_place(cs, mesh, {k: P(AXIS) for k in cs}))

    def step(carries, xs):
        outs = [chunk_fn(task_rep, c, x, k) for c, x, k in zip(carries, xs, consts)]
        return [o[0] for o in outs], [o[1] for o in outs]

    def inputs(k):
        return [f(k) for f in feeds]

    def evaluate(carries):
        parts = jax.device_get([eval_fn(task_rep, c.params) for c in carries])
        return {m: np.concatenate([p[m] for p in parts]) for m in parts[0]}

    def host_params(carries):
        parts = jax.device_get([c.params for c in carries])
        return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)

    n = len(indices)
    metrics0 = evaluate(carries)
    params0 = host_params(carries)
    hists = []
    for i in range(n):
        h = _chunks.History(plans[i].num_updates,
                            _run._history_row(0, plans[i], math.nan, {k: v[i] for k, v in metrics0.items()}))
        h.params = jax.tree.map(lambda a, i=i: a[i], params0)
        hists.append(h)

    def record(k, carries, losses, _wall):
        losses = np.swapaxes(np.concatenate(losses, axis=1), 0, 1)     # [B, K, C]
        metrics = evaluate(carries)
        params_host = host_params(carries)
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
    _chunks.run(step, carries, num_chunks=plans[0].num_chunks, inputs=inputs, record=record, histories=hists,
                bar=bar, bar_step=lambda k: chunk)
    compile_s = compile_seconds() - compile0
    total_s = time.perf_counter() - t_start
    mesh_names = [str(d) for d in devs]
    results = []
    task_config = task.config()
    for i, idx in enumerate(indices):
        pol, s, rule, _ = grid.configs[idx]
        sched = grid.schedules[(pol, s)]
        cfg = dict(task_config, lr=rates[i], lr_rule=rule.describe(), optimizer=grid.opt.describe(), seed=s,
                   policy=sched.policy, cluster=sched.cluster, workers=sched.num_workers, eval_every=chunk,
                   sweep=True, sweep_index=idx, sweep_size=len(grid), ring=grid.ring, slots=grid.slots,
                   block=block, devices=mesh_names, compile_s=compile_s, sweep_s=total_s)
        if grid.local is not None:
            cfg.update(inner_optimizer=grid.inner_opt.describe(), local_steps=[int(h) for h in grid.steps[idx]])
        results.append(hists[i].result(sched, cfg))
    return results


def grid_block(grid: Grid, block: int | None) -> int:
    """Configurations per device per call: `block`, else min(DEFAULT_BLOCK, grid size)."""
    if block is None:
        return min(DEFAULT_BLOCK, len(grid))
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block = {block!r} must be an integer >= 1 (configurations per device per call)")
    return int(block)


def sweep(task, policies, cluster, *, seeds=(0,), lr_rules=("constant",), lrs=(None,),
          num_updates: int | None = None, max_time: float | None = None, optimizer=None,
          inner_optimizer=None, eval_every: int | None = None, num_evals: int = 20,
          batch_size: int | None = None, progress: bool = False, ring: int | None = None,
          slots: int | None = None, devices=None, block: int | None = None) -> list:
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
      block: configurations per device per compiled call (default min(8, grid size));
        the Results depend on it (in the last bits), not on the devices or processes.
    Each Result's config holds ring, slots, devices, compile_s (seconds spent
    compiling during the sweep) and sweep_s (the sweep's wall time).
    """
    grid = prepare(task, policies, cluster, seeds=seeds, lr_rules=lr_rules, lrs=lrs, num_updates=num_updates,
                   max_time=max_time, optimizer=optimizer, inner_optimizer=inner_optimizer, eval_every=eval_every,
                   num_evals=num_evals, batch_size=batch_size, ring=ring, slots=slots)
    return replay_grid(grid, devices=devices, progress=progress, block=block)
