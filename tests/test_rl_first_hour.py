"""An RL engineer's first hour (issue 36): their own RL task on every command, replays that
say what is wrong in one line, nothing silently dropped, RL words in messages. Each test failed
before its fix."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
from staleness.cli import main

PLUGINS = Path(__file__).resolve().parent / "plugins"
OWN = ["--task", "sorttask:make_task"]


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_an_own_rl_task_runs_on_every_command(plugins, tmp_path, capsys):
    """tests/plugins/sorttask.py (the trial's ~30-line task: sort 4 digits with an MLP policy,
    its own reward) as --task package.module:factory: its factory returned an RLTask, which
    was refused ("not a staleness.tasks.Task"), and a **kw factory got data_dir=None."""
    sim = tmp_path / "sim"
    base = [*OWN, "--cluster", "1,1,1.5,3", "--no-progress"]
    assert run(["simulate", *base, "--policy", "rl_async:2", "--updates", "4", "--out", str(sim)], capsys)[0] == 0
    assert run(["compare", *base, "--policy", "rl_async:2", "--updates", "4", "--seeds", "0", "--lr", "0.003",
                "--out", str(tmp_path / "cmp")], capsys)[0] == 0
    assert run(["sweep", *base, "--policy", "rl_async:2", "--policy", "rl_sync", "--updates", "4", "--lrs", "0.003",
                "--out", str(tmp_path / "sweep")], capsys)[0] == 0
    code, out, _ = run(["schedule", *OWN, "--cluster", "1,1,1.5,3", "--policy", "rl_async:2", "--updates", "4"], capsys)
    assert code == 0 and "rl_async:2" in out
    real = tmp_path / "real"
    assert run(["run", *OWN, "--policy", "rl_async:1", "--workers", "2", "--updates", "3", "--no-progress",
                "--out", str(real)], capsys)[0] == 0
    for recorded in (sim, real):
        code, out, err = run(["replay", str(recorded), "--check", "--no-progress"], capsys)
        assert code == 0 and "bitwise" in out, err
        assert "learner updates" in out and "rollouts)" in out and "gradients" not in out   # RL's words
    r = st.Result.load(sim)
    assert r.config["task"] == "sorttask:make_task" and r.config["objective"] == "decoupled_ppo"


def test_replaying_with_a_wrong_task_or_without_its_module_is_one_line(plugins, tmp_path, capsys, monkeypatch):
    """A wrong task printed a 19-line traceback or blamed an option; a missing plugin module a
    60-line one (AttributeError: 'RLTask' object has no attribute 'minibatch')."""
    out = tmp_path / "sim"
    assert run(["simulate", *OWN, "--cluster", "1,1", "--updates", "2", "--no-progress", "--out", str(out)],
               capsys)[0] == 0
    code, _, err = run(["replay", str(out), "--task", "digits-mlp"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "recorded run is an RL run" in err and "'sorttask:make_task'" in err and "'digits-mlp'" in err
    code, _, err = run(["replay", str(out), "--task", "rl-bandit"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "other parameters" in err and "rl-bandit" in err
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p != str(PLUGINS)])
    monkeypatch.delitem(__import__("sys").modules, "sorttask", raising=False)
    code, _, err = run(["replay", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no module named 'sorttask'" in err


def test_nothing_is_silently_dropped():
    """A mode without η ran as plain rl_async; rollouts.summary summarised a gradient
    schedule; rl_sync:3 said "too many values"."""
    for spec in ("rl_async:mode=requeue", "rl_inflight:mode=drop"):
        with pytest.raises(ValueError, match="needs a staleness bound η"):
            st.policies.parse(spec)
    assert st.policies.parse("rl_async:2:mode=drop").describe() == "rl_async:2:mode=drop"
    for spec in ("rl_async:2:mode=requeue:minibatches=2:learner=1", "rl_partial:1:refill=2:minibatches=4",
                 "rl_sync:split=2:minibatches=2"):
        assert st.policies.parse(st.policies.parse(spec).describe()).describe() == st.policies.parse(spec).describe()
    with pytest.raises(ValueError, match="whose workers push gradients: it has no rollouts"):
        st.rollouts.summary(st.simulate_schedule("asp", "1,2", num_updates=3), st.tasks.get("rl-bandit"))
    with pytest.raises(ValueError, match="takes no positional value.*KEY=VALUE: learner, minibatches, split"):
        st.policies.parse("rl_sync:3")


def test_a_nan_reward_names_the_reward_function():
    """It blamed "the loss function or the data"."""
    base = st.tasks.get("rl-bandit", num_workers=2)
    task = st.tasks.rl.from_functions(
        st.tasks.rl.Policy(base.init_fn, base.logits_fn, 1),
        st.tasks.rl.PromptSet(base.prompts, st.tasks.rl.lengths.constant(1)),
        lambda prompt, completion, length: jnp.where(completion[0] == 0, jnp.nan, 1.0), num_workers=2)
    from staleness.engine.result import DivergenceError

    with pytest.raises(DivergenceError, match="check the task.s reward function first"):
        st.simulate(task, "rl_sync", st.cluster.heterogeneous([1.0, 1.0]), num_updates=2)


def test_actors_all_lost_before_the_first_update_say_so(capsys):
    """It said "schedule has no update to replay"."""
    code, _, err = run(["simulate", "--task", "rl-bandit", "--policy", "rl_async:1", "--cluster",
                        "1,1+fail=0@0.5,1@0.5", "--updates", "3", "--no-progress"], capsys)
    assert code == 2 and "every actor was lost before the first learner update" in err


def test_rl_tuning_uses_three_seeds_and_long_enough_runs(tmp_path):
    """RL learning-rate tuning: 3 tuning seeds (sampling makes RL runs noisy), at least
    RL_TUNE_UPDATES learner updates (past the reward's early dip) scored on the second half;
    compare.json records the rate the optimizer really uses (it recorded default_lr 0.1 for
    rl-digits, whose optimizer is Adam at 1e-3)."""
    import json

    from staleness.results import compare as C

    task = st.tasks.get("rl-bandit", num_workers=2, objective="reinforce")
    cmp = C.compare(task, ["rl_sync"], st.cluster.heterogeneous([1.0, 1.0]), seeds=[0], num_updates=4, num_evals=2,
                    lr_grid=[0.1, 0.5], out=tmp_path / "c", default_lr=0.1)
    t = cmp.tuning["rl_sync"]
    assert t["seeds"] == list(C.RL_TUNE_SEEDS) and t["updates"] == C.RL_TUNE_UPDATES
    assert "3 seeds per policy" in cmp.budget()
    digits = st.tasks.get("rl-digits", num_workers=2, warm_start_steps=0, num_layers=1, d_model=16, num_heads=2)
    C.compare(digits, ["rl_sync"], st.cluster.heterogeneous([1.0, 1.0]), seeds=[0], num_updates=2, num_evals=1,
              tune=False, out=tmp_path / "d", default_lr=0.1)
    plan = json.loads((tmp_path / "d" / "compare.json").read_text())["config"]
    assert plan["default_lr"] is None and plan["base_lr"]["rl_sync"] == pytest.approx(1e-3)
    assert "tuning the learning rates first" in C.tuning_cost(task, ["rl_sync"], num_updates=4)
    assert np.isfinite(cmp.table()["kl_behav"]).all()


def test_every_command_states_an_estimate_before_a_long_rl_run(plugins, tmp_path, capsys, monkeypatch):
    """`--updates 5000` on rl-digits started silently (several hours). The estimate scales with
    the budget and the runs; every command that runs RL numerics prints it (here from 0 s on)."""
    from staleness.tasks.rl import base

    task = st.tasks.get("rl-digits", num_workers=4)
    s1, b1 = task.estimate(5000)
    assert 300 < s1 < 3600 and b1 == 4 * task.param_count * 12   # the case: 9 updates/s here, ~10 min
    assert task.estimate(10_000, runs=3)[0] == pytest.approx(6 * s1)
    assert "estimate: about" in task.estimate_note(5000) and task.estimate_note(10) is None
    monkeypatch.setattr(base, "ESTIMATE_FROM", 0.0)
    base_args = [*OWN, "--cluster", "1,1", "--no-progress", "--updates", "2"]
    sim = tmp_path / "sim"
    for argv in (["simulate", *base_args, "--out", str(sim)],
                 ["compare", *base_args, "--policy", "rl_sync", "--seeds", "0", "--lr", "0.003",
                  "--out", str(tmp_path / "cmp")],
                 ["sweep", *base_args, "--policy", "rl_sync", "--lrs", "0.003", "--out", str(tmp_path / "sweep")]):
        code, _, err = run(argv, capsys)
        assert code == 0 and "estimate: about" in err and "2 learner updates" in err, (argv[0], err)
    code, _, err = run(["replay", str(sim)], capsys)          # a replay with its progress line
    assert code == 0 and "estimate: about" in err
    code, _, err = run(["run", *OWN, "--policy", "rl_async:1", "--workers", "2", "--updates", "2",
                        "--out", str(tmp_path / "real")], capsys)
    assert code == 0 and "estimate: about" in err
    code, _, err = run(["replay", str(sim), "--no-progress"], capsys)   # quiet when asked
    assert code == 0 and "estimate" not in err
