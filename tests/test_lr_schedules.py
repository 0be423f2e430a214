"""'+cosine' and '+linear' learning-rate schedules work wherever they are advertised:
`st.simulate`, the real runtime and the command line (they always failed before:
"lr schedule 'cosine' needs horizon >= 1 updates")."""

import jax
import numpy as np
import pytest

import staleness as st
from staleness.cli import main
from staleness.runtime.replay import replay_trace


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_simulate_with_a_schedule_is_gradient_descent_with_that_lr(schedule):
    """One ASP worker on the deterministic quadratic: θ_{u+1} = θ_u − α0·shape(u)·A(θ_u − θ*)."""
    task = st.tasks.get("quadratic", num_workers=1)
    n, lr = 30, 0.05
    res = st.simulate(task, "asp", st.cluster.constant(1), num_updates=n, seed=0, lr=lr,
                      optimizer=f"sgd+{schedule}", num_evals=3)
    theta = np.asarray(task.init_params(st.engine.keys(0)[0])["theta"], np.float64)
    a, star = np.asarray(task.hessian, np.float64), np.asarray(task.optimum["theta"], np.float64)
    for u in range(n):
        frac = u / n
        shape = 0.5 * (1 + np.cos(np.pi * frac)) if schedule == "cosine" else 1 - frac
        theta = theta - lr * shape * (a @ (theta - star))
    np.testing.assert_allclose(np.asarray(res.params["theta"]), theta, rtol=2e-5, atol=2e-6)
    assert res.config["optimizer"] == f"sgd+{schedule}"


def test_the_runtime_runs_a_schedule_and_its_trace_replays_bitwise():
    task = st.tasks.get("quadratic", num_workers=2)
    res = st.runtime.run(task, "asp", num_updates=12, num_workers=2, devices=2, lr=0.05,
                         optimizer="momentum:0.9+linear", num_evals=2)
    assert res.status == "complete" and res.config["optimizer"] == "momentum:0.9+linear"
    rep, cmp = replay_trace(res)
    assert cmp.bitwise, cmp


@pytest.mark.parametrize("argv", [
    ["simulate", "--task", "quadratic", "--updates", "6", "--optimizer", "adam+cosine"],
    ["run", "--task", "quadratic", "--updates", "6", "--workers", "2", "--devices", "2", "--optimizer", "adam+linear"],
])
def test_cli_accepts_the_advertised_schedules(argv, capsys):
    assert main([*argv, "--no-progress"]) == 0, capsys.readouterr().err
    assert jax.devices()  # the in-process run left JAX usable
