"""The `staleness` command: output, files written, and one-line errors with exit status 2."""

import json
import subprocess
import sys

import pandas as pd
import pytest

import staleness as st
from staleness.cli import main


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_schedule_table_and_json(capsys):
    code, out, _ = run(["schedule", "--policy", "ssp:3", "--policy", "dssp:3:12", "--updates", "200"], capsys)
    assert code == 0 and "ssp:3" in out and "dssp:3:12" in out and "staleness_mean" in out
    code, out, _ = run(["schedule", "--policy", "softsync:2", "--cluster", "1,2,3,4", "--updates", "50", "--json"], capsys)
    row = json.loads(out.strip().splitlines()[0])
    assert code == 0 and row["updates"] == 50 and row["gradients_per_update"] == 2.0


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["schedule", "--policy", "ssp:-1"], "staleness = -1"),
        (["schedule", "--cluster", "0"], "cluster"),
        (["schedule", "--policy", "softsync:9"], "n = 9"),
        (["schedule", "--cluster", "gtx9999*2"], "gtx9999"),
        (["schedule", "--updates", "x"], "is not an integer"),
        (["schedule", "--cluster", "trace:/nonexistent.csv"], "nonexistent"),
        (["simulate", "--task", "nope", "--updates", "5"], "unknown task"),
        (["simulate", "--lr", "-1", "--updates", "5"], "--lr"),
        (["compare", "--seeds", "a,b"], "--seeds"),
        (["compare", "--updates", "5", "--max-time", "3"], "not both"),
        (["bogus"], "invalid choice"),
    ],
)
def test_bad_input_one_line_exit_2(argv, fragment, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("staleness: error:") and fragment in lines[0], err
    assert "Traceback" not in err


def test_console_script_exits_2_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "staleness", "schedule", "--policy", "dssp:x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_simulate_writes_result(tmp_path, capsys):
    out = tmp_path / "sim"
    code, text, _ = run(["simulate", "--policy", "softsync:2", "--cluster", "1,1,2,2", "--updates", "40",
                         "--lr-rule", "per_gradient", "--no-progress", "--out", str(out)], capsys)
    assert code == 0 and "accuracy" in text
    from staleness.engine.result import Result

    r = Result.load(out)
    assert r.config["lr_rule"] == "per_gradient" and r.history["update"].iloc[-1] == 40
    assert (out / "summary.png").stat().st_size > 10_000


def test_compare_writes_table_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    code, text, _ = run(["compare", "--policy", "bsp", "--policy", "asp", "--cluster", "1,1,2.6,2.6",
                         "--max-time", "30", "--seeds", "0,1", "--target", "0.5", "--no-progress",
                         "--out", str(out)], capsys)
    assert code == 0 and "time to 0.5 (s)" in text and "metric accuracy" in text
    wide = [line for line in text.splitlines() if len(line) > 100 and not line.startswith("wrote ")]
    assert not wide, wide   # the compact table and its header fit 100 columns: the full table is table.csv
    table = pd.read_csv(out / "table.csv")
    assert {"time_to_accuracy_0.5_s", "wait_fraction_mean", "comm_fraction_mean", "bytes_sent"} <= set(table.columns)
    assert list(table["policy"]) == ["bsp", "asp"] and (table["seeds"] == 2).all()
    hist = pd.read_csv(out / "history.csv")
    assert set(hist["seed"]) == {0, 1} and hist["time"].max() <= 30
    for name in ["comparison.png", "timeline_bsp.png", "timeline_asp.png"]:
        assert (out / name).stat().st_size > 10_000
    assert (out / "results" / "asp_s1" / "result.json").exists()


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("not ours")
    return path


@pytest.mark.parametrize("argv, fragment", [
    (["run", "--checkpoint", "{afile}", "--checkpoint-every", "5"], "--checkpoint = '{afile}' is an existing file, "
                                                                    "not a directory"),
    (["run", "--checkpoint", "{afile}/ck", "--checkpoint-every", "5"], "lies under '{afile}', which is a file"),
    (["run", "--checkpoint", "{tmp}/ck"], "--checkpoint alone writes nothing: give --checkpoint-every K"),
    (["run", "--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint DIR"),
    (["launch", "--local", "2", "--checkpoint", "{tmp}/ck"], "--checkpoint alone writes nothing"),
    (["run", "--resume"], "--resume needs --checkpoint DIR"),
    (["schedule", "--save", "{afile}"], "--save = '{afile}' is an existing file that staleness did not write"),
    (["schedule", "--save", "{tmp}"], "is a directory; give a file name"),
    (["sweep", "--devices", "64", "--updates", "5", "--out", "{tmp}/sw"], "--devices = 64 must be in 1.."),
    (["run", "--policy", "bsp", "--sync", "collective", "--on-worker-failure", "continue"],
     "--on-worker-failure = 'continue' needs sync='server'"),
])
def test_paths_and_flags_are_checked_before_computing(argv, fragment, tmp_path, afile, capsys):
    """Each is one line, exit 2, before anything runs (a checkpoint path that is a file
    used to fail after compiling, and --checkpoint alone silently wrote nothing)."""
    fill = dict(afile=afile, tmp=tmp_path)
    code, _, err = run([a.format(**fill) for a in argv] + ["--updates", "5"] * ("--updates" not in argv), capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment.format(**fill) in lines[0], err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "sw").exists()


def test_schedule_save_writes_a_file_in_any_directory_and_replaces_its_own(tmp_path, capsys):
    (tmp_path / "other.txt").write_text("a directory of other things")
    path = tmp_path / "s.json"
    for _ in range(2):   # the second replaces the schedule the first wrote
        code, _, err = run(["schedule", "--policy", "asp", "--updates", "20", "--save", str(path)], capsys)
        assert code == 0, err
    assert st.Schedule.load(path).num_updates == 20
