"""`staleness pipeline`: output, Result files, and one-line errors with exit status 2."""

import pytest

from staleness.cli import main
from staleness.engine.result import Result


def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_pipeline_dsp_writes_result(tmp_path, capsys):
    out = tmp_path / "dsp"
    code, text, _ = run(["pipeline", "--schedule", "dsp", "--delays", "1,1,0", "--batches", "6", "--batch-size", "8",
                         "--eval-every", "3", "--cluster", "1,2,1", "--no-progress", "--out", str(out)], capsys)
    assert code == 0, text
    assert "dsp:1,1,0 on 3 stages (lags m = [4, 2, 0])" in text and "batches_per_sim_s" in text
    r = Result.load(out)
    assert r.config["schedule"] == "dsp:1,1,0" and r.config["stages"] == 3 and r.status == "complete"
    assert list(r.history["update"]) == [0, 0, 2, 5, 6]  # batches applied at every stage, per evaluation
    assert r.schedule.meta["kind"] == "pipeline" and r.schedule.num_workers == 3
    assert r.schedule.summary()["staleness_max"] == 4 and len(r.train_loss) == 6


def test_pipeline_gpipe_on_devices(tmp_path, capsys):
    code, text, _ = run(["pipeline", "--schedule", "gpipe", "--microbatches", "2", "--stages", "2", "--devices",
                         "--batches", "3", "--batch-size", "8", "--no-progress"], capsys)
    assert code == 0, text
    assert "gpipe:2 on 2 stages" in text and "2 devices" in text


@pytest.mark.parametrize("argv, fragment", [
    (["--delays", "1,1", "--stages", "3"], "has 2 entries but the model has 3 stages"),
    (["--delays", "1,-1,0"], "delays must be >= 0"),
    (["--schedule", "ddg", "--stages", "3", "--blocks", "2"], "num_stages = 3 is more than the model's 2 blocks"),
    (["--schedule", "gpipe", "--microbatches", "3", "--stages", "2"],
     "microbatches = 3 does not divide batch_size = 32"),
    (["--schedule", "pipedream"], "not known"),
    (["--schedule", "ddg", "--delays", "1,0"], "dsp only"),
    (["--schedule", "ddg", "--stages", "2", "--batches", "0"], "--batches"),
    (["--schedule", "ddg", "--stages", "3", "--cluster", "1,2", "--batches", "2"], "2 workers but the pipeline has 3"),
    (["--task", "nope", "--stages", "2"], "unknown pipeline task"),
    (["--schedule", "ddg", "--stages", "2", "--lr", "-1", "--batches", "2"], "--lr"),
])
def test_bad_input_one_line_exit_2(argv, fragment, capsys):
    code, _, err = run(["pipeline", "--no-progress", *argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:") and fragment in lines[0], err
