"""`staleness run`/`launch` flags generated from `runtime.spec.Settings`: their help,
their values checked once (by the library, shown with the flag), and launch's argv."""

import dataclasses

import pytest

import staleness as st
from staleness.cli import build_parser, main, run_cmd
from staleness.cli.config_flags import flag_argv, flags_of, values_of
from staleness.runtime.spec import DEFAULT_UPDATES, Settings, check_settings

FLAGGED = [f for f in dataclasses.fields(Settings) if f.metadata["cli"] is not None]


def test_every_settings_field_says_whether_it_has_a_flag():
    names = {f.name for f in dataclasses.fields(Settings)}
    assert {f.name for f in FLAGGED} == names - {"num_evals", "processes"}
    assert {f.dest for f in flags_of(Settings)} == {f.name for f in FLAGGED}


def test_library_defaults_are_unchanged():
    s = Settings(num_updates=7)
    assert dataclasses.asdict(s) == dict(
        num_updates=7, num_workers=None, seed=0, lr=None, lr_rule="constant", optimizer=None, batch_size=None,
        data_dir=None, max_time=None, eval_every=None, num_evals=20, time_scale=0.01, worker_timeout=30.0,
        on_worker_failure=None, checkpoint=None, checkpoint_every=None, resume=False, inner_optimizer=None,
        sync=None, processes=1)
    with pytest.raises(TypeError):
        Settings()   # num_updates has no library default
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1


@pytest.mark.parametrize("command", ["run", "launch"])
def test_every_flagged_setting_is_in_the_help_with_its_text(command):
    sub = build_parser().commands[command]
    text = sub.format_help()
    bare = "".join(text.split())   # argparse wraps lines, also at hyphens
    for flag in flags_of(Settings):
        assert flag.flag in text and "".join(flag.help.split()) in bare, flag
        assert sub.flag_of(flag.dest) == flag.flag
    assert "--updates UPDATES" in text and "--workers WORKERS" in text and "NUM_UPDATES" not in text


def test_cli_defaults():
    args = build_parser().parse_args(["run"])
    assert values_of(args, Settings) == dict(
        num_updates=DEFAULT_UPDATES, num_workers=None, seed=0, lr=None, lr_rule="constant", optimizer=None,
        batch_size=None, data_dir=None, max_time=None, eval_every=None, time_scale=0.01, worker_timeout=30.0,
        on_worker_failure=None, checkpoint=None, checkpoint_every=None, resume=False, inner_optimizer=None, sync=None)
    check_settings(Settings(**values_of(args, Settings)))


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a run, a process or a task were started."""
    def boom(*args, **kwargs):
        raise AssertionError("computed before the flags were checked")

    for name in ("run", "run_process", "launch_local"):
        monkeypatch.setattr(st.runtime, name, boom)
    monkeypatch.setattr(st.tasks.registry, "resolve", boom)


@pytest.mark.parametrize("argv, line", [
    (["run", "--updates", "0"], "--updates = 0 must be an integer >= 1 (server updates)"),
    (["run", "--seed", "-1"], "--seed = -1 must be an integer >= 0"),
    (["run", "--time-scale", "0"], "--time-scale = 0.0 must be a finite number of seconds > 0"),
    (["run", "--worker-timeout", "-1"], "--worker-timeout = -1.0 must be a finite number of seconds > 0"),
    (["run", "--max-time", "-3"], "--max-time = -3.0 must be a finite number of seconds > 0"),
    (["run", "--max-time", "inf"], "--max-time = inf must be a finite number of seconds > 0"),
    (["run", "--workers", "0"], "--workers = 0 must be an integer >= 1"),
    (["run", "--batch-size", "0"], "--batch-size = 0 must be an integer >= 1"),
    (["run", "--lr", "0"], "--lr = 0.0 must be a finite number > 0"),
    (["run", "--eval-every", "0"], "--eval-every = 0 must be an integer >= 1 (updates)"),
    (["launch", "--local", "2", "--updates", "0"], "--updates = 0 must be an integer >= 1"),
    (["launch", "--local", "2", "--checkpoint-every", "0"], "--checkpoint-every = 0 must be an integer >= 1"),
    (["run", "--updates", "x"], "argument --updates: 'x' is not an integer"),
    (["run", "--time-scale", "fast"], "argument --time-scale: 'fast' is not a number"),
])
def test_bad_settings_fail_once_naming_the_flag_before_anything_runs(argv, line, nothing_runs, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error: ") and line in lines[0], err


def test_launch_argv_round_trips_the_flags():
    given = ["--task", "quadratic", "--policy", "asp", "--cluster", "1*2", "--workers", "2", "--updates", "7",
             "--max-time", "12.5", "--lr", "1e-05", "--lr-rule", "per_gradient", "--optimizer", "momentum:0.9",
             "--batch-size", "4", "--data-dir", "/tmp/d", "--seed", "3", "--time-scale", "0.002",
             "--eval-every", "2", "--checkpoint", "/tmp/ck", "--checkpoint-every", "3", "--resume",
             "--worker-timeout", "9", "--on-worker-failure", "stop", "--sync", "server", "--cpu-devices", "2",
             "--heartbeat-timeout", "5", "--out", "/tmp/o", "--overwrite", "--no-progress",
             "--task-option", "a=1"]
    parser = build_parser()
    args = parser.parse_args(["launch", "--local", "2", *given])
    argv = run_cmd._run_argv(args)
    back = parser.parse_args(["run", *argv])
    for flag in run_cmd._RUN_OPTIONS:
        assert getattr(back, flag.dest) == getattr(args, flag.dest), flag
    assert back.task_option == ["a=1"]
    assert run_cmd._run_argv(back) == argv
    assert run_cmd._run_argv(parser.parse_args(["launch", "--local", "2"])) == []   # defaults: nothing to pass


def test_flags_are_generic_over_a_described_dataclass():
    @dataclasses.dataclass(frozen=True)
    class Demo:
        rate: float = dataclasses.field(default=1.0, metadata={"cli": dict(help="a rate", kind=float)})
        count: int = dataclasses.field(default=2, metadata={"cli": dict(help="n", kind=int, flag="--n", default=5)})
        quiet: bool = dataclasses.field(default=False, metadata={"cli": dict(help="q", kind=bool)})
        hidden: int = dataclasses.field(default=0, metadata={"cli": None})

    flags = flags_of(Demo)
    assert [(f.flag, f.dest, f.default) for f in flags] == [("--rate", "rate", 1.0), ("--n", "count", 5),
                                                           ("--quiet", "quiet", False)]
    import argparse

    from staleness.cli.config_flags import add_flags

    p = argparse.ArgumentParser()
    add_flags(p, flags)
    args = p.parse_args(["--rate", "2.5", "--quiet"])
    assert values_of(args, Demo) == dict(rate=2.5, count=5, quiet=True)
    assert flag_argv(args, flags) == ["--rate", "2.5", "--quiet"]

    @dataclasses.dataclass
    class Undescribed:
        x: int = 0

    with pytest.raises(TypeError, match="Undescribed.x"):
        flags_of(Undescribed)
