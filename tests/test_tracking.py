"""Experiment tracking: callbacks at every evaluation, and the TensorBoard and W&B writers.

One small simulated run (digits-mlp, SSP(2) on two equal workers, 20 updates, 4
evaluations) is shared by the tests that read what the callbacks and the writers saw;
the writers' files are read back from disk (TensorBoard's TFRecord event files and
W&B's offline run file are parsed here, with the writers' own protobuf messages).
"""

import glob
import importlib.util
import json
import math
import struct

import numpy as np
import pytest

import staleness as st
from staleness.infra import tracking
from staleness.pipeline import tasks as ptasks
from staleness.engine.result import Result

KW = dict(num_updates=20, num_evals=4, lr=0.05)
HAS_WANDB = importlib.util.find_spec("wandb") is not None   # the `dev` extra installs it


@pytest.fixture(scope="module")
def task():
    return st.tasks.get("digits-mlp", batch_size=8, num_workers=2)


def _same_metrics(ev, row: dict, axes=("update", "time")) -> bool:
    want = {k: float(v) for k, v in row.items() if k not in axes}
    return set(ev.metrics) == set(want) and all(
        (math.isnan(a) and math.isnan(want[k])) or a == want[k] for k, a in ev.metrics.items())


class Recorder:
    """A callback that keeps every Evaluation and every finished run."""

    def __init__(self):
        self.seen, self.finished = [], []

    def __call__(self, ev):
        self.seen.append(ev)

    def finish(self, run, status):
        self.finished.append((run.label, status))


@pytest.fixture(scope="module")
def logged(task, tmp_path_factory):
    """(Result, Recorder, TensorBoard logdir, W&B dir) of one run with every writer attached
    (W&B in offline mode, where installed)."""
    root = tmp_path_factory.mktemp("tracking")
    rec = Recorder()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(root / "wandb"))
        mp.setenv("WANDB_SILENT", "true")
        (root / "wandb").mkdir()
        result = st.simulate(task, "ssp:2", "1*2", seed=0, **KW,
                             callbacks=[rec, tracking.TensorBoard(root / "tb")]
                             + ([tracking.parse("wandb:staleness-test")] if HAS_WANDB else []))
    return result, rec, root / "tb", root / "wandb"


def test_a_callback_sees_every_evaluation_of_simulate(logged):
    result, rec, _, _ = logged
    rows = result.history.to_dict("records")
    assert [ev.step for ev in rec.seen] == [int(r["update"]) for r in rows] == [0, 5, 10, 15, 20]
    assert [ev.time for ev in rec.seen] == [r["time"] for r in rows]
    assert all(_same_metrics(ev, r) for ev, r in zip(rec.seen, rows))
    assert {"train_loss", "loss", "accuracy"} <= set(rec.seen[-1].metrics)
    walls = [ev.wall_time for ev in rec.seen]
    assert walls[0] == 0.0 and all(b >= a for a, b in zip(walls, walls[1:])) and walls[-1] > 0
    run = rec.seen[0].run
    assert (run.policy, run.seed, run.lr, run.lr_rule, run.index) == ("ssp:2", 0, 0.05, "constant", 0)
    assert run.label == "ssp:2 seed=0 lr=0.05" and run.config == result.config
    assert rec.finished == [(run.label, "complete")]


def test_a_sweep_calls_once_per_configuration_and_evaluation_in_grid_order(task):
    seen = []
    results = st.sweep(task, ["ssp:2", "asp"], "1*2", seeds=[0], num_updates=20, num_evals=2, lrs=[0.05],
                       callbacks=seen.append)
    steps = [int(u) for u in results[0].history["update"]]
    assert [(ev.step, ev.run.index) for ev in seen] == [(s, i) for s in steps for i in (0, 1)]
    assert [ev.run.policy for ev in seen[:2]] == ["ssp:2", "asp"]
    for i, r in enumerate(results):
        mine = [ev for ev in seen if ev.run.index == i]
        assert all(_same_metrics(ev, row) for ev, row in zip(mine, r.history.to_dict("records")))
        assert len({ev.run.label for ev in mine}) == 1
    assert seen[0].run.label != seen[1].run.label


def test_pipeline_train_calls_back_at_every_evaluation():
    ptask = ptasks.get("digits-resmlp", num_stages=3, batch_size=8, width=32)
    seen = []
    r = st.pipeline.train(ptask, "dsp:1,1,0", 8, lr=0.05, eval_every=4, callbacks=seen.append)
    rows = r.history.to_dict("records")
    assert len(seen) == len(rows) == 4    # every 4 batches, at 4-tick chunks: ticks 0, 4, 8, 12
    assert [ev.step for ev in seen] == [int(x["update"]) for x in rows]
    assert [ev.time for ev in seen] == [x["sim_time"] for x in rows]
    assert [ev.wall_time for ev in seen] == [x["wall_time"] for x in rows]
    axes = ("update", "tick", "time", "sim_time", "wall_time")
    assert all(_same_metrics(ev, x, axes) for ev, x in zip(seen, rows))
    assert seen[0].run.policy == r.config["schedule"] and seen[0].run.label.startswith(r.config["schedule"])

    def stop_at_four(ev):
        if ev.step == 4:
            raise RuntimeError("enough")

    with pytest.raises(tracking.CallbackError, match="stop_at_four raised RuntimeError at update 4") as e:
        st.pipeline.train(ptask, "dsp:1,1,0", 8, lr=0.05, eval_every=4, callbacks=stop_at_four)
    assert e.value.result.status == "stopped" and list(e.value.result.history["update"]) == [0, 0, 4]


def test_pipeline_sweep_calls_back_per_member_until_it_diverges():
    from staleness.pipeline.sweep import sweep as pipeline_sweep

    ptask = ptasks.get("digits-resmlp", num_stages=3, batch_size=8, width=16)
    seen, done = [], []

    class Rec:
        def __call__(self, ev):
            seen.append(ev)

        def finish(self, run, status):
            done.append((run.index, status))

    out = pipeline_sweep(ptask, "dsp:1,1,0", 24, lrs=[0.01, 50.0], seeds=[0], eval_every=8, callbacks=Rec())
    assert out.status == ["complete", "diverged"] and done == [(0, "complete"), (1, "diverged")]
    ok = [ev for ev in seen if ev.run.index == 0]
    assert [ev.step for ev in ok] == out.update.tolist()
    np.testing.assert_allclose([ev.metrics["accuracy"] for ev in ok], out.accuracy[0])
    assert ok[0].run.lr == 0.01 and ok[0].run.label == "dsp:1,1,0 seed=0 lr=0.01" and math.isnan(ok[0].time)
    alone = st.pipeline.simulate(ptask, "dsp:1,1,0", 24, lr=0.01, seed=0, eval_every=8)   # its rows, as train's
    np.testing.assert_allclose([ev.metrics["train_loss"] for ev in ok[1:]], alone.history["train_loss"][1:],
                               rtol=1e-4)
    bad = [ev.step for ev in seen if ev.run.index == 1]   # its evaluations up to the chunk it diverged in
    assert bad == out.update.tolist()[:len(bad)] and 1 < len(bad) <= len(out.update)
    assert np.isfinite(out.accuracy[1, len(bad) - 1]) or len(bad) == len(out.update)


def test_compare_reports_every_run_in_plan_order(task):
    seen = []
    cmp = st.compare.compare(task, ["ssp:2", "asp"], "1*2", seeds=[0, 1], num_updates=20, lr=0.05, num_evals=2,
                             callbacks=seen.append)
    assert [(ev.run.policy, ev.run.seed) for ev in seen if ev.step == 0] == [("ssp:2", 0), ("ssp:2", 1),
                                                                            ("asp", 0), ("asp", 1)]
    assert len(seen) == sum(len(r.history) for r in cmp.results)


def test_a_failing_callback_is_named_and_the_results_so_far_are_kept(task):
    rec = Recorder()

    def explode_at_ten(ev):
        if ev.step == 10:
            raise ValueError("disk full")

    with pytest.raises(tracking.CallbackError, match="explode_at_ten raised ValueError at update 10 .*disk full") as e:
        st.simulate(task, "ssp:2", "1*2", seed=0, **KW, callbacks=[rec, explode_at_ten])
    assert isinstance(e.value.__cause__, ValueError) and "explode_at_ten" in e.value.callback
    r = e.value.result
    assert isinstance(r, Result) and r.status == "stopped"
    assert list(r.history["update"]) == [0, 5, 10]            # the row that was being reported is kept
    assert np.isnan(r.train_loss[10:]).all() and np.isfinite(r.train_loss[:10]).all()
    assert rec.finished == [(rec.seen[0].run.label, "stopped")]  # the writers still close


def test_a_resumed_run_reports_only_its_new_evaluations(task, tmp_path):
    sched = st.simulate_schedule(st.policies.parse("ssp:2"), st.cluster.parse("1*2"), num_updates=20, seed=0)
    kw = dict(lr=0.05, eval_every=5, checkpoint=tmp_path / "ck")
    first, second = [], []
    st.engine.replay(sched, task, stop_after=10, callbacks=first.append, **kw)
    resumed = st.engine.replay(sched, task, resume=True, callbacks=second.append, **kw)
    assert [ev.step for ev in first] == [0, 5, 10] and [ev.step for ev in second] == [15, 20]
    assert list(resumed.history["update"]) == [0, 5, 10, 15, 20]


# -- the writers' files, read back ------------------------------------------------------
def _tfrecords(path):
    """The records of a TFRecord file: u64 length, u32 crc, data, u32 crc."""
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        yield data[pos + 12:pos + 12 + n]
        pos += 12 + n + 4


def test_tensorboard_event_files_hold_every_scalar(logged):
    from tensorboardX.proto import event_pb2

    result, rec, logdir, _ = logged
    run_dir = logdir / "ssp-2_seed=0_lr=0.05"
    files = glob.glob(str(run_dir / "events.out.tfevents.*"))
    assert len(files) == 1, sorted(p.name for p in logdir.rglob("*"))
    scalars = {}   # tag -> [(step, walltime, value)]
    for raw in _tfrecords(files[0]):
        ev = event_pb2.Event.FromString(raw)
        for v in ev.summary.value:
            scalars.setdefault(v.tag, []).append((ev.step, ev.wall_time, v.simple_value))
    h = result.history
    assert {"loss", "accuracy", "train_loss", "sim_time", "wall_time"} <= set(scalars)
    assert [s for s, _, _ in scalars["loss"]] == list(h["update"])
    assert [t for _, t, _ in scalars["loss"]] == list(h["time"])            # wall_time = simulated seconds
    np.testing.assert_allclose([v for *_, v in scalars["loss"]], h["loss"], rtol=1e-6)
    assert [s for s, _, _ in scalars["train_loss"]] == list(h["update"][1:])  # the NaN of update 0 is skipped
    np.testing.assert_allclose([v for *_, v in scalars["wall_time"]], [ev.wall_time for ev in rec.seen], rtol=1e-6)


def _wandb_records(path):
    """The protobuf records of a W&B run file: LevelDB-log blocks of 32 KiB after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = open(path, "rb").read(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:   # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):   # FULL or LAST
            yield pb.Record.FromString(buf)
            buf = b""


@pytest.mark.skipif(not HAS_WANDB, reason="needs wandb (pip install 'staleness[wandb]')")
def test_wandb_offline_run_holds_the_metrics(logged):
    result, _, _, wandb_dir = logged
    files = glob.glob(str(wandb_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    history, runs = [], []
    for rec in _wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "run":
            runs.append(rec.run)
    assert runs[0].display_name == "ssp:2 seed=0 lr=0.05" and runs[0].project == "staleness-test"
    h = result.history
    assert [x["_step"] for x in history] == list(h["update"])
    np.testing.assert_allclose([x["loss"] for x in history], h["loss"], rtol=1e-6)
    np.testing.assert_allclose([x["sim_time"] for x in history], h["time"])
    assert "train_loss" not in history[0] and history[-1]["train_loss"] == pytest.approx(h["train_loss"].iloc[-1])


# -- specs and arguments ----------------------------------------------------------------
def test_parse_makes_the_writers_and_rejects_anything_else(tmp_path):
    tb = tracking.parse(f"tensorboard:{tmp_path}")
    assert isinstance(tb, tracking.TensorBoard) and tb.logdir == tmp_path
    for bad in ("mlflow:x", "tensorboard:", "wandb", ""):
        with pytest.raises(ValueError, match="must be 'tensorboard:DIR'"):
            tracking.parse(bad, what="--log")
    with pytest.raises(TypeError, match="spec = 3 must be a string"):
        tracking.parse(3)
    with pytest.raises(TypeError, match="callbacks: 3 is not callable"):
        tracking.as_callbacks([print, 3])
    with pytest.raises(TypeError, match="callbacks = 3"):
        tracking.as_callbacks(3)
    assert tracking.as_callbacks(None) == () and tracking.as_callbacks(print) == (print,)
    assert st.tracking is tracking and "tracking" in dir(st)


def test_wandb_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "wandb", None)   # `import wandb` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'staleness\[wandb\]'"):
        tracking.WandB("p")


# -- the CLI's --log ---------------------------------------------------------------------------
def test_cli_log_writes_tensorboard_events_for_simulate_and_compare(tmp_path, capsys):
    from staleness.cli import main

    tb = tmp_path / "tb"
    assert main(["simulate", "--task", "quadratic", "--policy", "asp", "--updates", "10", "--no-progress",
                 "--log", f"tensorboard:{tb}"]) == 0
    assert main(["compare", "--task", "quadratic", "--policy", "asp", "--policy", "ssp:1", "--seeds", "0",
                 "--updates", "10", "--no-tune", "--no-progress", "--out", str(tmp_path / "c"),
                 "--log", f"tensorboard:{tb}"]) == 0
    runs = sorted(p.name for p in tb.iterdir() if p.is_dir())   # a run per label: asp's twice, ssp:1's once
    assert runs == ["asp_seed=0_lr=0.1", "ssp-1_seed=0_lr=0.1"]
    assert all(any(p.glob("events.out.tfevents.*")) for p in tb.iterdir())
    capsys.readouterr()


@pytest.mark.parametrize("argv", [["simulate", "--log", "nonsense"], ["compare", "--log", "tensorboard:"],
                                  ["sweep", "--log", "mlflow:x"]])
def test_cli_bad_log_is_one_line_before_anything_runs(tmp_path, capsys, monkeypatch, argv):
    from staleness.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--updates", "5"]) == 2
    err = capsys.readouterr().err
    assert "--log = " in err and len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_runtime_run_reports_every_history_row_after_the_run():
    import staleness as st

    seen = []
    r = st.runtime.run("quadratic", "asp", num_workers=2, num_updates=8, num_evals=4, callbacks=seen.append)
    assert [e.step for e in seen] == r.history["update"].tolist() and len(seen) >= 3
    assert all(e.time == e.wall_time for e in seen) and seen[-1].run.policy == "asp"
    assert seen[-1].metrics["loss"] == pytest.approx(r.history["loss"].iloc[-1])

    def boom(ev):
        raise OSError("disk full")

    with pytest.raises(st.tracking.CallbackError, match="callback .*boom raised OSError at update 0") as e:
        st.runtime.run("quadratic", "asp", num_workers=2, num_updates=4, num_evals=2, callbacks=boom)
    assert e.value.result is not None and e.value.result.schedule.num_updates == 4
