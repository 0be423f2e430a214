"""Control-plane regressions of the asynchronous-RL policies (no numerics)."""

import dataclasses

import numpy as np
import pytest

import staleness as st
from staleness.policies import Fresh, Policy, Rollout, gates


@pytest.mark.parametrize("eta", [0, 1, 2, 3])
def test_capacity_gate_with_small_batches_never_deadlocks_after_drops(eta):
    """8 actors, 2 rollouts per update: the first rollouts past the bound are dropped. The
    gate once counted dropped rollouts as if they would be consumed, so no actor could start
    again and the simulation ended silently after one update (the η = 0, 1 rows of the
    AReaL table were a few updates long)."""
    sched = st.simulate_schedule(f"rl_async:{eta}:batch=2", "1*8+jitter=0.5", num_updates=60, seed=0)
    assert sched.num_updates == 60
    assert sched.staleness[sched.applied].max() <= eta


def test_capacity_gate_frees_the_places_of_failed_actors():
    cluster = st.cluster.parse("1*8+jitter=0.5").failures([(w, 3.0 + w, None) for w in range(5)])
    sched = st.simulate_schedule("rl_async:1:batch=2", cluster, num_updates=80, seed=0)
    assert sched.num_updates == 80
    assert sched.staleness[sched.applied].max() <= 1


def test_throughput_rises_with_eta_on_small_batches():
    times = [st.simulate_schedule(f"rl_async:{e}:batch=2", "1*8+jitter=0.5", num_updates=60, seed=s).update_time[-1]
             for e in (0, 1, 2, 4) for s in (0,)]
    assert all(a > b for a, b in zip(times, times[1:]))


@dataclasses.dataclass(frozen=True)
class _Stuck(gates.Free):
    """A gate whose level never rises once its workers wait (the old capacity rule's bug)."""

    def level(self, state):
        return 0

    def after_push(self, state, worker, pull_version, now):
        return 1


def test_a_deadlocked_policy_is_an_error_not_a_short_run():
    p = Policy(_Stuck(), Fresh(None, 2), "stuck", Rollout())
    with pytest.raises(RuntimeError, match="'stuck' deadlocked after 2 updates"):
        st.simulate_schedule(p, "1*4", num_updates=10, seed=0)


def test_every_worker_dead_is_not_a_deadlock():
    cluster = st.cluster.constant(2).failures([(0, 2.5, None), (1, 2.5, None)])
    sched = st.simulate_schedule("asp", cluster, num_updates=100, seed=0)
    assert 0 < sched.num_updates < 100


def test_rl_async_zero_is_rl_sync_with_batches_of_one_per_actor():
    a = st.simulate_schedule("rl_async:0", st.cluster.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.2), num_updates=20)
    b = st.simulate_schedule("rl_sync", st.cluster.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.2), num_updates=20)
    for k in ("worker", "iteration", "pull_version", "apply_version"):
        np.testing.assert_array_equal(np.sort(a.columns[k]), np.sort(b.columns[k]))
    np.testing.assert_array_equal(a.update_time, b.update_time)


@pytest.mark.parametrize("m", [1, 2, 4])
def test_split_adds_staleness_one_version_per_optimizer_step(m):
    """miles#1697 / verl's counting: several optimizer steps per rollout batch, each a version
    of its own (split=m), silently add staleness: every round's rollouts are generated on one
    version and its j-th update consumes them j versions stale; m = 1 is plain rl_sync."""
    sched = st.simulate_schedule(f"rl_sync:split={m}", st.cluster.heterogeneous([1.0, 1.0, 1.5, 3.0]),
                                 num_updates=8 * m, seed=0)
    a = sched.applied
    np.testing.assert_array_equal(sched.staleness[a], sched.columns["apply_version"][a] % m)
    assert np.all(sched.columns["pull_version"][a] % m == 0)
    np.testing.assert_array_equal(np.bincount(sched.staleness[a]), [32 // m] * m)


@pytest.mark.parametrize("spec", ["rl_sync", "rl_one_step_off", "rl_async:2", "rl_inflight:1", "rl_partial:1"])
def test_minibatches_are_steps_within_a_version(spec):
    """AReaL's counting (minibatches=M): the M optimizer steps of a version are one version, so
    the schedule is the one of M = 1 (a version is what the actors pull) and the spec
    round-trips."""
    cluster = st.cluster.heterogeneous([1.0, 1.0, 1.5, 3.0]).jitter(0.2)
    one = st.simulate_schedule(spec, cluster, num_updates=10, seed=0)
    pol = st.policies.parse(f"{spec}:minibatches=4")
    assert pol.work.minibatches == 4 and st.policies.parse(pol.describe()) == pol
    four = st.simulate_schedule(pol, cluster, num_updates=10, seed=0)
    assert one.to_frame().drop(columns=[]).equals(four.to_frame())


def test_split_must_divide_the_actors():
    with pytest.raises(ValueError, match="split = 3 must divide the number of actors"):
        st.simulate_schedule("rl_sync:split=3", "1*4", num_updates=3)
    for bad in ("split", "minibatches"):
        with pytest.raises(ValueError, match=bad):
            st.policies.rl_sync(**{bad: 0})
    with pytest.raises(ValueError, match="minibatches"):
        st.policies.rl_async(2, minibatches=0)


def test_requeue_generates_a_dropped_rollouts_prompts_again_on_a_newer_version():
    """mode=requeue: a rollout staler than η is thrown away and the same actor generates the
    same prompts (its clock did not advance: the same iteration) next, on a newer version."""
    cluster = st.cluster.parse("1,1,1.5,3+jitter=0.5")
    sched = st.simulate_schedule("rl_async:1:mode=requeue", cluster, num_updates=60, seed=0)
    c = sched.columns
    dropped = np.flatnonzero(c["dropped"])
    assert len(dropped) > 0
    assert sched.staleness[sched.applied].max() <= 1
    for r in dropped:
        later = np.flatnonzero((c["worker"] == c["worker"][r]) & (np.arange(len(c["worker"])) > r))
        if len(later):
            nxt = later[0]
            assert c["iteration"][nxt] == c["iteration"][r] and c["pull_version"][nxt] > c["pull_version"][r]
    drop = st.simulate_schedule("rl_async:1:mode=drop", cluster, num_updates=60, seed=0).columns
    for w in range(4):   # in drop mode a worker's iterations never repeat
        assert len(np.unique(drop["iteration"][drop["worker"] == w])) == int((drop["worker"] == w).sum())
