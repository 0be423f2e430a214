"""stdlib-lm: the byte-level transformer LM on the Python standard library's source.

Exact checks first (the corpus is a pure function of the installed stdlib; the
host index table is the minibatch's offsets; a window is the corpus bytes at
its offset; the pipeline split computes the unsplit model's loss; a real run's
trace replays bitwise), then properties of the model (loss at init near
ln 256, causality) and one short training run. A tiny configuration keeps the
file fast: 1-2 blocks, d_model 32, context 16, a 64 KiB training stream.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
import staleness.pipeline as pp
import staleness.runtime as rt
from staleness.engine import core
from staleness.tasks import optim
from staleness.pipeline import model as pmodel
from staleness.pipeline import tasks as ptasks
from staleness.runtime.replay import replay_trace
from staleness.tasks import lm, registry, transformer

T = 16                 # context
CORPUS = 1 << 16       # training stream cap, bytes
TINY = dict(num_layers=1, d_model=32, num_heads=2, context=T, corpus_bytes=CORPUS, eval_windows=32)
WORKERS = 2
MU = 8
DEFAULT = optim.get(lm.DEFAULT_OPTIMIZER).describe()   # as a Result config records it


@pytest.fixture(scope="module")
def task():
    return st.tasks.get("stdlib-lm", batch_size=MU, num_workers=WORKERS, **TINY)


@pytest.fixture(scope="module")
def shard_task():
    return st.tasks.get("stdlib-lm", batch_size=MU, num_workers=4, partition="shard", **TINY)


def _init(model):
    return jax.jit(lambda key: model.init(key, jnp.zeros((1, T), jnp.int32))["params"])(jax.random.key(0))


def _model(**kw):
    cfg = {**TINY, **kw}
    return transformer.Transformer(cfg["num_layers"], cfg["d_model"], cfg["num_heads"], cfg["context"])


# ---------------------------------------------------------------------------
# Corpus


def test_corpus_is_deterministic_and_the_split_is_disjoint(task):
    c = lm.corpus(CORPUS)
    again = lm.corpus.__wrapped__(CORPUS)          # read from disk once more, uncached
    assert np.array_equal(c.train, again.train) and np.array_equal(c.heldout, again.heldout)
    assert c.fingerprint == again.fingerprint == lm.fingerprint(task)
    assert c.train.size == CORPUS and c.heldout.size > 0
    assert not set(c.train_files) & set(c.heldout_files)
    assert all(lm._held_out(f) for f in c.heldout_files) and not any(lm._held_out(f) for f in c.train_files)
    skipped = ("test/", "tests/", "idle_test/", "site-packages/", "__pycache__/")
    assert not any(f"/{s}" in f"/{p}" for p in lm.stdlib_files() for s in skipped)
    # the streams are the files' bytes, each followed by the separator (the last training file cut)
    root = lm.stdlib_root()
    train = b"".join((root / f).read_bytes() + lm.SEPARATOR for f in c.train_files)[:CORPUS]
    heldout = b"".join((root / f).read_bytes() + lm.SEPARATOR for f in c.heldout_files)
    assert c.train.tobytes() == train and c.heldout.tobytes() == heldout
    # a larger cap extends the training stream and keeps the held-out stream
    bigger = lm.corpus(2 * CORPUS)
    assert np.array_equal(bigger.train[:CORPUS], c.train) and np.array_equal(bigger.heldout, c.heldout)


def test_evaluation_windows_are_held_out_bytes(task):
    c = lm.corpus(CORPUS)
    x = np.asarray(task.data["x_test"]).reshape(-1, T)[: task.test_size]
    y = np.asarray(task.data["y_test"]).reshape(-1, T)[: task.test_size]
    assert x.shape == (TINY["eval_windows"], T) and np.array_equal(x[:, 1:], y[:, :-1])
    assert np.array_equal(x[0], c.heldout[:T]) and np.array_equal(y[-1], c.heldout[-T:])


# ---------------------------------------------------------------------------
# Sampling


@pytest.mark.parametrize("which", ["task", "shard_task"])
def test_host_indices_are_the_minibatch_offsets_and_windows_the_corpus_bytes(which, request):
    t = request.getfixturevalue(which)
    train = lm.corpus(CORPUS).train
    key = jax.random.key(7)
    assert t.indexed and t.train_size == CORPUS - T
    for w, i in [(0, 0), (1, 5), (t.num_workers - 1, 123)]:
        b = t.minibatch(key, w, i)
        index = t.host_indices(key, w, i)
        assert np.array_equal(np.asarray(b["index"]), index)
        assert b["x"].shape == b["y"].shape == (MU, T) and b["x"].dtype == jnp.int32
        for o, x, y in zip(index, np.asarray(b["x"]), np.asarray(b["y"]), strict=True):
            assert np.array_equal(x, train[o:o + T]) and np.array_equal(y, train[o + 1:o + T + 1])
        # the engine's gather from the table gives the same batch
        again = t.batch(jnp.asarray(index), key, w, i)
        assert all(np.array_equal(b[k], again[k]) for k in b)


def test_shards_are_contiguous_disjoint_byte_regions(shard_task):
    regions = []
    for w in range(shard_task.num_workers):
        own = shard_task.shard_indices(w)
        assert np.array_equal(own, np.arange(own[0], own[-1] + 1))          # contiguous offsets
        regions.append((int(own[0]), int(own[-1]) + T + 1))                 # bytes its windows cover
        drawn = shard_task.host_indices(jax.random.key(0), np.full(64, w), np.arange(64))
        assert np.isin(drawn, own).all()
    assert regions[0][0] == 0 and all(a[1] <= b[0] for a, b in zip(regions, regions[1:]))
    with pytest.raises(ValueError, match="at most"):
        st.tasks.get("stdlib-lm", num_workers=CORPUS // (T + 1) + 1, partition="shard", **TINY)


def test_sizes_are_contiguous_regions_of_those_fractions():
    t = st.tasks.get("stdlib-lm", batch_size=MU, num_workers=3, partition="sizes:0.5,0.3,0.2", **TINY)
    owned = [t.shard_indices(w) for w in range(3)]
    assert [int(o[0]) for o in owned] == [0, round(0.5 * CORPUS), round(0.8 * CORPUS)]
    assert [len(o) + T for o in owned] == [round(f * CORPUS) for f in (0.5, 0.3, 0.2)]
    assert t.config()["worker_examples"] == [len(o) for o in owned]
    with pytest.raises(ValueError, match="one per worker"):
        st.tasks.get("stdlib-lm", num_workers=2, partition="sizes:0.5,0.3,0.2", **TINY)


def test_bad_options_name_what_is_valid():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        st.tasks.get("stdlib-lm", **{**TINY, "d_model": 30, "num_heads": 4})
    with pytest.raises(ValueError, match="context"):
        st.tasks.get("stdlib-lm", **{**TINY, "context": 0})
    with pytest.raises(ValueError, match="labels"):
        st.tasks.get("stdlib-lm", partition="dirichlet:0.5", **TINY)
    with pytest.raises(TypeError, match="unknown option"):
        st.tasks.get("stdlib-lm", width=32)


def test_registry_declares_the_optimizer_without_building(monkeypatch):
    monkeypatch.setattr(lm, "corpus", None)   # building would fail: nothing is read
    assert "stdlib-lm" in registry.names()
    assert registry.declared_optimizer("stdlib-lm") == lm.DEFAULT_OPTIMIZER
    assert set(registry.options("stdlib-lm")) == {"num_layers", "d_model", "num_heads", "context",
                                                  "corpus_bytes", "eval_windows"}


# ---------------------------------------------------------------------------
# Model


def test_loss_at_init_is_about_ln_256(task):
    params = task.init_params(jax.random.key(0))
    assert task.param_count == sum(x.size for x in jax.tree.leaves(params))
    loss = float(jax.jit(task.loss)(params, task.minibatch(jax.random.key(1), 0, 0)))
    metrics = {k: float(v) for k, v in core.evaluate(task, params).items()}   # the engine's compiled evaluate
    # logits at init have std ~0.02·sqrt(d_model) ≈ 0.1: the loss exceeds ln 256 by about half their variance
    assert abs(loss - math.log(256)) < 0.1 and abs(metrics["loss"] - math.log(256)) < 0.1
    assert metrics["bits_per_byte"] == pytest.approx(metrics["loss"] / math.log(2), rel=1e-6)
    assert task.optimizer == lm.DEFAULT_OPTIMIZER


def test_causal_a_future_byte_does_not_change_earlier_logits(task):
    model = _model()                                           # the task's model
    params = task.init_params(jax.random.key(0))
    x = jax.random.randint(jax.random.key(1), (2, T), 0, 256)
    t = 9
    y = x.at[:, t].set((x[:, t] + 1) % 256)
    a, b = jax.jit(jax.vmap(lambda x: model.apply({"params": params}, x)))(jnp.stack([x, y]))
    assert np.array_equal(a[:, :t], b[:, :t])                  # exactly: masked scores get zero weight
    assert not np.allclose(a[:, t:], b[:, t:])


# ---------------------------------------------------------------------------
# Drivers


def test_a_short_simulate_lowers_the_held_out_loss(task):
    res = st.simulate(task, "asp", st.cluster.heterogeneous([1.0, 2.0]), num_updates=30, seed=0, eval_every=30)
    first, last = res.history.iloc[0], res.history.iloc[-1]
    assert res.config["optimizer"] == DEFAULT
    assert np.isfinite(res.train_loss).all()
    assert last["loss"] < first["loss"] - 0.5 and last["bits_per_byte"] < first["bits_per_byte"]


@pytest.mark.timeout(180)
def test_a_real_run_replays_bitwise(task):
    res = rt.run(task, "asp", "1,2", num_updates=12, time_scale=0.002, seed=1, devices=1, num_evals=1)
    assert res.status == "complete" and res.config["optimizer"] == DEFAULT
    # the task is passed: a Result's config names the task but not its options (the tiny sizes here)
    assert replay_trace(res, task)[1].bitwise


def test_pipeline_split_computes_the_unsplit_loss():
    k = 2
    ptask = ptasks.get("stdlib-lm", num_stages=k, batch_size=MU, blocks=2, width=TINY["d_model"],
                       lm_options={key: TINY[key] for key in ptasks.LM_OPTIONS})
    stages = ptask.init_stage_params(jax.random.key(0))
    assert [len(s) for s in stages] == [2, 2]                   # embed + block 0 | block 1 + head
    params = ptasks.lm_params_from_stages(stages)               # the unsplit Transformer's params
    whole = _model(num_layers=2)
    assert jax.tree.structure(params) == jax.tree.structure(jax.eval_shape(lambda: _init(whole)))
    again = ptasks.lm_stage_params(params, k)
    assert jax.tree.structure(again) == jax.tree.structure(stages)
    assert all(a is b for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(stages), strict=True))

    @jax.jit
    def losses(params, stages, batch):
        unsplit = ptasks.cross_entropy(whole.apply({"params": params}, batch["x"]), batch["y"])
        h = batch["x"]
        for i in range(k):
            h = ptask.apply(i, stages[i], h)
        return unsplit, ptask.task.loss(pmodel.join_params(stages), batch), ptask.output_loss(h, batch["y"])

    unsplit, joined, stage_by_stage = losses(params, stages, ptask.minibatch(jax.random.key(3), 4))
    assert unsplit == joined == stage_by_stage
    # and a pipeline schedule trains it (stage 0's input is int tokens: no input gradient)
    res = pp.simulate(ptask, "dsp:1,0", 6, optimizer="adamw", lr=3e-3, num_evals=1)
    assert res.status == "complete" and np.isfinite(res.train_loss).all()
    assert res.history["loss"].iloc[-1] < res.history["loss"].iloc[0]


def test_a_result_rebuilds_a_non_default_task_from_its_config():
    """The Result records the task's options, so replay_trace rebuilds the same
    (non-default) model from the Result alone and the replay is bitwise."""
    from staleness.runtime.replay import replay_trace

    task = st.tasks.get("stdlib-lm", num_workers=2, num_layers=1, d_model=32, context=16, corpus_bytes=100_000)
    res = st.runtime.run(task, "asp", "1,2", num_updates=8, time_scale=0.002)
    assert res.config["task_options"]["d_model"] == 32
    assert replay_trace(res)[1].bitwise
