"""The asynchronous-RL staleness planner (`st.rl.plan`, `staleness plan`): its numbers are the
simulator's, from timing alone."""

import numpy as np
import pandas as pd
import pytest

import staleness as st
from staleness.cli import main
from staleness.engine import core
from staleness.tasks.rl import lengths as L


def test_the_planners_numbers_are_simulate_schedules():
    """Each row equals what `st.simulate_schedule` and `st.rollouts.summary` give for the same
    policy, actors, lengths and seed: updates/s, staleness per token, dropped share, length shift."""
    cluster = st.cluster.parse("1*3,3+jitter=0.3")
    rule = L.lognormal(32, 1.0, 256)
    table = st.rl.plan(cluster, lengths=rule, policies=["rl_sync", "rl_async:1:mode=drop", "rl_inflight:2"],
                       num_updates=200, prompts_per_rollout=4)
    from staleness.results.planner import _timing_task

    task = _timing_task(4, rule, 4, 256, 0.0)
    for row in table.to_dict("records"):
        sched = st.simulate_schedule(row["policy"], cluster, num_updates=200, seed=0,
                                     sizes=task.rollout_sizes(core.keys(0)[1]))
        s = st.rollouts.summary(sched, task, seed=0)
        assert row["updates_per_s"] == pytest.approx(200 / sched.update_time[-1], rel=1e-12)
        assert row["staleness_mean"] == pytest.approx(s["mean_staleness_per_token"], rel=1e-12)
        assert row["staleness_max"] == s["max_staleness"]
        assert row["dropped_share"] == pytest.approx(s["dropped"] / s["rollouts"])
        assert row["length_shift"] == pytest.approx(s["length_consumed"]["mean"] - s["length_generated"]["mean"])
        assert 0 <= row["actor_utilization"] <= 1 and 0 < row["learner_utilization"] <= 1
    drop = table.set_index("policy").loc["rl_async:1:mode=drop"]
    assert drop["dropped_share"] > 0 and drop["length_shift"] < 0   # the long ones go stale


def test_policies_of_and_the_frontier():
    specs = st.rl.policies_of([0, 2, None], ["pace", "drop"], inflight=True, one_step_off=True, minibatches=2)
    assert specs[0] == "rl_sync:minibatches=2" and "rl_async:2:mode=drop:minibatches=2" in specs
    assert "rl_inflight:2:minibatches=2" in specs and "rl_one_step_off:minibatches=2" in specs
    assert not any("mode=drop" in s and not any(c.isdigit() for c in s.split(":")[1]) for s in specs)
    table = pd.DataFrame({"policy": ["rl_sync", "rl_async:1", "rl_async:2", "rl_async:4", "rl_async"],
                          "eta": [0, 1, 2, 4, None], "mode": ["pace"] * 5,
                          "updates_per_s": [1.0, 2.0, 2.95, 3.0, 3.0]})
    assert st.rl.frontier(table) == {"pace": 2}   # 2.95 is within 2% of 3.0


def test_measured_lengths_and_the_command(tmp_path, capsys):
    """Measured lengths from a CSV (`lengths.empirical`), the command's table in 100 columns,
    its files, and bad input refused in one line before anything is simulated."""
    csv = tmp_path / "lengths.csv"
    pd.DataFrame({"length": [10, 40, 400], "count": [70, 25, 5]}).to_csv(csv, index=False)
    out = tmp_path / "plan"
    code = main(["plan", "--cluster", "1*3,3", "--lengths", str(csv), "--eta", "0,1,inf", "--mode", "pace,drop",
                 "--updates", "100", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "frontier" in text and not [ln for ln in text.splitlines() if len(ln) > 100
                                                     and not ln.startswith("wrote ")]
    table = pd.read_csv(out / "plan.csv")
    assert list(table["policy"])[:3] == ["rl_sync", "rl_async:1", "rl_async"] and (out / "plan.png").is_file()
    rng = np.random.default_rng(0)
    drawn = L.empirical([10, 40, 400], [70, 25, 5]).draw(rng, 4000)
    assert set(np.unique(drawn)) == {10, 40, 400} and abs(np.mean(drawn == 10) - 0.7) < 0.03
    for argv, fragment in ((["--lengths", "lognormal:1"], "--lengths = 'lognormal:1'"),
                           (["--eta", "1,x"], "--eta = '1,x'"), (["--mode", "fast"], "--mode = 'fast'"),
                           (["--policy", "asp"], "rl_* policies"), (["--updates", "0"], "--updates = 0"),
                           (["--lengths", str(tmp_path / "none.csv")], "no such file")):
        assert main(["plan", *argv]) == 2
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_the_grid_keywords_build_the_policies():
    """plan(..., etas=, modes=, ...) plans `policies_of(...)`'s specs; an unknown keyword or a grid
    beside policies= is refused, naming it."""
    kw = dict(num_updates=20, prompts_per_rollout=2, lengths=L.constant(4))
    table = st.rl.plan("1*2", etas=[0, 2], modes=["pace"], learner=0.25, **kw)
    assert list(table["policy"]) == st.rl.policies_of([0, 2], ["pace"], learner=0.25)
    with pytest.raises(TypeError, match="unknown keyword 'eta'.*etas"):
        st.rl.plan("1*2", eta=[2], **kw)
    with pytest.raises(ValueError, match="not both"):
        st.rl.plan("1*2", policies=["rl_sync"], etas=[2], **kw)
