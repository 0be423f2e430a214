"""One settings value per kind of run. A simulated run (`engine.settings.Settings`): `simulate` and
`replay` build and check it once; `staleness simulate`, `compare`, `sweep` and `replay`
generate their shared flags from it and check them with it, before anything runs. A pipeline
run (`pipeline.settings.RunArgs`): `training.set_up` checks it, `staleness pipeline` generates
its flags from it (`runtime.spec.Settings`, the real run's, is tested in test_cli_config)."""

import dataclasses
import re

import numpy as np

import pytest

import staleness as st
from staleness.cli import build_parser, main
from staleness.cli.config_flags import flags_of
from staleness.engine import settings
from staleness.engine.settings import Settings
from staleness.infra.checks import ArgumentError

# the flags each command generates from Settings
OFFERED = {
    "simulate": ["max_time", "num_updates", "lr", "lr_rule", "optimizer", "inner_optimizer", "batch_size", "seed",
                 "checkpoint", "resume"],
    "compare": ["max_time", "num_updates", "lr", "lr_rule", "optimizer", "inner_optimizer", "batch_size"],
    "sweep": ["num_updates", "max_time", "optimizer", "inner_optimizer", "batch_size", "eval_every"],
    "replay": ["lr", "lr_rule", "optimizer", "batch_size", "seed"],
    "schedule": ["num_updates", "max_time", "seed", "batch_size"],
}


def test_every_field_says_whether_it_has_a_flag():
    fields = dataclasses.fields(Settings)
    assert all("cli" in f.metadata for f in fields)
    assert {f.name for f in fields if f.metadata["cli"] is None} == {"num_evals", "progress", "stop_after",
                                                                     "slot_mode", "config", "callbacks"}
    with pytest.raises(ValueError, match="has no flag"):
        flags_of(Settings, ["progress"])
    with pytest.raises(ValueError, match="no field 'speed'"):
        flags_of(Settings, ["lr"], speed={"help": "x"})


@pytest.mark.parametrize("command", sorted(OFFERED))
def test_each_command_offers_its_settings_flags_named_for_their_field(command):
    sub = build_parser().commands[command]
    text = sub.format_help()
    for name in OFFERED[command]:
        flag = sub.flag_of(name)
        assert flag.startswith("--") and flag in text, (command, name)
    assert "NUM_UPDATES" not in text and "MAX_TIME" in text or command == "replay"


def test_replay_defaults_to_the_recorded_run():
    args = build_parser().parse_args(["replay", "trace.json"])
    assert [getattr(args, n) for n in OFFERED["replay"]] == [None] * 5
    args = build_parser().parse_args(["simulate"])
    assert (args.seed, args.lr_rule, args.num_updates, args.max_time) == (0, "constant", None, None)


@pytest.mark.parametrize("field, value, line", [
    ("lr", 0, "lr = 0 must be a finite number > 0 (the learning rate)"),
    ("lr", float("nan"), "lr = nan must be a finite number > 0 (the learning rate)"),
    ("seed", -1, "seed = -1 must be an integer >= 0"),
    ("eval_every", 0, "eval_every = 0 must be an integer >= 1 (updates)"),
    ("num_evals", 0, "num_evals = 0 must be an integer >= 1"),
    ("batch_size", 0, "batch_size = 0 must be an integer >= 1"),
    ("num_updates", 0, "num_updates = 0 must be an integer >= 1"),
    ("max_time", -1.0, "max_time = -1.0 must be a finite number of seconds > 0"),
    ("stop_after", 0, "stop_after = 0 must be an integer >= 1 (updates)"),
    ("slot_mode", "scan", "slot_mode = 'scan' must be 'vmap' or 'map'"),
])
def test_check_names_the_field_the_value_and_what_is_valid(field, value, line):
    with pytest.raises(ArgumentError) as e:
        settings.check(Settings(**{field: value}))
    assert str(e.value) == line and e.value.name == field


def test_simulate_and_replay_check_their_settings_once_before_any_work(monkeypatch):
    calls = []
    real = settings.check
    monkeypatch.setattr(settings, "check", lambda s: calls.append(s) or real(s))
    task = st.tasks.get("quadratic", num_workers=2)
    r = st.simulate(task, "asp", "1,2", num_updates=6, seed=1, lr=0.05, eval_every=3)
    assert len(calls) == 1 and calls[0].num_updates == 6 and calls[0].seed == 1
    st.engine.replay(r.schedule, task, lr=0.05, eval_every=3)
    assert len(calls) == 2
    with pytest.raises(TypeError, match="speed"):
        st.simulate(task, "asp", "1,2", num_updates=6, speed=2)
    with pytest.raises(ValueError, match="eval_every = 0"):
        st.simulate(task, "asp", "1,2", num_updates=6, eval_every=0)


def test_schedule_checks_its_settings_once_in_the_library(monkeypatch, capsys):
    calls = []
    real = settings.check
    monkeypatch.setattr(settings, "check", lambda s: calls.append(s) or real(s))
    assert main(["schedule", "--policy", "asp", "--cluster", "1,2", "--updates", "5", "--seed", "3"]) == 0
    assert len(calls) == 1 and (calls[0].num_updates, calls[0].seed, calls[0].max_time) == (5, 3, None)
    assert "seed: 3" in capsys.readouterr().out


@pytest.mark.parametrize("argv, line", [
    (["--payload-bytes", "-5"], "simulate_schedule: --payload-bytes = -5 must be an integer number of bytes >= 0"),
    (["--payload-bytes", "0", "--cluster", "1*2+net=10mbps:20ms"], "the transfers carry no bytes"),
])
def test_schedule_payload_bytes_checked_by_the_simulator_named_as_the_flag(argv, line, capsys):
    code = main(["schedule", "--policy", "asp", "--updates", "5"] + argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and line in lines[0], lines


def test_a_sweep_checks_its_settings_once_before_any_schedule(monkeypatch):
    from staleness.engine import run as engine_run
    from staleness.engine.settings import SweepSettings, check_sweep

    def boom(*args, **kwargs):
        raise AssertionError("simulated before the settings were checked")

    monkeypatch.setattr(engine_run, "simulate_schedules", boom)
    for kw, line in (({"ring": 0}, "ring = 0 must be an integer >= 1"),
                     ({"slots": True}, "slots = True must be an integer >= 1"),
                     ({"eval_every": 0}, "eval_every = 0 must be an integer >= 1 (updates)")):
        with pytest.raises(ArgumentError, match=re.escape(line)):
            st.sweep("quadratic", ["asp"], "1,2", num_updates=6, **kw)
    assert check_sweep(SweepSettings(ring=np.int64(8))).ring == 8
    assert [f.flag for f in flags_of(SweepSettings)] == ["--ring", "--slots"]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail the test if a task were built or a simulation started."""
    def boom(*args, **kwargs):
        raise AssertionError("computed before the flags were checked")

    monkeypatch.setattr(st.tasks.registry, "resolve", boom)
    monkeypatch.setattr(st.engine.run, "stream_schedule", boom)
    monkeypatch.setattr(st.sim.scheduler, "simulate_schedule", boom)


@pytest.mark.parametrize("argv, line", [
    (["simulate", "--lr", "-1"], "--lr = -1.0 must be a finite number > 0 (the learning rate)"),
    (["simulate", "--updates", "0"], "--updates = 0 must be an integer >= 1"),
    (["simulate", "--max-time", "inf"], "--max-time = inf must be a finite number of seconds > 0"),
    (["simulate", "--seed", "-1"], "--seed = -1 must be an integer >= 0"),
    (["simulate", "--batch-size", "0"], "--batch-size = 0 must be an integer >= 1"),
    (["compare", "--lr", "0"], "--lr = 0.0 must be a finite number > 0"),
    (["compare", "--max-time", "-2"], "--max-time = -2.0 must be a finite number of seconds > 0"),
    (["sweep", "--eval-every", "0"], "--eval-every = 0 must be an integer >= 1 (updates)"),
    (["sweep", "--updates", "-3"], "--updates = -3 must be an integer >= 1"),
    (["replay", "nowhere.json", "--seed", "-2"], "--seed = -2 must be an integer >= 0"),
    (["replay", "nowhere.json", "--lr", "nan"], "--lr = nan must be a finite number > 0"),
    (["simulate", "--updates", "x"], "argument --updates: 'x' is not an integer"),
    (["sweep", "--ring", "0"], "--ring = 0 must be an integer >= 1"),
    (["sweep", "--slots", "-2"], "--slots = -2 must be an integer >= 1"),
    (["schedule", "--updates", "0"], "--updates = 0 must be an integer >= 1"),
    (["schedule", "--max-time", "-2"], "--max-time = -2.0 must be a finite number of seconds > 0"),
    (["schedule", "--seed", "-1"], "--seed = -1 must be an integer >= 0"),
    (["schedule", "--task", "digits-mlp", "--batch-size", "0"], "--batch-size = 0 must be an integer >= 1"),
])
def test_bad_flags_fail_once_naming_the_flag_before_anything_runs(argv, line, nothing_runs, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error: ") and line in lines[0], err


# -- the pipeline's run: pipeline.settings.RunArgs ----------------------------------------------
def test_every_pipeline_field_says_whether_it_has_a_flag_and_the_help_lists_them():
    from staleness.pipeline.settings import RunArgs

    fields = dataclasses.fields(RunArgs)
    assert {f.name for f in fields if f.metadata["cli"] is None} == {"schedule", "num_evals"}
    sub = build_parser().commands["pipeline"]
    text = sub.format_help()
    for flag in flags_of(RunArgs):
        assert flag.flag in text and sub.flag_of(flag.dest) == flag.flag, flag
    args = build_parser().parse_args(["pipeline"])
    assert (args.num_batches, args.lr, args.optimizer, args.seed) == (300, 0.005, "momentum:0.9", 0)


def test_the_pipeline_checks_its_settings_before_it_builds_anything(monkeypatch):
    import staleness.pipeline as pp
    from staleness.pipeline import training

    def boom(*args, **kwargs):
        raise AssertionError("built before the settings were checked")

    monkeypatch.setattr(training, "make_plan", boom)
    for kw, line in ((dict(num_batches=0), "num_batches = 0 must be an integer >= 1"),
                     (dict(num_batches=5, backward_ratio=0), "backward_ratio = 0 must be a finite number > 0"),
                     (dict(num_batches=5, recompute_cost=-1), "recompute_cost = -1 must be a finite number >= 0"),
                     (dict(num_batches=5, seed=-1), "seed = -1 must be an integer >= 0")):
        with pytest.raises(ArgumentError, match=line):
            training.set_up(None, training.RunArgs("dsp", **kw))
    assert pp.settings.check(pp.settings.RunArgs("dsp", 5, seed=2)).seed == 2


@pytest.mark.parametrize("argv, line", [
    (["pipeline", "--batches", "0"], "--batches = 0 must be an integer >= 1"),
    (["pipeline", "--lr", "0"], "--lr = 0.0 must be a finite number > 0 (the learning rate)"),
    (["pipeline", "--backward-ratio", "0"], "--backward-ratio = 0.0 must be a finite number > 0"),
    (["pipeline", "--recompute-cost", "-1"], "--recompute-cost = -1.0 must be a finite number >= 0"),
    (["pipeline", "--seed", "-1"], "--seed = -1 must be an integer >= 0"),
    (["pipeline", "--eval-every", "0"], "--eval-every = 0 must be an integer >= 1"),
])
def test_bad_pipeline_flags_fail_once_naming_the_flag_before_anything_runs(argv, line, monkeypatch, capsys):
    import staleness.pipeline as pp

    monkeypatch.setattr(pp.tasks, "get", lambda *a, **k: (_ for _ in ()).throw(AssertionError("task built")))
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and line in lines[0], err


# -- a policy and a cluster given as values or specs: resolved by their own concept ------------
def test_every_entry_point_resolves_a_policy_and_a_cluster_the_same_way():
    from staleness.runtime.spec import make_spec

    calls = [lambda p, c: st.simulate("quadratic", p, c, num_updates=3),
             lambda p, c: st.simulate_schedule(p, c, num_updates=3),
             lambda p, c: make_spec("quadratic", p, c, num_updates=3)]
    for call in calls:
        with pytest.raises(TypeError, match=r"^policy = 123 must be a staleness.policies.Policy or a spec string"):
            call(123, "1,1")
        with pytest.raises(TypeError, match=r"cluster = 2.5 must be .*a staleness.cluster.Cluster or a spec string"):
            call("asp", 2.5)
    assert st.policies.resolve("ssp:3") == st.policies.ssp(3) and st.cluster.resolve(None, allow_none=True) is None
    assert st.cluster.resolve("1,2").describe() == st.cluster.parse("1,2").describe()


class _Reached(Exception):
    pass


def _every_field(tmp_path, replay: bool) -> dict:
    """A valid value, not the default, for every field of `Settings` (replay: no budget)."""
    from staleness.engine.settings import Settings

    values = dict(num_updates=7, max_time=50.0, seed=3, lr=0.05, lr_rule="per_update", optimizer="momentum:0.9",
                  inner_optimizer="adam", eval_every=5, num_evals=7, batch_size=4, progress=True,
                  checkpoint=str(tmp_path / "ck"), resume=True, stop_after=3, slot_mode="map",
                  config={"label": "x"}, callbacks=[print])
    if replay:
        del values["num_updates"], values["max_time"]
    fields = {f.name for f in dataclasses.fields(Settings)} - ({"num_updates", "max_time"} if replay else set())
    assert set(values) == fields, "a Settings field without a value here: add one"
    return values


@pytest.mark.parametrize("entry", ["simulate", "replay"])
@pytest.mark.parametrize("whole", [True, False])
def test_every_settings_field_reaches_the_run(entry, whole, tmp_path, monkeypatch):
    """Issue 37: `simulate` and `replay` take `settings=` whole (or its fields by keyword) and
    copy no field by hand: the run sees exactly the checked value, field for field."""
    from staleness.engine import run as engine_run
    from staleness.engine.settings import Settings, check

    seen = []

    def reached(source, task, s):
        seen.append(s)
        raise _Reached

    monkeypatch.setattr(engine_run, "_replay", reached)
    values = _every_field(tmp_path, entry == "replay")
    kwargs = {"settings": Settings(**values)} if whole else values
    with pytest.raises(_Reached):
        if entry == "simulate":
            st.simulate("quadratic", "asp", "1*2", **kwargs)
        else:
            st.engine.replay(st.simulate_schedule("asp", "1*2", num_updates=7), "quadratic", **kwargs)
    assert seen == [check(Settings(**values))]
    with pytest.raises(TypeError, match=rf"{entry}\(\) got an unexpected keyword argument 'lrr'; it takes settings="):
        getattr(st.engine, entry)(*(["quadratic", "asp", "1*2"] if entry == "simulate" else
                                    [st.simulate_schedule("asp", "1*2", num_updates=2), "quadratic"]), lrr=0.1)


@pytest.mark.parametrize("whole", [True, False])
def test_every_sweep_settings_field_reaches_the_sweep(whole, monkeypatch):
    """`st.sweep` takes `settings=` (a SweepSettings) whole or its fields by keyword: the
    sweep checks exactly that value, field for field, before simulating anything."""
    from staleness.engine.settings import SweepSettings, check_sweep

    values = dict(seeds=(1, 2), lr_rules=("per_update",), lrs=(0.05,), num_updates=7, max_time=50.0,
                  optimizer="momentum:0.9", inner_optimizer="adam", eval_every=5, num_evals=7, batch_size=4,
                  ring=16, slots=4)
    assert set(values) == {f.name for f in dataclasses.fields(SweepSettings)}, "a field without a value here"
    expected, seen = check_sweep(SweepSettings(**values)), []

    def reached(s):
        seen.append(check_sweep(s))
        raise _Reached

    monkeypatch.setattr(settings, "check_sweep", reached)
    with pytest.raises(_Reached):
        st.sweep("quadratic", ["asp"], "1*2", **({"settings": SweepSettings(**values)} if whole else values))
    assert seen == [expected]


@pytest.mark.parametrize("whole", [True, False])
def test_every_pipeline_field_reaches_the_run(whole, monkeypatch):
    """`pipeline.train` takes `settings=` (a RunArgs) whole or its fields by keyword."""
    from staleness.pipeline import run as pipeline_run
    from staleness.pipeline.settings import RunArgs

    values = dict(cluster="1,1,2", seed=3, lr=0.05, optimizer="sgd", eval_every=4, num_evals=7,
                  backward_ratio=1.5, recompute_cost=0.5)
    assert set(values) | {"schedule", "num_batches"} == {f.name for f in dataclasses.fields(RunArgs)}
    seen = []

    def reached(ptask, args):
        seen.append(args)
        raise _Reached

    monkeypatch.setattr(pipeline_run, "set_up", reached)
    kwargs = {"settings": RunArgs("gpipe:1", 99, **values)} if whole else values
    with pytest.raises(_Reached):
        st.pipeline.train(None, "dsp:1,1,0", 8, **kwargs)
    assert seen == [RunArgs("dsp:1,1,0", 8, **values)]
    with pytest.raises(TypeError, match=r"train\(\) got an unexpected keyword argument 'lrr'; it takes settings="):
        st.pipeline.train(None, "dsp:1,1,0", 8, lrr=0.1)


@pytest.mark.parametrize("whole", [True, False])
def test_every_real_run_field_reaches_its_spec(whole, tmp_path, monkeypatch):
    """`runtime.run` takes `settings=` (a runtime.spec.Settings) whole or its fields by keyword."""
    from staleness.runtime import local_run
    from staleness.runtime.spec import Settings as RealSettings

    values = dict(num_updates=7, num_workers=3, seed=3, lr=0.05, lr_rule="per_update", optimizer="momentum:0.9",
                  batch_size=4, data_dir=str(tmp_path), max_time=9.0, eval_every=5, num_evals=7, time_scale=0.5,
                  worker_timeout=12.0, on_worker_failure="stop", checkpoint=str(tmp_path / "ck"),
                  checkpoint_every=2, resume=True, inner_optimizer="adam", sync="server")
    assert set(values) | {"processes"} == {f.name for f in dataclasses.fields(RealSettings)}
    seen = []

    def reached(task, policy, cluster, settings):
        seen.append(settings)
        raise _Reached

    monkeypatch.setattr(local_run, "make_spec", reached)
    with pytest.raises(_Reached):
        st.runtime.run("quadratic", "asp", **({"settings": RealSettings(**values)} if whole else values))
    assert seen == [RealSettings(**values)]


@pytest.mark.parametrize("whole", [True, False])
def test_every_compare_field_reaches_its_runs(whole, monkeypatch):
    """`compare` takes `settings=` (a CompareSettings) whole or its fields by keyword: the
    runs it builds see each field (`_Runs` holds the per-run ones; the task its sizes)."""
    from staleness.results import compare as cmp_mod
    from staleness.results.compare import CompareSettings

    values = dict(seeds=(4, 5), max_time=30.0, num_updates=9, lr=0.05, lr_rule="per_update",
                  optimizer="momentum:0.9", inner_optimizer="adam", batch_size=4, metric="loss", target=0.5,
                  num_evals=7, data_dir=None, partition="iid", tune=False, lr_grid=(0.01, 0.1), tune_seeds=(9,),
                  default_lr=0.2)
    assert set(values) == {f.name for f in dataclasses.fields(CompareSettings)}
    seen = {}

    def reached(runs, pols, stage, resume, tune, lr_grid, tune_seeds, progress):
        seen.update(runs=runs, tune=tune, lr_grid=lr_grid, tune_seeds=tune_seeds)
        raise _Reached

    monkeypatch.setattr(cmp_mod, "_tuning", reached)
    with pytest.raises(_Reached):
        cmp_mod.compare("quadratic", ["asp"], "1*2", **({"settings": CompareSettings(**values)} if whole else values))
    runs = seen["runs"]
    assert (runs.max_time, runs.num_updates, runs.lr, runs.lr_rule, runs.optimizer, runs.inner_optimizer,
            runs.num_evals, runs.default_lr, runs.metric) == (30.0, 9, 0.05, "per_update", "momentum:0.9", "adam",
                                                                  7, 0.2, "loss")
    assert runs.task.batch_size == 4 and (seen["tune"], seen["lr_grid"], seen["tune_seeds"]) == (False, (0.01, 0.1),
                                                                                                  (9,))
