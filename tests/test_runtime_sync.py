"""Collective sync and the sharded parameter server (8 virtual CPU devices, tests/conftest.py).

Differential checks first: collective BSP == parameter-server BSP == the
engine's replay of the collective run's trace, within the stated tolerance
(the collective sums the λ gradients with one psum, the server with a
tensordot over stacked slots: float32 sums of 8 terms in another order, so
each update may differ in the last bit; 1e-6 absolute on weights of order 0.1
after 40 updates is ~100 ulp of headroom); the sharded server's ASP, SSP and
DSSP traces replay bitwise. Then the choice itself (defaults, conflicts as
clear errors), resume under collectives, bytes per gradient, and a lost
worker under collectives (in a subprocess with 4 CPU devices set before any
JAX op: a hung device step must not outlive the test in this process).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

import staleness as st
import staleness.runtime as rt
from staleness import policies as P
from staleness.cli import main
from staleness.runtime.collective import RunAhead
from staleness.runtime.replay import compare_params
from staleness.runtime.spec import make_spec
from test_sim import check_invariants

TOLERANCE = 1e-6   # collective vs server vs replay: see the module docstring
CLUSTER = "1*4,2.6*4+jitter=0.2"
SCALE = 0.002


@pytest.fixture(scope="module")
def digits8():
    return st.tasks.get("digits-mlp", num_workers=8, batch_size=16)


@pytest.mark.timeout(300)
def test_collective_bsp_matches_server_bsp_and_the_replay_of_its_trace(digits8):
    kw = dict(num_updates=40, lr=0.05, seed=3, optimizer="momentum:0.9")
    coll = rt.run(digits8, "bsp", None, **kw)          # the default for BSP
    server = rt.run(digits8, "bsp", None, sync="server", **kw)
    assert coll.config["sync"] == "collective" and coll.schedule.meta["sync"] == "collective"
    assert server.config["sync"] == "server"
    assert coll.status == "complete" and coll.schedule.num_updates == 40
    check_invariants(coll.schedule, P.bsp(), 8)
    f = coll.schedule.columns
    assert np.all(f["pull_version"] == f["apply_version"])   # every round: all 8 workers, staleness 0
    assert np.all(np.bincount(f["apply_version"]) == 8)
    assert compare_params(coll.params, server.params).within(TOLERANCE)
    rep = st.engine.replay(coll.schedule, digits8, slot_mode="map", lr=0.05, seed=3, optimizer="momentum:0.9")
    assert compare_params(coll.params, rep.params).within(TOLERANCE)
    np.testing.assert_allclose(coll.train_loss, rep.train_loss, rtol=1e-5)
    np.testing.assert_allclose(coll.train_loss, server.train_loss, rtol=1e-5)
    # the server's own trace still replays bitwise
    rep = st.engine.replay(server.schedule, digits8, slot_mode="map", lr=0.05, seed=3, optimizer="momentum:0.9")
    assert compare_params(server.params, rep.params).bitwise
    assert list(coll.history["update"])[-1] == 40 and np.isfinite(coll.history["train_loss"][1:]).all()


@pytest.mark.timeout(300)
def test_pipelined_rounds_are_bitwise_the_unpipelined_ones(digits8, monkeypatch):
    """Within one process the next round is computed while the serve loop handles the
    last one (`RunAhead.start_after`): every round after the first is computed
    ahead and released by the policy, and the run is bitwise the one without it
    (same step, same inputs), trace and losses included."""
    kw = dict(num_updates=30, lr=0.05, seed=1, optimizer="adam")
    piped = rt.run(digits8, "bsp", None, **kw)
    assert piped.schedule.meta["rounds_ahead"] == 29
    monkeypatch.setattr(RunAhead, "start_after", lambda self, rnd: None)
    plain = rt.run(digits8, "bsp", None, **kw)
    assert plain.schedule.meta["rounds_ahead"] == 0
    assert compare_params(piped.params, plain.params).bitwise
    np.testing.assert_array_equal(piped.train_loss, plain.train_loss)
    for col in ("worker", "iteration", "pull_version", "apply_version"):
        np.testing.assert_array_equal(piped.schedule.columns[col], plain.schedule.columns[col])
    check_invariants(piped.schedule, P.bsp(), 8)


@pytest.mark.timeout(300)
def test_a_round_computed_ahead_and_not_released_is_dropped(digits8):
    """A run stopped by max_time ends with rounds on the devices that no update applies:
    the one the policy released with the last update (in flight, as in any run) and
    the one computed ahead after it, never released (not counted). Neither changes the
    parameters: they are bitwise those of a run of as many updates."""
    stopped = rt.run(digits8, "bsp", None, num_updates=100_000, max_time=0.5, lr=0.05, seed=2)
    k = stopped.schedule.num_updates
    assert stopped.status == "complete" and 1 < k < 100_000
    assert stopped.schedule.meta["rounds_ahead"] == k   # rounds 1 .. k, the last one released, in flight
    again = rt.run(digits8, "bsp", None, num_updates=k, lr=0.05, seed=2)
    assert compare_params(stopped.params, again.params).bitwise


@pytest.mark.timeout(300)
def test_collective_with_several_workers_per_device_and_an_lr_rule():
    task = st.tasks.get("quadratic", num_workers=8)
    kw = dict(num_updates=30, lr=0.05, lr_rule="per_update", devices=4, num_workers=8)
    coll = rt.run(task, "bsp", None, sync="collective", on_worker_failure="stop", **kw)
    assert len(coll.config["devices"]) == 4 and coll.schedule.num_workers == 8
    server = rt.run(task, "bsp", None, sync="server", **kw)
    assert compare_params(coll.params, server.params).within(TOLERANCE)


@pytest.mark.timeout(300)
def test_collective_rounds_last_as_long_as_the_slowest_injected_worker():
    """A cluster's delays under sync='collective': 2 fast workers (1 s) and 2 slow ones
    (4 s) at time_scale 0.01, so every round lasts at least the slow workers' 40 ms
    and each worker's recorded span is its own; the numbers are those of the same run
    without delays (bitwise: the same steps on the same inputs)."""
    task = st.tasks.get("quadratic", num_workers=4)
    kw = dict(num_updates=20, lr=0.05, devices=4, num_workers=4, sync="collective", time_scale=0.01)
    slow = rt.run(task, "bsp", "1*2,4*2", **kw)
    plain = rt.run(task, "bsp", None, **kw)
    assert slow.config["sync"] == "collective" and slow.config["cluster"] == "1*2,4*2"
    assert compare_params(slow.params, plain.params).bitwise
    rounds = np.diff(np.concatenate([[0.0], slow.schedule.update_time]))
    assert rounds.min() >= 0.04 * 0.95, rounds                       # the slowest worker's injected time
    assert rounds.mean() <= 0.04 * 3, rounds                         # and not much more (margin for load)
    f = slow.schedule.columns
    span = f["end"] - f["start"]
    fast_span, slow_span = np.median(span[f["worker"] < 2]), np.median(span[f["worker"] >= 2])
    assert slow_span >= 0.04 * 0.95 and slow_span > 2 * fast_span, (fast_span, slow_span)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("spec, lr_rule, optimizer", [
    ("asp", "per_gradient", "momentum:0.9"),
    ("ssp:3", "constant", "adam"),
    ("dssp:3:12", "constant", "sgd"),
])
def test_sharded_server_traces_replay_bitwise(digits8, spec, lr_rule, optimizer):
    kw = dict(lr=0.05, lr_rule=lr_rule, optimizer=optimizer, seed=4)
    res = rt.run(digits8, spec, CLUSTER, num_updates=60, time_scale=SCALE, server_devices=8, **kw)
    assert res.config["sync"] == "server" and len(res.config["server_devices"]) == 8
    check_invariants(res.schedule, P.parse(spec), 8)
    rep = st.engine.replay(res.schedule, digits8, slot_mode="map", **kw)
    assert compare_params(res.params, rep.params).bitwise


def test_the_layout_of_the_sharded_server():
    from staleness.runtime.sharding import ServerPlacement

    placement = ServerPlacement(jax.local_devices())
    params = {"w": np.zeros((64, 3), np.float32), "b": np.zeros((10,), np.float32), "s": np.float32(0)}
    placed = placement.put(params)
    assert len(placed["w"].sharding.device_set) == 8 and placed["w"].addressable_shards[0].data.shape == (8, 3)
    assert placed["b"].sharding.is_fully_replicated and placed["s"].sharding.is_fully_replicated
    with pytest.raises(ValueError, match="aggregates"):
        rt.run("quadratic", "bsp", "1*4", num_updates=5, server_devices=2)


@pytest.mark.parametrize("policy, cluster, failure, expected", [
    ("bsp", None, None, ("collective", "stop")),
    ("bsp", None, "continue", ("server", "continue")),    # worker-level fault tolerance asked for
    ("bsp", "1*4", None, ("server", "continue")),         # injected delays need worker threads
    ("asp", None, None, ("server", "continue")),
    ("ssp:3", None, "stop", ("server", "stop")),
])
def test_default_sync(policy, cluster, failure, expected):
    spec = make_spec("quadratic", policy, cluster, num_updates=5, num_workers=4, on_worker_failure=failure)
    assert (spec.sync, spec.on_worker_failure) == expected
    assert spec.config()["sync"] == expected[0]


def test_several_processes_default_to_the_server_and_take_collectives_when_asked():
    spec = make_spec("quadratic", "bsp", None, num_updates=5, num_workers=4, processes=2)
    assert (spec.sync, spec.on_worker_failure) == ("server", "continue")   # rejoins and fault tolerance
    spec = make_spec("quadratic", "bsp", None, num_updates=5, num_workers=4, processes=2, sync="collective")
    assert (spec.sync, spec.on_worker_failure) == ("collective", "stop")


def test_the_collective_mesh_takes_as_many_devices_of_every_process():
    from types import SimpleNamespace

    from staleness.runtime.collective import mesh_devices

    devs = [SimpleNamespace(process_index=p, id=10 * p + i) for p in range(2) for i in range(4)]
    ids = lambda ds: [d.id for d in ds]  # noqa: E731
    assert ids(mesh_devices(8, devs)) == [0, 1, 2, 3, 10, 11, 12, 13]
    assert ids(mesh_devices(4, devs)) == [0, 1, 10, 11]
    assert ids(mesh_devices(6, devs)) == [0, 1, 2, 10, 11, 12]
    assert ids(mesh_devices(2, devs)) == [0, 10]
    with pytest.raises(ValueError, match="num_workers = 3 must be a multiple of the 2 processes"):
        mesh_devices(3, devs)
    assert ids(mesh_devices(6, devs[:4])) == [0, 1, 2]    # one process: the most that divide λ


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(sync="collective", on_worker_failure="continue"), "on_worker_failure = 'continue' needs sync='server'"),
    (dict(policy="asp", sync="collective"), "'asp' needs sync='server'"),
    (dict(policy="backup:1", sync="collective"), "'backup:1' needs sync='server'"),
    (dict(cluster="1*4+fail=2@5", sync="collective"), "the failure model of cluster"),
    (dict(sync="lockstep"), "sync = 'lockstep' must be one of"),
])
def test_sync_conflicts_are_value_errors_naming_them(kwargs, fragment):
    args = dict(policy="bsp", cluster=None, num_updates=5, num_workers=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        rt.run("quadratic", args.pop("policy"), args.pop("cluster"), **args)


@pytest.mark.parametrize("argv, fragment", [
    (["--sync", "collective", "--on-worker-failure", "continue"], "--on-worker-failure = 'continue'"),
    (["--sync", "collective", "--policy", "asp"], "needs sync='server'"),
    (["--sync", "nope"], "--sync = 'nope'"),
    (["--sync", "collective", "--cluster", "1*4+fail=1@3-9"], "the failure model of cluster"),
])
def test_cli_sync_conflicts_one_line_exit_2(argv, fragment, capsys):
    code = main(["run", "--policy", "bsp", "--updates", "5", *argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:") and fragment in lines[0], lines


@pytest.mark.timeout(300)
def test_collective_resume_continues_bitwise(tmp_path):
    task = st.tasks.get("quadratic", num_workers=4)
    kw = dict(lr=0.05, optimizer="momentum:0.9", seed=2, devices=4, sync="collective")
    whole = rt.run(task, "bsp", None, num_updates=50, **kw)
    rt.run(task, "bsp", None, num_updates=30, checkpoint=tmp_path / "c", checkpoint_every=20, **kw)
    res = rt.run(task, "bsp", None, num_updates=50, checkpoint=tmp_path / "c", resume=True, **kw)
    assert res.schedule.num_updates == 50 and res.config["sync"] == "collective"
    assert compare_params(whole.params, res.params).bitwise
    np.testing.assert_array_equal(res.train_loss, whole.train_loss)


@pytest.mark.timeout(300)
def test_bytes_per_gradient_match_the_network_models_count(digits8):
    """The trace's pull/push bytes are the network model's count for the same pytree
    (`engine.payload`, what `simulate` times): the parameters per pull, a gradient per
    push, nothing pushed by a lost gradient; under collectives a ring all-reduce share."""
    from staleness.cluster import network
    from staleness.engine.payload import payload_bytes, tree_bytes

    quad = st.tasks.get("quadratic", num_workers=4)
    pull, push = payload_bytes(quad, P.ssp(2))
    assert pull == push == tree_bytes(quad.init_params(jax.random.key(0))) > 0
    res = rt.run(quad, "ssp:2", "1*4+fail=1@5", num_updates=40, time_scale=0.01)
    f = res.schedule.columns
    assert np.all(f["pull_bytes"] == pull) and np.all(f["push_bytes"][~f["lost"]] == push)
    assert f["lost"].any() and np.all(f["push_bytes"][f["lost"]] == 0)   # pulled, never pushed
    coll = rt.run(digits8, "bsp", None, num_updates=4, lr=0.05)
    cf = coll.schedule.columns
    nbytes = payload_bytes(digits8, P.bsp())[1]
    transfer, _ = network.allreduce_parts("ring", nbytes, 8, 1.0, 0.0)   # seconds at 1 byte/s = bytes
    assert np.all(cf["pull_bytes"] == 0) and np.all(cf["push_bytes"] == int(transfer))


def test_progress_line_shows_gradients_per_second_and_server_busy():
    from staleness.runtime.progress import format_progress

    line = format_progress({"updates": 5, "num_updates": 10, "time": 1.0, "updates_per_s": 5.0,
                            "gradients_per_s": 40.0, "server_busy": 0.25, "staleness_mean": 0.0,
                            "staleness_max": 0, "live": 8, "workers": 8, "clocks": [5] * 8})
    assert "40.0 grad/s" in line and "server busy 25%" in line


@pytest.mark.parametrize("sync", ["collective", "server"])
def test_the_progress_line_ends_on_the_final_state(sync):
    """A short run's line stayed at its first report (0/200 or 1/200): the last one is
    the run's end."""
    seen = []
    res = rt.run("quadratic", "bsp", None, num_workers=4, num_updates=30, lr=0.05, sync=sync, progress=seen.append)
    assert res.status == "complete" and seen and seen[-1]["updates"] == 30 == seen[-1]["num_updates"]


_LOST = textwrap.dedent("""
    import os, sys, time
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import dataclasses
    import numpy as np
    import staleness as st
    import staleness.runtime as rt

    task = st.tasks.get("quadratic", num_workers=4)

    def hang(w, i):
        if int(w) == 3 and int(i) >= 5:
            time.sleep(600)
        return np.int32(0)

    def sample(data, key, w, i):
        z = jax.experimental.io_callback(hang, jax.ShapeDtypeStruct((), np.int32), w, i)
        batch = base(data, key, w, i)
        return dict(batch, index=batch["index"] + z)

    base = task.sample_fn
    task = dataclasses.replace(task, sample_fn=sample)
    t0 = time.monotonic()
    try:
        rt.run(task, "bsp", None, num_updates=10_000, worker_timeout=3.0, lr=0.05)
        print("NO ERROR")
    except rt.WorkerLostError as e:
        print(f"ERROR {type(e).__name__}: {e}")
        print(f"ELAPSED {time.monotonic() - t0:.1f}")
        print(f"RESULT {e.result.status} {e.result.schedule.num_updates} {e.result.config['sync']}")
        sched = e.result.schedule
        print(f"WAITED {sched.end_time - sched.update_time[-1]:.2f}")   # from the last update to the stop
    sys.stdout.flush()
    os._exit(0)   # the hung device thread must not keep this process alive
""")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("eval_every", [None, 5])
def test_a_lost_worker_under_collectives_stops_the_run_naming_it(eval_every):
    """Worker 3's step hangs at iteration 5 (an io_callback sleeps 600 s); within
    worker_timeout (3 s) of the round's start the run stops: WorkerLostError naming
    the round's unfinished workers, with the Result so far. In one process the other
    devices wait for worker 3 in the all-reduce, so all four are unfinished and named.
    The hung round is computed ahead (pipelined rounds); with eval_every=5 the serve
    loop first waits for it to fetch losses at update 5's evaluation point, and its
    deadline still runs from when it could start (not twice worker_timeout)."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("XLA_FLAGS", None)
    code = _LOST if eval_every is None else _LOST.replace("lr=0.05)", f"lr=0.05, eval_every={eval_every})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150, env=env)
    text = out.stdout + out.stderr
    assert "ERROR WorkerLostError: worker 0 lost: the collective step of iteration 5 did not finish" in text, text
    assert "on the devices of workers 0, 1, 2, 3;" in text and "worker_timeout = 3 s" in text, text
    assert "a collective cannot go on without it" in text, text
    assert "RESULT stopped 5 collective" in text, text   # the 5 rounds before the hung one
    waited = float(text.split("WAITED ")[1].split()[0])
    assert 2.5 <= waited < 5.5, text   # about one worker_timeout after the last update, not two
    elapsed = float(text.split("ELAPSED ")[1].split()[0])
    assert elapsed < 100, text   # far below the 600 s hang: the run did not wait for it


@pytest.mark.timeout(300)
def test_cli_replay_check_of_a_collective_run_takes_its_tolerance(digits8, tmp_path, capsys):
    """`staleness replay --check` of a run recorded under collectives accepts float32
    rounding of the all-reduce (the README's 1e-6) by default; --tolerance 0 asks for bits."""
    res = rt.run(digits8, "bsp", None, num_updates=40, lr=0.05, seed=3, optimizer="momentum:0.9",
                 sync="collective")
    res.save(tmp_path / "coll")
    diff = compare_params(res.params, st.engine.replay(res.schedule, digits8, slot_mode="map", lr=0.05, seed=3,
                                                       optimizer="momentum:0.9").params)
    assert not diff.bitwise and diff.within(TOLERANCE)   # the case this test is about
    assert main(["replay", str(tmp_path / "coll"), "--check"]) == 0
    assert "equal within the tolerance (max |difference|" in capsys.readouterr().out
    assert main(["replay", str(tmp_path / "coll"), "--check", "--tolerance", "0"]) == 1
    assert "differ (max |difference|" in capsys.readouterr().out
