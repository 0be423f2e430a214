"""Plots: the right artists on the right axes, files written, bad input named.

Runs are made by hand from small simulated schedules (no training), so the
module stays well under a few seconds.
"""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle, StepPatch

from staleness import cluster as C
from staleness.results import plots
from staleness import policies as P
from staleness.engine.result import Result
from staleness.sim.scheduler import simulate_schedule

CLUSTER = C.heterogeneous([1, 2.6]).jitter(0.1)


def _schedule(policy=None, seed=0, cluster=CLUSTER, num_updates=50):
    return simulate_schedule(policy or P.ssp(2), cluster, num_updates=num_updates, seed=seed)


def _result(sched, *, accuracy=True, **config):
    u = np.arange(0, sched.num_updates + 1, 10)
    t = np.concatenate([[0.0], sched.update_time[u[1:] - 1]])
    loss = 2.0 * np.exp(-u / 20) + 0.1 * sched.seed
    cols = {"update": u, "time": t, "train_loss": np.r_[np.nan, loss[1:]], "loss": loss}
    if accuracy:
        cols["accuracy"] = 1 - loss / 2.5
    return Result(history=pd.DataFrame(cols), schedule=sched, params={},
                  config={"policy": sched.policy, "seed": sched.seed, **config},
                  train_loss=np.zeros(sched.num_updates))


@pytest.fixture(scope="module")
def runs():
    """ssp:2 with three seeds, bsp with one: two labels."""
    return [_result(_schedule(P.ssp(2), seed=s)) for s in range(3)] + [_result(_schedule(P.bsp()))]


def _lines(ax):
    return [a for a in ax.get_lines() if not a.get_label().startswith("_")]


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


# -- metric curves ------------------------------------------------------------------
def test_metric_vs_time_one_line_per_label_and_band_for_seeds(runs):
    fig = plots.metric_vs_time(runs, "accuracy")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 2  # ssp:2 (3 seeds -> median) and bsp
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 1  # one min-max band
    legend = _legend(ax)
    assert legend[0].startswith("ssp:2") and "of 3" in legend[0] and legend[1] == "bsp"
    assert "(s)" in ax.get_xlabel() and "accuracy" in ax.get_ylabel()
    # the median of the three seeds lies inside [min, max] of their values
    x, y = ax.get_lines()[0].get_data()
    ys = np.stack([np.interp(x, r.history["time"], r.history["accuracy"]) for r in runs[:3]])
    np.testing.assert_allclose(y, np.median(ys, axis=0), atol=1e-12)


def test_metric_vs_time_single_runs_are_plain_lines(runs):
    fig = plots.metric_vs_time([runs[0], runs[3]], "loss")
    (ax,) = fig.axes
    assert len(ax.get_lines()) == 2 and not ax.collections
    np.testing.assert_array_equal(ax.get_lines()[0].get_xdata(), runs[0].history["time"])


def test_metric_vs_time_drops_nan_points(runs):
    ax = plots.metric_vs_time(runs[3], "train_loss").axes[0]
    assert len(ax.get_lines()[0].get_xdata()) == len(runs[3].history) - 1  # first row has no train loss


def test_label_fn_and_default_labels_name_what_differs():
    s = _schedule()
    a, b = _result(s, lr_rule="constant"), _result(s, lr_rule="per_gradient")
    ax = plots.metric_vs_updates([a, b], "loss").axes[0]
    assert _legend(ax) == ["ssp:2 (lr_rule=constant)", "ssp:2 (lr_rule=per_gradient)"]
    assert "updates" in ax.get_xlabel()
    ax = plots.metric_vs_updates([a, b], label_fn=lambda r: "same").axes[0]
    assert len(ax.get_lines()) == 1 and _legend(ax)[0].startswith("same")


def test_given_ax_is_drawn_on_and_its_figure_returned(runs):
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2)
    try:
        assert plots.metric_vs_updates(runs, ax=ax2) is fig
        assert not ax1.get_lines() and len(ax2.get_lines()) == 2
    finally:
        plt.close(fig)


def test_new_figures_are_not_left_open_in_pyplot(runs):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plots.metric_vs_time(runs)
    plots.comparison_figure(runs)
    assert plt.get_fignums() == before


# -- staleness histogram -----------------------------------------------------------------
def test_staleness_histogram_one_normalized_step_per_policy(runs):
    fig = plots.staleness_histogram(runs)
    (ax,) = fig.axes
    steps = [p for p in ax.patches if isinstance(p, StepPatch)]
    assert len(steps) == 2  # ssp:2 seeds pooled, bsp
    for step in steps:
        np.testing.assert_allclose(step.get_data().values.sum(), 1.0, rtol=1e-12)
    # pooled ssp:2 frequencies equal the pooled bincount
    tau = np.concatenate([r.schedule.staleness[r.schedule.applied] for r in runs[:3]])
    want = np.bincount(tau, minlength=len(steps[0].get_data().values)) / len(tau)
    np.testing.assert_allclose(steps[0].get_data().values, want)
    # one dashed mean marker per policy, at the mean
    means = [line.get_xdata()[0] for line in ax.get_lines()]
    np.testing.assert_allclose(means, [tau.mean(), 0.0])
    assert _legend(ax) == ["ssp:2", "bsp"]   # one entry per policy; the means are notes
    notes = [t.get_text() for t in ax.texts]
    assert notes == [f"mean {tau.mean():.2f}", "mean 0.00"]
    assert "τ" in ax.get_xlabel()


def test_a_single_bin_histogram_has_integer_ticks():
    """Reported: a single rl_sync run's histogram (τ = 0 only) had ticks at −0.45 ... 0.45."""
    s = simulate_schedule(P.rl_sync(), CLUSTER, num_updates=5, seed=0)
    ax = plots.staleness_histogram(s).axes[0]
    lo, hi = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if lo <= t <= hi]
    assert shown == [0.0]
    assert ax.get_xlabel() == "staleness (versions)" and "rollouts" in ax.get_ylabel()


def test_staleness_histogram_max_tau_keeps_the_tail_in_the_last_bin():
    s = _schedule(P.asp(), cluster=C.heterogeneous([1, 1, 1, 4]))
    assert s.staleness.max() > 2
    ax = plots.staleness_histogram(s, max_tau=2).axes[0]
    (step,) = ax.patches
    values = step.get_data().values
    assert len(values) == 3 and values.sum() == pytest.approx(1.0)
    assert "≥ 2" in ax.get_xlabel()


# -- worker timeline -----------------------------------------------------------------------
def test_worker_timeline_one_row_per_worker():
    s = _schedule(P.ssp(1), cluster=C.heterogeneous([1, 1.5, 2.6]).network(push=0.05, pull=0.05))
    fig = plots.worker_timeline(s)
    (ax,) = fig.axes
    rows = {round(c.get_paths()[0].get_extents().y0 + c.get_paths()[0].get_extents().height / 2, 6)
            for c in ax.collections}
    assert rows == {0.0, 1.0, 2.0}
    assert list(ax.get_yticks()) == [0, 1, 2]
    assert ax.get_xlim() == (0.0, s.end_time) and "(s)" in ax.get_xlabel()
    # compute bars: one rectangle per gradient, spanning [start, end]
    compute = [c for c in ax.collections if c.get_label() in ("compute", "_compute")]
    assert sum(len(c.get_paths()) for c in compute) == s.num_gradients
    legend = _legend(ax)
    assert {"compute", "waiting at the gate", "network (pull, push)"} <= set(legend)
    assert len(legend) == len(set(legend))


def test_worker_timeline_marks_lost_and_dropped_and_clips():
    lost = _schedule(P.ssp(2), cluster=CLUSTER.failures([(1, 20.0, None)]))
    ax = plots.worker_timeline(lost, max_time=30).axes[0]
    assert ax.get_xlim() == (0.0, 30.0)
    assert "lost (worker failed)" in _legend(ax)
    (x_marks,) = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert len(x_marks.get_xdata()) == int(lost["lost"].sum())
    dropped = _schedule(P.backup_workers(1), cluster=C.heterogeneous([1, 1, 2.6]))
    ax = plots.worker_timeline(dropped).axes[0]
    (o_marks,) = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert len(o_marks.get_xdata()) == int(dropped["dropped"].sum()) > 0


def test_an_rl_timeline_has_a_learner_lane_of_its_training():
    """Reported: timelines had no learner lane. Each update's bar ends at its time and lasts
    the learner's seconds the simulator charged (learner × mean step × rollouts / actors)."""
    s = simulate_schedule(P.rl_async(2, learner=2.0), C.heterogeneous([1, 1, 1, 2]), num_updates=8, seed=0)
    ax = plots.worker_timeline(s).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["learner", "0", "1", "2", "3"]
    (lane,) = [c for c in ax.collections if c.get_label() == "learner training"]
    boxes = [p.get_extents() for p in lane.get_paths()]
    np.testing.assert_allclose([b.x1 for b in boxes], s.update_time)
    np.testing.assert_allclose([b.x1 - b.x0 for b in boxes], 2.0 * 1.25 * 1 / 4 * 4)   # 4 rollouts per update
    assert {round(b.y0 + b.height / 2, 9) for b in boxes} == {-1.0}
    assert "rollout (decode)" in _legend(ax) and ax.get_ylabel() == "actor"


def test_worker_timeline_max_workers_limits_rows():
    s = _schedule(P.asp(), cluster=C.constant(5))
    ax = plots.worker_timeline(_result(s), max_workers=3).axes[0]
    assert list(ax.get_yticks()) == [0, 1, 2] and "of 5" in ax.get_title(loc="left")


# -- wait fraction ---------------------------------------------------------------------------
def test_wait_fraction_grouped_bars(runs):
    ax = plots.wait_fraction(runs).axes[0]
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == 2 * 2  # 2 policies x 2 workers
    heights = np.array([b.get_height() for b in bars]).reshape(2, 2)
    want = np.mean([r.schedule.wait_fraction() for r in runs[:3]], axis=0)
    np.testing.assert_allclose(heights[0], want)
    np.testing.assert_allclose(heights[1], runs[3].schedule.wait_fraction())
    assert _legend(ax) == ["ssp:2", "bsp"] and ax.get_xlabel() == "worker" and "%" in ax.get_ylabel()


# -- comparison figure and save ----------------------------------------------------------------
def test_comparison_figure_panels(runs):
    fig = plots.comparison_figure(runs, metric="accuracy", target=0.8)
    assert len(fig.axes) == 4
    acc, loss, hist, wait = fig.axes
    figure_legend = [t.get_text() for t in fig.legends[0].get_texts()]   # one legend under the panels
    assert len(_lines(acc)) == 3 and "target 0.8" in figure_legend  # 2 labels + target line
    assert all(ax.get_legend() is None for ax in fig.axes)          # none covers a panel
    assert len(_lines(loss)) == 2 and "loss" in loss.get_ylabel()
    assert len([p for p in hist.patches if isinstance(p, StepPatch)]) == 2
    assert len(wait.patches) == 4
    assert str(CLUSTER) in fig.get_suptitle()
    # the same label has the same colour in every panel
    from matplotlib.colors import to_rgba

    for k in range(2):
        color = to_rgba(acc.get_lines()[k].get_color())
        assert to_rgba(hist.patches[k].get_edgecolor()) == color
        assert to_rgba(wait.patches[2 * k].get_facecolor()) == color
    assert figure_legend[0].startswith("ssp:2")


def test_long_labels_do_not_collapse_the_comparison(runs, tmp_path):
    """A low-communication comparison.png was unreadable: legend entries of 90 characters
    covered the panels and matplotlib reported 'axes sizes collapsed to zero'."""
    import warnings

    long = lambda r: f"{r.config['policy']} with a very long label (optimizer=nesterov:0.9, lr=0.7) x" * 2  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # matplotlib's collapse warning would fail here
        fig = plots.comparison_figure(runs, metric="accuracy", label_fn=long)
        plots.save(fig, tmp_path / "c.png")
    assert all(ax.get_position().height > 0.15 and ax.get_position().width > 0.2 for ax in fig.axes)


def test_comparison_figure_regression_task_uses_train_loss():
    r = _result(_schedule(), accuracy=False)
    fig = plots.comparison_figure([r], metric="loss")
    assert fig.axes[1].get_ylabel() == "training loss"


def test_save_writes_png(runs, tmp_path):
    path = plots.save(plots.comparison_figure(runs), tmp_path / "a" / "b" / "cmp.png")
    assert path == tmp_path / "a" / "b" / "cmp.png"
    data = path.read_bytes()
    assert len(data) > 10_000 and data[:8] == b"\x89PNG\r\n\x1a\n"


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [plots.metric_vs_time, plots.metric_vs_updates, plots.staleness_histogram,
                                plots.wait_fraction, plots.comparison_figure])
def test_empty_input_is_a_value_error(fn):
    with pytest.raises(ValueError, match="no runs"):
        fn([])


def test_unknown_metric_names_available_columns():
    r = _result(_schedule(), accuracy=False)
    with pytest.raises(ValueError, match=r"'accuracy'.*available columns.*'loss'"):
        plots.metric_vs_time([r], "accuracy")
    with pytest.raises(ValueError, match="available columns"):
        plots.comparison_figure([r])
    r.history = r.history.drop(columns="time")
    with pytest.raises(ValueError, match="'time' is not in the history"):
        plots.metric_vs_time([r], "loss")


def test_bad_arguments_are_named():
    s = _schedule()
    with pytest.raises(TypeError, match="item 0 is a str"):
        plots.metric_vs_time(["ssp:2"])
    with pytest.raises(TypeError, match="Result objects"):
        plots.metric_vs_time([s])
    with pytest.raises(ValueError, match="max_tau"):
        plots.staleness_histogram(s, max_tau=-1)
    with pytest.raises(ValueError, match="max_time"):
        plots.worker_timeline(s, max_time=0)
    with pytest.raises(ValueError, match="max_workers"):
        plots.worker_timeline(s, max_workers=0)
    with pytest.raises(TypeError, match="Schedule or a Result"):
        plots.worker_timeline([s])
    with pytest.raises(ValueError, match="target"):
        plots.comparison_figure([_result(s)], target=float("nan"))
    with pytest.raises(ValueError, match=r"\.png"):
        plots.save(plots.wait_fraction(s), "/tmp/x.pdf")
