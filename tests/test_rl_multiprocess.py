"""Asynchronous RL across processes: actors in worker processes, the learner on process 0.

2-3 local processes joined through `jax.distributed` on 127.0.0.1 (a free port per
test). An actor pulls the parameters of the version it was released on through the
transfer server, generates its rollout (tokens, behavior log-probs, mask, rewards,
lengths, prompt indices) and pushes it back the way a gradient is pushed; process 0's
learner computes the gradient at its current version and applies the update (the
same policy objects and Driver as the one-process run). The recorded trace replays
bit for bit (the replay generates every rollout again from its recorded pull version)
and its data staleness obeys the policy's bound.

Every process runs under a hard kill (its own session, SIGKILLed at the test's
deadline); every wait is bounded and fails with the processes' output. Tiny budgets:
the file runs in well under a minute on an idle 2-core machine.

Run as a script, this file is one process of such a job.
"""

import sys

import numpy as np
import pytest
from _jobs import Procs

DEADLINE = 120   # seconds: hard limit for the processes of one test
# No process dies in these tests, so the heartbeat timeout is only a margin: process 0's
# heartbeats were once held up past 5 s while the whole suite loaded the 2 cores (the
# service then declared it dead and every process aborted: exit 134); a lost process
# would still be seen well within DEADLINE.
HEARTBEAT = 20
UPDATES = 6
LR = 0.5


@pytest.fixture
def procs():
    p = Procs(DEADLINE)
    yield p
    p.kill()


def _task(num_workers: int):
    import staleness as st

    return st.tasks.get("rl-bandit", num_workers=num_workers, objective="reinforce")


def _child(port: int, n: int, pid: int, policy: str, out: str) -> int:
    """Process `pid` of an n-process job of rl-bandit with n actors (actor w in process w % n)."""
    from staleness.runtime import run_process

    # the task is built once jax.distributed is initialized (no JAX operation before it)
    result = run_process(lambda: _task(n), policy, coordinator=f"127.0.0.1:{port}", num_processes=n,
                         process_id=pid, num_workers=n, num_updates=UPDATES, lr=LR, num_evals=1,
                         worker_timeout=30, heartbeat_timeout=HEARTBEAT, init_timeout=60)
    if pid == 0:
        result.save(out)
        print(f"RESULT {result.status} {result.schedule.num_updates}", flush=True)
    elif result is not None:
        print(f"process {pid} returned a Result; only process 0 should", flush=True)
        return 4
    return 0


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("n, policy, bound", [(2, "rl_sync", 0), (3, "rl_async:1", 1)])
def test_actors_in_worker_processes_feed_the_learner_and_the_trace_replays_bitwise(procs, tmp_path, n, policy,
                                                                                    bound):
    import staleness as st
    from staleness.runtime.multiprocess import free_port
    from staleness.runtime.replay import replay_trace

    out = tmp_path / "out"
    port = free_port()
    for i in range(n):
        procs.spawn([sys.executable, __file__, str(port), str(n), str(i), policy, str(out)])
    codes = procs.finish()
    assert codes == [0] * n, procs.text()
    assert f"RESULT complete {UPDATES}" in procs.text(0), procs.text(0)[-3000:]

    res = st.Result.load(out)
    sched, f = res.schedule, res.schedule.columns
    assert res.config["processes"] == n and res.config["policy"] == policy
    assert res.config["transport"] == "coordination-service+jax.experimental.transfer"
    assert sched.num_updates == UPDATES
    # actor w ran in process w % n: every process generated rollouts that were trained on
    assert set(f["worker"][sched.applied] % n) == set(range(n))
    # data staleness (learner version - behavior version) within the policy's bound; rl_async:1
    # reaches it (an actor generates while the learner trains on the previous batch)
    stale = sched.staleness[sched.applied]
    assert np.all(stale >= 0) and stale.max() == bound, stale
    assert not f["lost"].any() and np.all(np.isfinite(res.train_loss))
    # the replay generates each rollout again from its recorded pull version and trains on it
    # in the recorded order: bit for bit the parameters of the real run (both on CPU)
    rep, same = replay_trace(res)
    assert same.bitwise, same
    assert rep.schedule.num_updates == UPDATES


@pytest.mark.timeout(DEADLINE + 30)
def test_staleness_launch_runs_rl_across_processes_and_replay_check_is_bitwise(procs, tmp_path):
    """The command line: `staleness launch --local 2` of rl-bandit (its default objective,
    rebuilt from the recorded config by the replay, as `staleness replay --check` does)."""
    import staleness as st
    from staleness.runtime.replay import replay_trace

    out = tmp_path / "out"
    procs.spawn([sys.executable, "-m", "staleness", "launch", "--local", "2", "--timeout", str(DEADLINE - 10),
                 "--task", "rl-bandit", "--policy", "rl_async:1", "--updates", str(UPDATES), "--lr", str(LR),
                 "--worker-timeout", "30", "--heartbeat-timeout", str(HEARTBEAT), "--no-progress", "--out", str(out)])
    codes = procs.finish()
    assert codes == [0], procs.text(0)[-3000:]
    res = st.Result.load(out)
    assert res.status == "complete" and res.config["processes"] == 2 and res.schedule.num_updates == UPDATES
    assert res.schedule.staleness[res.schedule.applied].max() <= 1
    rep, same = replay_trace(out)
    assert same.bitwise, same


@pytest.mark.timeout(DEADLINE + 30)
def test_inflight_actors_in_worker_processes_take_published_versions_and_replay_bitwise(procs, tmp_path):
    """`rl_inflight` across 2 processes: the server offers every version it completes to the
    actors mid-rollout on their process's channel (`Published`), each actor takes the ones
    that reach it before its decode ends, and the switches travel with its push."""
    import staleness as st
    from staleness.engine import plan as engine_plan

    out = tmp_path / "out"
    tiny = [x for opt in ("warm_start_steps=0", "num_layers=1", "d_model=16", "num_heads=2")
            for x in ("--task-option", opt)]
    procs.spawn([sys.executable, "-m", "staleness", "launch", "--local", "2", "--timeout", str(DEADLINE - 10),
                 "--task", "rl-digits", *tiny, "--policy", "rl_inflight:2", "--cluster", "3,3,1,1.5",
                 "--time-scale", "0.002", "--updates", "10", "--lr", "0.001", "--worker-timeout", "30",
                 "--heartbeat-timeout", str(HEARTBEAT), "--no-progress", "--out", str(out)])
    codes = procs.finish()
    assert codes == [0], procs.text(0)[-3000:]
    res = st.Result.load(out)
    sched = res.schedule
    assert res.status == "complete" and res.config["processes"] == 2 and sched.num_updates == 10
    switches = engine_plan.segment_lists(sched)   # checked against the rows: versions in (pull, apply]
    assert switches, "no version reached an actor mid-rollout"
    # in both processes: each holds a slow actor (workers 0 and 1; process p runs workers p, p + 2), whose
    # long decode window new versions reach even on a loaded machine (with process 0's actors the two
    # fastest, they took none under two CPU hogs)
    assert {int(sched.columns["worker"][r]) % 2 for r in switches} == {0, 1}, switches
    # `staleness replay --check` as a user runs it: in a process with the run's one CPU device (the
    # 8 virtual devices of this test process change the rounding of rl-digits' replay by ~3e-8)
    procs.spawn([sys.executable, "-m", "staleness", "replay", str(out), "--check"])
    codes = procs.finish()
    assert codes == [0, 0], procs.text(1)[-3000:]
    assert "bitwise equal" in procs.text(1), procs.text(1)[-3000:]


if __name__ == "__main__":
    sys.exit(_child(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]))
