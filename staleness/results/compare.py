"""Compare several policies on one cluster and task: the question users ask first.

    cmp = staleness.results.compare.compare("digits-mlp", ["bsp", "asp", "ssp:3"], cluster, max_time=600, seeds=[0, 1, 2])
    cmp.table()          # one row per policy: time to target, final metric, staleness, waiting
    cmp.rollout_table()  # RL tasks: one row per policy: staleness per token, dropped rollouts, lengths
    cmp.results          # every Result (policy x seed) that ran
    cmp.save("runs/compare")   # table.csv, history.csv, comparison.png, timelines, one Result dir per run

Every policy gets the same simulated-time budget (or the same number of updates), the
same task, learning rate and seeds, so rows differ only by the policy. On an RL task the
policies are the rl_* ones (`DEFAULT_RL_POLICIES`), the metric is the task's reward, and
`rollout_table` gives what the learner consumed. With `out=`, every finished run is written
to `results/<policy>_s<seed>/` as soon as it ends (with `compare.json` naming the whole
plan), in a hidden sibling of `out` that replaces `out` as a whole when the comparison ends
or is interrupted (a failed one keeps the old `out`); `resume=True` runs only what is
missing. Ctrl-C stops the run in progress (status 'stopped'); the table marks the policies
with stopped or missing runs and leaves stopped runs out of its medians.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from staleness.infra import checks
from staleness.infra import files
from staleness.infra import interrupts
from staleness.infra import settings as _infra_settings
from staleness import policies as _policies
from staleness.results import stats
from staleness.engine.result import DivergenceError, Result
from staleness.infra.tracking import CallbackError

__all__ = ["Comparison", "compare", "DEFAULT_POLICIES", "DEFAULT_RL_POLICIES", "MANIFEST", "ResumeError",
           "rollout_table"]

DEFAULT_POLICIES = ("bsp", "asp", "ssp:3", "ssp:15", "dssp:3:12", "softsync:4")
DEFAULT_RL_POLICIES = ("rl_sync", "rl_one_step_off", "rl_async:2", "rl_async")   # on an RL task
GRID_FACTORS = (0.1, 0.3, 1.0, 3.0, 10.0)   # the default lr grid, times the optimizer's learning rate
TUNE_SEEDS = (1001, 1002)                   # seeds of the tuning runs (not the comparison's)
RL_TUNE_SEEDS = (1001, 1002, 1003)          # an RL task's: sampling makes its runs noisier
RL_TUNE_UPDATES = 100
"""An RL task's tuning runs take at least this many learner updates (a comparison of fewer
updates is tuned on this many): the reward dips in the first updates, and a run that ends
in the dip scores the rate that barely moves the policy best."""
RL_TUNE_FROM = 0.5
"""An RL tuning run is scored by its mean held-out reward over the evaluations of the second
half of the run (past the early dip), not over all of them."""
EXTEND = 2   # times the default grid is extended by one step when its best value is at an edge
MANIFEST = "compare.json"
_MANIFEST_VERSION = 1
_COUNTED = ("complete", "diverged", "failed")   # statuses whose runs enter the medians


# the table's schedule columns: (over the runs, type, value without runs)
_SCHEDULE_COLUMNS = {"updates": (np.median, int, 0), "staleness_mean": (np.mean, float, math.nan),
                     "staleness_max": (max, int, 0), "wait_fraction_mean": (np.mean, float, math.nan),
                     "comm_fraction_mean": (np.mean, float, math.nan), "goodput": (np.median, float, math.nan),
                     "bytes_sent": (np.median, float, math.nan),
                     "sim_time_s": (np.median, float, math.nan), "updates_per_s": (np.median, float, math.nan)}


class ResumeError(ValueError):
    """`resume=True` on a directory that holds a different (or no) comparison."""


def run_name(policy: str, seed: int) -> str:
    """Directory name of one run under `results/`."""
    return f"{policy.replace(':', '-')}_s{seed}"


@dataclasses.dataclass
class Comparison:
    """Results of `compare`, in plan order (policy major, seed minor).

    results: every Result that ran (complete, diverged, or stopped by Ctrl-C).
    metric / target: the metric of the table and its target (None: no time-to-target).
    planned: [(policy spec, seed)] the comparison set out to run.
    interrupted: True when Ctrl-C stopped it before every planned run finished.
    """

    results: list[Result]
    metric: str
    target: float | None
    planned: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    interrupted: bool = False
    tuning: dict = dataclasses.field(default_factory=dict)   # policy -> tune_lr's record (or "skipped")
    task: object = dataclasses.field(default=None, repr=False)   # the task (rollout_table of an RL task)

    def budget(self) -> str:
        """What the learning rates cost to choose: grid size × tuning seeds per policy."""
        tuned = [t for t in self.tuning.values() if isinstance(t, dict) and "grid" in t]
        if not tuned:
            why = self.tuning.get("skipped") if isinstance(self.tuning.get("skipped"), str) else None
            return "learning rates not tuned" + (f" ({why})" if why else "")
        sizes = sorted({len(t["grid"]) for t in tuned})
        g = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        seeds = len(tuned[0].get("seeds", TUNE_SEEDS))
        return (f"learning rates tuned on a validation split: {g} values x {seeds} seeds per policy "
                f"({len(tuned)} {'policy' if len(tuned) == 1 else 'policies'})")

    def tuning_notes(self) -> list[str]:
        """One line per policy whose tuned learning rate the tuning seeds could not tell from
        the runner-up (a ranking decided by it is weaker than it looks)."""
        return [f"{pol}: lr {t['lr']:g} vs {t['runner_up']:g} is within the tuning seeds' noise"
                for pol, t in self.tuning.items() if isinstance(t, dict) and t.get("within_noise")]

    def _by_policy(self) -> dict[str, list[Result]]:
        order = list(dict.fromkeys([p for p, _ in self.planned] + [r.config["policy"] for r in self.results]))
        out: dict[str, list[Result]] = {p: [] for p in order}
        for r in self.results:
            out[r.config["policy"]].append(r)
        return out

    def table(self):
        """pandas DataFrame, one row per policy: medians over the runs that finished
        (complete or diverged), spread as min-max, an interval around each median
        (`staleness.results.stats.interval`; the `interval` column says which kind), and a
        status ('complete', or 'stopped' / 'incomplete' when runs were stopped or not run;
        stopped runs are counted in `stopped` and left out of the medians)."""
        import pandas as pd

        planned = {}
        for p, _ in self.planned:
            planned[p] = planned.get(p, 0) + 1
        rows = []
        for pol, every in self._by_policy().items():
            runs = [r for r in every if r.status in _COUNTED]
            stopped = sum(r.status == "stopped" for r in every)
            want = planned.get(pol, len(every))
            status = "complete" if len(runs) >= want else ("stopped" if stopped else "incomplete")
            if any(r.status == "failed" for r in runs):   # every worker was lost before the budget
                status = "failed"
            row = {"policy": pol, "seeds": len(runs), "status": status, "stopped": stopped}
            t = self.tuning.get(pol)
            if isinstance(t, dict) and "lr" in t:
                row["lr"] = t["lr"]
                row["lr_at_grid_edge"] = bool(t["edge"])
            elif runs:
                row["lr"] = runs[0].config.get("lr")
            m = runs[0].metric(self.metric) if runs and self.metric in runs[0].history else None
            if self.target is not None:
                times = np.array([r.time_to(self.target, self.metric) for r in runs]) if m is not None else np.zeros(0)
                reached = np.isfinite(times)
                row[f"time_to_{self.metric}_{self.target:g}_s"] = float(np.median(times[reached])) if reached.any() else math.nan
                row["reached"] = f"{int(reached.sum())}/{len(runs)}"
                row["time_min_s"] = float(times[reached].min()) if reached.any() else math.nan
                row["time_max_s"] = float(times[reached].max()) if reached.any() else math.nan
                row["time_ci_low_s"], row["time_ci_high_s"], _ = stats.interval(times)
            finals = [r.final.get(self.metric, math.nan) for r in runs]
            row[f"final_{self.metric}"] = float(np.median(finals)) if finals else math.nan
            row["final_min"] = float(np.min(finals)) if finals else math.nan
            row["final_max"] = float(np.max(finals)) if finals else math.nan
            row["final_ci_low"], row["final_ci_high"], row["interval"] = stats.interval(finals)
            sums = [r.schedule.summary() for r in runs]
            for key, (over, kind, empty) in _SCHEDULE_COLUMNS.items():
                row[key] = kind(over([s[key] for s in sums])) if sums else empty
            diags = [r.diagnostics for r in runs if r.diagnostics is not None]
            for name in DIAGNOSTICS_IN_TABLE if diags else ():   # an RL learner's, medians over the runs
                per_run = [float(d[name].max() if name == "is_weight_max" else d[name].mean()) for d in diags
                           if name in d]
                row[name] = float(np.median(per_run)) if per_run else math.nan
            row["diverged"] = sum(r.status == "diverged" for r in runs)
            rows.append(row)
        return pd.DataFrame(rows)

    def rollout_table(self):
        """RL tasks: pandas DataFrame, one row per policy, of the rollouts its finished runs
        generated and consumed (`rollout_table`); None for other tasks."""
        return rollout_table(self._counted(), self.task)

    def history(self):
        """All evaluation histories in one frame, with policy, seed and status columns."""
        import pandas as pd

        frames = []
        for r in self.results:
            h = r.history.copy()
            h.insert(0, "status", r.status)
            h.insert(0, "seed", r.config["seed"])
            h.insert(0, "policy", r.config["policy"])
            frames.append(h)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def figure(self):
        from staleness.results import plots

        return plots.comparison_figure(self._counted(), metric=self.metric, target=self.target)

    def _counted(self) -> list[Result]:
        return [r for r in self.results if r.status in _COUNTED]

    def save(self, out, *, results: bool = True) -> Path:
        """Write table.csv, history.csv, comparison.png, timeline_<policy>.png and
        (results=True) results/<policy>_s<seed>/ Result directories under `out`;
        every file atomically. Returns `out`."""
        from staleness.results import plots

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        files.write_with(out / "table.csv", lambda p: self.table().to_csv(p, index=False))
        files.write_with(out / "history.csv", lambda p: self.history().to_csv(p, index=False))
        rollouts = self.rollout_table()
        if rollouts is not None:
            files.write_with(out / "rollouts.csv", lambda p: rollouts.to_csv(p, index=False))
        counted = self._counted()
        if counted:
            plots.save(self.figure(), out / "comparison.png")
        seen = set()
        for r in self.results:
            name = r.config["policy"].replace(":", "-")
            if results:
                r.save(out / "results" / run_name(r.config["policy"], r.config["seed"]), overwrite=True)
            if name not in seen and r.status in _COUNTED:
                seen.add(name)
                plots.save(plots.worker_timeline(r.schedule, max_time=_timeline_window(r)), out / f"timeline_{name}.png")
        return out


def _is_rl(task) -> bool:
    from staleness.tasks import rl   # here: importing the comparison loads no JAX

    return rl.is_task(task)


DIAGNOSTICS_IN_TABLE = ("kl_behav", "clip_fraction", "masked_fraction", "is_weight_max", "kl_version")
"""An RL learner's diagnostics in the comparison table: each run's mean over its updates
(is_weight_max: its largest), the median over the runs."""


def rollout_table(results, task):
    """RL: pandas DataFrame with one row per policy (in the order of `results`) of what its
    runs generated and consumed (`staleness.results.rollouts.summary` of each run's schedule;
    counts and lengths are medians over the runs, staleness means their mean, its max the
    max): rollouts, consumed, dropped, lost, staleness_per_token (mean staleness of the
    consumed completion tokens, each at its own version), staleness_per_rollout, staleness_max
    (of a rollout's oldest tokens), versions_per_rollout (> 1 with in-flight updates), length_generated /
    length_consumed (mean completion length of generated / consumed rollouts). None when
    `task` is not an RL task."""
    import pandas as pd

    from staleness.results import rollouts

    if task is None or not _is_rl(task):
        return None
    by_policy: dict[str, list] = {}
    for r in results:
        by_policy.setdefault(r.config.get("policy", r.schedule.policy.describe()), []).append(r)
    rows = []
    for pol, runs in by_policy.items():
        sums = [rollouts.summary(r.schedule, task) for r in runs]

        def med(key, sub=None):
            values = [s[key] if sub is None else s[key][sub] for s in sums]
            values = [v for v in values if math.isfinite(v)]
            return float(np.median(values)) if values else math.nan

        def mean(key):
            values = [s[key] for s in sums if math.isfinite(s[key])]
            return float(np.mean(values)) if values else math.nan

        row = {"policy": pol, "seeds": len(runs)}
        for key in ("rollouts", "consumed", "dropped", "lost"):
            v = med(key)
            row[key] = int(v) if float(v).is_integer() else v
        row["staleness_per_token"] = mean("mean_staleness_per_token")
        row["staleness_per_rollout"] = mean("mean_staleness_per_rollout")
        row["staleness_max"] = max(s["max_staleness"] for s in sums)
        row["versions_per_rollout"] = mean("mean_segments")
        row["length_generated"] = med("length_generated", "mean")
        row["length_consumed"] = med("length_consumed", "mean")
        rows.append(row)
    return pd.DataFrame(rows)


def _holdout(task):
    """The task to tune learning rates on: its `holdout()` (an RL task's holds out a
    quarter of its training prompts). ValueError when the task has no validation split."""
    if hasattr(task, "holdout"):
        return task.holdout()
    raise ValueError(f"task {getattr(task, 'name', task)!r} has no validation split; give a learning rate instead "
                     "of tuning it")


def _timeline_window(result: Result) -> float:
    """A window showing ~30 iterations of the slowest worker."""
    f = result.schedule.columns
    if not len(f["worker"]):
        return 1.0
    per_worker = np.bincount(f["worker"], minlength=result.schedule.num_workers)
    horizon = float(np.nanmax(f["end"]))
    return max(1e-9, horizon * min(1.0, 30.0 / max(1, per_worker.min())))


def _optimizer_of(policy, optimizer, task):
    """The optimizer `policy` runs with: the comparison's, else the policy's own, else the task's."""
    if optimizer is not None:
        return optimizer
    return policy.optimizer if policy.optimizer is not None else task.optimizer


def _uses_default(policy, optimizer, task) -> bool:
    """Whether `policy`'s optimizer names no learning rate (so the comparison's default_lr
    is the one it uses)."""
    from staleness.tasks import optim

    opt = _optimizer_of(policy, optimizer, task)
    return opt is None or (isinstance(opt, str) and optim.get(opt).lr is None)


def _base_lr(policy, optimizer, task, default_lr):
    """The learning rate the grid is centred on, or None if it cannot be set (an optax
    object without a learning rate in its state)."""
    from staleness.tasks import optim

    opt = _optimizer_of(policy, optimizer, task)
    if opt is None or isinstance(opt, str):
        spec = optim.get(opt or "sgd")
        return spec.lr if spec.lr is not None else (default_lr if default_lr is not None else optim.DEFAULT_LR)
    import jax

    value = optim.get_lr(opt.init(task.init_params(jax.random.key(0))))
    return None if value is None else float(value)


def tuning_cost(task, policies, lr_grid=None, tune_seeds=None, num_updates=None) -> str:
    """What tuning the policies' learning rates will run, in one line (said before it starts)."""
    seeds = len(tune_seeds) if tune_seeds is not None else len(RL_TUNE_SEEDS if _is_rl(task) else TUNE_SEEDS)
    rates = f"{len(lr_grid)}" if lr_grid is not None else f"{len(GRID_FACTORS)} (up to {len(GRID_FACTORS) + EXTEND})"
    length = ""
    if num_updates is not None:
        n = max(num_updates, RL_TUNE_UPDATES) if _is_rl(task) else num_updates
        length = f" of {n} {'learner ' if _is_rl(task) else ''}updates"
    return (f"tuning the learning rates first: {len(policies)} {'policy' if len(policies) == 1 else 'policies'} x "
            f"{rates} rates x {seeds} seeds = about {len(policies) * len(GRID_FACTORS) * seeds} runs{length} on a "
            "validation split (--lr to skip it)")


def check_tunable(task, what: str) -> None:
    """Raise ValueError (naming `what`, the argument that asks for tuning) if `task`
    has no validation split to tune learning rates on (`Task.holdout`)."""
    try:
        _holdout(task)
    except ValueError as e:
        raise ValueError(f"{what} asks to tune the learning rates, but {e}") from None


def tune_lr(task, policy, cluster, *, grid, seeds, metric, lr_rule, score_from: float = 0.0, **run) -> dict:
    """Pick `policy`'s learning rate from `grid` on `task`'s validation split (one sweep; run:
    its other settings, as `st.sweep` takes them; num_evals default 8).

    The score of a run is the mean of the validation metric over its evaluation points (the
    area under its learning curve: fast progress and a good end both count; a final value
    alone is noise once every rate has plateaued); score_from: only the evaluations at or
    after this fraction of the run count (an RL reward dips first); a grid value's score is
    the median over the tuning seeds, and a value with a diverged seed is out. Returns
    {"lr": chosen, "grid": [...], "edge": chosen at an end of the grid, "scores": [per grid
    value, NaN: out], "runner_up": the second best value (or None), "within_noise": whether
    the tuning seeds cannot tell the two apart (the runner-up's best seed is at least as
    good as the chosen value's worst)}.
    """
    from staleness.engine.run import sweep

    val = _holdout(task)
    m = val.metric(metric)
    runs = sweep(val, [policy], cluster, seeds=seeds, lr_rules=[lr_rule], lrs=list(grid), **{"num_evals": 8, **run})
    if any(r.status == "stopped" for r in runs):   # Ctrl-C inside the sweep: an interrupt, not a divergence
        raise KeyboardInterrupt
    scores, per_seed = [], []
    def score(r):
        h = r.history
        if r.status != "complete" or len(h) < 2:
            return math.nan
        late = h[h["update"] >= score_from * float(h["update"].iloc[-1])].iloc[1 if score_from == 0 else 0:]
        return float(np.mean(late[metric].to_numpy()))

    for rate in grid:
        curves = [score(r) for r in runs if r.config["lr"] == rate]
        curves = [c for c in curves if math.isfinite(c)]
        per_seed.append(curves)
        scores.append(float(np.median(curves)) if len(curves) == len(seeds) else math.nan)
    order = sorted((i for i, sc in enumerate(scores) if math.isfinite(sc)), key=lambda i: scores[i],
                   reverse=m.higher_is_better)
    if not order:
        raise ValueError(f"compare: tuning {policy.describe()}: every learning rate of the grid "
                         f"[{', '.join(f'{g:g}' for g in grid)}] diverged on the validation split; give a smaller "
                         "lr_grid")
    best = order[0]
    out = {"lr": float(grid[best]), "grid": [float(g) for g in grid], "edge": best in (0, len(grid) - 1),
           "scores": scores, "runner_up": None, "within_noise": False}
    if len(order) > 1:   # the choice is noise when the runner-up's seeds reach the best one's worst seed
        second = order[1]
        worst_best = min(per_seed[best]) if m.higher_is_better else max(per_seed[best])
        best_second = max(per_seed[second]) if m.higher_is_better else min(per_seed[second])
        out["runner_up"] = float(grid[second])
        out["within_noise"] = bool(not m.better(worst_best, best_second))
    return out


def _resolve_metric(task, metric, target):
    name = task.default_metric if metric is None else metric
    m = task.metric(name)
    if target is not None:
        target = m.check_target(target)
    return name, target


def _described(value):
    """A setting as the manifest records it: its spec (`describe()`), its text, or None (JSON null)."""
    return None if value is None else str(getattr(value, "describe", lambda: value)())


def _load_done(out: Path, plan_config: dict) -> dict[tuple[str, int], Result]:
    """Finished runs (complete or diverged) of the comparison in `out`."""
    manifest = out / MANIFEST   # there (`_open_out`)
    try:
        meta = json.loads(manifest.read_text())
        saved = meta["config"]
    except (ValueError, KeyError, TypeError):
        raise ResumeError(f"resume: {manifest} is not a comparison manifest") from None
    saved = {k: None if v == "None" else v for k, v in saved.items()}   # manifests once wrote None as "None"
    diff = sorted(k for k in set(saved) | set(plan_config) if saved.get(k) != plan_config.get(k))
    if diff:
        k = diff[0]
        raise ResumeError(f"resume: {str(out)!r} was written with {k} = {saved.get(k)!r}, not "
                          f"{plan_config.get(k)!r}; resume with the same settings or use another --out")
    done = {}
    for pol, seed in (tuple(x) for x in meta.get("runs", [])):
        d = out / "results" / run_name(pol, seed)
        if (d / "result.json").is_file():
            r = Result.load(d)
            if r.status in _COUNTED:
                done[(pol, int(seed))] = r
    return done


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    """What `compare` runs, given whole (`settings=`) or field by field as its keyword
    arguments (see `compare` for each field's meaning)."""

    seeds: Any = (0,)
    max_time: Any = None
    num_updates: Any = None
    lr: Any = None
    lr_rule: Any = "constant"
    optimizer: Any = None
    inner_optimizer: Any = None
    batch_size: Any = None
    metric: Any = None
    target: Any = None
    num_evals: Any = 40
    data_dir: Any = None
    partition: Any = None
    tune: Any = True
    lr_grid: Any = None
    tune_seeds: Any = None
    default_lr: Any = None


def compare(task, policies=None, cluster=None, *, settings: CompareSettings | None = None, out=None,
            resume: bool = False, overwrite: bool = False, progress: bool = False, callbacks=None,
            **overrides) -> Comparison:
    """Run every policy × seed on `cluster` (default: `cluster.default()`) and collect Results.

    settings: a `CompareSettings` (default: its defaults), taken whole; its fields (below and
      as `simulate`'s) may also be given by keyword, overriding it.
    policies: specs or Policy objects (default: `DEFAULT_POLICIES`, `DEFAULT_RL_POLICIES`
      on an RL task). An RL policy on a supervised task, or the other way round, is a
      ValueError before anything runs.
    metric: the table's metric (default: the task's, accuracy where it has one);
      its direction and range come from the task. target: a value of it for
      time-to-target (checked against the metric's range), or None.
    out: a directory to write each finished run into as it ends, and the
      table and plots at the end (see the module docstring); checked before
      anything runs (`staleness.infra.files.check_out`; an existing comparison is
      replaced only with overwrite=True, or continued with resume=True).
    tune: with lr None (the default), pick each policy's learning rate from `lr_grid`
      (default: its optimizer's learning rate × GRID_FACTORS, extended at an edge: `_tune_one`)
      on a validation split of the training set, disjoint from the test set, over
      `tune_seeds` (`tune_lr`). The table reports the chosen value and whether it lies at
      the edge of the grid. A given `lr`, or tune=False, runs every policy at that (or the
      optimizer's own) learning rate.
    default_lr: the learning rate of an optimizer spec that names none (the CLI's).
    callbacks: a callable, a spec string ('tensorboard:DIR', 'wandb:PROJECT') or a list of
      them, called at every evaluation of every run that runs (policy major, seed minor;
      not the tuning sweeps, nor the runs a resumed comparison loads): see
      `staleness.infra.tracking`. A callback that raises stops the comparison like Ctrl-C
      (everything recorded is written, resumable) and then raises its `CallbackError`,
      whose `comparison` is the interrupted Comparison.
    A run that diverges is kept with status 'diverged' (its history stops there).
    Ctrl-C stops the comparison: the Comparison has interrupted=True, the run in
    progress has status 'stopped', and (with out=) everything is written.
    """
    from staleness import cluster as _cluster
    from staleness.infra import tracking
    from staleness.engine.run import resolve_task

    callbacks = tracking.as_callbacks(callbacks)
    s = _infra_settings.merge(CompareSettings, settings, overrides, "compare")
    pols = None if policies is None else [_policies.parse(p) for p in policies]
    if pols is not None and not pols:
        raise ValueError("compare: policies is empty; give at least one policy")
    seeds = [int(x) for x in s.seeds]
    if not seeds:
        raise ValueError("compare: seeds is empty; give at least one seed")
    checks.distinct("compare", "policies", [p.describe() for p in pols or ()])
    checks.distinct("compare", "seeds", seeds)
    cluster = _cluster.default() if cluster is None else (_cluster.parse(cluster) if isinstance(cluster, str) else cluster)
    for p in pols or ():
        p.init(cluster.num_workers)  # fail fast on e.g. softsync:n with n > workers
    if s.max_time is None and s.num_updates is None:
        raise ValueError("compare: give max_time (simulated seconds, the same for every policy) or num_updates")
    if resume and overwrite:
        raise ValueError("compare: resume and overwrite exclude each other")
    if out is not None:
        out = files.check_out(out, overwrite=overwrite or resume, what="out")
    task = resolve_task(task, cluster.num_workers, s.batch_size, s.data_dir, s.partition)
    if pols is None:
        pols = [_policies.parse(p) for p in (DEFAULT_RL_POLICIES if _is_rl(task) else DEFAULT_POLICIES)]
        for p in pols:
            p.init(cluster.num_workers)
    _check_kinds(task, pols)
    metric, target = _resolve_metric(task, s.metric, s.target)
    if s.lr_grid is not None and s.lr is None and s.tune:
        check_tunable(task, "lr_grid")
    planned = [(p.describe(), x) for p in pols for x in seeds]
    plan_config = {"task": task.name, "policies": [p.describe() for p in pols], "seeds": seeds,
                   "cluster": cluster.describe(), "max_time": s.max_time, "num_updates": s.num_updates, "lr": s.lr,
                   "lr_rule": _described(s.lr_rule), "optimizer": _described(s.optimizer),
                   "inner_optimizer": _described(s.inner_optimizer),
                   "batch_size": task.batch_size, "partition": task.partition, "num_evals": s.num_evals,
                   **_task_settings(task),
                   "tune": bool(s.lr is None and s.tune), "lr_grid": None if s.lr_grid is None else list(s.lr_grid),
                   # the rate an untuned policy starts from (None: its optimizer names its own)
                   "default_lr": s.default_lr if any(_uses_default(p, s.optimizer, task) for p in pols) else None,
                   "base_lr": {p.describe(): _base_lr(p, s.optimizer, task, s.default_lr) for p in pols}}
    runs = _Runs(task, cluster, metric, s.max_time, s.num_updates, s.lr, s.lr_rule, s.optimizer, s.inner_optimizer,
                 s.num_evals, s.default_lr)
    tune_seeds = s.tune_seeds if s.tune_seeds is not None else (RL_TUNE_SEEDS if _is_rl(task) else TUNE_SEEDS)
    # a new comparison is built in a hidden sibling and swapped in when it ends (also when
    # interrupted): a failure keeps the old one and leaves nothing that blocks the next
    stage = out if out is None or resume else files.stage_dir(out, overwrite=True)
    try:
        done = _open_out(stage, resume, plan_config, planned)
        tuning, stopped = _tuning(runs, pols, stage, resume, s.tune, s.lr_grid, tune_seeds, progress)
        if stopped:   # Ctrl-C while tuning: the runs done before are kept, nothing more runs
            results, interrupted, failed = list(done.values()), True, None
        else:
            results, interrupted, failed = _run_all(runs, pols, seeds, tuning, done, stage, progress, callbacks)
        cmp = Comparison(results, metric, target, planned, interrupted, tuning, task)
        if stage is not None:
            cmp.save(stage, results=False)
    except BaseException:
        if stage is not out:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    if stage is not out:
        files.swap_in(stage, out)
    if failed is not None:   # written like an interrupted comparison (resumable); then the error
        failed.comparison = cmp
        raise failed
    return cmp


def _check_kinds(task, pols) -> None:
    """ValueError when an RL policy meets a supervised task or the other way round, or a
    method does not fit the model (before anything is written or run)."""
    from staleness.engine import payload
    from staleness.engine.run import work_sizes

    for p in pols:
        work_sizes(task, p, 0)   # the engine's check (a closure for RL; nothing is computed)
        payload.payload_bytes(task, p)   # the method against the model (e.g. streaming_diloco's fragments)


def _task_settings(task) -> dict:
    """What of an RL task, beyond its name, a resumed comparison must share: its
    objective, group size and options ({} for other tasks, as before)."""
    out = {}
    if not _is_rl(task):
        return out
    if task.options:
        out["task_options"] = [[k, v if isinstance(v, (bool, int, float, str)) else str(v)] for k, v in task.options]
    objective = getattr(task, "objective", None)
    if objective is not None:
        out["objective"] = objective.describe()
        out["group_size"] = task.group_size
    return out


@dataclasses.dataclass(frozen=True)
class _Runs:
    """What every run of one comparison shares (checked by `compare`)."""

    task: object
    cluster: object
    metric: str
    max_time: float | None
    num_updates: int | None
    lr: float | None
    lr_rule: object
    optimizer: object
    inner_optimizer: object
    num_evals: int
    default_lr: float | None

    def inner(self, policy):
        return self.inner_optimizer if policy.local else None


def _open_out(out, resume: bool, plan_config: dict, planned: list) -> dict:
    """The runs already done (resume=True), after writing the manifest; {} without `out`
    (a new comparison's `out` is a fresh staging directory: nothing to replace)."""
    done: dict[tuple[str, int], Result] = {}
    if out is None:
        return done
    if resume and (out / MANIFEST).is_file():
        done = _load_done(out, plan_config)
    elif resume:
        raise ResumeError(f"resume: {str(out)!r} holds no comparison ({MANIFEST} not found); "
                          "run without --resume first")
    files.write_text(out / MANIFEST, json.dumps({"format_version": _MANIFEST_VERSION, "config": plan_config,
                                                 "runs": [list(x) for x in planned]}, indent=1))
    return done


def _tuning(runs: _Runs, pols, out, resume: bool, tune: bool, lr_grid, tune_seeds,
            progress: bool) -> tuple[dict, bool]:
    """(each policy's tuned learning rate (`tune_lr`), stopped): {} when the rate is given or
    tuning is off. Each policy's choice is written into the manifest as soon as it is made,
    so a resume tunes only the policies left; Ctrl-C stops the tuning (stopped True) and
    keeps the choices made."""
    if runs.lr is not None or not tune:
        return {}, False
    tuning = {}
    if resume and out is not None and (out / MANIFEST).is_file():
        tuning = json.loads((out / MANIFEST).read_text()).get("tuning") or {}
        if "skipped" in tuning or all(p.describe() in tuning for p in pols):
            return tuning, False
    from tqdm.auto import tqdm

    def keep():
        if out is not None:   # resumable: the manifest keeps the chosen learning rates
            meta = json.loads((out / MANIFEST).read_text())
            files.write_text(out / MANIFEST, json.dumps({**meta, "tuning": tuning}, indent=1))

    try:
        _holdout(runs.task)
    except ValueError as e:
        tuning = {"skipped": str(e)}
        keep()
        return tuning, False
    try:
        for pol in tqdm([p for p in pols if p.describe() not in tuning], desc="tune lr", unit="policy",
                        disable=not progress):
            tuning[pol.describe()] = _tune_one(runs, pol, lr_grid, tune_seeds)
            keep()
    except KeyboardInterrupt:
        return tuning, True
    return tuning, False


def _tune_one(runs: _Runs, pol, lr_grid, tune_seeds) -> dict:
    """`tune_lr` of one policy over `lr_grid` (default: its base rate × GRID_FACTORS,
    extended by a step up to EXTEND times while the best value is at an edge)."""
    base = _base_lr(pol, runs.optimizer, runs.task, runs.default_lr)
    if base is None:
        return {"skipped": "the optimizer has no learning_rate in its state"}
    grid = list(lr_grid) if lr_grid is not None else [base * f for f in GRID_FACTORS]
    kw = dict(seeds=list(tune_seeds), metric=runs.metric, max_time=runs.max_time, num_updates=runs.num_updates,
              lr_rule=runs.lr_rule, optimizer=runs.optimizer, inner_optimizer=runs.inner(pol))
    if _is_rl(runs.task):   # past the early dip of the reward: long enough, scored on the second half
        kw["score_from"] = RL_TUNE_FROM
        if runs.num_updates is not None and runs.max_time is None:
            kw["num_updates"] = max(runs.num_updates, RL_TUNE_UPDATES)
    t = tune_lr(runs.task, pol, runs.cluster, grid=grid, **kw)
    for _ in range(EXTEND if lr_grid is None else 0):   # the best at an edge: look one step beyond
        if not t["edge"]:
            break
        step = grid[1] / grid[0]
        grid = [grid[0] / step] + grid if t["lr"] == grid[0] else grid + [grid[-1] * step]
        t = tune_lr(runs.task, pol, runs.cluster, grid=grid, **kw)
    return {**t, "seeds": list(tune_seeds), "updates": kw["num_updates"]}


def _fixed_rate(runs: _Runs, pol):
    """The learning rate of an untuned run: the given one; else None (the optimizer's
    own) for a local-update method's outer optimizer and for an optimizer that names
    its rate (a task's 'adam:lr=1e-3', an optax object); else `default_lr`."""
    if runs.lr is not None:
        return runs.lr
    if pol.local and runs.optimizer is None:
        return None
    return runs.default_lr if _uses_default(pol, runs.optimizer, runs.task) else None


def _run_all(runs: _Runs, pols, seeds, tuning: dict, done: dict, out, progress: bool,
             callbacks: tuple = ()) -> tuple[list, bool, Exception | None]:
    """(Results in plan order, interrupted, the CallbackError that stopped it or None):
    every policy × seed not `done`, each saved into `out` as it ends; Ctrl-C anywhere
    (scheduling, saving) or a failing callback stops the loop and keeps what finished."""
    from tqdm.auto import tqdm

    from staleness.engine.run import simulate

    results: list[Result] = []
    interrupted, failed = False, None
    bar = tqdm([(p, s) for p in pols for s in seeds], desc="compare", unit="run", disable=not progress)
    try:
        for pol, seed in bar:
            interrupts.check()   # a Ctrl-C that a callback swallowed stops here
            key = (pol.describe(), seed)
            if key in done:
                results.append(done[key])
                continue
            bar.set_postfix_str(f"{pol.describe()} seed {seed}")
            chosen = tuning.get(pol.describe(), {}).get("lr")
            rate = chosen if chosen is not None else _fixed_rate(runs, pol)
            try:
                r = simulate(runs.task, pol, runs.cluster, num_updates=runs.num_updates, max_time=runs.max_time,
                             seed=seed, lr=rate, lr_rule=runs.lr_rule, optimizer=runs.optimizer,
                             inner_optimizer=runs.inner(pol), num_evals=runs.num_evals, callbacks=callbacks)
            except DivergenceError as e:
                r = e.result
            except CallbackError as e:   # a user's callback failed: keep what was recorded, as after Ctrl-C
                r, failed = e.result, e
            results.append(r)
            if out is not None:
                r.save(out / "results" / run_name(*key), overwrite=True)
            if r.status == "stopped":  # Ctrl-C inside the replay: keep what is done, run nothing more
                interrupted = True
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
    return results, interrupted, failed


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
