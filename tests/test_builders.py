"""Tasks from the user's own pieces: from_flax (linen and nnx), from_functions,
register and `--task package.module:factory` on the command line.

Exact differential check first (an nnx and a linen network with the same
weights train along the same trajectory), then the Result round trip of nnx
weights, then each construction mistake as a named error, then the CLI.
"""

from __future__ import annotations

import math
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import staleness as st
from staleness.cli import main
from staleness.tasks.metrics import Metric
from staleness.engine.result import flatten_params, unflatten_params
from staleness.tasks import errors

RNG = np.random.default_rng(0)
X = RNG.normal(size=(150, 6)).astype(np.float32)
Y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int32) + (X[:, 2] > 0.8).astype(np.int32)   # 3 classes


class LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(16, name="hidden")(x))
        return nn.Dense(3, name="out")(x)


class NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(6, 16, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))


def _cluster():
    return st.cluster.heterogeneous([1.0, 1.7, 2.6])


def _copy_into_nnx(params) -> NnxMLP:
    model = NnxMLP(nnx.Rngs(1))
    for layer in ("hidden", "out"):
        for leaf in ("kernel", "bias"):
            getattr(getattr(model, layer), leaf)[...] = jnp.asarray(params[layer][leaf])
    return model


# ---------------------------------------------------------------------------
# linen == nnx; nnx weights survive Result.save/load


def test_nnx_and_linen_versions_of_one_network_train_the_same_trajectory():
    linen_task = st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=8, num_workers=3,
                                    partition="dirichlet:1", seed=3)
    p0 = jax.device_get(linen_task.init_params(jax.random.key(5)))
    fixed = st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=8, num_workers=3,
                               partition="dirichlet:1", seed=3, params=p0)
    nnx_task = st.tasks.from_flax(_copy_into_nnx(p0), "cross_entropy", (X, Y), batch_size=8, num_workers=3,
                                  partition="dirichlet:1", seed=3)
    assert jax.tree.structure(nnx_task.init_params(jax.random.key(0))) == jax.tree.structure(p0)
    kw = dict(num_updates=24, lr=0.2, optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.2, momentum=0.9),
              num_evals=3, seed=2)
    a = st.simulate(fixed, st.policies.ssp(2), _cluster(), **kw)
    b = st.simulate(nnx_task, st.policies.ssp(2), _cluster(), **kw)
    # the same dot products in the same order: equal to the last bit on CPU; 1e-6 allows
    # XLA to fuse the two programs differently
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    np.testing.assert_allclose(a.history[["loss", "accuracy"]], b.history[["loss", "accuracy"]], atol=1e-6)
    assert not np.allclose(a.params["out"]["kernel"], p0["out"]["kernel"])   # it trained


def test_result_save_load_round_trips_every_nnx_weight(tmp_path):
    task = st.tasks.from_flax(NnxMLP(nnx.Rngs(0)), "cross_entropy", (X, Y), batch_size=8)
    res = st.simulate(task, st.policies.asp(), st.cluster.heterogeneous([1.0]), num_updates=6, lr=0.1, num_evals=1)
    res.save(tmp_path / "r")
    loaded = st.Result.load(tmp_path / "r")
    assert jax.tree.structure(loaded.params) == jax.tree.structure(res.params)
    for x, y in zip(jax.tree.leaves(res.params), jax.tree.leaves(loaded.params)):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert sum(a.size for a in jax.tree.leaves(loaded.params)) == 6 * 16 + 16 + 16 * 3 + 3


def test_flatten_params_reads_nnx_state_and_refuses_what_it_cannot_save():
    state = nnx.state(NnxMLP(nnx.Rngs(0)), nnx.Param)
    flat = flatten_params(state)
    assert sorted(flat) == ["hidden/bias", "hidden/kernel", "out/bias", "out/kernel"]
    assert flat["hidden/kernel"].shape == (6, 16) and flat["hidden/kernel"].dtype == np.float32
    assert np.array_equal(unflatten_params(flat)["out"]["bias"], np.asarray(state["out"]["bias"].get_value()))
    for bad, where in (({"a": {"b": object()}}, "a/b"), ({"w": None}, "w"), ({"k": jax.random.key(0)}, "k"),
                       ({"a/b": np.ones(2)}, "'a/b'")):
        with pytest.raises(TypeError, match=where):
            flatten_params(bad)


# ---------------------------------------------------------------------------
# Other losses in a few lines: regression (mse), next-token, callables


def test_regression_task_in_a_few_lines_simulates():
    w = RNG.normal(size=(6, 2)).astype(np.float32)
    task = st.tasks.from_flax(nn.Dense(2), "mse", (X, X @ w), batch_size=16, num_workers=2,
                              partition="sizes:0.7,0.3", metrics=["mse", "mae", "loss"])
    assert task.metric_names == ("mse", "mae", "loss") and task.metric("mse").goal == "lower"
    res = st.simulate(task, st.policies.bsp(), st.cluster.heterogeneous([1.0, 1.0]), num_updates=40, lr=0.1,
                      num_evals=2)
    assert res.history["mse"].iloc[-1] < 0.5 * res.history["mse"].iloc[0]
    assert res.history["mse"].iloc[-1] == pytest.approx(res.history["loss"].iloc[-1], rel=1e-6)


class TinyLM(nnx.Module):
    def __init__(self, vocab, rngs):
        self.embed = nnx.Embed(vocab, 8, rngs=rngs)
        self.head = nnx.Linear(16, vocab, rngs=rngs)

    def __call__(self, tokens):            # [B, T] -> [B, T, vocab]: previous + current token
        e = self.embed(tokens)
        prev = jnp.concatenate([jnp.zeros_like(e[:, :1]), e[:, :-1]], axis=1)
        return self.head(jnp.concatenate([prev, e], axis=-1))


def test_next_token_task_in_a_few_lines_simulates():
    text = np.frombuffer(b"abcabcabdabcabcabd" * 40, np.uint8).astype(np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(text, 9)[::3]            # [N, T + 1]
    task = st.tasks.from_flax(TinyLM(256, nnx.Rngs(0)), "next_token", windows, batch_size=8, num_workers=2,
                              metrics=["loss", "bits_per_byte", "perplexity", "accuracy"], eval_chunk=16)
    assert task.metric_names == ("loss", "bits_per_byte", "perplexity", "accuracy")
    res = st.simulate(task, st.policies.asp(), st.cluster.heterogeneous([1.0, 2.0]), num_updates=30,
                      optimizer="adam:lr=0.03", num_evals=2)
    last = res.history.iloc[-1]
    assert last["loss"] < res.history["loss"].iloc[0] - 1.0
    assert last["bits_per_byte"] == pytest.approx(last["loss"] / math.log(2), rel=1e-5)
    assert last["perplexity"] == pytest.approx(math.exp(last["loss"]), rel=1e-5)
    default = st.tasks.from_flax(TinyLM(256, nnx.Rngs(0)), "next_token", windows, batch_size=8)
    assert default.metric_names == ("loss", "bits_per_byte")


def test_next_token_reads_its_tokens_from_input_key():
    """The token field named by input_key is what next_token predicts: the same windows
    under another field name train the same parameters, bit for bit."""
    text = np.frombuffer(b"abcabcabdabcabcabd" * 20, np.uint8).astype(np.int32)
    windows = np.lib.stride_tricks.sliding_window_view(text, 9)[::3]
    kw = dict(batch_size=8, num_workers=2, metrics=["loss", "accuracy"])
    as_x = st.tasks.from_flax(TinyLM(256, nnx.Rngs(0)), "next_token", windows, **kw)
    as_tokens = st.tasks.from_flax(TinyLM(256, nnx.Rngs(0)), "next_token", {"tokens": windows},
                                   input_key="tokens", **kw)
    run = dict(num_updates=12, optimizer="adam:lr=0.03", num_evals=2)
    a = st.simulate(as_x, "asp", st.cluster.heterogeneous([1.0, 2.0]), **run)
    b = st.simulate(as_tokens, "asp", st.cluster.heterogeneous([1.0, 2.0]), **run)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
    assert a.history["accuracy"].equals(b.history["accuracy"])


@pytest.mark.parametrize("per_example", [False, True])
def test_callable_losses_scalar_or_per_example_evaluate_without_padding(per_example):
    def loss(logits, batch):
        values = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
        return values if per_example else values.mean()

    # 30 test examples in chunks of 8: two padded slots that must not count
    named = st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=4, eval_chunk=8)
    mine = st.tasks.from_flax(LinenMLP(), loss, (X, Y), batch_size=4, eval_chunk=8,
                              metrics={"loss": None, Metric("hits", "higher", 0.0, 1.0):
                                       lambda out, b: (out.argmax(-1) == b["y"]).astype(jnp.float32)})
    p = named.init_params(jax.random.key(0))
    want, got = named.evaluate(p), mine.evaluate(p)
    assert named.test_size == 30
    assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=1e-6)
    assert float(got["hits"]) == pytest.approx(float(want["accuracy"]), abs=1e-7)
    batch = named.minibatch(jax.random.key(1), 0, 0)
    assert float(mine.loss(p, batch)) == pytest.approx(float(named.loss(p, batch)), rel=1e-6)


def test_dict_data_labels_and_explicit_test_set():
    data = {"x": X[:100], "y": Y[:100], "group": (np.arange(100) % 4).astype(np.int32)}
    test = {"x": X[100:], "y": Y[100:], "group": np.zeros(50, np.int32)}
    task = st.tasks.from_flax(LinenMLP(), "cross_entropy", data, test=test, batch_size=4, num_workers=4,
                              partition="shard", labels="group")
    assert (task.train_size, task.test_size) == (100, 50)
    assert task.partition_info()["label_skew"] == pytest.approx(0.75)   # one group per worker of 4
    batch = task.minibatch(jax.random.key(0), 2, 0)
    assert set(batch) == {"x", "y", "group", "index"} and (np.asarray(batch["group"]) == 2).all()


def test_from_functions_builds_a_task_for_anything_else():
    target = jnp.arange(3.0)

    def sample(key, worker, iteration):
        return {"noise": 0.01 * jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, worker), iteration),
                                                  (4, 3))}

    task = st.tasks.from_functions(
        init=lambda key: {"w": jnp.zeros(3)},
        loss=lambda p, b: jnp.sum((p["w"] - target + b["noise"].mean(0)) ** 2),
        sample=sample, evaluate=lambda p: {"dist": jnp.linalg.norm(p["w"] - target)},
        batch_size=4, num_workers=2, metrics=[Metric("dist", "lower", 0.0)], name="toy")
    res = st.simulate(task, st.policies.asp(), st.cluster.heterogeneous([1.0, 1.3]), num_updates=40, lr=0.2,
                      num_evals=2)
    assert res.history["dist"].iloc[-1] < 0.1 * res.history["dist"].iloc[0]
    with pytest.raises(errors.TaskError, match="exactly the metrics"):
        st.tasks.from_functions(lambda k: {"w": jnp.zeros(3)}, lambda p, b: jnp.sum(p["w"]), sample,
                                lambda p: {"other": 0.0}, batch_size=4, metrics=["loss"])


def test_from_flax_tasks_hold_out_a_validation_split_to_tune_on():
    """`Task.holdout` of a from_flax task: a fraction of the training examples becomes the
    held-out set (disjoint from the rest, the test set unused), so compare tunes its
    learning rates on it; a task without such a split refuses an explicit lr_grid."""
    task = st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=4, num_workers=3,
                              partition="shard", test_fraction=0.2)
    val = task.holdout(0.25, seed=1)
    n = task.train_size
    assert (val.train_size, val.test_size) == (n - round(0.25 * n), round(0.25 * n))
    assert val.name.endswith("[validation]") and val.partition == "shard"
    train_x = np.asarray(task.data["examples"]["x"])
    kept = np.asarray(val.data["examples"]["x"])
    held = np.asarray(val.data["test_examples"]["x"]).reshape(-1, 6)[np.asarray(val.data["mask_test"]).reshape(-1)]
    rows = {r.tobytes() for r in train_x}
    assert {r.tobytes() for r in kept} | {r.tobytes() for r in held} == rows
    assert not {r.tobytes() for r in kept} & {r.tobytes() for r in held}
    held_y = np.asarray(val.data["test_examples"]["y"]).reshape(-1)[np.asarray(val.data["mask_test"]).reshape(-1)]
    ref = st.tasks.from_flax(LinenMLP(), "cross_entropy", (kept, np.asarray(val.data["examples"]["y"])),
                             test=(held, held_y), batch_size=4, num_workers=3)   # the same split, given
    params = task.init_params(jax.random.key(0))
    got, want = val.evaluate(params), ref.evaluate(params)
    assert all(float(got[k]) == pytest.approx(float(want[k]), abs=1e-6) for k in ("loss", "accuracy"))
    assert val.partition_info()["worker_examples"] != task.partition_info()["worker_examples"]

    cmp = st.compare.compare(task, ["asp"], st.cluster.heterogeneous([1.0, 1.7, 2.6]), seeds=[0], num_updates=6,
                     lr_grid=[0.03, 0.1], tune_seeds=(0,), progress=False)
    assert cmp.tuning["asp"]["lr"] in (0.03, 0.1)

    toy = st.tasks.from_functions(lambda k: {"w": jnp.zeros(2)}, lambda p, b: jnp.sum((p["w"] - b) ** 2),
                                  lambda k, w, i: jnp.ones(2), lambda p: {"loss": jnp.sum(p["w"] ** 2)},
                                  batch_size=1, num_workers=3, metrics=["loss"], train_size=10)
    with pytest.raises(ValueError, match="lr_grid asks to tune the learning rates, but task 'custom' has no "
                                         "validation split"):
        st.compare.compare(toy, ["asp"], st.cluster.heterogeneous([1.0, 1.7, 2.6]), seeds=[0], num_updates=6,
                   lr_grid=[0.03, 0.1], progress=False)


# ---------------------------------------------------------------------------
# Construction mistakes: named errors, at construction


class LinenBN(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.BatchNorm(use_running_average=False)(x))


class NnxBN(nnx.Module):
    def __init__(self, rngs):
        self.bn = nnx.BatchNorm(6, rngs=rngs)
        self.out = nnx.Linear(6, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(self.bn(x))


class NnxDrop(nnx.Module):
    def __init__(self, rngs):
        self.out = nnx.Linear(6, 3, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.out(x))


def _ce(model=None, loss="cross_entropy", data=(X, Y), **kw):
    return lambda: st.tasks.from_flax(LinenMLP() if model is None else model, loss, data, batch_size=4, **kw)


@pytest.mark.parametrize("build, error, fragment", [
    (lambda: st.tasks.classification_task("t", NnxMLP(nnx.Rngs(0)),
                                                st.tasks.data.Arrays(X, Y, X, Y), batch_size=4),
     errors.ModelKindError, "flax nnx module NnxMLP.*from_flax"),
    (_ce(model=LinenMLP), errors.ModelKindError, "linen Module class; pass an instance"),
    (_ce(model=NnxMLP), errors.ModelKindError, "nnx Module class; pass an instance"),
    (_ce(model=lambda x: x), errors.ModelKindError, "not a flax Module instance"),
    (_ce(model=NnxMLP(nnx.Rngs(0)), params={}), errors.ModelKindError, "params= is for linen"),
    (_ce(model=LinenBN()), errors.MutableStateError, "batch_stats"),
    (_ce(model=NnxBN(nnx.Rngs(0))), errors.MutableStateError, "BatchStat"),
    (_ce(loss="hinge"), errors.LossError, "valid: cross_entropy, mse, next_token"),
    (_ce(loss=lambda out, b: out), errors.LossError, r"scalar .*per-example values \[B\] = \[4\]"),
    (_ce(loss=lambda out, b: jnp.sum(out, axis=0)), errors.LossError, "scalar"),
    (_ce(data=(X, np.eye(3, dtype=np.int32)[Y])), errors.LabelShapeError, "one-hot labels"),
    (_ce(data=(X, Y.astype(np.float32))), errors.LabelShapeError, "integer class ids"),
    (_ce(data=(X, Y + 5)), errors.LabelShapeError, r"labels must lie in \[0, 3\)"),
    (_ce(model=nn.Dense(1), loss="mse", data=(X, X[:, 0])), errors.LabelShapeError, r"y\[:, None\]"),
    (_ce(loss="next_token", data=X), errors.LabelShapeError, "integer token sequences"),
    (_ce(data=(X, Y[:-1])), errors.DataError, "same leading length.*x: 150, y: 149"),
    (_ce(data={"x": X, "y": Y, "w": np.ones(10)}), errors.DataError, "w: 10"),
    (_ce(data={"x": X, "y": Y, "index": Y}), errors.DataError, "reserved"),
    (_ce(model=NnxMLP(nnx.Rngs(0)), data=(X[:, :4], Y)), errors.TaskError, r"failed on inputs of shape \(4, 4\)"),
    (_ce(partition="dirichlet:0.5", num_workers=200), ValueError, "num_workers must be <= 120"),
    (_ce(sizes=[0.5, 0.5], partition="shard"), errors.TaskError, "not both"),
    (_ce(metrics=["f1"]), ValueError, "no known direction"),
    (_ce(model=NnxDrop(nnx.Rngs(0))), errors.TaskError, r"Dropout in training mode.*model\.eval\(\)"),
    (_ce(optimizer="adamx:lr=1"), ValueError, "optimizer = 'adamx:lr=1': unknown optimizer 'adamx'"),
])
def test_construction_mistakes_are_named_errors(build, error, fragment):
    with pytest.raises(error, match=fragment) as info:
        build()
    assert isinstance(info.value, ValueError)   # the CLI's one line, exit 2


# ---------------------------------------------------------------------------
# register and package.module:factory


def test_register_names_a_factory_for_get(monkeypatch):
    from staleness.tasks import registry

    monkeypatch.setattr(registry, "_REGISTERED", {})
    seen = {}

    @st.tasks.register("my-mlp")
    def factory(num_workers, batch_size, seed=0, width=16):   # no partition, no data_dir: not passed
        seen.update(num_workers=num_workers, batch_size=batch_size, seed=seed, width=width)
        return st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=batch_size,
                                  num_workers=num_workers, name="whatever")

    task = st.tasks.get("my-mlp", num_workers=3, batch_size=5, width=32)
    assert task.name == "my-mlp" and seen == dict(num_workers=3, batch_size=5, seed=0, width=32)
    assert st.tasks.get("my-mlp", num_workers=3).batch_size == 32   # no default of its own: get's

    @st.tasks.register("my-mlp-16")
    def own_default(num_workers, batch_size=16, seed=5):
        seen.update(seed=seed)
        return st.tasks.from_flax(LinenMLP(), "cross_entropy", (X, Y), batch_size=batch_size,
                                  num_workers=num_workers)

    assert st.tasks.get("my-mlp-16", num_workers=3).batch_size == 16 and seen["seed"] == 5
    assert st.tasks.get("my-mlp-16", num_workers=3, batch_size=8, seed=1).batch_size == 8 and seen["seed"] == 1
    assert "my-mlp" in st.tasks.names() and st.tasks.options("my-mlp") == {}
    assert st.engine.resolve_task("my-mlp", 3).num_workers == 3
    with pytest.raises(TypeError, match="unknown option"):
        st.tasks.get("my-mlp", depth=3)
    with pytest.raises(ValueError, match="built in"):
        st.tasks.register("digits-mlp", factory)
    with pytest.raises(ValueError, match="already registered"):
        st.tasks.register("my-mlp", lambda **kw: None)


MODULE = '''
import numpy as np
import flax.linen as nn
import staleness as st

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(nn.tanh(nn.Dense(16)(x)))

def make(num_workers, batch_size, partition="iid", seed=0):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 2] > 0.8)
    return st.tasks.from_flax(MLP(), "cross_entropy", (x, y), batch_size=batch_size,
                              num_workers=num_workers, partition=partition, seed=seed)

def number(**kwargs):
    return 3

def make16(num_workers, batch_size=16, partition="shard", seed=0):
    return make(num_workers, batch_size, partition, seed)

def needs_extra(*, num_workers, extra):
    return make(num_workers, 8)

def make_adamw(num_workers, batch_size, partition="iid", seed=0):
    import dataclasses, optax
    return dataclasses.replace(make(num_workers, batch_size, partition, seed), optimizer=optax.adamw(3e-3))
'''


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    name = f"user_tasks_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def _cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(300)
def test_cli_simulate_compare_run_and_replay_a_custom_task(custom_module, tmp_path, capsys):
    ref = f"{custom_module}:make"
    code, out, _ = _cli(["simulate", "--task", ref, "--cluster", "1,2", "--updates", "12", "--batch-size", "8",
                         "--partition", "dirichlet:0.5", "--no-progress", "--out", str(tmp_path / "sim")], capsys)
    assert code == 0 and ref in out
    sim = st.Result.load(tmp_path / "sim")
    assert sim.config["task"] == ref and sim.config["batch_size"] == 8

    code, out, _ = _cli(["compare", "--task", ref, "--cluster", "1,2", "--updates", "8", "--seeds", "0",
                         "--policy", "bsp", "--policy", "asp", "--no-progress", "--out", str(tmp_path / "cmp")],
                        capsys)
    assert code == 0 and "bsp" in out and "asp" in out

    code, out, _ = _cli(["run", "--task", ref, "--devices", "2", "--workers", "2", "--policy", "asp",
                         "--updates", "10", "--batch-size", "8", "--no-progress", "--out", str(tmp_path / "run")],
                        capsys)
    assert code == 0, out
    run = st.Result.load(tmp_path / "run")
    assert run.config["task"] == ref and run.config["runtime"] == "real"
    code, out, _ = _cli(["replay", str(tmp_path / "run"), "--check"], capsys)
    assert code == 0 and "bitwise equal" in out


@pytest.mark.parametrize("ref, fragment", [
    ("no_such_module_zz:make", "no module named 'no_such_module_zz'"),
    ("{mod}:nope", "has no attribute 'nope'"),
    ("{mod}:number", "returned int, not a staleness.tasks.Task"),
    ("{mod}:needs_extra", "cannot be called with the arguments staleness passes (num_workers): missing a "
                          "required argument: 'extra'"),
    (":make", "must have the form 'package.module:factory'"),
])
def test_cli_bad_factory_is_one_line_exit_2(custom_module, ref, fragment, capsys):
    for command in (["simulate", "--updates", "5"], ["run", "--updates", "5"]):
        code, _, err = _cli([*command, "--task", ref.format(mod=custom_module)], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("staleness: error:"), err
        assert fragment in lines[0]


@pytest.mark.parametrize("ref, fragment", [
    ("no_such_module_zz:make", "no module named 'no_such_module_zz'"),
    ("{mod}:nope", "has no attribute 'nope'"),
])
def test_cli_launch_checks_the_factory_before_starting_processes(custom_module, ref, fragment, capsys,
                                                                  monkeypatch):
    from staleness.runtime import multiprocess

    monkeypatch.setattr(multiprocess, "launch_local", lambda *a, **k: pytest.fail("processes were started"))
    code, _, err = _cli(["launch", "--local", "2", "--updates", "5", "--task", ref.format(mod=custom_module)],
                        capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err


@pytest.mark.timeout(300)
def test_cli_replays_a_task_whose_own_optimizer_is_an_optax_object(custom_module, tmp_path, capsys):
    """The task's own optax optimizer is recorded as the task's (optim.TASK_OPTAX): the
    replay rebuilds the task from its factory and uses it again, bit for bit."""
    ref = f"{custom_module}:make_adamw"
    code, out, err = _cli(["simulate", "--task", ref, "--cluster", "1,2", "--updates", "12", "--batch-size", "8",
                           "--no-progress", "--out", str(tmp_path / "sim")], capsys)
    assert code == 0, err
    assert st.Result.load(tmp_path / "sim").config["optimizer"] == st.engine.optim.TASK_OPTAX
    code, out, err = _cli(["replay", str(tmp_path / "sim"), "--check"], capsys)
    assert code == 0 and "bitwise equal" in out, err


def test_cli_keeps_a_factorys_own_batch_size_and_partition(custom_module, tmp_path, capsys):
    """Without --batch-size/--partition the command line passed 32 and iid over the
    factory's own defaults; explicit flags still win."""
    ref = f"{custom_module}:make16"
    for argv, want in (([], (16, "shard")), (["--batch-size", "4", "--partition", "iid"], (4, "iid"))):
        out = tmp_path / f"sim{len(argv)}"
        code, _, err = _cli(["simulate", "--task", ref, "--cluster", "1,2", "--updates", "6", "--no-progress",
                             "--out", str(out), *argv], capsys)
        assert code == 0, err
        cfg = st.Result.load(out).config
        assert (cfg["batch_size"], cfg["partition"]) == want
