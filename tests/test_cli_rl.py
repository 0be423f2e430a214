"""The `staleness` command on RL tasks (rl-bandit, rl-digits) and rl_* policies: simulate,
compare (reward, rollout staleness), sweep, schedule, and one-line errors (exit 2) for an RL
policy on a supervised task and the other way round. Tiny budgets: the file runs in well
under a minute."""

import numpy as np
import pandas as pd
import pytest

import staleness as st
from staleness.cli import main

CLUSTER = "1,1,1.5,3"
# rl-digits at its smallest: no warm start, one narrow layer (the model compiles in seconds)
TINY_DIGITS = ["--task-option", "warm_start_steps=0", "--task-option", "num_layers=1", "--task-option", "d_model=16",
               "--task-option", "num_heads=2"]


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_rl_bandit_prints_reward_and_rollouts(tmp_path, capsys):
    out = tmp_path / "sim"
    code, text, err = run(["simulate", "--task", "rl-bandit", "--cluster", CLUSTER, "--updates", "4",
                           "--task-option", "objective=ppo", "--task-option", "eps=0.1", "--batch-size", "4",
                           "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert "rl_async:2" in text.splitlines()[0] and "ppo(eps=0.1" in text.splitlines()[0]   # the RL default policy
    assert "final reward" in text and "token stale mean/max" in text and "-> " in text and "kl_behav" in text
    assert not [line for line in text.splitlines() if len(line) > 100]   # RL's words, in 100 columns
    from staleness.engine.result import Result

    r = Result.load(out)
    assert {"reward", "greedy_reward"} <= set(r.history.columns) and r.history["update"].iloc[-1] == 4
    assert r.config["objective"] == "ppo" and r.config["prompts_per_rollout"] == 4


def test_compare_rl_bandit_defaults_to_rl_policies(tmp_path, capsys):
    out = tmp_path / "cmp"
    code, text, err = run(["compare", "--task", "rl-bandit", "--cluster", CLUSTER, "--updates", "4", "--seeds", "0,1",
                           "--no-tune", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert "metric reward (higher is better)" in text and "final reward" in text
    table = pd.read_csv(out / "table.csv")
    assert list(table["policy"]) == ["rl_sync", "rl_one_step_off", "rl_async:2", "rl_async"]
    assert (table["seeds"] == 2).all() and np.isfinite(table["final_reward"]).all()
    rollouts = pd.read_csv(out / "rollouts.csv")
    assert list(rollouts["policy"]) == list(table["policy"])
    by = rollouts.set_index("policy")
    assert by.loc["rl_sync", "staleness_per_token"] == 0 and by.loc["rl_sync", "staleness_max"] == 0
    assert by.loc["rl_one_step_off", "staleness_max"] == 1 and by.loc["rl_async:2", "staleness_max"] <= 2
    assert (rollouts["consumed"] + rollouts["dropped"] <= rollouts["rollouts"]).all()
    assert "token stale mean/max" in text and "upd/s" in text and "kl_behav" in text and "rollouts.csv" in text
    wide = [line for line in text.splitlines() if len(line) > 100 and not line.startswith("wrote ")]   # (paths vary)
    assert not wide, wide
    assert {"updates_per_s", "sim_time_s", "kl_behav", "clip_fraction"} <= set(table.columns)


def test_compare_rl_tunes_the_learning_rate_on_a_validation_split(tmp_path, capsys):
    code, text, err = run(["compare", "--task", "rl-bandit", "--policy", "rl_async:2", "--cluster", CLUSTER,
                           "--updates", "4", "--seeds", "0", "--lr-grid", "0.1,1", "--no-progress",
                           "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    assert "tuned on a validation split: 2 values" in text
    assert pd.read_csv(tmp_path / "cmp" / "table.csv")["lr"].iloc[0] in (0.1, 1.0)


def test_rl_holdout_splits_the_training_prompts():
    task = st.tasks.get("rl-bandit", num_workers=4, objective="tis", c=3.0)
    val = task.holdout()
    assert val.num_prompts + val.num_eval_prompts == task.num_prompts and val.num_eval_prompts == 16
    train_x, val_x = np.asarray(val.prompts["x"]), np.asarray(val.eval_prompts["x"])
    assert not (train_x[:, None, :] == val_x[None, :, :]).all(-1).any()   # disjoint prompts
    assert val.objective == task.objective and val.group_size == task.group_size


def test_compare_rl_digits_with_the_tasks_optimizer(tmp_path, capsys):
    """The issue's command: rl-digits with rl_async:4; untuned, it trains at the task's own adam rate."""
    code, text, err = run(["compare", "--task", "rl-digits", "--policy", "rl_async:4", "--cluster", CLUSTER,
                           "--updates", "2", "--seeds", "0", "--no-tune", "--batch-size", "2", *TINY_DIGITS,
                           "--no-progress", "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    assert "rl-digits, decoupled_ppo" in text and "final reward" in text and "token stale mean/max" in text
    table = pd.read_csv(tmp_path / "cmp" / "table.csv")
    assert table["lr"].iloc[0] == pytest.approx(1e-3) and table["updates"].iloc[0] == 2


def test_sweep_over_two_rl_policies(tmp_path, capsys):
    out = tmp_path / "sw"
    code, text, err = run(["sweep", "--task", "rl-bandit", "--policy", "rl_sync", "--policy", "rl_async:2",
                           "--cluster", CLUSTER, "--seeds", "0,1", "--updates", "4", "--no-progress",
                           "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out / "table.csv")
    assert list(table["policy"]) == ["rl_sync"] * 2 + ["rl_async:2"] * 2 and (table["status"] == "complete").all()
    assert np.isfinite(table["final_reward"]).all() and "staleness_per_token" in table
    assert (table.loc[table["policy"] == "rl_sync", "staleness_per_token"] == 0).all()


def test_schedule_times_rollouts_by_the_tasks_lengths(capsys):
    code, text, err = run(["schedule", "--task", "rl-bandit", "--cluster", CLUSTER, "--updates", "20"], capsys)
    assert code == 0, err
    for policy in ("rl_sync", "rl_one_step_off", "rl_async:2", "rl_async"):
        assert policy in text
    code, plain, err = run(["schedule", "--policy", "rl_sync", "--cluster", CLUSTER, "--updates", "20", "--json"],
                           capsys)
    code2, timed, err2 = run(["schedule", "--task", "rl-bandit", "--policy", "rl_sync", "--cluster", CLUSTER,
                              "--updates", "20", "--json"], capsys)
    import json

    assert code == code2 == 0, err + err2
    # rl-bandit's rollouts decode ~100s of tokens each: far longer than one cluster step
    assert json.loads(timed)["sim_time_s"] > 10 * json.loads(plain)["sim_time_s"]


@pytest.mark.parametrize("argv, fragment", [
    (["simulate", "--task", "rl-bandit", "--policy", "bsp"], "--task rl-bandit is an RL task but --policy bsp"),
    (["simulate", "--task", "digits-mlp", "--policy", "rl_async:2"],
     "--policy rl_async:2 trains on rollouts (asynchronous RL) but --task digits-mlp is not an RL task"),
    (["compare", "--task", "rl-digits", "--policy", "rl_sync", "--policy", "asp"], "--policy asp does not generate"),
    (["compare", "--policy", "rl_async:4"], "--task digits-mlp is not an RL task"),
    (["sweep", "--task", "rl-bandit", "--policy", "ssp:3"], "--policy ssp:3 does not generate rollouts"),
    (["sweep", "--policy", "rl_sync"], "--policy rl_sync trains on rollouts"),
    (["schedule", "--task", "rl-bandit", "--policy", "asp"], "--policy asp does not generate rollouts"),
    (["run", "--task", "rl-bandit", "--policy", "asp"], "--policy asp does not generate rollouts"),
    (["simulate", "--task", "rl-bandit", "--task-option", "eps"], "--task-option = 'eps' must be KEY=VALUE"),
    (["simulate", "--task", "rl-bandit", "--task-option", "nope=1"], "nope = 1 is not an option of 'rl-bandit'"),
    (["simulate", "--task", "rl-bandit", "--task-option", "objective=sgd"], "objective = 'sgd'"),
    (["simulate", "--task", "digits-mlp", "--task-option", "eps=0.2"], "--task-option: task 'digits-mlp' got unknown"),
    (["simulate", "--task", "rl-bandit", "--batch-size", "2", "--task-option", "prompts_per_rollout=2"],
     "not both"),
    (["compare", "--task", "rl-bandit", "--partition", "shard"], "has no data partition"),
])
def test_rl_mismatches_are_one_line_before_computing(argv, fragment, tmp_path, capsys):
    out = tmp_path / "out"
    code, text, err = run(argv + ["--updates", "3", "--out", str(out)] * (argv[0] != "schedule")
                          + ["--updates", "3"] * (argv[0] == "schedule"), capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:") and fragment in lines[0], err
    assert "Traceback" not in err and not out.exists() and text == ""


def test_replay_check_of_a_real_rl_run_is_bitwise(tmp_path, capsys):
    """`staleness replay` rebuilt an RL task from its recorded options and failed
    ("decode_length_rule = 'lognormal(...)' must be a length rule"); it now rebuilds it
    from the config (objective, group size, prompts per rollout, options) and checks."""
    task = st.tasks.get("rl-bandit", num_workers=2, objective="ppo", eps=0.1, group_size=3)
    res = st.runtime.run(task, "rl_async:1", num_updates=4, num_workers=2, lr=0.5, num_evals=1)
    res.save(tmp_path / "real")
    code, text, err = run(["replay", str(tmp_path / "real"), "--check"], capsys)
    assert code == 0, err
    assert "bitwise" in text
    again = st.tasks.rl.from_config(res.config, 2)
    assert again.objective == task.objective and again.group_size == 3


def test_compare_rl_inflight_counts_tokens_at_their_own_versions(tmp_path, capsys):
    """rl_inflight next to rl_async on the same cluster (its timing is rl_async's): rollouts of
    several versions, fresher tokens, the same oldest ones."""
    out = tmp_path / "cmp"
    code, text, err = run(["compare", "--task", "rl-digits", *TINY_DIGITS, "--policy", "rl_async", "--policy",
                           "rl_inflight", "--cluster", CLUSTER + "+jitter=0.3", "--updates", "8", "--seeds", "0",
                           "--no-tune", "--lr", "0.001", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    by = pd.read_csv(out / "rollouts.csv").set_index("policy")
    assert by.loc["rl_async", "versions_per_rollout"] == 1.0 and by.loc["rl_inflight", "versions_per_rollout"] > 1.0
    assert by.loc["rl_inflight", "staleness_per_token"] < by.loc["rl_async", "staleness_per_token"]
    assert by.loc["rl_inflight", "staleness_max"] == by.loc["rl_async", "staleness_max"]   # its oldest tokens


def test_run_refuses_rl_inflight_without_a_cluster_in_one_line(capsys):
    code, text, err = run(["run", "--task", "rl-bandit", "--policy", "rl_inflight:2", "--workers", "2",
                           "--updates", "2"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "need a cluster" in err


def test_run_rl_inflight_for_real_then_replay_check_is_bitwise(tmp_path, capsys):
    out = tmp_path / "real"
    code, text, err = run(["run", "--task", "rl-digits", *TINY_DIGITS, "--policy", "rl_inflight:2", "--cluster",
                           CLUSTER, "--workers", "4", "--updates", "8", "--lr", "0.001", "--time-scale", "0.002",
                           "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert st.Result.load(out).schedule.meta.get("segments"), "no version reached an actor mid-rollout"
    code, text, err = run(["replay", str(out), "--check"], capsys)
    assert code == 0, err
    assert "bitwise" in text


def test_run_task_options_need_a_worker_count_and_launch_passes_them_on(capsys):
    from staleness.cli import build_parser, run_cmd

    code, text, err = run(["run", "--task", "rl-bandit", "--task-option", "objective=ppo", "--policy", "rl_async:1",
                           "--updates", "2"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "give --workers or --cluster" in err
    args = build_parser().parse_args(["launch", "--local", "2", "--task", "rl-bandit", "--task-option",
                                      "objective=ppo", "--workers", "2"])
    argv = run_cmd._run_argv(args)
    assert argv[argv.index("--task-option") + 1] == "objective=ppo"


def test_a_registered_objective_runs_from_the_cli(tmp_path, capsys, monkeypatch):
    """A user's objective (tests/plugins/user_objectives.py registers CISPO) named on the
    command line as module:name: simulated, recorded in the Result, and rebuilt by replay."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
    out = tmp_path / "cispo"
    code, text, err = run(["simulate", "--task", "rl-bandit", "--cluster", CLUSTER, "--updates", "4",
                           "--task-option", "objective=user_objectives:cispo", "--task-option", "eps_high=0.5",
                           "--no-progress", "--out", str(out)], capsys)
    assert code == 0, err
    assert "user_objectives:cispo(eps_high=0.5" in text.splitlines()[0]
    r = st.Result.load(out)
    assert r.config["objective"] == "user_objectives:cispo" and r.config["objective_params"]["eps_high"] == 0.5
    code, text, err = run(["replay", str(out), "--check"], capsys)
    assert code == 0, err
    code, _, err = run(["simulate", "--task", "rl-bandit", "--updates", "2", "--task-option",
                        "objective=user_objectives:nope", "--no-progress"], capsys)
    assert code == 2 and "registered no objective 'nope'" in err and len(err.strip().splitlines()) == 1


def test_replay_check_of_a_simulated_rl_run_is_bitwise(tmp_path, capsys):
    """A simulated RL Result replays bitwise with `replay --check` (it differed by 8.6e-6 to
    3.6e-5: the simulation vmapped the rollouts of an update, the check computes them one by
    one; now both run each rollout with an actor's own ops)."""
    for policy in ("rl_async:2", "rl_inflight:1"):
        out = tmp_path / policy.replace(":", "-")
        code, _, err = run(["simulate", "--task", "rl-digits", *TINY_DIGITS, "--cluster", CLUSTER, "--policy", policy,
                            "--updates", "4", "--no-progress", "--out", str(out)], capsys)
        assert code == 0, err
        code, text, err = run(["replay", str(out), "--check"], capsys)
        assert code == 0, err
        assert "bitwise" in text, text
