"""A policy written in the user's own file (tests/plugins/user_policies.py: bounded-delay
ASP, which drops gradients staler than tau) runs through every entry point without
touching the package: schedule, simulate, sweep, compare, the explorer, runtime.run,
launch and replay, named as 'user_policies:bounded_asp:TAU' or registered by name.
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import staleness as st
from staleness.cli import main

PLUGINS = Path(__file__).resolve().parent / "plugins"
SPEC = "user_policies:bounded_asp:tau=1"
CLUSTER = "1*2,3*2"      # two fast and two slow workers: slow gradients arrive stale


@pytest.fixture(autouse=True)
def plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def _bounded(schedule, tau):
    applied = schedule.applied
    assert applied.any()
    assert schedule.staleness[applied].max() <= tau
    return int(schedule.columns["dropped"].sum())


def test_a_module_reference_is_a_policy_value_that_round_trips_through_its_spec():
    p = st.policies.parse(SPEC)
    assert isinstance(p, st.policies.Policy) and p.describe() == SPEC and str(p) == SPEC
    assert st.policies.parse(p.describe()) == p
    assert not p.local and not p.lockstep and not p.collective
    with pytest.raises(ValueError, match="tau = -1 must be >= 0"):
        st.policies.parse("user_policies:bounded_asp:-1")
    with pytest.raises(ValueError, match="no module named 'no_such_module'"):
        st.policies.parse("no_such_module:bounded_asp")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        st.policies.parse("user_policies:nope")


def test_a_registered_user_policy_is_parsed_by_name_and_listed_in_the_help():
    import user_policies

    st.policies.register("bounded_asp_test", user_policies.bounded_asp, overwrite=True)
    p = st.policies.parse("bounded_asp_test:3")
    assert p.describe() == "bounded_asp_test:3" and p.aggregation.tau == 3
    assert "bounded_asp_test" in st.policies.names()
    assert "bounded_asp_test[:TAU]" in st.policies.spec_help()
    with pytest.raises(ValueError, match="built in"):
        st.policies.register("ssp", user_policies.bounded_asp)
    with pytest.raises(TypeError, match="does not follow the Aggregation protocol"):
        st.policies.Policy(st.policies.Free(), object(), "broken")


def test_simulate_and_sweep_keep_the_bound_and_replay_the_drops():
    sched = st.simulate_schedule(SPEC, CLUSTER, num_updates=60, seed=0)
    assert sched.policy == st.policies.parse(SPEC)
    assert _bounded(sched, 1) > 0          # the slow workers' stale gradients were dropped
    task = st.tasks.get("quadratic", num_workers=4)
    res = st.simulate(task, SPEC, CLUSTER, num_updates=60, seed=0, lr=0.05)
    loss = res.history["train_loss"].to_numpy()[1:]   # row 0: before any update
    assert res.config["policy"] == SPEC and np.isfinite(loss).all() and loss[-1] < 0.1 * loss[0]
    # the sweep replays the same schedules (vmapped over configurations: equal up to the
    # last bits of float32, which vmap may reorder)
    grid = st.sweep(task, [SPEC, "asp"], CLUSTER, seeds=[0, 1], lrs=[0.05], num_updates=60)
    assert [r.config["policy"] for r in grid].count(SPEC) == 2
    mine = next(r for r in grid if r.config["policy"] == SPEC and r.config["seed"] == 0)
    for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(res.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_schedule_saves_and_loads_its_policy_as_a_value(tmp_path):
    sched = st.simulate_schedule(SPEC, CLUSTER, num_updates=20, seed=0)
    sched.save(tmp_path / "s.json")
    back = st.Schedule.load(tmp_path / "s.json")
    assert back.policy == sched.policy and isinstance(back.policy.aggregation, type(sched.policy.aggregation))
    for i, spec in enumerate(("dssp:3:12:nocap", "streaming_diloco:4:fragments=2", "backup:1")):
        st.simulate_schedule(spec, "1*4", num_updates=4, seed=0).save(tmp_path / f"{i}.json")
        assert st.Schedule.load(tmp_path / f"{i}.json").policy == st.policies.parse(spec)
    assert st.Schedule.load(tmp_path / "0.json").policy == st.policies.dssp(3, 12, cap=False)
    # a spec this build cannot rebuild loads as data: it replays, it does not simulate
    raw = json.loads((tmp_path / "0.json").read_text())
    raw["policy"] = "elsewhere:policy_we_do_not_have"
    (tmp_path / "e.json").write_text(json.dumps(raw))
    other = st.Schedule.load(tmp_path / "e.json")
    assert other.policy.describe() == "elsewhere:policy_we_do_not_have"
    with pytest.raises(ValueError, match="not known to this build"):
        st.simulate_schedule(other.policy, "1*4", num_updates=4)


def test_every_cli_command_takes_the_user_policy(tmp_path, capsys):
    base = ["--task", "quadratic", "--cluster", CLUSTER, "--no-progress"]
    assert main(["schedule", "--policy", SPEC, "--cluster", CLUSTER, "--updates", "40"]) == 0
    assert SPEC in capsys.readouterr().out
    assert main(["simulate", "--policy", SPEC, *base, "--updates", "20", "--out", str(tmp_path / "sim")]) == 0
    assert main(["sweep", "--policy", SPEC, "--policy", "asp", "--seeds", "0,1", *base, "--updates", "20",
                 "--out", str(tmp_path / "sweep")]) == 0
    assert main(["compare", "--policy", SPEC, "--policy", "asp", "--seeds", "0", "--no-tune", *base,
                 "--max-time", "20", "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "table.csv").read_text()
    assert SPEC in table
    assert main(["schedule", "--policy", "user_policies:bounded_asp:-1"]) == 2
    assert "tau = -1 must be >= 0" in capsys.readouterr().err


def test_the_explorer_takes_the_user_policy():
    from staleness.results import explorer

    s = explorer.Settings(task="quadratic", policies=(SPEC,), cluster=CLUSTER, seeds=(0,), max_time=10.0)
    assert s.policies == (SPEC,)
    results = explorer.run(s)
    assert len(results) == 1 and results[0].config["policy"] == SPEC


def test_a_real_run_of_the_user_policy_replays_bitwise(tmp_path):
    res = st.runtime.run("quadratic", SPEC, CLUSTER, num_updates=30, seed=0, lr=0.05, time_scale=0.002,
                         progress=False)
    assert res.status == "complete" and res.schedule.policy == st.policies.parse(SPEC)
    _bounded(res.schedule, 1)
    out = tmp_path / "real"
    res.save(out)
    assert main(["replay", str(out), "--check"]) == 0


@pytest.mark.timeout(240)
def test_launch_runs_the_user_policy_in_two_processes(tmp_path):
    from _jobs import Procs, child_env

    env = child_env()
    env["PYTHONPATH"] = str(PLUGINS) + ":" + env["PYTHONPATH"]
    procs = Procs(180, env=env)
    out = tmp_path / "launched"
    try:
        procs.spawn([sys.executable, "-m", "staleness", "launch", "--local", "2", "--task", "quadratic",
                     "--policy", SPEC, "--cluster", CLUSTER, "--time-scale", "0.002", "--updates", "30",
                     "--no-progress", "--out", str(out)])
        codes = procs.finish()
    finally:
        procs.kill()
    assert codes == [0], procs.text(0)[-3000:]
    res = st.Result.load(out)
    assert res.schedule.policy.describe() == SPEC and res.config["processes"] == 2
    _bounded(res.schedule, 1)


def test_optional_members_come_from_the_protocols_and_required_ones_are_named():
    """The user's aggregation leaves out fixed_size, grace and requeue: the Policy takes the
    defaults `Aggregation` declares for them (not streamed, no window, no requeue); a part
    lacking required members is refused, naming exactly those."""
    from user_policies import DropStale

    P = st.policies
    p = st.policies.parse(SPEC)
    assert not any(hasattr(p.aggregation, m) for m in ("fixed_size", "grace", "requeue"))
    assert (P.Aggregation.fixed_size, P.Aggregation.grace, P.Aggregation.requeue) == (None, 0.0, False)
    assert p.streamable(4) is None and p.grace == 0.0 and not p.learner and P.Work.learner_seconds is None

    class NoSize:   # DropStale without `size` and `all_live`
        accepts, due, validate = DropStale.accepts, DropStale.due, DropStale.validate

    with pytest.raises(TypeError, match=r"aggregation = .* Aggregation protocol \(it lacks all_live, size\)"):
        P.Policy(P.Free(), NoSize(), "no-size")
