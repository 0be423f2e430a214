"""Plots of runs (`Result`) and schedules (`Schedule`); matplotlib is imported only here.

Every function returns the matplotlib `Figure` that holds the plot: given `ax` (a
matplotlib Axes), it draws on it and returns its (root) figure; without `ax` it makes a new
figure with pyplot (so it carries the session's canvas: a notebook shows a figure that is a
cell's value), then closes it in pyplot (sweeps making many figures do not pile them up).
To show one in a window, draw on your own Axes (`fig, ax = plt.subplots(); plots.x(...,
ax=ax)`); to write a file, `save(fig, path)`. `label_fn` (Result or Schedule -> str) labels
the runs: several runs with one label (by default, seeds of one configuration) are drawn as
one median line with a min-max band. The default label is the policy, followed by the
configuration values that differ between the runs (`lr_rule`, `lr`, `cluster`, ...; never
the seed).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from staleness.engine.result import Result
from staleness.schedule import Schedule

__all__ = [
    "metric_vs_time", "metric_vs_updates", "staleness_histogram", "worker_timeline",
    "wait_fraction", "comparison_figure", "plan_figure", "save", "DPI",
]

MAX_BARS = 64   # per-worker bar charts group consecutive workers above this many

DPI = 120  # of PNGs written by `save`

# Configuration keys that distinguish runs in a default label, in that order
# (the seed is left out on purpose: seeds of one configuration share a label).
_LABEL_KEYS = ("task", "cluster", "workers", "optimizer", "lr_rule", "lr", "batch_size")
_AXIS_LABELS = {"accuracy": "held-out accuracy", "loss": "held-out loss", "train_loss": "training loss"}
# worker_timeline colours
_COMPUTE, _WAIT, _NETWORK, _LOST, _DROPPED = "tab:blue", "tab:orange", "0.75", "tab:red", "0.2"
_LEARNER = "tab:green"


# -- public plots --------------------------------------------------------------------
def metric_vs_time(results, metric: str = "accuracy", ax=None, label_fn: Callable | None = None):
    """`metric` (a column of the runs' `history`: 'accuracy', 'loss', 'train_loss', ...) of
    each run of `results` (a `Result` or a list of them) over simulated time (seconds)."""
    return _metric_plot(results, metric, "time", "simulated time (s)", ax, label_fn, "metric_vs_time")


def metric_vs_updates(results, metric: str = "loss", ax=None, label_fn: Callable | None = None):
    """`metric` of each run over server updates (versions). Arguments as in `metric_vs_time`."""
    return _metric_plot(results, metric, "update", "server updates", ax, label_fn, "metric_vs_updates")


def staleness_histogram(schedules_or_results, ax=None, max_tau: int | None = None,
                        label_fn: Callable | None = None):
    """Distribution of the staleness τ (updates) of applied gradients, one step
    histogram per label (policy, one legend entry each), as the fraction of applied
    gradients, with integer bins; runs with equal labels are pooled. A dashed line marks
    (and a note gives) each label's mean τ.

    schedules_or_results: a `Schedule` or `Result`, or a list of them. max_tau: last bin
    shown; it then holds every τ >= max_tau, so the bars still sum to 1 (default: the
    largest τ seen).
    """
    fn = "staleness_histogram"
    if max_tau is not None and (isinstance(max_tau, bool) or not isinstance(max_tau, (int, np.integer))
                                or max_tau < 0):
        raise ValueError(f"{fn}: max_tau = {max_tau!r} must be an integer >= 0 (or None for all)")
    items = _items(schedules_or_results, fn, allow_schedules=True)
    labels = _labels(items, label_fn)
    fig, ax = _axes(ax, (6.4, 4.0))
    colors = _colors(labels)
    groups = _group(labels, [_schedule(x) for x in items])
    top = 0
    hists = {}
    for label, scheds in groups.items():
        tau = np.concatenate([s.staleness[s.applied] for s in scheds])
        if len(tau) == 0:
            raise ValueError(f"{fn}: runs labelled {label!r} have no applied gradients to histogram")
        hists[label] = tau
        top = max(top, int(tau.max()))
    if max_tau is not None:
        top = int(max_tau)
    edges = np.arange(top + 2) - 0.5
    for k, (label, tau) in enumerate(hists.items()):
        freq = np.bincount(np.minimum(tau, top), minlength=top + 1) / len(tau)
        mean = float(tau.mean())
        # a small sideways dodge keeps identical histograms (bsp vs backup) both visible
        dodge = 0.06 * (k - (len(hists) - 1) / 2)
        ax.stairs(freq, edges + dodge, color=colors[label], linewidth=1.6, label=label)   # one entry per label
        ax.axvline(mean, color=colors[label], linestyle="--", linewidth=1.0, label="_mean")
        ax.annotate(f"mean {mean:.2f}", (mean, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -4 - 11 * k),
                    textcoords="offset points", va="top", fontsize="x-small", color=colors[label])
    clipped = max_tau is not None and any(t.max() > top for t in hists.values())
    rl = all(getattr(_schedule(x).policy, "learner", False) for x in items)   # RL's words: versions, rollouts
    ax.set_xlabel(("staleness (versions)" if rl else "staleness τ (updates)")
                  + (f"; last bin: τ ≥ {top}" if clipped else ""))
    ax.set_ylabel("fraction of consumed rollouts" if rl else "fraction of applied gradients")
    ax.set_xlim(edges[0] - 0.1, edges[-1] + 0.1)
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(_int_locator())
    ax.legend(fontsize="small")
    return fig


def worker_timeline(schedule, ax=None, max_time: float | None = None, max_workers: int = 32):
    """What each worker did over simulated time: one row per worker, with its
    compute intervals [start, end], gate waits [pull_time - wait, pull_time],
    network time (pull: [pull_time, start], push: [end, push_time]; thinner,
    light), gradients lost to a failure (their would-be compute, red, with x)
    and gradients dropped by the policy (o at their push). Asynchronous RL (a policy
    with a learner) gets a learner lane on top: each update's training, from its last
    rollout's arrival (or the previous update's end) to the update.

    schedule: a `Schedule` (or a `Result`, whose schedule is drawn); a new figure is sized
    to the rows. max_time: draw [0, max_time] seconds only (default: the whole run).
    max_workers: draw workers 0 .. max_workers-1 only (rows get unreadable past ~32).
    """
    fn = "worker_timeline"
    if isinstance(schedule, Result):
        schedule = schedule.schedule
    if not isinstance(schedule, Schedule):
        raise TypeError(f"{fn}: schedule = {type(schedule).__name__} must be a Schedule or a Result")
    if max_time is not None and not (isinstance(max_time, (int, float, np.number))
                                     and math.isfinite(max_time) and max_time > 0):
        raise ValueError(f"{fn}: max_time = {max_time!r} must be a finite number of seconds > 0")
    if isinstance(max_workers, bool) or not isinstance(max_workers, (int, np.integer)) or max_workers < 1:
        raise ValueError(f"{fn}: max_workers = {max_workers!r} must be an integer >= 1")
    rows = min(schedule.num_workers, int(max_workers))
    fig, ax = _axes(ax, (10.0, 1.0 + 0.35 * rows))
    c = schedule.columns
    begin = c["pull_time"] - c["wait"]
    keep = c["worker"] < rows
    if max_time is not None:
        keep &= begin < max_time
    seen = set()
    # thin white edges separate back-to-back iterations, while they are wide enough to see
    per_row = np.bincount(c["worker"][keep], minlength=1).max(initial=0)
    edge = {"edgecolor": "white", "linewidth": 0.5} if per_row <= 150 else {"linewidth": 0}

    def bars(w, lo, hi, y, height, color, label, **kw):
        ok = np.isfinite(lo) & np.isfinite(hi) & (hi > lo)
        if ok.any():
            xr = np.stack([lo[ok], (hi - lo)[ok]], axis=1)
            ax.broken_barh(xr, (y - height / 2, height), facecolors=color,
                           label=label if label not in seen else "_" + label, **kw)
            seen.add(label)

    learner = bool(getattr(schedule.policy, "learner", False)) and schedule.num_updates > 0
    work = "rollout (decode)" if learner else "compute"
    for w in range(rows):
        i = np.flatnonzero(keep & (c["worker"] == w))
        lost = c["lost"][i]
        bars(w, c["pull_time"][i], c["start"][i], w, 0.3, _NETWORK, "network (pull, push)")
        bars(w, c["end"][i], c["push_time"][i], w, 0.3, _NETWORK, "network (pull, push)")
        bars(w, begin[i], c["pull_time"][i], w, 0.8, _WAIT, "waiting at the gate")
        bars(w, c["start"][i][~lost], c["end"][i][~lost], w, 0.8, _COMPUTE, work, **edge)
        bars(w, c["start"][i][lost], c["end"][i][lost], w, 0.8, _LOST, "lost (worker failed)", alpha=0.35)
    if learner:   # asynchronous RL: the learner's lane on top, one bar per update it trained
        lo, hi = _learner_intervals(schedule)
        if max_time is not None:
            lo, hi = lo[lo < max_time], hi[lo < max_time]
        bars(-1, lo, hi, -1, 0.8, _LEARNER, "learner training", **edge)
    sel = keep & c["lost"]
    if sel.any():
        ax.plot(c["end"][sel], c["worker"][sel], "x", color=_LOST, markersize=7, label="_lost")
    sel = keep & c["dropped"]
    if sel.any():
        ax.plot(c["push_time"][sel], c["worker"][sel], "o", color=_DROPPED, markersize=4,
                markerfacecolor="none", linestyle="none", label="dropped by the policy")
    end = max_time if max_time is not None else (
        schedule.end_time if math.isfinite(schedule.end_time) else float(np.nanmax(c["end"], initial=1.0)))
    ax.set_xlim(0, end)
    top = -1.5 if learner else -0.5
    ax.set_ylim(rows - 0.5, top)  # worker 0 (or the learner) on top
    ax.set_yticks(range(-1 if learner else 0, rows))
    if learner:
        ax.set_yticklabels(["learner", *map(str, range(rows))])
    ax.set_ylabel("actor" if learner else "worker")
    ax.set_xlabel("simulated time (s)")
    more = f" (workers 0–{rows - 1} of {schedule.num_workers})" if rows < schedule.num_workers else ""
    ax.set_title(f"{schedule.policy}{more}", fontsize="medium", loc="left")
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=5, fontsize="small", frameon=False,
              borderaxespad=0.1, handlelength=1.5, columnspacing=1.2)
    return fig


def _learner_intervals(schedule) -> tuple[np.ndarray, np.ndarray]:
    """([U] start, [U] end) of the learner's training of each update: it ends at the update's
    time and starts when both its last rollout arrived and the previous update was trained
    (the simulator trains the decided updates one at a time, in order)."""
    c, a = schedule.columns, schedule.applied
    decided = np.full(schedule.num_updates, -np.inf)
    np.maximum.at(decided, c["apply_version"][a], c["push_time"][a])
    previous = np.concatenate([[0.0], schedule.update_time[:-1]])
    return np.maximum(decided, previous), np.asarray(schedule.update_time, float)


def wait_fraction(schedules_or_results, ax=None, label_fn: Callable | None = None):
    """Fraction of each worker's time spent blocked at the gate (`Schedule.wait_fraction`),
    as bars grouped by worker, one bar per label (policy); several runs with
    one label are averaged, with a min-max error bar. Above `MAX_BARS` workers a bar
    is the mean of a group of consecutive workers (100,000 bars took minutes to draw).
    schedules_or_results: a `Schedule` or `Result`, or a list of them."""
    from matplotlib.ticker import PercentFormatter

    items = _items(schedules_or_results, "wait_fraction", allow_schedules=True)
    labels = _labels(items, label_fn)
    fig, ax = _axes(ax, (6.4, 4.0))
    colors = _colors(labels)
    groups = _group(labels, [_schedule(x) for x in items])
    width = 0.8 / len(groups)
    per_bar = 1
    for k, (label, scheds) in enumerate(groups.items()):
        num = max(s.num_workers for s in scheds)
        wf = np.full((len(scheds), num), np.nan)
        for r, s in enumerate(scheds):
            wf[r, : s.num_workers] = s.wait_fraction()
        if num > MAX_BARS:   # one bar per group of consecutive workers (their mean), not one per worker
            per_bar = -(-num // MAX_BARS)
            pad = np.full((len(scheds), per_bar * MAX_BARS - num), np.nan)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                wf = np.nanmean(np.concatenate([wf, pad], axis=1).reshape(len(scheds), MAX_BARS, per_bar), axis=2)
            num = wf.shape[1]
        mean = np.nanmean(wf, axis=0)
        yerr = None
        if len(scheds) > 1:
            yerr = np.stack([mean - np.nanmin(wf, axis=0), np.nanmax(wf, axis=0) - mean])
        x = np.arange(num) - 0.4 + width * (k + 0.5)
        ax.bar(x, mean, width, yerr=yerr, color=colors[label], label=label,
               error_kw={"elinewidth": 0.8, "capsize": 0})
    ax.set_xlabel("worker" if per_bar == 1 else f"workers, {per_bar} per bar (their mean)")
    ax.set_ylabel("time blocked at the gate (%)")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.xaxis.set_major_locator(_int_locator())
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    return fig


def comparison_figure(results, metric: str = "accuracy", target: float | None = None,
                      label_fn: Callable | None = None):
    """The standard 2x2 comparison of runs: `metric` vs simulated time (with a
    dashed line at `target` if given), loss vs time ('loss', or 'train_loss'
    when `metric` is 'loss' or the task has no held-out loss), staleness
    histograms, and wait fractions per worker, in a new Figure titled with the task and
    cluster. results: a `Result` or a list of them (seeds of one config are banded);
    target: e.g. the accuracy a time-to-target counts to."""
    fn = "comparison_figure"
    items = _items(results, fn, allow_schedules=False)
    _check_metric(items, metric, fn)
    if target is not None and not (isinstance(target, (int, float, np.number)) and math.isfinite(target)):
        raise ValueError(f"{fn}: target = {target!r} must be a finite number (or None)")
    rl = all(r.diagnostics is not None for r in items)   # asynchronous RL: a surrogate loss means nothing
    if rl:
        second = "kl_behav" if all("kl_behav" in r.history for r in items) else metric
    else:
        second = "loss" if metric != "loss" and all("loss" in r.history for r in items) else "train_loss"
    _check_metric(items, second, fn)
    by_label = dict(zip(items, _labels(items, label_fn))).__getitem__   # the labels of all the runs, fixed
    fig, axes = _figure(2, 2, (12.0, 8.0))
    metric_vs_time(items, metric, ax=axes[0, 0], label_fn=by_label)
    if target is not None:
        axes[0, 0].axhline(target, color="0.3", linestyle=":", linewidth=1.2, label=f"target {target:g}")
        axes[0, 0].legend(fontsize="small")
    metric_vs_time(items, second, ax=axes[0, 1], label_fn=by_label)
    staleness_histogram(items, ax=axes[1, 0], label_fn=by_label)
    wait_fraction(items, ax=axes[1, 1], label_fn=by_label)
    axes[0, 0].set_title(_AXIS_LABELS.get(metric, metric), fontsize="medium")
    axes[0, 1].set_title(_AXIS_LABELS.get(second, second), fontsize="medium")
    if rl:   # RL's words: rollouts consumed by the learner, actors held back by the gate
        axes[0, 1].set_title("KL(behaviour ‖ learner) per update (k3), mean over each interval", fontsize="medium")
        axes[1, 0].set_title("staleness of the rollouts the learner consumed", fontsize="medium")
        axes[1, 1].set_title("actors waiting at the gate", fontsize="medium")
    else:
        axes[1, 0].set_title("staleness of applied gradients", fontsize="medium")
        axes[1, 1].set_title("waiting at the gate", fontsize="medium")
    fig.suptitle(_title(items))
    _one_legend(fig, axes)
    return fig


def plan_figure(table):
    """The staleness planner's table (`st.rl.plan`) as two panels over η, one line per mode:
    learner updates per simulated second, and the mean (solid) and max (dotted) staleness of
    the consumed tokens. Returns a new Figure."""
    fig, axes = _figure(1, 2, (11.0, 3.8))
    axes = np.ravel(axes)
    sweep = table[table["eta"].notna() | table["policy"].str.fullmatch(r"rl_(async|inflight|partial)(:.*)?")]
    top = max([int(e) for e in sweep["eta"].dropna()] + [0]) + 1
    for mode, rows in sweep.groupby("mode", sort=False):
        x = [top if e != e or e is None else int(e) for e in rows["eta"]]   # unbounded drawn last
        order = np.argsort(x)
        xs = np.asarray(x)[order]
        line, = axes[0].plot(xs, rows["updates_per_s"].to_numpy()[order], marker="o", label=mode)
        axes[1].plot(xs, rows["staleness_mean"].to_numpy()[order], marker="o", color=line.get_color(), label=mode)
        axes[1].plot(xs, rows["staleness_max"].to_numpy()[order], linestyle=":", color=line.get_color())
    ticks = sorted({int(e) for e in sweep["eta"].dropna()} | {top})
    for ax in axes:
        ax.set_xticks(ticks, [str(t) if t != top else "∞" for t in ticks])
        ax.set_xlabel("η (staleness bound, versions)")
    axes[0].set(ylabel="learner updates / simulated s", title="throughput")
    axes[1].set(ylabel="staleness of consumed tokens (versions)", title="staleness: mean (solid), max (dotted)")
    axes[0].legend(fontsize="small")
    return fig


def _one_legend(fig, axes) -> None:
    """One legend under the panels instead of one in each (the colours are the same in
    every panel): long labels then never cover the data or squeeze the axes."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if seen:
        widest = max(len(label) for label in seen)
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", fontsize="small",
                   ncols=max(1, min(len(seen), 120 // max(widest, 1), 4)))


def save(fig, path) -> Path:
    """Write `fig` as a PNG at `DPI` dots per inch to `path`, atomically (parent
    directories are created). Returns the path."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"save: path = {str(path)!r} must end in .png")
    from staleness.infra import files

    return files.write_with(path, lambda tmp: fig.savefig(tmp, dpi=DPI, format="png"))


# -- helpers ---------------------------------------------------------------------------
def _figure(nrows: int, ncols: int, figsize):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, layout="constrained", squeeze=False)
    plt.close(fig)  # the caller owns it; see the module docstring
    return fig, axes


def _axes(ax, figsize):
    """(figure to return, Axes to draw on)."""
    if ax is None:
        fig, axes = _figure(1, 1, figsize)
        return fig, axes[0, 0]
    from matplotlib.axes import Axes

    if not isinstance(ax, Axes):
        raise TypeError(f"ax = {type(ax).__name__} must be a matplotlib Axes (or None for a new figure)")
    fig = ax.get_figure(root=True) if _has_root_kw() else ax.figure.figure
    return fig, ax


def _has_root_kw() -> bool:
    import matplotlib

    return tuple(int(p) for p in matplotlib.__version__.split(".")[:2]) >= (3, 10)


def _int_locator():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True, min_n_ticks=1)   # a single bin (τ = 0 only) gets the tick 0, not ±0.45


def _items(x, fn: str, *, allow_schedules: bool) -> list:
    """The runs as a list, checked."""
    kinds = (Result, Schedule) if allow_schedules else (Result,)
    items = [x] if isinstance(x, kinds) else x
    try:
        items = list(items)
    except TypeError:
        items = [items]
    want = "Result or Schedule objects" if allow_schedules else "Result objects"
    if not items:
        raise ValueError(f"{fn}: got no runs to plot; pass one or more {want}")
    for i, item in enumerate(items):
        if not isinstance(item, kinds):
            raise TypeError(f"{fn}: item {i} is a {type(item).__name__}; expected {want}")
    return items


def _schedule(item) -> Schedule:
    return item.schedule if isinstance(item, Result) else item


def _check_metric(results: list, metric: str, fn: str) -> None:
    """Every run's history has column `metric`."""
    for r in results:
        if metric not in r.history:
            raise ValueError(
                f"{fn}: metric = {metric!r} is not in the history of run "
                f"{r.config.get('policy', r.schedule.policy.describe())!r}; available columns: {list(r.history.columns)}"
            )


def _config(item) -> dict:
    s = _schedule(item)
    base = {"policy": s.policy.describe(), "cluster": s.cluster, "workers": s.num_workers}
    return {**base, **item.config} if isinstance(item, Result) else base


def _labels(items: list, label_fn) -> list[str]:
    if label_fn is not None:
        return [str(label_fn(x)) for x in items]
    configs = [_config(x) for x in items]
    varying = [k for k in _LABEL_KEYS
               if len({repr(c.get(k)) for c in configs}) > 1 and all(k in c for c in configs)]
    out = []
    for c in configs:
        extra = ", ".join(f"{k}={_fmt(c[k])}" for k in varying)
        out.append(f"{c['policy']} ({extra})" if extra else str(c["policy"]))
    return out


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _colors(labels: list[str]) -> dict[str, object]:
    """One colour per distinct label, in order of first appearance (same in every panel)."""
    import matplotlib as mpl

    cycle = mpl.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    distinct = list(dict.fromkeys(labels))
    return {label: cycle[i % len(cycle)] for i, label in enumerate(distinct)}


def _group(labels: list[str], values: list) -> dict[str, list]:
    out: dict[str, list] = {}
    for label, v in zip(labels, values):
        out.setdefault(label, []).append(v)
    return out


def _metric_plot(results, metric, x_col, xlabel, ax, label_fn, fn):
    items = _items(results, fn, allow_schedules=False)
    if not isinstance(metric, str):
        raise TypeError(f"{fn}: metric = {metric!r} must be a history column name (str)")
    _check_metric(items, x_col, fn)
    _check_metric(items, metric, fn)
    labels = _labels(items, label_fn)
    fig, ax = _axes(ax, (6.4, 4.0))
    colors = _colors(labels)
    curves = []
    for r in items:
        x = r.history[x_col].to_numpy(np.float64)
        y = r.history[metric].to_numpy(np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        order = np.argsort(x[ok], kind="stable")
        curves.append((x[ok][order], y[ok][order]))
    for label, group in _group(labels, curves).items():
        group = [g for g in group if len(g[0])]
        if not group:  # nothing finite to draw; keep the label in the legend
            ax.plot([], [], color=colors[label], label=label)
            continue
        if len(group) == 1:
            ax.plot(*group[0], color=colors[label], label=label, linewidth=1.6)
            continue
        grid, mid, lo, hi = _band(group)
        ax.fill_between(grid, lo, hi, color=colors[label], alpha=0.2, linewidth=0)
        ax.plot(grid, mid, color=colors[label], linewidth=1.6,
                label=f"{label} (median, min–max of {len(group)})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(_AXIS_LABELS.get(metric, metric))
    ax.legend(fontsize="small")
    return fig


def _band(curves: list[tuple[np.ndarray, np.ndarray]]):
    """Median, min and max of several curves on the union of their x values,
    over the x range that every curve covers (no extrapolation); if they share
    no range, wherever at least one is defined."""
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    ys = np.stack([np.interp(grid, x, y, left=np.nan, right=np.nan) for x, y in curves])
    defined = np.isfinite(ys)
    keep = defined.all(axis=0)
    if keep.sum() < 2:
        keep = defined.any(axis=0)
    grid, ys = grid[keep], ys[:, keep]
    return grid, np.nanmedian(ys, axis=0), np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)


def _title(items: list) -> str:
    configs = [_config(x) for x in items]
    tasks = list(dict.fromkeys(str(c["task"]) for c in configs if c.get("task")))
    clusters = list(dict.fromkeys(str(c["cluster"]) for c in configs if c.get("cluster")))
    workers = sorted({int(c["workers"]) for c in configs})
    parts = []
    if tasks:
        parts.append(" / ".join(tasks))
    if clusters:
        parts.append("cluster " + " / ".join(clusters))
    parts.append(f"{'/'.join(map(str, workers))} worker{'s' if workers != [1] else ''}")
    return " — ".join(parts)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
