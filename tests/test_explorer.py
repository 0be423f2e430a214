"""staleness.results.explorer (notebook 05's model): the "copy as CLI" line parses with the real
`staleness` parser into exactly the explorer's settings, and running it reproduces the
explorer's runs; settings are checked and canonical; the figure and table show every policy.
The widget callbacks themselves are exercised by the notebook's own check cell (CI runs it)."""

import inspect
import shlex

import numpy as np
import pytest

import staleness as st
from staleness.results import explorer
from staleness.cli import _attach_dash_values, build_parser
from staleness.cli.simulate_cmd import _cmd_compare, _seeds
from staleness.results.compare import compare
from staleness.engine.result import Result

SETTINGS = [
    explorer.Settings(),
    explorer.Settings(task="linreg", policies=("asp",), cluster="1*8", seeds=(3, 4, 5, 6, 7), lr=0.001,
                      lr_rule="delay_adaptive", max_time=12.5),
    explorer.Settings(task="mnist1d-mlp", policies=("softsync:8", "dssp:2:5:nocap"),
                      cluster=explorer.cluster_spec(1, 5.9, 0.95, 0.1), lr=1.0, lr_rule="per_update"),
    explorer.Settings(task="quadratic", policies=("ssp:0", "bsp"), cluster="1,1,2.6,2.6", seeds=(0,),
                      lr=0.2, lr_rule="per_gradient", max_time=200.0),
]


def _parse(argv):
    parser = build_parser()
    return parser.parse_args(_attach_dash_values(parser, argv))   # what staleness.cli.main does


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.task)
def test_cli_line_parses_into_the_same_settings(s):
    line = s.cli()
    words = shlex.split(line)
    assert words[0] == "staleness"
    args = _parse(words[1:])
    assert args.func is _cmd_compare
    assert args.task == s.task
    assert [st.policies.parse(p).describe() for p in args.policy] == list(s.policies)
    assert st.cluster.parse(args.cluster).describe() == s.cluster
    assert _seeds(args.seeds) == list(s.seeds)
    assert args.lr == s.lr            # a fixed lr: compare does not tune it
    assert st.lr.get(args.lr_rule).describe() == s.lr_rule
    assert args.max_time == s.max_time and args.num_updates is None
    # what the explorer leaves at the task's defaults, the command line does too
    assert args.optimizer is None and args.inner_optimizer is None
    get = inspect.signature(st.tasks.get).parameters
    assert args.batch_size == get["batch_size"].default      # None: 32, or a task factory's own
    assert args.partition in (get["partition"].default, "iid")


def test_explorer_evaluates_as_often_as_compare():
    from staleness.results.compare import CompareSettings

    assert CompareSettings().num_evals == explorer.NUM_EVALS


def test_running_the_cli_line_reproduces_the_explorer(tmp_path, capsys):
    from staleness.cli import main

    s = explorer.Settings(task="quadratic", policies=("ssp:1", "bsp"), cluster="1,2.5+jitter=0.2",
                          seeds=(0, 1), lr=0.05, lr_rule="per_gradient", max_time=15.0)
    ours = explorer.run(s)
    assert main(shlex.split(s.cli())[1:] + ["--out", str(tmp_path), "--no-progress"]) == 0
    capsys.readouterr()
    for r in ours:
        theirs = Result.load(tmp_path / "results" / f"{r.config['policy'].replace(':', '-')}_s{r.config['seed']}")
        assert theirs.config["lr"] == r.config["lr"] and theirs.config["lr_rule"] == r.config["lr_rule"]
        assert theirs.schedule.to_frame().equals(r.schedule.to_frame())
        np.testing.assert_array_equal(theirs.history["update"], r.history["update"])
        # sweep against compare's simulate per seed: bitwise (a sweep runs each configuration's own replay)
        np.testing.assert_array_equal(theirs.history["loss"], r.history["loss"])


def test_settings_are_checked_and_canonical():
    s = explorer.Settings(policies=("dssp:s_low=3,r_max=12", "dssp:3:12", "BSP"), cluster="1*4,2.6*4+jitter=0.1",
                          seeds=[0, 1], lr=1, lr_rule="delay_adaptive", max_time=10)
    assert s.policies == ("dssp:3:12", "bsp") and s.seeds == (0, 1)
    assert s.lr_rule == "delay_adaptive:8" and isinstance(s.lr, float) and s.max_time == 10.0
    assert s == explorer.Settings(policies=("dssp:3:12", "bsp"), cluster=s.cluster, seeds=(0, 1), lr=1.0,
                                  lr_rule="delay_adaptive:8", max_time=10.0)
    for bad in [dict(policies=()), dict(policies=("nope",)), dict(policies=("softsync:9",)),
                dict(seeds=()), dict(seeds=(0, 0)), dict(seeds=(-1,)), dict(lr=0.0), dict(lr=float("nan")),
                dict(lr=True), dict(lr_rule="bogus"), dict(max_time=0.0), dict(cluster="1*4,x"), dict(task="")]:
        with pytest.raises(ValueError):
            explorer.Settings(**bad)


def test_policy_and_cluster_specs():
    specs = [explorer.policy_spec(k, s=2, r_max=5, n=6, num_workers=4) for k in explorer.POLICY_KINDS]
    assert specs == ["bsp", "asp", "ssp:2", "dssp:2:5", "dssp:2:5:nocap", "softsync:4", "backup:1"]
    for spec in specs:
        assert st.policies.parse(spec).describe() == spec
    with pytest.raises(ValueError, match="kind"):
        explorer.policy_spec("sspp")
    assert explorer.cluster_spec(4, 2.6) == "1*4,2.6*4"
    c = st.cluster.parse(explorer.cluster_spec(2, 3.0, 0.1, 0.05, num_workers=3))
    assert c.num_workers == 3 and c.describe() == "1*2,3+jitter=0.1+stragglers=0.05:4:10"
    with pytest.raises(ValueError, match="fast"):
        explorer.cluster_spec(9, 2.0)


def test_run_caches_and_figure_and_table_show_every_policy():
    s = explorer.Settings(task="quadratic", policies=("asp", "bsp"), cluster="1,1,3", seeds=tuple(range(5)),
                          lr=0.05, max_time=10.0)
    cache = {}
    results = explorer.run(s, cache)
    assert [(r.config["policy"], r.config["seed"]) for r in results] == [(p, k) for p in s.policies for k in s.seeds]
    assert all(r.config.get("sweep") for r in results)   # each policy's seeds in one sweep
    again = explorer.run(s, cache)
    assert all(a is b for a, b in zip(again, results))   # nothing re-run
    one = explorer.Settings(**{**vars(s), "policies": ("asp",)})
    assert explorer.run(one, cache) == results[:5] and len(cache) == 3   # task + two sweeps

    fig = explorer.figure(s, results)
    axes = fig.get_axes()
    assert len(axes) == 2 + 1 + 2   # two curves; the histogram; one timeline per policy
    assert [a.get_title(loc="left") for a in axes[3:]] == ["asp, seed 0", "bsp, seed 0"]
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert legend == ["asp (median, min–max of 5)", "bsp (median, min–max of 5)"]
    assert len(explorer.figure(one, results[:5]).get_axes()) == 4

    t = explorer.table(s, results)
    assert list(t.index) == ["asp", "bsp"] and (t["seeds"] == 5).all()
    assert (t["interval"] == "bootstrap 95%").all()
    assert (t["final_ci_low"] <= t["final_loss"]).all() and (t["final_loss"] <= t["final_ci_high"]).all()
    with pytest.raises(ValueError, match="empty"):
        explorer.figure(s, [])


def test_the_policy_menu_comes_from_the_registry(monkeypatch):
    """A registered gradient policy joins the explorer's menu (no list to edit); RL and
    local-update policies, which the explorer's tasks cannot run, do not."""
    from staleness.policies import registry

    menu = explorer.policy_kinds()
    assert "rl_async" not in menu and "diloco" not in menu and "dssp (no cap)" in menu
    monkeypatch.setitem(registry._REGISTERED, "capped_asp", (lambda staleness=3: st.policies.ssp(staleness), None))
    assert explorer.policy_kinds()[-1] == "capped_asp" and "capped_asp" in explorer.POLICY_KINDS
    assert explorer.policy_spec("capped_asp", s=5) == "ssp:5"
