"""Issue 25 regressions: what a researcher hits in the first hour is an error that names the
setting, not an AttributeError or a silently dropped setting."""

import pytest

import staleness as st


def test_simulate_names_a_policy_or_cluster_of_the_wrong_type():
    """`st.simulate(task, 123, cl)` raised AttributeError: 'int' object has no attribute 'work'."""
    with pytest.raises(TypeError, match=r"policy = 123 must be a staleness.policies.Policy or a spec string"):
        st.simulate("quadratic", 123, "2", num_updates=2)
    with pytest.raises(TypeError, match=r"cluster = None must be a staleness.cluster.Cluster or a spec string"):
        st.simulate("quadratic", "asp", None, num_updates=2)


def test_summary_with_a_target_on_a_metric_the_task_lacks_is_an_error():
    """`r.summary(target=0.9)` on a task without accuracy dropped the target silently."""
    r = st.simulate("quadratic", "asp", "2", num_updates=4, num_evals=1)
    with pytest.raises(ValueError, match="metric = 'accuracy' is not in the history; valid: train_loss, loss"):
        r.summary(target=0.9)
    assert "time_to_loss_1" in r.summary(target=1.0, metric="loss")


@pytest.mark.parametrize("kwargs, name", [(dict(seeds=(0, 0)), "seeds repeats 0"),
                                          (dict(policies=["asp", "asp"]), "policies repeats asp"),
                                          (dict(lrs=(0.1, 0.1)), "lrs repeats 0.1")])
def test_a_sweep_refuses_repeated_runs(kwargs, name):
    """`--policy asp --policy asp` or `--seeds 0,0` counted duplicate runs as independent seeds."""
    policies = kwargs.pop("policies", ["asp"])
    with pytest.raises(ValueError, match=f"sweep: {name}; give each once"):
        st.sweep("quadratic", policies, "2", num_updates=2, **kwargs)


def test_wait_fraction_groups_workers_above_the_bar_limit():
    """`staleness simulate --cluster "1*100000"` spent minutes drawing one bar per worker."""
    from staleness import plots

    sched = st.simulate_schedule("ssp:1", "0.5*600,2*600", num_updates=3000, seed=0)
    ax = plots.wait_fraction(sched).axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == plots.MAX_BARS and "19 per bar" in ax.get_xlabel()
    wf = sched.wait_fraction()
    assert abs(heights[0] - wf[:19].mean()) < 1e-12 and abs(heights[-1] - wf[19 * 63:].mean()) < 1e-12
