"""The one chunk loop (`staleness.engine.chunks`) and the one checkpoint format
(`staleness.infra.checkpoint`) in their callers: replay, sweep and the pipeline.

Divergence: every caller names the update, the worker (pipeline: the stage) and
the staleness of the first non-finite loss. Resume: a run stopped after a chunk
and resumed from its checkpoint equals the uninterrupted run bitwise (same
compiled programs, same inputs; only wall-clock columns differ).
"""

import json

import jax
import numpy as np
import pytest

import staleness as st
import staleness.pipeline as pp
from staleness.infra import checkpoint
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import chunks
from staleness.engine.result import DivergenceError

MESSAGE = r"non-finite loss at update \d+ \(gradient of {kind} \d+, .*staleness \d+\); try a smaller lr"


def _equal_tree(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def quadratic4():
    return st.tasks.get("quadratic", num_workers=4)


@pytest.fixture(scope="module")
def digits3():
    return pp.tasks.get("digits-resmlp", num_stages=3, batch_size=8, width=32)


# -- the checkpoint format -------------------------------------------------------------
def test_checkpoint_roundtrip_is_exact_and_checks_identity(tmp_path):
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7, "n": np.int32(3),
            "h": (np.array([1.5, np.nan], np.float64),)}
    meta = {"rows": [{"update": 0, "loss": float("nan")}, {"update": 4, "loss": 0.1 + 0.2}], "next": 2}
    checkpoint.save(tmp_path, tree, meta, match={"seed": 1, "lags": (1, 2)})
    got_meta, got = checkpoint.load(tmp_path, tree, match={"seed": 1, "lags": [1, 2]})
    assert _equal_tree(got, tree) or all(np.array_equal(x, y, equal_nan=True) for x, y in
                                         zip(jax.tree.leaves(got), jax.tree.leaves(tree)))
    assert got_meta["rows"][1]["loss"] == 0.1 + 0.2 and np.isnan(got_meta["rows"][0]["loss"])
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"written with .*'seed': \(1, 2\)"):
        checkpoint.load(tmp_path, tree, match={"seed": 2, "lags": [1, 2]})
    with pytest.raises(checkpoint.CheckpointMismatch, match="another model or layout"):
        checkpoint.load(tmp_path, {"w": np.zeros((3, 2), np.float32), "n": np.int32(0), "h": (np.zeros(2),)},
                        match={"seed": 1, "lags": [1, 2]})
    with pytest.raises(FileNotFoundError, match="no other.json"):
        checkpoint.load(tmp_path, tree, name="other")


def test_checkpoint_replaces_its_arrays_and_never_points_at_missing_ones(tmp_path):
    for i in range(3):
        checkpoint.save(tmp_path, [np.full(3, i, np.float32)], {"i": i})
    doc = json.loads((tmp_path / "state.json").read_text())
    npz = sorted(p.name for p in tmp_path.glob("*.npz"))
    assert npz == [doc["arrays"]], "the previous arrays file is removed once the new JSON is in place"
    meta, leaves = checkpoint.load(tmp_path)
    assert meta == {"i": 2} and np.array_equal(leaves[0], np.full(3, 2, np.float32))
    (tmp_path / doc["arrays"]).unlink()
    with pytest.raises(ValueError, match="missing or damaged"):
        checkpoint.load(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"format_version": 1}))
    with pytest.raises(ValueError, match="format_version 1 is not supported"):
        checkpoint.load(tmp_path)


def test_checkpoint_restores_onto_the_template_sharding(tmp_path):
    devs = jax.devices()[:2]
    mesh = jax.sharding.Mesh(np.asarray(devs), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    x = jax.device_put(np.arange(8, dtype=np.float32), sharding)
    checkpoint.save(tmp_path, {"x": x}, {})
    _, got = checkpoint.load(tmp_path, {"x": jax.device_put(np.zeros(8, np.float32), sharding)})
    assert got["x"].sharding == sharding and np.array_equal(np.asarray(got["x"]), np.arange(8))


# -- the loop's pieces ---------------------------------------------------------------
def test_history_stop_keeps_only_recorded_steps():
    h = chunks.History(10, {"update": 0})
    h.losses(0, [1.0, 2.0, 3.0])
    h.add({"update": 3})
    h.losses(3, [4.0, 5.0])          # a chunk whose row never came (Ctrl-C during its evaluation)
    h.stop()
    assert h.status == "stopped" and h.train_loss[:3].tolist() == [1.0, 2.0, 3.0]
    assert np.isnan(h.train_loss[3:]).all()


def test_run_stops_on_false_and_marks_histories():
    calls = []
    h = chunks.History(4, {"update": 0})

    def record(k, carry, out, wall):
        calls.append((k, int(out)))
        h.add({"update": k + 1})
        return k < 1

    carry, status, _ = chunks.run(lambda c, x: (c + 1, x * 10), 0, num_chunks=4, inputs=lambda k: k,
                                  record=record, histories=[h])
    assert calls == [(0, 0), (1, 10)] and carry == 2 and status == "stopped" and h.status == "stopped"


def test_with_capture_the_next_chunk_is_dispatched_before_the_record():
    """capture=: `record` gets what was captured of chunk k's carry, and chunk k + 1 is
    already dispatched when it runs; a stop wastes that chunk, records nothing of it."""
    events = []

    def step(c, x):
        events.append(("step", x))
        return c + 1, x * 10

    def record(k, seen, out, wall):
        events.append(("record", k, seen, int(out)))
        return k < 1

    carry, status, _ = chunks.run(step, 0, num_chunks=4, inputs=lambda k: k, record=record,
                                  capture=lambda c: ("seen", c))
    assert events == [("step", 0), ("step", 1), ("record", 0, ("seen", 1), 0), ("step", 2),
                      ("record", 1, ("seen", 2), 10)]
    assert status == "stopped" and carry == 3   # chunk 2 ran ahead, unrecorded
    with pytest.raises(ValueError, match="capture"):
        chunks.run(step, 0, num_chunks=2, inputs=lambda k: k, record=record, capture=lambda c: c,
                   save=lambda k, c: None)


@pytest.mark.parametrize("stop_after", [None, 9])
def test_a_replay_recorded_ahead_is_the_replay_recorded_after(quadratic4, monkeypatch, stop_after):
    from staleness.engine import runner

    sched = st.simulate_schedule("asp", "1,1,2,2", num_updates=20, seed=0)
    ahead = st.engine.replay(sched, quadratic4, lr=0.05, eval_every=4, stop_after=stop_after)
    real = runner.single
    monkeypatch.setattr(runner, "single", lambda *a, **k: real(*a, **k)._replace(capture=None))
    after = st.engine.replay(sched, quadratic4, lr=0.05, eval_every=4, stop_after=stop_after)
    assert ahead.history.equals(after.history) and ahead.status == after.status
    np.testing.assert_array_equal(ahead.train_loss, after.train_loss)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ahead.params), jax.tree.leaves(after.params)))
    assert len(ahead.history) == (4 if stop_after else 6)


def test_divergence_message_names_update_worker_and_staleness():
    d = chunks.Divergence(17, 3, 5, "iteration 4")
    assert d.message(0.5) == ("non-finite loss at update 17 (gradient of worker 3, iteration 4, staleness 5); "
                              "try a smaller lr (now 0.5) or a staleness-aware lr_rule")


# -- divergence in every caller ------------------------------------------------------
def test_replay_divergence_message(quadratic4):
    with pytest.raises(DivergenceError, match=MESSAGE.format(kind="worker")) as e:
        st.simulate(quadratic4, P.asp(), C.constant(4).jitter(0.1), num_updates=400, seed=0, lr=50.0,
                    eval_every=10)
    r = e.value.result
    assert r.status == "diverged" and r.config["divergence"] == str(e.value)
    assert np.isfinite(r.history["loss"]).all()


def test_sweep_divergence_message_per_configuration(quadratic4):
    out = st.sweep(quadratic4, [P.asp()], C.constant(4).jitter(0.1), seeds=[0], lrs=[0.01, 50.0],
                   num_updates=400, eval_every=10)
    ok, bad = out
    assert ok.status == "complete" and "divergence" not in ok.config
    assert bad.status == "diverged"
    assert bad.config["divergence"].startswith("non-finite loss at update ")
    import re

    assert re.match(MESSAGE.format(kind="worker"), bad.config["divergence"])
    # the same message as the single run's DivergenceError
    with pytest.raises(DivergenceError) as e:
        st.simulate(quadratic4, P.asp(), C.constant(4).jitter(0.1), num_updates=400, seed=0, lr=50.0,
                    eval_every=10)
    assert bad.config["divergence"] == str(e.value)
    assert np.isfinite(bad.history["loss"]).all() and len(bad.history) == len(e.value.result.history)


def test_pipeline_divergence_message(digits3):
    with pytest.raises(DivergenceError, match=MESSAGE.format(kind="stage") + r".*") as e:
        pp.simulate(digits3, "dsp:1,1,0", 40, lr=1e4, eval_every=2, optimizer="sgd")
    msg = str(e.value)
    assert "tick " in msg and "stage lags" in msg
    assert e.value.result.status == "diverged" and e.value.result.config["divergence"] == msg


# -- resume, bitwise, in the engine and the pipeline -----------------------------------
def test_replay_resume_is_bitwise_with_the_one_format(tmp_path):
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
    sched = st.simulate_schedule(P.softsync(2), C.heterogeneous([1.0, 1.2, 2.0, 2.6]).jitter(0.2),
                                 num_updates=50, seed=3)
    kw = dict(lr=0.1, optimizer="adam", eval_every=10)
    full = st.engine.replay(sched, task, **kw)
    part = st.engine.replay(sched, task, checkpoint=tmp_path, stop_after=20, **kw)
    assert part.status == "stopped" and checkpoint.exists(tmp_path, "replay")
    assert np.isnan(part.train_loss[20:]).all() and np.isfinite(part.train_loss[:20]).all()
    back = st.engine.replay(sched, task, checkpoint=tmp_path, resume=True, **kw)
    assert back.status == "complete" and _equal_tree(back.params, full.params)
    assert back.history.equals(full.history)
    assert np.array_equal(back.train_loss, full.train_loss)


@pytest.mark.parametrize("devices", [False, True])
def test_pipeline_resume_is_bitwise(tmp_path, digits3, devices):
    kw = dict(lr=0.05, eval_every=3, seed=1, cluster="1,2,1", devices=devices)
    full = pp.train(digits3, "dsp:2,0,1", 12, **kw)
    part = pp.train(digits3, "dsp:2,0,1", 12, checkpoint=tmp_path, stop_after=6, **kw)
    assert part.status == "stopped" and part.history["update"].iloc[-1] <= 9
    back = pp.train(digits3, "dsp:2,0,1", 12, checkpoint=tmp_path, resume=True, **kw)
    assert back.status == "complete"
    assert _equal_tree(back.params, full.params)
    cols = [c for c in full.history.columns if c not in ("wall_time",) and not (devices and c == "time")]
    assert back.history[cols].equals(full.history[cols])
    assert np.array_equal(back.train_loss, full.train_loss)
    with pytest.raises(ValueError, match="written with"):
        pp.train(digits3, "dsp:2,0,1", 12, checkpoint=tmp_path, resume=True, **{**kw, "lr": 0.06})
