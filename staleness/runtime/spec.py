"""Arguments of a real run, checked once at the boundary, and what derives from them.

`make_spec` validates every user argument (a `ValueError` naming the argument,
the value and what would be valid) and resolves specs (policy, cluster, lr
rule, optimizer, task). Both the one-process runtime (`runtime.run`) and each
process of a multi-process run (`runtime.run_process`) start from a `RunSpec`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from staleness.infra import checks
from staleness.infra import settings as _infra_settings
from staleness.infra.settings import flag, no_flag
from staleness import lr as _lr
from staleness import policies as _policies

__all__ = ["RunSpec", "Settings", "check_settings", "make_spec", "DEFAULT_UPDATES", "FAILURE_MODES", "SYNC_MODES",
           "resolve_sync"]

FAILURE_MODES = ("continue", "stop")
DEFAULT_UPDATES = 500   # `staleness run`'s --updates (the library has no default)
SYNC_MODES = ("collective", "server")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A validated real run (`Settings` and `runtime.run` describe the fields)."""

    task: Any
    policy: _policies.Policy
    cluster: Any            # staleness.cluster.Cluster or None (no injected delays)
    num_workers: int
    opt: Any                # engine.optim.Optimizer (an optax transformation + its learning rate)
    rule: Any               # lr rule
    lr: float | None        # the learning rate set in the optimizer state (None: the optimizer's own)
    seed: int
    num_updates: int
    max_time: float | None
    eval_every: int
    time_scale: float
    worker_timeout: float
    on_worker_failure: str
    sync: str               # 'collective' (one pmean step per round) or 'server' (the parameter server)
    checkpoint: Any
    checkpoint_every: int | None
    resume: bool
    local: Any = None          # engine.local.Local of a local-update method, else None
    inner: Any = None          # its inner Optimizer
    local_steps: tuple | None = None   # [λ] inner steps per iteration of each worker

    @property
    def inflight(self) -> bool:
        """Asynchronous RL with in-flight weight updates: the server publishes every version
        to the actors mid-rollout and the trace records their switches."""
        return bool(self.policy.learner and self.policy.work.inflight)

    @property
    def slots(self) -> int:
        """Gradient slots of the policy's largest update (1: the one-gradient path)."""
        return max(1, self.policy.gradients_per_update(self.num_workers, self.num_workers))

    def config(self, **extra) -> dict:
        """The Result's config (the engine's keys, plus how the run was executed)."""
        out = dict(self.task.config(), lr=self.lr,
                   lr_rule=self.rule.describe(), optimizer=self.opt.describe(), seed=self.seed,
                   policy=self.policy.describe(), cluster=self.cluster.describe() if self.cluster else "",
                   workers=self.num_workers, eval_every=self.eval_every, runtime="real", sync=self.sync,
                   time_scale=self.time_scale if self.cluster else None, num_updates=self.num_updates)
        if self.local_steps is not None:
            out.update(inner_optimizer=self.inner.describe(), local_steps=list(self.local_steps))
        out.update(extra)
        return out

    def delays(self, t0: float):
        """Injected delays (None without a cluster); t0: the run's start on the local clock."""
        if self.cluster is None:
            return None
        from staleness.engine import core, payload
        from staleness.runtime.worker import Delays

        sizes = None
        if self.local is not None and self.local.learner:   # an actor's rollout takes its size in tokens
            sizes = self.task.rollout_sizes(core.keys(self.seed)[1])
        pull_bytes, push_bytes = payload.payload_bytes(self.task, self.policy)
        inflight = self.inflight
        return Delays(self.cluster.sampler(self.seed), self.time_scale, t0, self.local_steps, sizes, pull_bytes,
                      push_bytes, inflight, self.policy.work.refill if inflight else None)

    def membership(self, after: float = 0.0) -> list[tuple[float, str, int]]:
        """Failure-model events (real seconds since the start) later than `after`."""
        if self.cluster is None:
            return []
        events = self.cluster.sampler(self.seed).membership_events()
        return [(t * self.time_scale, kind, w) for t, kind, w in events if t * self.time_scale > after]


def resolve_sync(sync, policy, cluster, on_worker_failure, processes, seed: int = 0) -> tuple[str, str]:
    """(sync, on_worker_failure) of a run: the explicit choice, checked, or the default:
    'collective' for a BSP-like policy in one process without a cluster or
    on_worker_failure='continue', else 'server'. An explicit 'collective' takes a
    cluster's delays, not its failure model."""
    if sync is not None and sync not in SYNC_MODES:
        raise checks.ArgumentError("sync", sync, f"must be one of {SYNC_MODES} (or None: collective for "
                                   "synchronous policies, server otherwise)")
    if on_worker_failure is not None and on_worker_failure not in FAILURE_MODES:
        raise checks.ArgumentError("on_worker_failure", on_worker_failure, f"must be one of {FAILURE_MODES} "
                                   "(or None: 'stop' under sync='collective', 'continue' under sync='server')")
    capable = policy.collective
    if sync is None:
        sync = "collective" if (capable and on_worker_failure != "continue" and cluster is None
                                and processes == 1) else "server"
    if sync == "collective":
        if not capable:
            raise checks.ArgumentError("sync", sync, "needs a policy that releases every worker at once and "
                                       f"averages all their gradients (bsp); {policy.describe()!r} needs "
                                       "sync='server'")
        if on_worker_failure == "continue":
            raise checks.ArgumentError("on_worker_failure", on_worker_failure, "needs sync='server' "
                                       "(worker-level fault tolerance): a collective round cannot go on once a "
                                       "worker is lost; or use on_worker_failure='stop'")
        if cluster is not None and cluster.sampler(seed).membership_events():
            raise ValueError(f"the failure model of cluster = {cluster.describe()!r} needs sync='server': a "
                             "collective round cannot go on once a worker is lost (its delays alone work under "
                             "collectives)")
        return sync, "stop"
    return sync, on_worker_failure or "continue"


_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class Settings:
    """A real run's settings as given (`runtime.run`'s keyword arguments; see there), which
    `check_settings` and `make_spec` check once. processes: the job's process count
    (several: sync='collective' only when asked for, see `resolve_sync`). Each field's
    metadata describes its command-line flag, or says it has none (`staleness.infra.settings`)."""

    num_updates: Any = _field(metadata=flag(f"server updates (default {DEFAULT_UPDATES})", int, flag="--updates",
                                             default=DEFAULT_UPDATES))
    num_workers: Any = _field(default=None, metadata=flag(
        "number of workers (default: the cluster's, else one per device)", int, flag="--workers"))
    seed: Any = _field(default=0, metadata=flag(
        "seed of parameters, minibatches and the cluster's draws (default 0)", int))
    lr: Any = _field(default=None, metadata=flag(
        "learning rate (default 0.1, or the lr= the --optimizer spec names)", float))
    lr_rule: Any = _field(default="constant", metadata=flag(
        "constant, per_gradient, per_update, delay_adaptive:N"))
    optimizer: Any = _field(default=None, metadata=flag(
        "server optimizer spec, e.g. sgd, momentum:0.9, 'adamw:lr=1e-3,wd=0.1,clip=1,warmup=100+cosine' (see "
        "staleness simulate --help)"))
    batch_size: Any = _field(default=None, metadata=flag(
        "per-worker minibatch μ (default 32, or the task factory's own)", int))
    data_dir: Any = _field(default=None, metadata=flag("local data directory (CIFAR tasks)"))
    max_time: Any = _field(default=None, metadata=flag("wall-clock budget in seconds (optional)", float))
    eval_every: Any = _field(default=None, metadata=flag("updates between history rows (default: 20 rows)", int))
    num_evals: Any = _field(default=20, metadata=no_flag("the command line keeps 20 rows; --eval-every sets "
                                                           "their spacing"))
    time_scale: Any = _field(default=0.01, metadata=flag(
        "real seconds per simulated second of the cluster (default 0.01)", float))
    worker_timeout: Any = _field(default=30.0, metadata=flag(
        "seconds after which a silent worker (or a dead process) is declared lost (default 30)", float))
    on_worker_failure: Any = _field(default=None, metadata=flag(
        "continue (gates count live workers) or stop (default: stop under --sync collective, continue under "
        "--sync server)"))
    checkpoint: Any = _field(default=None, metadata=flag("checkpoint directory (the server's state)"))
    checkpoint_every: Any = _field(default=None, metadata=flag("checkpoint every K updates", int))
    resume: Any = _field(default=False, metadata=flag("continue from the checkpoint in --checkpoint", bool))
    inner_optimizer: Any = _field(default=None, metadata=flag(
        "local-update methods: the workers' inner optimizer spec (default: the task's, else sgd); --optimizer is "
        "then the outer one"))
    sync: Any = _field(default=None, metadata=flag(
        "collective (each round one jitted pmean step over the devices; bsp; a lost worker stops the run) or "
        "server (the parameter server; worker-level fault tolerance). Default: collective for bsp without "
        "--cluster or --on-worker-failure continue in one process, else server (several processes: collective "
        "when asked for)"))
    processes: Any = _field(default=1, metadata=no_flag("the job: --num-processes of `staleness run`, --local of "
                                                          "`staleness launch`"))


def check_settings(s: Settings) -> Settings:
    """`s` with each value checked on its own (`checks.ArgumentError` naming the field, the
    value and what would be valid) and normalised (ints, floats): what needs nothing but
    the value, so a command line can check its flags before it starts JAX or builds a task.
    `make_spec` calls it; what depends on the policy, the cluster or the task is checked there."""
    return dataclasses.replace(
        s, num_workers=checks.at_least("num_workers", s.num_workers, 1, allow_none=True),
        num_updates=checks.at_least("num_updates", s.num_updates, 1, what=" (server updates)"),
        seed=checks.at_least("seed", s.seed, 0), lr=checks.learning_rate(s.lr, allow_none=True),
        batch_size=checks.at_least("batch_size", s.batch_size, 1, allow_none=True),
        max_time=checks.seconds("max_time", s.max_time, allow_none=True),
        eval_every=checks.at_least("eval_every", s.eval_every, 1, allow_none=True, what=" (updates)"),
        num_evals=checks.at_least("num_evals", s.num_evals, 1),
        time_scale=checks.seconds("time_scale", s.time_scale),
        worker_timeout=checks.seconds("worker_timeout", s.worker_timeout),
        checkpoint_every=checks.at_least("checkpoint_every", s.checkpoint_every, 1, allow_none=True,
                                         what=" (updates)"),
        processes=checks.at_least("processes", s.processes, 1))


def make_spec(task, policy, cluster=None, *, settings: Settings | None = None, **overrides) -> RunSpec:
    """Validate a real run: `task`, `policy` and `cluster` (objects or specs) and its
    `Settings` (given whole, and/or its fields by keyword: an unknown one is a TypeError);
    see `runtime.run`."""
    s = _infra_settings.merge(Settings, settings, overrides, "make_spec")
    from staleness import cluster as _cluster

    policy, cluster = _policies.resolve(policy), _cluster.resolve(cluster, allow_none=True)
    s = check_settings(s)
    num_workers = s.num_workers
    if cluster is not None:
        if num_workers is not None and num_workers != cluster.num_workers:
            raise ValueError(f"num_workers = {num_workers!r} differs from the cluster's {cluster.num_workers} "
                             "workers; give one or make them agree")
        num_workers = cluster.num_workers
    num_workers = checks.at_least("num_workers", num_workers, 1)   # None without a cluster
    num_updates, seed, lr = s.num_updates, s.seed, s.lr
    rule = _lr.get(s.lr_rule) if isinstance(s.lr_rule, str) else s.lr_rule
    if not hasattr(rule, "scale"):
        raise ValueError(f"lr_rule = {s.lr_rule!r} must be a staleness.lr rule or a spec string")
    sync, on_worker_failure = resolve_sync(s.sync, policy, cluster, s.on_worker_failure, s.processes, seed)
    if s.checkpoint_every is not None and s.checkpoint is None:
        raise ValueError("checkpoint_every needs a checkpoint directory (checkpoint=...)")
    if s.resume and s.checkpoint is None:
        raise ValueError("resume=True needs the checkpoint directory to resume from (checkpoint=...)")
    eval_every = s.eval_every if s.eval_every is not None else max(1, -(-num_updates // s.num_evals))
    _check_real(policy, cluster, num_workers)
    task, opt, local, inner, steps = _numerics(task, policy, cluster, s, num_workers, num_updates, seed, lr)
    if local is not None and not local.learner and s.processes > 1 and s.checkpoint_every is not None:
        raise ValueError(f"policy {policy.describe()!r}: checkpoint_every with workers in several processes is not "
                         "supported for a local-update method yet (its workers' inner states live in their "
                         "processes); run it in one process, or without checkpoints")
    if policy.merge_keys > 1 and s.checkpoint_every is not None:
        raise ValueError(f"policy {policy.describe()!r}: checkpoint_every with fragments merged by their own windows "
                         "is not supported yet (a checkpoint waits until no window is open or pending, which with "
                         "several fragments may never come); run it without checkpoints")
    return RunSpec(task=task, policy=policy, cluster=cluster, num_workers=num_workers, opt=opt, rule=rule,
                   lr=opt.lr, seed=seed, num_updates=num_updates, max_time=s.max_time, eval_every=eval_every,
                   time_scale=s.time_scale, worker_timeout=s.worker_timeout, on_worker_failure=on_worker_failure,
                   sync=sync, checkpoint=s.checkpoint, checkpoint_every=s.checkpoint_every, resume=bool(s.resume),
                   local=local, inner=inner, local_steps=steps)


def _check_real(policy, cluster, num_workers: int) -> None:
    """What a real run of `policy` needs beyond the simulator's checks."""
    policy.init(num_workers)  # policy-specific checks (e.g. softsync n <= workers)
    if policy.learner and policy.work.inflight and cluster is None:
        raise ValueError(f"policy {policy.describe()!r}: in-flight weight updates in a real run need a cluster "
                         "(cluster=..., --cluster): its seconds per token make the decode window in which new "
                         "versions reach an actor")


def _numerics(task, policy, cluster, s: Settings, num_workers: int, num_updates: int, seed: int, lr):
    """(task, opt, local, inner, local steps) of a real run: the task built, the optimizer
    resolved, and a local-update method's (or RL learner's) step configuration."""
    from staleness.engine import local as _local
    from staleness.engine.run import check_outer, policy_default, resolve_optimizer, resolve_task, work_sizes

    task = resolve_task(task, num_workers, s.batch_size, s.data_dir)
    work_sizes(task, policy, seed)   # an RL policy needs an RL task and vice versa (ValueError)
    opt = resolve_optimizer(s.optimizer if s.optimizer is not None else policy_default(policy.optimizer, lr), lr,
                            num_updates, task)
    local = inner = steps = None
    if policy.local:
        from staleness.engine.run import local_config, streaming_outer

        steps = policy.work.steps_per_worker(cluster.mean_seconds if cluster is not None else [1.0] * num_workers)
        local, inner = local_config([policy.work], np.asarray([steps], np.int32), num_updates, task,
                                    s.inner_optimizer)
        opt = streaming_outer(opt, local)
    elif s.inner_optimizer is not None:
        raise ValueError(f"inner_optimizer is for local-update methods; the policy {policy.describe()!r} "
                         "computes gradients")
    else:
        local = _local.configure(policy.work)   # asynchronous RL's learner step, else None
    check_outer(opt, local, policy)
    if task.num_workers < num_workers:
        raise ValueError(f"task {task.name!r} was built for num_workers = {task.num_workers}, fewer than the "
                         f"run's {num_workers} workers; build it for num_workers={num_workers} (tasks.get, from_flax "
                         "or from_functions)")
    return task, opt, local, inner, steps
