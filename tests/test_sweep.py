"""Sweeps over devices and processes, pinned padding, and `staleness sweep`.

The contract: a configuration's Result does not depend on where it ran. The
configuration axis sharded over 4 or 8 virtual CPU devices (`shard_map`, each
device the unchanged batched replay), or split over 2 processes of a
`jax.distributed` job, gives the same bits as one device. Device counts are set
with `jax_num_cpu_devices` before JAX starts, so those checks run in a child
process; the 2-process job runs under one hard deadline (SIGKILL of every
process's session: a hung JAX process ignores SIGTERM) on its own free port.
Nothing here asserts on timings.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from _jobs import ROOT, Procs, child_env

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.cli import main
from staleness.engine import sweeps
from staleness.engine.result import Result

DEADLINE = 300   # seconds: hard limit for the child processes of one test

GRID = ("asp", "softsync:2")
ARGS = ["--policy", "asp", "--policy", "softsync:2", "--seeds", "0,1", "--lr-rules", "constant,per_gradient",
        "--updates", "40", "--eval-every", "10", "--batch-size", "8", "--cluster", "1,1.3,2,2.6", "--no-progress"]


def _equal_tree(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _same(a: Result, b: Result) -> bool:
    return (_equal_tree(a.params, b.params) and a.history.equals(b.history)
            and np.array_equal(a.train_loss, b.train_loss, equal_nan=True) and a.status == b.status)


@pytest.fixture(scope="module")
def digits4():
    return st.tasks.get("digits-mlp", batch_size=8, num_workers=4)


CLUSTER = C.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1)


# -- devices -----------------------------------------------------------------------------
_CHILD = r"""
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
import numpy as np
import staleness as st
from staleness import cluster as C
from staleness.engine import sweeps
task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
grid = sweeps.prepare(task, ["asp", "softsync:2", "ssp:1"], C.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1),
                      seeds=[0, 1], lr_rules=["constant", "per_gradient"], lrs=[0.1], num_updates=30, eval_every=10)
one = sweeps.replay_grid(grid, block=2)
many = sweeps.replay_grid(grid, devices=int(sys.argv[1]), block=2)
sub = sweeps.replay_grid(grid, [5, 4], block=2)   # a process's share: whole blocks, in any order
def same(a, b):
    return (all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
            and a.history.equals(b.history) and np.array_equal(a.train_loss, b.train_loss, equal_nan=True))
print(json.dumps({"devices": len(jax.devices()), "configs": len(one), "used": many[0].config["devices"],
                  "same": [bool(same(a, b)) for a, b in zip(one, many)],
                  "share": [bool(same(one[5], sub[0])), bool(same(one[4], sub[1]))]}))
"""


@pytest.mark.parametrize("n", [4, 8])
def test_sharded_sweep_is_bitwise_the_single_device_sweep(n):
    """12 configurations in blocks of 2 on n virtual devices (6 blocks: 2 rounds on 4
    devices, 1 round with 2 padding blocks on 8)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(n)], cwd=ROOT, env=child_env(None),
                         capture_output=True, text=True, timeout=DEADLINE)   # timeout: SIGKILL
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["devices"] == n and len(got["used"]) == n and got["configs"] == 12
    assert all(got["same"]), f"configurations that differ from the one-device sweep: {got}"
    assert all(got["share"]), f"a share of whole blocks differs from the whole grid: {got}"


def test_sharded_sweep_in_process_equals_sweep(digits4):
    """devices= through `st.sweep` itself (conftest gives this process 8 CPU devices)."""
    kw = dict(seeds=[0], lr_rules=["constant"], lrs=[0.1, 0.2], num_updates=20, eval_every=10)
    one = st.sweep(digits4, GRID, CLUSTER, **kw)
    two = st.sweep(digits4, GRID, CLUSTER, devices=2, **kw)
    assert [r.config["devices"] for r in two][0] == [str(d) for d in jax.local_devices()[:2]]
    assert all(_same(a, b) for a, b in zip(one, two))


@pytest.mark.parametrize("cores, block", [(1, 8), (2, 4), (3, 3), (16, 1)])
def test_the_default_block_gives_every_core_a_call(digits4, monkeypatch, cores, block):
    """8 configurations on one CPU device: one call of 8 ran on one core while the other idled
    (the threads run a chunk's calls, and there was one); the default block now cuts them
    into a call per core (what `prepare`'s docs promise: every core), the same numbers."""
    kw = dict(seeds=[0, 1], lr_rules=["constant"], lrs=[0.1, 0.2], num_updates=20, eval_every=10)
    whole = st.sweep(digits4, GRID, CLUSTER, block=8, **kw)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    got = st.sweep(digits4, GRID, CLUSTER, **kw)
    assert {r.config["block"] for r in got} == {block}
    assert all(_same(a, b) for a, b in zip(whole, got))
    assert sweeps.grid_block(sweeps.prepare(digits4, GRID, CLUSTER, **kw), None, devices=4) == 2   # 8 over 4 devices


def test_bad_devices(digits4):
    with pytest.raises(ValueError, match="devices = 99 must be in 1.."):
        st.sweep(digits4, ["asp"], CLUSTER, num_updates=5, devices=99)
    with pytest.raises(ValueError, match="devices = 'gpu'"):
        st.sweep(digits4, ["asp"], CLUSTER, num_updates=5, devices="gpu")


# -- pinned padding, compile time ---------------------------------------------------------
def test_pinned_ring_and_slots_compile_once_for_two_grids(digits4):
    kw = dict(seeds=[0], lrs=[0.1], num_updates=24, eval_every=12, ring=16, slots=2, block=2)
    from staleness.engine import core

    a = st.sweep(digits4, ["asp", "softsync:2"], CLUSTER, **kw)
    traces = core.run_chunk_batched._cache_size()   # one device: the engine's batched replay
    # other policies that compile to the same variants (one gradient per update, two)
    b = st.sweep(digits4, ["ssp:2", "softsync:2"], CLUSTER, **kw)
    assert core.run_chunk_batched._cache_size() == traces, "a grid with the same pins recompiled"
    assert {r.config["ring"] for r in a + b} == {16} and {r.config["slots"] for r in a + b} == {2}
    assert all(r.config["compile_s"] >= 0 and r.config["sweep_s"] > 0 for r in a + b)
    # pinning does not change the numbers: the ring's size only changes where versions live
    free = st.sweep(digits4, ["ssp:2"], CLUSTER, seeds=[0], lrs=[0.1], num_updates=24, eval_every=12, slots=2,
                    block=2)
    assert free[0].config["ring"] != 16 and _same(free[0], b[0])


def test_pins_too_small_are_refused(digits4):
    with pytest.raises(ValueError, match=r"ring = 1 is too small .* need \d+"):
        st.sweep(digits4, ["asp"], CLUSTER, num_updates=20, ring=1)
    with pytest.raises(ValueError, match=r"slots = 1 is too small .* need 2"):
        st.sweep(digits4, ["softsync:2"], CLUSTER, num_updates=20, slots=1)
    with pytest.raises(ValueError, match="ring = 0 must be an integer >= 1"):
        st.sweep(digits4, ["asp"], CLUSTER, num_updates=20, ring=0)


def test_every_swept_lr_must_agree_with_the_optimizers_own(digits4):
    """An optimizer spec naming lr= and a sweep over other rates is refused for every
    rate, not only the first (the second rate was applied while the Result recorded
    the spec's lr, and replaying that Result was then refused)."""
    for lrs in ([1e-3, 1e-2], [1e-2, 1e-3]):
        with pytest.raises(ValueError, match=r"names lr=0.001 and lr = 0.01 was given too"):
            st.sweep(digits4, ["asp"], CLUSTER, num_updates=20, optimizer="adam:lr=1e-3", lrs=lrs)


def test_grid_shares_are_contiguous_and_cover_the_grid():
    from staleness.engine.distributed import share

    for b in (1, 5, 12):
        for n in (1, 2, 3, 4):
            for block in (1, 2, 8):
                parts = [share(b, n, p, block) for p in range(n)]
                assert sum(parts, []) == list(range(b))
                assert all(not part or part[0] % block == 0 for part in parts), "shares are whole blocks"
    with pytest.raises(ValueError, match="block = 0"):
        sweeps.grid_block(sweeps.prepare(st.tasks.get("quadratic", num_workers=4), ["asp"], CLUSTER,
                                         num_updates=4), 0)


# -- processes -----------------------------------------------------------------------------
def test_two_processes_gather_the_single_process_sweep(tmp_path, digits4):
    from staleness.runtime.multiprocess import free_port

    port = free_port()
    procs = Procs(DEADLINE)
    try:
        for i in range(2):
            procs.spawn([sys.executable, "-m", "staleness", "sweep", *ARGS, "--block", "4", "--out", str(tmp_path / "two"),
                         "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)])
        procs.finish()
    finally:
        procs.kill()
    assert [p.returncode for p in procs.procs] == [0, 0], procs.text()
    single = st.sweep(digits4, GRID, C.parse("1,1.3,2,2.6"), seeds=[0, 1], lr_rules=["constant", "per_gradient"],
                      lrs=[0.1], num_updates=40, eval_every=10, block=4)
    table = (tmp_path / "two" / "table.csv").read_text().splitlines()
    assert len(table) == 1 + len(single)
    for i, r in enumerate(single):
        got = Result.load(tmp_path / "two" / "results" / str(i))
        assert got.config["processes"] == 2 and got.config["process"] == (0 if i < 4 else 1)
        assert got.config["block"] == 4
        assert _equal_tree(got.params, r.params), f"configuration {i}: params differ from one process"
        np.testing.assert_array_equal(got.history.to_numpy(float), r.history.to_numpy(float))
        np.testing.assert_array_equal(got.train_loss, r.train_loss)


# -- the command line ---------------------------------------------------------------------------
def test_cli_sweep_writes_one_row_per_configuration(tmp_path, capsys):
    out = tmp_path / "grid"
    assert main(["sweep", *ARGS[:-1], "--lrs", "0.1,0.2", "--out", str(out), "--no-progress"]) == 0
    import pandas as pd

    table = pd.read_csv(out / "table.csv")
    assert len(table) == 16 and list(table.columns[:5]) == ["config", "policy", "seed", "lr_rule", "lr"]
    assert set(table["policy"]) == {"asp", "softsync:2"} and set(table["lr"]) == {0.1, 0.2}
    assert (table["status"] == "complete").all() and "final_accuracy" in table
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["configurations"] == 16 and meta["compile_s"] >= 0 and meta["wall_s"] > 0
    r = Result.load(out / "results" / "05")
    assert r.config["sweep_index"] == 5 and r.config["lr"] == table["lr"][5]
    assert "compilation" in capsys.readouterr().out
    # an existing sweep output is refused, and replaced with --overwrite
    again = ["sweep", *ARGS[:-1], "--lrs", "0.1", "--out", str(out), "--no-progress"]
    assert main(again) == 2 and "--overwrite" in capsys.readouterr().err
    assert main([*again, "--overwrite"]) == 0
    assert len(pd.read_csv(out / "table.csv")) == 8 and not (out / "results" / "08").exists()


def test_cli_sweep_local_steps_expand_local_methods(tmp_path):
    out = tmp_path / "h"
    assert main(["sweep", "--policy", "diloco:2", "--local-steps", "1,3", "--updates", "4", "--eval-every", "2",
                 "--batch-size", "8", "--cluster", "1,1,2,2", "--out", str(out), "--no-progress"]) == 0
    import pandas as pd

    table = pd.read_csv(out / "table.csv")
    assert list(table["policy"]) == ["diloco:1", "diloco:3"] and list(table["local_steps"]) == [1, 3]


def test_cli_sweep_table_gives_streaming_diloco_its_h(tmp_path):
    """A Streaming DiLoCo iteration is H / fragments inner steps; the table's local_steps is H."""
    out = tmp_path / "s"
    assert main(["sweep", "--policy", "streaming_diloco:4:fragments=2", "--seeds", "0,1", "--updates", "4",
                 "--eval-every", "2", "--batch-size", "8", "--cluster", "1,1,2,2", "--out", str(out),
                 "--no-progress"]) == 0
    import pandas as pd

    assert list(pd.read_csv(out / "table.csv")["local_steps"]) == [4, 4]


@pytest.mark.parametrize("argv, message", [
    (["--policy", "asp", "--local-steps", "2"], "no --policy is one"),
    (["--policy", "asp", "--policy", "diloco:2"], "need separate sweeps"),
    (["--policy", "streaming_diloco:4:fragments=2", "--local-steps", "4,8"],
     "streaming_diloco:8 need one sweep each (H and the fragment settings"),
    (["--seeds", "a"], "--seeds = 'a'"),
    (["--lrs", "0.1,-1"], "--lrs = '0.1,-1'"),
    (["--lr-rules", "bogus"], "bogus"),
    (["--updates", "5", "--max-time", "3"], "either --updates or --max-time"),
    (["--coordinator", "127.0.0.1:1"], "need all of --coordinator"),
    (["--timeout", "5"], "--timeout applies to --launch-local"),
    (["--policy", "nope"], "unknown policy"),
])
def test_cli_sweep_refuses_bad_arguments_before_computing(tmp_path, capsys, argv, message):
    assert main(["sweep", *argv, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_sweep_checks_out_before_computing(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(sweeps, "replay_grid", lambda *a, **k: pytest.fail("computed before checking --out"))
    assert main(["sweep", "--out", str(tmp_path / "file")]) == 2
    assert "--out" in capsys.readouterr().err


def test_sweep_schedules_carry_the_task_payload_as_simulate_does(digits4):
    cluster = "1,1.3,2,2.6+net=10mbps:1ms"
    swept = st.sweep(digits4, ["asp"], cluster, seeds=[0], lrs=[0.1], num_updates=12, eval_every=6)[0]
    single = st.simulate(digits4, "asp", cluster, seed=0, lr=0.1, num_updates=12, eval_every=6)
    assert swept.schedule.equals(single.schedule)
    assert swept.schedule.columns["push_bytes"].max() > 0


def test_a_policy_that_is_no_policy_is_a_type_error():
    """`st.sweep(task, [42], ...)` raised AttributeError (it skipped `policies.resolve`);
    `simulate` raises the documented TypeError, and so does the sweep now."""
    task = st.tasks.get("quadratic", num_workers=4)
    with pytest.raises(TypeError, match="policy = 42 must be a staleness.policies.Policy"):
        st.sweep(task, [42], CLUSTER, num_updates=2)
    with pytest.raises(TypeError, match="policies = 'ssp:3' must be a list"):
        st.sweep(task, "ssp:3", CLUSTER, num_updates=2)
