"""The chunk runner: history, divergence, evaluation, checkpoints and progress of every compiled replay.

    results = runner.run(program, carry, members, options)

`engine.run.replay` (one configuration, `single`) and `engine.grid.replay_grid` (B
configurations batched, sharded over devices) pass their compiled `Program`, one `Member`
per configuration and the run's `Options`, as mctx passes its loop. Everything else
happens here, the same way for every caller: the history rows (one per chunk, at
simulated time), the per-update train loss, the first non-finite loss (raised as
`DivergenceError`, or marked 'diverged' while the other configurations go on),
`stop_after`, checkpoints and resume, the progress bar, Ctrl-C, each Result's config
(`config`) and the tracking callbacks (`staleness.infra.tracking`: one call per history
row; a resumed run calls them only for its new rows). The loop is `engine.chunks.run`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from staleness.infra import checkpoint as _checkpoint
from staleness.infra import tracking as _tracking
from staleness.engine import chunks as _chunks
from staleness.engine import core
from staleness.tasks.optim import get_lr
from staleness.engine.plan import Plan, chunk_inputs, fingerprint

__all__ = ["Program", "Member", "Options", "run", "single", "config", "learning_rate", "run_info"]

DIVERGENCE = ("raise", "mark")   # Options.on_divergence


class Program(NamedTuple):
    """What differs between compiled replays."""

    step: Callable      # (carry, xs) -> (carry, out): one compiled chunk (donates its carry)
    inputs: Callable    # k -> xs of chunk k (built on the host while chunk k - 1 runs)
    losses: Callable    # out (NumPy) -> ([B, K, C] per-slot losses, NaN on padding; [B] dicts {name: [K]} of
    #                     an RL learner's per-update diagnostics, else {})
    metrics: Callable   # carry -> B dicts {metric: value}: each configuration's evaluation, on the host
    params: Callable    # carry -> B host pytrees
    span: Callable | None = None   # (lo, hi) -> xs of updates lo..hi < one chunk, run by `step` as a chunk
    capture: Callable | None = None   # carry -> (() -> (metrics, params)): `metrics` and `params` taken
    #                                   before the next chunk is dispatched (`chunks.run`'s capture)


class Member(NamedTuple):
    """One configuration of a replay: what it replays and what its Result reports."""

    schedule: Any                  # its Schedule
    plan: Plan                     # its plan, padded to the program's shapes
    seed: int
    rule: Any                      # its `staleness.lr` rule
    lr: float | None               # its learning rate (`learning_rate`; named by a divergence message)
    steps: np.ndarray | None = None   # [λ] inner steps per iteration of a local-update method
    extra: dict | None = None      # further config entries (replay's `config=`, a sweep's index)


@dataclasses.dataclass(frozen=True)
class Options:
    """What every configuration of one run shares."""

    chunk: int                           # updates per compiled call (the evaluation interval)
    task_config: dict                    # `task.config()`
    optimizer: str                       # the optimizers' descriptions
    inner_optimizer: str | None = None
    on_divergence: str = "raise"         # 'raise' (`DivergenceError` with the Result so far: replay) or 'mark'
    #                                      (status 'diverged', the others go on: a sweep)
    stop_after: int | None = None        # stop (status 'stopped') after the chunk that reaches this many updates
    checkpoint: Path | None = None       # directory to checkpoint into after every chunk (one configuration)
    resume: bool = False                 # continue from the checkpoint found there
    progress: bool = False               # show a progress bar, labelled `desc`
    desc: str = ""
    callbacks: tuple = ()   # `staleness.infra.tracking` callables, called with an `Evaluation` at every history
    #                         row: the initial one of every member in order, then after each chunk every member
    #                         still running, in order


def single(task, plan: Plan, consts: dict, static) -> Program:
    """The program of one configuration (`engine.run.replay`): `core.run_chunk` with
    `static` (a `core.Static`) and `consts` on `plan`'s chunks, `core.evaluate`."""
    def step(carry, xs):
        return core.run_chunk(task, carry, xs, consts, opt=static.opt, rules=static.rules, slot_mode=static.slot_mode,
                              local=static.local, padded=static.padded)

    key = np.asarray(jax.random.key_data(consts["data_key"]))   # fetched once, not per chunk

    def inputs(k):   # the updates of chunk k that exist: the last chunk's padding updates are not run
        return core.pad_chunk(chunk_inputs(task, plan, k, key),
                              min(plan.chunk, plan.num_updates - k * plan.chunk))

    def span(lo, hi):   # updates lo .. hi - 1 of one chunk, padded as the chunk's (one compiled program)
        return core.pad_chunk(chunk_inputs(task, plan, lo // plan.chunk, key, (lo, hi)), hi - lo, plan.chunk)

    def capture(carry):   # the evaluation runs before the next chunk, fetched when recorded
        metrics, params = core.evaluate(task, carry.params), jax.device_get(carry.params)
        return lambda: ([jax.device_get(metrics)], [params])

    def losses(out):
        loss, diag = out
        return loss[None, :plan.chunk], [{k: v[:plan.chunk] for k, v in diag.items()}]

    return Program(step=step, inputs=inputs, losses=losses,
                   metrics=lambda carry: [jax.device_get(core.evaluate(task, carry.params))],
                   params=lambda carry: [jax.device_get(carry.params)], span=span, capture=capture)


def learning_rate(opt, opt_state) -> float | None:
    """The learning rate a run starts from (for its config): the one `opt` (an
    `engine.optim.Optimizer`) sets, else the one in `opt_state`."""
    if opt.lr is not None:
        return opt.lr
    value = get_lr(opt_state)
    return None if value is None else float(np.asarray(value).reshape(-1)[0])


def config(options: Options, member: Member) -> dict:
    """The config of `member`'s Result: its extra entries, the task's, then the run's settings."""
    s = member.schedule
    cfg = dict(member.extra or {})
    cfg.update(**options.task_config, lr=member.lr, lr_rule=member.rule.describe(), optimizer=options.optimizer,
               seed=member.seed, policy=s.policy.describe(), cluster=s.cluster, workers=s.num_workers,
               eval_every=options.chunk)
    if member.steps is not None:
        cfg.update(inner_optimizer=options.inner_optimizer, local_steps=[int(h) for h in member.steps])
    return cfg


def run(program: Program, carry, members, options: Options) -> list:
    """Replay every chunk of `members` with `program` from `carry`; one Result per member.

    Raises `DivergenceError` (with `.result`) on a non-finite loss when
    `options.on_divergence` is 'raise', naming the update, worker and staleness, and
    `tracking.CallbackError` (with `.results`) when a callback raises."""
    if options.on_divergence not in DIVERGENCE:
        raise ValueError(f"on_divergence = {options.on_divergence!r} must be one of {DIVERGENCE}")
    if options.checkpoint is not None and len(members) != 1:
        raise ValueError(f"checkpoint: a replay of one configuration checkpoints, not {len(members)}")
    return _Run(program, list(members), options, tuple(options.callbacks)).run(carry)


def _history_row(update: int, plan: Plan, train_loss: float, metrics: dict) -> dict:
    time = float(plan.update_time[update - 1]) if update > 0 else 0.0
    row = {"update": int(update), "time": time, "train_loss": float(train_loss)}
    row.update({k: float(v) for k, v in metrics.items()})
    return row


def divergence(losses: np.ndarray, plan: Plan, k: int, kind: str = "worker") -> _chunks.Divergence | None:
    """The first non-finite loss among the real slots of chunk k (`losses` [K, C]), or None;
    kind 'actor' for an RL learner's rollouts."""
    view = plan.chunk_view(k)
    bad = _chunks.first_nonfinite(losses, view["mask"])
    if bad is None:
        return None
    row, slot = int(bad[0]), int(bad[1])
    return _chunks.Divergence(k * plan.chunk + row, int(view["worker"][row, slot]),
                              int(view["staleness"][row, slot]), f"iteration {int(view['iteration'][row, slot])}",
                              kind)


def run_info(member: Member, cfg: dict, index: int) -> _tracking.Run:
    """The `tracking.Run` of `member` (config `cfg`, position `index`)."""
    policy, rule = member.schedule.policy.describe(), member.rule.describe()
    return _tracking.Run(_tracking.label(policy, member.seed, member.lr, rule, member.extra), policy,
                         int(member.seed), member.lr, rule, index, cfg)


class _Run:
    """The host state of one run: each member's config, `chunks.History` and tracking."""

    def __init__(self, program: Program, members: list, options: Options, callbacks: tuple = ()):
        self.program, self.members, self.options = program, members, options
        self.configs = [config(options, m) for m in members]
        self.hists: list[_chunks.History] = []
        self.tracker = _tracking.Tracker(callbacks, [run_info(m, c, i) for i, (m, c) in
                                                     enumerate(zip(members, self.configs))])
        self.wall = 0.0   # wall seconds in compiled chunks (the callbacks' wall_time)
        # what chunk k's record gets of its carry (`chunks.run`): taken early, so chunk k + 1 runs
        # meanwhile; a checkpoint saves the carry itself
        self.capture = program.capture if options.checkpoint is None else None
        self.identity = None
        if options.checkpoint is not None:   # what a checkpoint must agree with: schedule and settings
            self.identity = {"fingerprint": fingerprint(members[0].schedule),
                             **{k: self.configs[0][k] for k in ("task", "lr", "lr_rule", "optimizer", "seed",
                                                                 "eval_every")}}

    def run(self, carry) -> list:
        """Every chunk from `carry` (see `run`); the tracking callbacks finish every run
        whatever happens, and a `CallbackError` carries the Results so far."""
        from tqdm.auto import tqdm

        options, members = self.options, self.members
        try:
            carry, start = self.begin(carry)
            chunk, total = options.chunk, max(m.plan.num_updates for m in members)
            bar = tqdm(total=total, initial=min(start * chunk, total), unit="upd", disable=not options.progress,
                       desc=options.desc, leave=False)
            _chunks.run(self.program.step, carry, num_chunks=members[0].plan.num_chunks, inputs=self.program.inputs,
                        record=self.record, start=start, save=self.save if options.checkpoint is not None else None,
                        histories=self.hists, bar=bar, bar_step=lambda k: min((k + 1) * chunk, total) - k * chunk,
                        capture=self.capture)
        except BaseException as e:
            if isinstance(e, _tracking.CallbackError):   # keep what was recorded, as Ctrl-C does
                e.results = self.results(stop=True)
            self.tracker.finish([h.status for h in self.hists])   # its own errors would hide this one
            raise
        results = self.results()
        err = self.tracker.finish([h.status for h in self.hists])
        if err is not None:
            err.results = results
            raise err
        return results

    def results(self, stop: bool = False) -> list:
        """Each member's Result; `stop`: the active ones marked 'stopped' first."""
        if stop:
            for h in self.hists:
                if h.active:
                    h.stop()
        return [h.result(m.schedule, c) for m, h, c in zip(self.members, self.hists, self.configs)]

    def begin(self, carry):
        """(carry, first chunk): the initial rows, then the checkpoint's state when resuming."""
        metrics = self.program.metrics(carry)
        self.hists = [_chunks.History(m.plan.num_updates, _history_row(0, m.plan, math.nan, x))
                      for m, x in zip(self.members, metrics)]
        start = 0
        if self.options.checkpoint is not None and self.options.resume:
            meta, carry = _checkpoint.load(self.options.checkpoint, carry, match=self.identity, name="replay")
            self.hists[0].restore(meta)
            start = int(meta["next_chunk"])
        for h, p in zip(self.hists, self.program.params(carry)):
            h.params = p
        if start == 0:   # a resumed run reported its initial row before
            for i, h in enumerate(self.hists):
                self.tracker.row(i, h.rows[0], h.rows[0]["time"], 0.0)
        return carry, start

    def record(self, k: int, carry, out, wall: float) -> bool:
        """Chunk k's losses, divergence checks, history rows and their callbacks; False
        after `stop_after`."""
        self.wall += wall
        losses, diags = self.program.losses(out)
        chunk = self.options.chunk
        lo = k * chunk
        live = []
        for i, (m, h, cfg) in enumerate(zip(self.members, self.hists, self.configs)):
            if not h.active or lo >= m.plan.num_updates:
                continue
            hi = min(lo + chunk, m.plan.num_updates)
            view = m.plan.chunk_view(k)
            per_update = _chunks.update_losses(losses[i], view["mask"])[: hi - lo]
            h.losses(lo, per_update)
            diag = diags[i]
            if diag:   # an RL learner's: with the mean staleness of each update's rollouts
                diag = {**{n: np.asarray(v[: hi - lo], np.float64) for n, v in diag.items()},
                        "staleness_mean": _chunks.update_losses(view["staleness"].astype(np.float64),
                                                                view["mask"])[: hi - lo]}
                h.diagnostics(lo, diag)
            d = divergence(losses[i], m.plan, k, "actor" if m.schedule.policy.learner else "worker")
            if d is None:
                live.append((i, hi, float(np.mean(per_update)), {n: float(np.nanmean(v)) if np.isfinite(v).any()
                                                                 else float("nan") for n, v in diag.items()}))
            elif self.options.on_divergence == "raise":
                _chunks.raise_divergence(h, d, m.schedule, cfg, cfg["lr"], cut=d.update)
            else:
                h.diverge(d, cfg["lr"])
        if live:   # `carry`: the carry, or what `Program.capture` took of it
            metrics, params = (carry() if self.capture is not None
                               else (self.program.metrics(carry), self.program.params(carry)))
            for i, hi, loss, diag in live:
                self.hists[i].add(_history_row(hi, self.members[i].plan, loss, {**metrics[i], **diag}), params[i])
            for i, *_ in live:   # after every row is in: a failing callback loses none
                row = self.hists[i].rows[-1]
                self.tracker.row(i, row, row["time"], self.wall)
        end = min(lo + chunk, max(m.plan.num_updates for m in self.members))
        return not (self.options.stop_after is not None and end >= self.options.stop_after)

    def save(self, k: int, carry) -> None:
        _checkpoint.save(self.options.checkpoint, carry, {"next_chunk": k + 1, **self.hists[0].state()},
                         match=self.identity, name="replay")
