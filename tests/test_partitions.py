"""Per-worker partitions (staleness.tasks.partitions): iid, shard, dirichlet:ALPHA, sizes:F1,...

Invariants first (property-based): every layout is a permutation of the
training set cut into λ non-empty disjoint pieces, and a pure function of
(labels, num_workers, seed). Then the measure: Dirichlet skew grows as α
shrinks, iid is 0. Then the sampling contract for every kind: the host index
tables equal the minibatches' indices, inside the worker's own piece.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hs

import staleness as st
from staleness.tasks import partitions as P


def _labels(n: int, classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, size=n).astype(np.int32)


def _check_layout(layout, n: int, workers: int) -> None:
    order, bounds = layout
    assert order.dtype == np.int32 and bounds.dtype == np.int32
    assert sorted(order.tolist()) == list(range(n))           # disjoint and covering
    assert bounds[0] == 0 and bounds[-1] == n and len(bounds) == workers + 1
    assert np.all(np.diff(bounds) >= 1)                         # every worker has an example


# ---------------------------------------------------------------------------
# Specs


@pytest.mark.parametrize("spec, canonical", [
    ("iid", "iid"), ("shard", "shard"), ("dirichlet:0.5", "dirichlet:0.5"), ("dirichlet:1", "dirichlet:1"),
    ("dirichlet:1e-3", "dirichlet:0.001"), ("sizes:0.5,0.3,0.2", "sizes:0.5,0.3,0.2"),
])
def test_parse_and_describe_round_trip(spec, canonical):
    p = P.parse(spec)
    assert p.describe() == canonical and P.parse(p.describe()) == p


@pytest.mark.parametrize("spec, fragment", [
    ("random", "partition must be one of"), ("dirichlet", "partition must be one of"),
    ("dirichlet:0", "ALPHA must be a finite number > 0"), ("dirichlet:-1", "ALPHA"), ("dirichlet:x", "ALPHA"),
    ("dirichlet:inf", "ALPHA"), ("sizes:0.5,0.4", "sum to 1"), ("sizes:1.2,-0.2", "> 0"), ("sizes:", "fractions"),
    (" iid", "partition must be one of"), (3, "partition must be one of"),
])
def test_bad_specs_name_what_is_valid(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        P.parse(spec)


# ---------------------------------------------------------------------------
# Dirichlet


@given(n=hs.integers(8, 300), classes=hs.integers(1, 12), workers=hs.integers(1, 8),
       alpha=hs.sampled_from([0.01, 0.1, 0.5, 1.0, 10.0, 1000.0]), seed=hs.integers(0, 2**16))
def test_dirichlet_is_a_deterministic_disjoint_cover_with_no_empty_worker(n, classes, workers, alpha, seed):
    labels = _labels(n, classes, seed)
    layout = P.dirichlet_layout(labels, workers, alpha, seed)
    _check_layout(layout, n, workers)
    again = P.dirichlet_layout(labels, workers, alpha, seed)
    assert all(np.array_equal(a, b) for a, b in zip(layout, again))


def test_dirichlet_depends_on_the_seed():
    labels = _labels(500, 10)
    a, b = (P.dirichlet_layout(labels, 4, 0.5, s) for s in (0, 1))
    assert not np.array_equal(a[1], b[1])


def test_dirichlet_fills_empty_workers_when_resampling_cannot():
    """One class, many workers and a tiny α: nearly every draw leaves workers empty;
    the fix-up still gives each one an example, deterministically."""
    labels = np.zeros(20, np.int32)
    layout = P.dirichlet_layout(labels, 8, 1e-4, 0)
    _check_layout(layout, 20, 8)


def test_skew_grows_as_alpha_shrinks_and_iid_is_zero():
    labels = _labels(4000, 10)

    def skew(alpha):
        return np.mean([P.label_skew(labels, P.dirichlet_layout(labels, 8, alpha, s)) for s in range(3)])

    values = [skew(a) for a in (1000.0, 10.0, 1.0, 0.1, 0.01)]
    assert all(a < b for a, b in zip(values, values[1:])), values
    assert values[0] < 0.05 and values[-1] > 0.7, values
    assert P.label_skew(labels, None) == 0.0
    # sizes: iid within subsets, so only sampling noise; shard: one class or two per worker
    assert P.label_skew(labels, P.sizes_layout(4000, [0.4, 0.3, 0.2, 0.1], 0)) < 0.06
    assert P.label_skew(labels, P.shard_layout(labels, 10, 0)) > 0.85


def test_dirichlet_needs_integer_labels_and_enough_examples():
    with pytest.raises(ValueError, match="integer class labels"):
        P.layout("dirichlet:0.5", np.linspace(0, 1, 10), 2, 0, 10)
    with pytest.raises(ValueError, match="num_workers must be <= 10"):
        P.layout("dirichlet:0.5", _labels(10, 2), 11, 0, 10)
    with pytest.raises(ValueError, match="no per-example labels"):
        P.layout("shard", None, 2, 0, 10)


# ---------------------------------------------------------------------------
# Unequal sizes


@given(n=hs.integers(4, 500), weights=hs.lists(hs.integers(1, 20), min_size=1, max_size=6), seed=hs.integers(0, 99))
def test_sizes_follow_the_fractions(n, weights, seed):
    fractions = np.asarray(weights, np.float64) / sum(weights)
    if len(weights) > n:
        with pytest.raises(ValueError):
            P.sizes_layout(n, fractions, seed)
        return
    layout = P.sizes_layout(n, fractions, seed)
    _check_layout(layout, n, len(weights))
    counts, quota = np.diff(layout[1]), fractions * n
    if quota.min() >= 1:   # largest remainder: each count is its quota rounded down or up
        assert np.all(np.abs(counts - quota) < 1), (counts, quota)


def test_sizes_need_one_fraction_per_worker():
    with pytest.raises(ValueError, match="3 fractions for num_workers = 2"):
        P.layout("sizes:0.5,0.3,0.2", None, 2, 0, 100)


# ---------------------------------------------------------------------------
# Tasks: built-in and from_flax, the sampling contract for every kind

KINDS = ["iid", "shard", "dirichlet:0.3", "sizes:0.5,0.3,0.2"]


@pytest.fixture(scope="module")
def small_tasks():
    import flax.linen as nn

    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 3)).astype(np.float32)
    y = rng.integers(0, 4, size=240).astype(np.int32)
    return {kind: st.tasks.from_flax(nn.Dense(4), "cross_entropy", (x, y), batch_size=5, num_workers=3,
                                     partition=kind, seed=1) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_host_indices_equal_minibatch_indices_in_the_workers_piece(small_tasks, kind):
    task = small_tasks[kind]
    assert task.partition == kind and task.indexed
    key = jax.random.key(7)
    workers = np.repeat(np.arange(3), 4).astype(np.int32)
    iters = np.tile(np.arange(4), 3).astype(np.int32)
    table = task.host_indices(key, workers, iters)                         # [12, μ]
    device = jax.vmap(lambda w, i: task.minibatch(key, w, i)["index"])(workers, iters)
    np.testing.assert_array_equal(table, np.asarray(device))
    for w in range(3):
        assert np.isin(table[workers == w], task.shard_indices(w)).all()
    info = task.partition_info()
    assert info["partition"] == kind and len(info["worker_examples"]) == 3
    if kind == "iid":
        assert info["label_skew"] == 0.0 and info["worker_examples"] == [task.train_size] * 3
    else:
        assert sum(info["worker_examples"]) == task.train_size and 0.0 <= info["label_skew"] <= 1.0


def test_builtin_tasks_take_the_new_partitions():
    task = st.tasks.get("digits-mlp", partition="dirichlet:0.1", num_workers=4, batch_size=8)
    info = task.partition_info()
    assert info["label_skew"] > 0.4 and min(info["worker_examples"]) >= 1
    lin = st.tasks.get("linreg", partition="sizes:0.7,0.3", num_workers=2, batch_size=8)
    assert lin.partition_info()["worker_examples"] == [1400, 600] and lin.partition_info()["label_skew"] is None
    with pytest.raises(ValueError, match="integer class labels"):
        st.tasks.get("linreg", partition="dirichlet:0.5", num_workers=2)


def test_a_layout_built_for_fewer_workers_is_refused(small_tasks):
    with pytest.raises(ValueError, match="sharded for num_workers = 3"):
        st.engine.resolve_task(small_tasks["dirichlet:0.3"], 4)
    assert st.engine.resolve_task(small_tasks["iid"], 4) is small_tasks["iid"]


def test_simulate_trains_on_a_dirichlet_partition(small_tasks):
    res = st.simulate(small_tasks["dirichlet:0.3"], st.policies.asp(), st.cluster.heterogeneous([1.0, 1.5, 2.0]),
                      num_updates=12, lr=0.1, num_evals=2)
    assert res.status == "complete" and np.isfinite(res.history["loss"]).all()
