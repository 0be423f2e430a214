"""Compare several policies on one cluster and task: the question users ask first.

    cmp = staleness.compare.compare("digits-mlp", ["bsp", "asp", "ssp:3"], cluster, max_time=600, seeds=[0, 1, 2])
    cmp.table()          # one row per policy: time to target, final metric, staleness, waiting
    cmp.results          # every Result (policy x seed)
    cmp.save("runs/compare")   # table.csv, history.csv, comparison.png, timelines, one Result dir per run

Every policy gets the same simulated-time budget (or the same number of
updates), the same task, learning rate and seeds, so rows differ only by the
policy.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from staleness import policies as _policies
from staleness.results import DivergenceError, Result

__all__ = ["Comparison", "compare", "DEFAULT_POLICIES"]

DEFAULT_POLICIES = ("bsp", "asp", "ssp:3", "ssp:15", "dssp:3:12", "softsync:4")


@dataclasses.dataclass
class Comparison:
    """Results of `compare`: one Result per (policy, seed), in policy order."""

    results: list[Result]
    metric: str
    target: float | None

    def table(self):
        """pandas DataFrame, one row per policy (medians over seeds; spread as min-max)."""
        import pandas as pd

        rows = []
        by_policy: dict[str, list[Result]] = {}
        for r in self.results:
            by_policy.setdefault(r.config["policy"], []).append(r)
        for pol, runs in by_policy.items():
            row = {"policy": pol, "seeds": len(runs)}
            if self.target is not None and self.metric in runs[0].history:
                times = np.array([r.time_to(self.target, self.metric) for r in runs])
                reached = np.isfinite(times)
                row[f"time_to_{self.metric}_{self.target:g}_s"] = float(np.median(times[reached])) if reached.any() else math.nan
                row["reached"] = f"{int(reached.sum())}/{len(runs)}"
                row["time_min_s"] = float(times[reached].min()) if reached.any() else math.nan
                row["time_max_s"] = float(times[reached].max()) if reached.any() else math.nan
            finals = [r.final.get(self.metric, math.nan) for r in runs]
            row[f"final_{self.metric}"] = float(np.median(finals))
            row["final_min"], row["final_max"] = float(np.min(finals)), float(np.max(finals))
            sums = [r.schedule.summary() for r in runs]
            row["updates"] = int(np.median([s["updates"] for s in sums]))
            row["staleness_mean"] = float(np.mean([s["staleness_mean"] for s in sums]))
            row["staleness_max"] = int(max(s["staleness_max"] for s in sums))
            row["wait_fraction"] = float(np.mean([s["wait_fraction_mean"] for s in sums]))
            row["diverged"] = sum(r.status == "diverged" for r in runs)
            rows.append(row)
        return pd.DataFrame(rows)

    def history(self):
        """All evaluation histories in one frame, with policy and seed columns."""
        import pandas as pd

        frames = []
        for r in self.results:
            h = r.history.copy()
            h.insert(0, "seed", r.config["seed"])
            h.insert(0, "policy", r.config["policy"])
            frames.append(h)
        return pd.concat(frames, ignore_index=True)

    def figure(self):
        from staleness import plots

        return plots.comparison_figure(self.results, metric=self.metric, target=self.target)

    def save(self, out) -> Path:
        """Write table.csv, history.csv, comparison.png, timeline_<policy>.png and
        results/<policy>_s<seed>/ (Result directories) under `out`."""
        from staleness import plots

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.table().to_csv(out / "table.csv", index=False)
        self.history().to_csv(out / "history.csv", index=False)
        plots.save(self.figure(), out / "comparison.png")
        seen = set()
        for r in self.results:
            name = r.config["policy"].replace(":", "-")
            r.save(out / "results" / f"{name}_s{r.config['seed']}")
            if name not in seen:
                seen.add(name)
                plots.save(plots.worker_timeline(r.schedule, max_time=_timeline_window(r)), out / f"timeline_{name}.png")
        return out


def _timeline_window(result: Result) -> float:
    """A window showing ~30 iterations of the slowest worker."""
    f = result.schedule.columns
    if not len(f["worker"]):
        return 1.0
    per_worker = np.bincount(f["worker"], minlength=result.schedule.num_workers)
    horizon = float(np.nanmax(f["end"]))
    return max(1e-9, horizon * min(1.0, 30.0 / max(1, per_worker.min())))


def compare(task, policies=DEFAULT_POLICIES, cluster=None, *, seeds=(0,), max_time: float | None = None,
            num_updates: int | None = None, lr: float = 0.05, lr_rule="constant", optimizer="sgd",
            batch_size: int | None = None, metric: str = "accuracy", target: float | None = None,
            num_evals: int = 40, progress: bool = False, data_dir=None, partition: str | None = None) -> Comparison:
    """Run every policy × seed on `cluster` (default: `cluster.default()`) and collect Results.

    A run that diverges is kept with status 'diverged' (its history stops there).
    """
    from tqdm.auto import tqdm

    from staleness import cluster as _cluster
    from staleness.engine.run import resolve_task, simulate

    pols = [_policies.parse(p) if isinstance(p, str) else p for p in policies]
    if not pols:
        raise ValueError("compare: policies is empty; give at least one policy")
    cluster = _cluster.default() if cluster is None else (_cluster.parse(cluster) if isinstance(cluster, str) else cluster)
    for p in pols:
        p.init(cluster.num_workers)  # fail fast on e.g. softsync:n with n > workers
    if max_time is None and num_updates is None:
        raise ValueError("compare: give max_time (simulated seconds, the same for every policy) or num_updates")
    task = resolve_task(task, cluster.num_workers, batch_size, data_dir, partition)
    results = []
    runs = [(p, s) for p in pols for s in seeds]
    bar = tqdm(runs, desc="compare", unit="run", disable=not progress)
    for pol, seed in bar:
        bar.set_postfix_str(f"{pol.describe()} seed {seed}")
        try:
            r = simulate(task, pol, cluster, num_updates=num_updates, max_time=max_time, seed=seed, lr=lr,
                         lr_rule=lr_rule, optimizer=optimizer, num_evals=num_evals)
        except DivergenceError as e:
            r = e.result
        results.append(r)
        if r.status == "stopped":  # Ctrl-C inside a run: keep what is done, run nothing more
            break
    bar.close()
    return Comparison(results, metric, target)
