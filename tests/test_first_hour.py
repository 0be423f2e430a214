"""Issue 25 regressions: what a researcher hits in the first hour is an error that names the
setting, not an AttributeError or a silently dropped setting."""

import pytest

import staleness as st


def test_simulate_names_a_policy_or_cluster_of_the_wrong_type():
    """`st.simulate(task, 123, cl)` raised AttributeError: 'int' object has no attribute 'work'."""
    with pytest.raises(TypeError, match=r"policy = 123 must be a staleness.policies.Policy or a spec string"):
        st.simulate("quadratic", 123, "2", num_updates=2)
    with pytest.raises(TypeError, match=r"cluster = None must be a staleness.cluster.Cluster or a spec string"):
        st.simulate("quadratic", "asp", None, num_updates=2)


def test_summary_with_a_target_on_a_metric_the_task_lacks_is_an_error():
    """`r.summary(target=0.9)` on a task without accuracy dropped the target silently."""
    r = st.simulate("quadratic", "asp", "2", num_updates=4, num_evals=1)
    with pytest.raises(ValueError, match="metric = 'accuracy' is not in the history; valid: train_loss, loss"):
        r.summary(target=0.9)
    assert "time_to_loss_1_s" in r.summary(target=1.0, metric="loss")


@pytest.mark.parametrize("kwargs, name", [(dict(seeds=(0, 0)), "seeds repeats 0"),
                                          (dict(policies=["asp", "asp"]), "policies repeats asp"),
                                          (dict(lrs=(0.1, 0.1)), "lrs repeats 0.1")])
def test_a_sweep_refuses_repeated_runs(kwargs, name):
    """`--policy asp --policy asp` or `--seeds 0,0` counted duplicate runs as independent seeds."""
    policies = kwargs.pop("policies", ["asp"])
    with pytest.raises(ValueError, match=f"sweep: {name}; give each once"):
        st.sweep("quadratic", policies, "2", num_updates=2, **kwargs)


def test_wait_fraction_groups_workers_above_the_bar_limit():
    """`staleness simulate --cluster "1*100000"` spent minutes drawing one bar per worker."""
    from staleness.results import plots

    sched = st.simulate_schedule("ssp:1", "0.5*600,2*600", num_updates=3000, seed=0)
    ax = plots.wait_fraction(sched).axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == plots.MAX_BARS and "19 per bar" in ax.get_xlabel()
    wf = sched.wait_fraction()
    assert abs(heights[0] - wf[:19].mean()) < 1e-12 and abs(heights[-1] - wf[19 * 63:].mean()) < 1e-12


# -- nothing lost ------------------------------------------------------------------------
def _compare(argv, capsys):
    from staleness.cli import main

    code = main(["compare", "--task", "quadratic", "--seeds", "0", "--no-tune", "--updates", "6", "--no-progress",
                 *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _snapshot(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_failed_overwrite_keeps_the_previous_comparison(tmp_path, capsys):
    """`compare ... --overwrite` with a policy that fails validation deleted the previous
    comparison and left only compare.json (which then blocked the corrected command)."""
    out = tmp_path / "keep"
    code, _, err = _compare(["--policy", "asp", "--out", str(out)], capsys)
    assert code == 0, err
    before = _snapshot(out)
    assert "table.csv" in before and any(k.startswith("results/") for k in before)
    code, _, err = _compare(["--policy", "streaming_diloco:20:fragments=4", "--overwrite", "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "fragments = 4" in err
    assert _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]   # no staging directory left behind


def test_a_failed_comparison_leaves_nothing_that_blocks_the_next(tmp_path, capsys):
    out = tmp_path / "fresh"
    code, _, err = _compare(["--policy", "streaming_diloco:20:fragments=4", "--out", str(out)], capsys)
    assert code == 2 and not out.exists() and not list(tmp_path.iterdir())
    code, _, err = _compare(["--policy", "asp", "--out", str(out)], capsys)   # the corrected command runs
    assert code == 0, err


def test_a_failure_mid_comparison_keeps_the_old_one(tmp_path, monkeypatch):
    """A run that fails after the first result was written (an injected error) leaves the old
    comparison as it was and no partial directory."""
    from staleness.results import compare as cmp_mod

    out = tmp_path / "c"
    cmp_mod.compare("quadratic", ["asp"], "2", seeds=[0], num_updates=4, tune=False, out=out, progress=False)
    before = _snapshot(out)
    real = cmp_mod.Result.save
    calls = []

    def save_then_fail(self, path, *a, **k):
        calls.append(path)
        real(self, path, *a, **k)
        if len(calls) == 2:
            raise RuntimeError("disk full (injected)")

    monkeypatch.setattr(cmp_mod.Result, "save", save_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        cmp_mod.compare("quadratic", ["asp", "ssp:1"], "2", seeds=[0], num_updates=4, tune=False, out=out,
                   overwrite=True, progress=False)
    assert len(calls) == 2 and _snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


@pytest.mark.parametrize("argv, name", [(["--policy", "asp", "--policy", "asp"], "policies repeats asp"),
                                        (["--policy", "asp", "--seeds", "0,0"], "seeds repeats 0")])
def test_compare_refuses_repeated_runs(tmp_path, capsys, argv, name):
    code, _, err = _compare([*argv, "--out", str(tmp_path / "d")], capsys)
    assert code == 2 and f"compare: {name}; give each once" in err and not (tmp_path / "d").exists()


# -- a NaN at update 0 -------------------------------------------------------------------------
def test_a_nan_at_update_zero_blames_the_loss_or_data_not_the_lr():
    """A loss that is NaN at update 0 (staleness 0) suggested a smaller learning rate."""
    import jax.numpy as jnp

    from staleness.engine.result import DivergenceError

    task = st.tasks.from_functions(
        lambda key: {"w": jnp.zeros(3)}, lambda p, b: jnp.log(jnp.sum(p["w"] * b)),   # log(0) at the start
        lambda key, worker, iteration: jnp.ones(3), lambda p: {"loss": jnp.sum(p["w"])},
        batch_size=1, num_workers=2, metrics=["loss"])
    with pytest.raises(DivergenceError, match="at update 0 .*at the initial parameters: the loss function or the data"
                       ) as e:
        st.simulate(task, "asp", "2", num_updates=4, lr=0.1)
    assert "try a smaller lr" not in str(e.value)


# -- settings a task factory does not take ------------------------------------------------------
FACTORY = '''
import jax.numpy as jnp
import staleness as st


def fixed(num_workers=1):
    """A factory without batch_size, partition or seed: its task always has batch 16, iid."""
    return st.tasks.from_functions(
        lambda key: {"w": jnp.ones(2)}, lambda p, b: jnp.sum((p["w"] - b) ** 2),
        lambda key, worker, iteration: jnp.zeros(2), lambda p: {"loss": jnp.sum(p["w"] ** 2)},
        batch_size=16, num_workers=num_workers, metrics=["loss"])
'''


@pytest.mark.parametrize("kwargs, setting", [(dict(batch_size=64), "batch_size = 64"),
                                             (dict(partition="dirichlet:0.5"), "partition = 'dirichlet:0.5'"),
                                             (dict(seed=3), "seed = 3")])
def test_a_setting_the_task_factory_does_not_take_is_an_error(tmp_path, monkeypatch, kwargs, setting):
    """`--task mytask:fixed --batch-size 64 --partition dirichlet:0.5` with a factory lacking those
    parameters ran with batch 16 and iid, and recorded them, with no word."""
    from staleness.tasks.errors import FactoryError

    (tmp_path / "mytask.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FactoryError, match=f"its factory takes no .*{setting} cannot be honoured"):
        st.tasks.get("mytask:fixed", num_workers=2, **kwargs)
    # the values it has anyway are fine, and so is leaving them out
    assert st.tasks.get("mytask:fixed", num_workers=2, batch_size=16, partition="iid").batch_size == 16
    assert st.tasks.get("mytask:fixed", num_workers=2).batch_size == 16


def test_a_batch_larger_than_the_training_set_is_an_error():
    with pytest.raises(ValueError, match="batch_size = 100000 is more than its 1437 training examples"):
        st.tasks.get("digits-mlp", batch_size=100000)


def test_from_flax_refuses_non_finite_inputs():
    import flax.linen as nn
    import numpy as np

    from staleness.tasks.errors import DataError

    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    x[7, 1] = np.nan
    y = np.arange(40) % 2
    with pytest.raises(DataError, match=r"data\['x'\] holds NaN or inf in 1 example\(s\), the first at row 7"):
        st.tasks.from_flax(nn.Dense(2), "cross_entropy", (x, y), batch_size=4)


def test_schedule_refuses_a_bandwidth_it_would_ignore(capsys):
    """`staleness schedule --cluster "...+net=10mbps:20ms"` reported bytes_sent 0: without a task
    there was no payload size, so the bandwidth was ignored, silently."""
    from staleness.cli import main

    code = main(["schedule", "--cluster", "1*4,2.6*4+net=10mbps:20ms", "--updates", "20"])
    err = capsys.readouterr().err
    assert code == 2 and "has a bandwidth, but without --task or --payload-bytes" in err
    code = main(["schedule", "--cluster", "1*4,2.6*4+net=10mbps:20ms", "--updates", "20", "--payload-bytes",
                 "1000000", "--policy", "asp", "--json"])
    import json

    row = json.loads(capsys.readouterr().out)
    latency_only = st.simulate_schedule("asp", "1*4,2.6*4+net=10mbps:20ms", num_updates=20, seed=0)
    assert code == 0 and row["bytes_sent"] == 2 * 20 * 1_000_000   # a pull and a push of 1 MB per update
    assert row["sim_time_s"] > latency_only.update_time[-1] + 0.8   # 1 MB at 10 Mbit/s takes 0.8 s


def test_replay_with_another_task_is_one_line(tmp_path, capsys):
    """`staleness replay <digits-mlp result> --task mytask:make_task` trained another model on
    the schedule and ended in a 26-line DivergenceError (with --check: 'differ, inf')."""
    from staleness.cli import main

    st.simulate("quadratic", "asp", "2", num_updates=4, num_evals=1).save(tmp_path / "r")
    code = main(["replay", str(tmp_path / "r"), "--task", "linreg", "--check"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "task 'linreg' has other parameters" in err and "recorded run's task 'quadratic'" in err
    assert main(["replay", str(tmp_path / "r"), "--check"]) == 0


# -- absurd sizes ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, words", [
    (["simulate", "--updates", "99999999999"], "--updates 99999999999 means about 1e+11 gradients in 1 run(s)"),
    (["simulate", "--max-time", "1e308"], "--max-time 1e+308 is more gradients than any machine can simulate"),
    (["compare", "--updates", "99999999999", "--policy", "asp", "--seeds", "0,1"], "in 2 run(s)"),
    (["sweep", "--updates", "99999999999"], "--yes to go on"),
    (["schedule", "--updates", "99999999999", "--policy", "asp"], "at least 27.8 h of simulation alone"),
    (["launch", "--local", "100000", "--policy", "asp"], "--local 100000 would start 100000 JAX processes"),
])
def test_absurd_sizes_are_refused_with_an_estimate(tmp_path, capsys, monkeypatch, argv, words):
    """`launch --local 100000` would start that many JAX processes; `--max-time 1e308` and
    `--updates 99999999999` ran indefinitely with no estimate."""
    from staleness.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_yes_lets_a_large_budget_through():
    import argparse

    from staleness.cli import common

    args = argparse.Namespace(yes=False)
    cluster = st.cluster.parse("1*4")
    with pytest.raises(common.UsageError):
        common.check_scale(args, cluster, 10**11, None)
    common.check_scale(argparse.Namespace(yes=True), cluster, 10**11, None)   # no error: the user said so
    common.check_scale(args, cluster, 2000, None)                              # an ordinary budget passes
    common.check_scale(args, cluster, None, 600.0, runs=18)                    # the default comparison passes


def test_lr_tuning_says_when_its_choice_is_noise():
    """Tuning with 2 seeds decided a ranking (SSP 0.01 vs ASP 0.03) that one stuck seed made."""
    from staleness.results.compare import compare

    task = st.tasks.get("quadratic", num_workers=1)
    clear = compare(task, ["asp"], st.cluster.constant(1), seeds=[0], num_updates=40, lr_grid=[0.01, 2 / 11],
                    num_evals=2)
    assert clear.tuning["asp"]["lr"] == 2 / 11 and not clear.tuning["asp"]["within_noise"]
    assert clear.tuning_notes() == []
    close = compare(task, ["asp"], st.cluster.constant(1), seeds=[0], num_updates=40,
                    lr_grid=[0.1, 0.1 * (1 + 1e-7)], num_evals=2)
    t = close.tuning["asp"]
    assert t["within_noise"] and t["runner_up"] in t["grid"] and t["runner_up"] != t["lr"]
    assert close.tuning_notes() == [f"asp: lr {t['lr']:g} vs {t['runner_up']:g} is within the tuning seeds' noise"]


def test_a_run_whose_workers_all_died_is_failed_not_complete(tmp_path, capsys):
    """`+fail=0@10,1@10,2@10,3@10` reported status 'complete' after 36 of 50 updates."""
    from staleness.cli import main
    from staleness.engine.result import Result

    cluster = "1*4+fail=0@10,1@10,2@10,3@10"
    r = st.simulate("quadratic", "asp", cluster, num_updates=50, num_evals=2)
    assert r.status == "failed" and r.schedule.num_updates < 50
    assert r.config["ended"].startswith("every worker was lost: the run ended at 10 simulated s after")
    ok = st.simulate("quadratic", "asp", "1*4+fail=0@10", num_updates=50, num_evals=2)
    assert ok.status == "complete" and ok.schedule.num_updates == 50   # three workers go on
    code = main(["simulate", "--task", "quadratic", "--policy", "asp", "--cluster", cluster, "--updates", "50",
                 "--no-progress", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 1 and "every worker was lost" in err
    assert Result.load(tmp_path / "r").status == "failed"


# -- portable checkpoints ------------------------------------------------------------------------
def test_result_params_load_into_the_users_nnx_and_linen_models_from_orbax(tmp_path):
    """Parameters were npz only, with no helper to load them into the user's nnx or linen model."""
    from pathlib import Path

    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from flax import nnx

    x = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(5, 8, rngs=rngs)
            self.b = nnx.Linear(8, 2, rngs=rngs)

        def __call__(self, v):
            return self.b(nnx.relu(self.a(v)))

    for kind, model in (("nnx", Net(nnx.Rngs(0))), ("linen", nn.Dense(2))):
        task = st.tasks.from_flax(model, "cross_entropy", (x, y), batch_size=8, num_workers=2)
        r = st.simulate(task, "asp", "2", num_updates=6, num_evals=1, lr=0.5)
        r.save(tmp_path / kind)
        with ocp.StandardCheckpointer() as ckpt:
            restored = ckpt.restore(Path(tmp_path / kind / "orbax").absolute())
        if kind == "nnx":
            before = np.asarray(Net(nnx.Rngs(1))(jnp.asarray(x[:4])))
            got = np.asarray(st.tasks.load_into(Net(nnx.Rngs(1)), restored)(jnp.asarray(x[:4])))
            want = np.asarray(st.tasks.load_into(Net(nnx.Rngs(2)), r.params)(jnp.asarray(x[:4])))
            assert np.abs(got - before).max() > 1e-3   # the weights were replaced
            with pytest.raises(ValueError, match="load_into: params has no b/"):
                st.tasks.load_into(Net(nnx.Rngs(1)), {"a": restored["a"]})
        else:
            got = np.asarray(model.apply({"params": restored}, x[:4]))
            want = np.asarray(model.apply({"params": r.params}, x[:4]))
        np.testing.assert_array_equal(got, want)   # the orbax checkpoint holds exactly the Result's parameters


def test_real_runs_inject_the_bandwidth_of_the_network_model():
    """`+net=1gbps` changed nothing in `staleness run`: only latencies were injected. At 320 bit/s
    the quadratic's 40-byte parameters take 1 simulated second each way, so a BSP round lasts
    3 s (pull, compute, push) as the simulator predicts; the injected sleeps are lower bounds
    (a loaded machine only adds to them), so the check is one-sided up to 5% timer slack."""
    cluster, scale = "1*2+net=320bps:0ms", 0.05
    predicted = st.simulate_schedule("bsp", cluster, num_updates=6, seed=0, payload_bytes=40)
    assert predicted.update_time[-1] == pytest.approx(18.0)   # 6 rounds of 1 + 1 + 1 s
    r = st.runtime.run("quadratic", "bsp", cluster, num_workers=2, num_updates=6, time_scale=scale)
    c = r.schedule.columns
    assert (c["start"] - c["pull_time"] >= 0.95 * 1.0 * scale).all()    # every pull slept its transfer
    assert (c["push_time"] - c["end"] >= 0.95 * 1.0 * scale).all()      # and every push
    assert r.schedule.update_time[-1] >= 0.95 * predicted.update_time[-1] * scale
