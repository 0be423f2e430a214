"""Output directories and files: checked before anything runs, written atomically,
validated when read back (`staleness.infra.files`, `Result.save/load`, `Schedule.load`),
and the CLI's one-line errors for each."""

import json
import os
import zipfile

import hypothesis.strategies as hs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import staleness as st
from staleness.infra import files
from staleness.cli import main
from staleness.engine.result import FileFormatError, Result


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """A small finished run (quadratic task, 12 updates)."""
    return st.simulate(st.tasks.get("quadratic", num_workers=4), "asp", st.cluster.heterogeneous([1, 1, 2, 2]),
                       num_updates=12, seed=0, lr=0.05, num_evals=3)


def _cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err):
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("staleness: error:") and "Traceback" not in err


# -- check_out -----------------------------------------------------------------------------
def test_check_out_accepts_new_and_empty_directories(tmp_path):
    assert files.check_out(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()   # checking creates nothing
    (tmp_path / "empty").mkdir()
    assert files.check_out(tmp_path / "empty") == tmp_path / "empty"


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.write_text("x"), "is an existing file"),
    (lambda p: (p.parent / "f").write_text("x"), "which is a file"),
    (lambda p: (p.mkdir(), (p / "notes.txt").write_text("x")), "holds no staleness output"),
    (lambda p: (p.mkdir(), (p / "result.json").write_text("{}")), "pass --overwrite"),
])
def test_check_out_refuses_what_it_must(tmp_path, make, fragment):
    target = tmp_path / "out"
    make(target)
    path = tmp_path / "f" / "x" if fragment == "which is a file" else target
    with pytest.raises(files.OutputError, match=fragment):
        files.check_out(path)


def test_check_out_refuses_an_unwritable_place():
    with pytest.raises(files.OutputError, match="cannot be created"):
        files.check_out("/proc/staleness-nope")


# -- atomic writes ---------------------------------------------------------------------------
def test_save_replaces_a_result_only_with_overwrite_and_leaves_no_old_files(result, tmp_path):
    out = tmp_path / "run"
    result.save(out, extra=lambda d: (d / "summary.png").write_bytes(b"old"))
    with pytest.raises(FileExistsError):
        result.save(out)
    result.save(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["history.csv", "orbax", "params.npz", "result.json",
                                                      "schedule.json", "train_loss.npy"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temporaries left


def test_a_failing_save_keeps_the_previous_result(result, tmp_path, monkeypatch):
    out = tmp_path / "run"
    result.save(out)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(OSError, match="disk full"):
        result.save(out, overwrite=True)
    monkeypatch.undo()
    assert Result.load(out).schedule.num_updates == 12
    assert [p.name for p in tmp_path.iterdir()] == ["run"]


def test_write_text_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    files.write_text(path, "old")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):
        files.write_text(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.json"]


# -- validation on load -------------------------------------------------------------------------
def test_load_names_the_file_of_a_truncated_params_npz(result, tmp_path):
    out = result.save(tmp_path / "run")
    data = (out / "params.npz").read_bytes()
    (out / "params.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(FileFormatError, match="params.npz: cannot be read"):
        Result.load(out)


def test_load_names_the_file_of_bad_json(result, tmp_path):
    out = result.save(tmp_path / "run")
    (out / "result.json").write_text("{not json")
    with pytest.raises(FileFormatError, match="result.json: not valid JSON"):
        Result.load(out)


@pytest.mark.parametrize("field, value, fragment", [
    ("worker", 99, "is not a worker of this 4-worker schedule"),
    ("apply_version", 10_000, "must lie in pull_version"),
    ("pull_version", -3, "must be >= 0"),
])
def test_a_schedule_with_impossible_rows_is_refused_naming_the_field(result, tmp_path, field, value, fragment):
    out = result.save(tmp_path / "run")
    data = json.loads((out / "schedule.json").read_text())
    data["columns"][field][0] = value
    (out / "schedule.json").write_text(json.dumps(data))
    with pytest.raises(FileFormatError, match=f"field '{field}' \\(row 0\\) .*{fragment}"):
        Result.load(out)
    with pytest.raises(FileFormatError, match="schedule.json"):
        st.Schedule.load(out / "schedule.json")


_FILES = ["result.json", "schedule.json", "params.npz", "train_loss.npy", "history.csv"]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=hs.sampled_from(_FILES), cut=hs.floats(0, 1), flips=hs.lists(hs.integers(0, 10**9), max_size=4))
def test_fuzzed_result_files_load_or_raise_a_named_error(result, tmp_path, name, cut, flips):
    out = tmp_path / "fuzz"
    result.save(out, overwrite=True)
    data = bytearray((out / name).read_bytes())
    for f in flips:
        data[f % len(data)] ^= 0xFF
    data = data[: int(len(data) * cut)] if cut < 1 else data
    (out / name).write_bytes(bytes(data))
    try:
        r = Result.load(out)
    except (FileFormatError, FileNotFoundError) as e:
        assert str(e).splitlines() and (name in str(e) or "schedule" in str(e)), e
    else:
        assert isinstance(r, Result)


def test_cli_replay_of_a_damaged_result_is_one_line(result, tmp_path, capsys):
    out = result.save(tmp_path / "run")
    with zipfile.ZipFile(out / "params.npz", "a") as z:   # a valid zip, but not what numpy wrote
        z.writestr("junk.txt", "x")
    (out / "params.npz").write_bytes((out / "params.npz").read_bytes()[:40])
    code, _, err = _cli(["replay", str(out), "--check"], capsys)
    assert code == 2 and _one_line(err) and "params.npz" in err


# -- the CLI checks --out before computing ---------------------------------------------------------
@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.write_text("x"), "is an existing file"),
    (lambda p: None, "cannot be created"),
])
def test_cli_checks_out_before_any_computation(tmp_path, capsys, monkeypatch, make, fragment):
    def never(*a, **k):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(st.engine, "simulate", never)
    monkeypatch.setattr("staleness.engine.run.simulate", never)
    out = tmp_path / "out" if fragment != "cannot be created" else "/proc/staleness-nope"
    if fragment != "cannot be created":
        make(out)
    for argv in (["simulate", "--updates", "3"], ["compare", "--updates", "3", "--policy", "asp"],
                 ["run", "--updates", "3"], ["pipeline", "--batches", "2"]):
        code, _, err = _cli([*argv, "--no-progress", "--out", str(out)], capsys)
        assert code == 2 and _one_line(err) and fragment in err, (argv, err)


def test_cli_refuses_an_existing_result_unless_overwrite(result, tmp_path, capsys):
    out = result.save(tmp_path / "run")
    (out / "summary.png").write_bytes(b"stale")
    code, _, err = _cli(["simulate", "--task", "quadratic", "--updates", "4", "--no-progress", "--out", str(out)],
                        capsys)
    assert code == 2 and "--overwrite" in err
    code, _, _ = _cli(["simulate", "--task", "quadratic", "--updates", "4", "--no-progress", "--out", str(out),
                       "--overwrite"], capsys)
    assert code == 0 and Result.load(out).schedule.num_updates == 4
    assert (out / "summary.png").read_bytes() != b"stale"


def test_cli_bad_numbers_are_one_line(capsys):
    for argv in (["replay", "x", "--tolerance", "-1"], ["simulate", "--target", "2", "--updates", "3"],
                 ["simulate", "--task", "quadratic", "--target", "-1", "--updates", "3"],
                 ["schedule", "--cluster", ""], ["schedule", "--cluster", "-1,1"], ["schedule", "--policy", ""],
                 ["compare", "--metric", "f1", "--updates", "3"]):
        code, _, err = _cli(argv, capsys)
        assert code == 2 and _one_line(err), (argv, err)


def test_version_and_lazy_modules(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"staleness {st.__version__}"
    assert st.plots.save and st.compare.compare and st.metrics.get("accuracy").goal == "higher"
