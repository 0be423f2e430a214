"""Numerics of the one-device pipeline engine against independent references.

Tolerances: on CPU the engine and the references run the same float32 ops in
the same order, and the observed differences are 0 (zero delays vs backprop)
or a few ulps (accumulated micro-batch gradients vs one full-batch gradient,
and the literal reference, whose eager ops XLA fuses differently); we allow
1e-6 absolute on parameters of order 0.1-1 after a few momentum steps.
"""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness.pipeline as pp
from staleness.engine import core, update
from staleness.tasks import optim
from staleness.pipeline import sim
from staleness.pipeline import stage as S

LR, MOMENTUM = 0.05, 0.9
ATOL = 1e-6


@pytest.fixture(scope="module")
def digits3():
    return pp.tasks.get("digits-resmlp", num_stages=3, batch_size=8, width=32)


def _max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _engine(ptask, sched, n, seed=0, chunks=1):
    """Run the one-device engine; returns (per-stage params, per-tick loss, states after the first chunk)."""
    plan = pp.make_plan(sched, ptask.num_stages, n)
    opt = optim.resolve(f"momentum:{MOMENTUM}", LR)
    init_key, data_key = core.keys(seed)
    ctx = S.Context(ptask, data_key)
    cfgs, carry = sim.init(ptask, plan, opt, ptask.init_stage_params(init_key), ctx)
    length = -(-plan.num_ticks // chunks)
    losses, first = [], None
    for c in range(chunks):
        carry, loss = sim.run_chunk(cfgs, plan, opt, ctx, carry, plan.xs(c * length, length))
        losses.append(np.asarray(loss))
        if c == 0:
            first = jax.device_get(carry.stages)
            traces = sim._run_chunk._cache_size()
        else:
            assert sim._run_chunk._cache_size() == traces  # later chunks reuse the compiled program
    return jax.device_get(sim.stage_params(carry)), np.concatenate(losses), first, plan


def _backprop(ptask, n, seed=0, microbatches=1):
    """Plain SGD with momentum on the whole model; gradient = mean of the micro-batch gradients."""
    init_key, data_key = core.keys(seed)
    params = ptask.task.init_params(init_key)
    opt = optim.resolve(f"momentum:{MOMENTUM}", LR)
    state = opt.init(params)

    @jax.jit
    def step(params, state, i):
        batch = ptask.minibatch(data_key, i)
        # micro-batch j = examples [j·B/M, (j+1)·B/M) of the batch, as the engine slices them
        parts = [jax.tree.map(lambda a: a.reshape(microbatches, -1, *a.shape[1:])[j], batch)
                 for j in range(microbatches)]
        g = jax.tree.map(lambda *gs: sum(gs) / microbatches, *[jax.grad(ptask.task.loss)(params, p) for p in parts])
        return update.apply(opt.tx, params, state, g)

    for i in range(n):
        params, state = step(params, state, jnp.int32(i))
    return pp.stage_params(params)


def test_zero_delays_equal_backprop(digits3):
    n = 6
    ref = _backprop(digits3, n)
    for sched in (pp.backprop(), pp.dsp((0, 0, 0))):
        out, loss, _, _ = _engine(digits3, sched, n)
        assert _max_diff(out, ref) <= ATOL  # observed: 0.0 on CPU
        assert np.isfinite(loss).all()


def test_gpipe_equals_backprop_with_microbatch_accumulation(digits3):
    n, m = 4, 4
    out, loss, _, plan = _engine(digits3, pp.gpipe(m), n)
    assert _max_diff(out, _backprop(digits3, n, microbatches=m)) <= ATOL   # observed ~1e-8
    assert _max_diff(out, _backprop(digits3, n)) <= 1e-5                   # = full-batch backprop up to reassociation
    assert np.isfinite(loss[plan.fwd[:, -1] >= 0]).all()


def _reference(ptask, sched, n, seed=0):
    """The per-block algorithm written literally: dicts keyed by batch, eager JAX.

    Stage k forwards batch b at tick b + F_k with its current weights and keeps
    the input; it backpropagates batch b at tick b + F_k + m_k from the kept input
    with its current weights (DSP) or the weights of that forward (stash, DDG),
    then applies momentum SGD. Returns (params, losses, max inputs kept per stage)."""
    sched = sched.resolve(ptask.num_stages)
    k_all, offs, lags = ptask.num_stages, sched.offsets, sched.lags
    init_key, data_key = core.keys(seed)
    params = list(ptask.init_stage_params(init_key))
    vel = [jax.tree.map(jnp.zeros_like, p) for p in params]
    kept, acts, grads, losses = [dict() for _ in range(k_all)], {}, {}, {}
    most = [0] * k_all
    for t in range(n + lags[0]):
        for k in range(k_all):
            b = t - offs[k]
            if 0 <= b < n:
                batch = ptask.minibatch(data_key, b)
                x = batch["x"] if k == 0 else acts.pop((k - 1, b))
                y = ptask.apply(k, params[k], x)
                kept[k][b] = (x, params[k])
                if k == k_all - 1:
                    losses[b], grads[(k, b)] = jax.value_and_grad(ptask.output_loss)(y, batch["y"])
                else:
                    acts[(k, b)] = y
        for k in reversed(range(k_all)):
            most[k] = max(most[k], len(kept[k]) - (1 if 0 <= t - offs[k] < n else 0))
            b = t - offs[k] - lags[k]
            if 0 <= b < n:
                x, w_then = kept[k].pop(b)
                w = w_then if sched.backward in ("stash", "graph") else params[k]
                _, vjp = jax.vjp(lambda p, x, k=k: ptask.apply(k, p, x), w, x)
                g_w, g_x = vjp(grads.pop((k, b)))
                if k > 0:
                    grads[(k - 1, b)] = g_x
                vel[k] = jax.tree.map(lambda v, g: MOMENTUM * v + g, vel[k], g_w)
                params[k] = jax.tree.map(lambda p, v: p - LR * v, params[k], vel[k])
    return params, losses, most


@pytest.mark.parametrize("sched", [pp.dsp((2, 0, 1)), pp.ddg(), pp.dsp((0, 2, 0), stash=True)],
                         ids=lambda s: s.describe())
def test_engine_matches_the_literal_per_block_algorithm(digits3, sched):
    """Mixed delays (a same-tick link, a delayed loss link), DDG's stored graph, weight stashing."""
    n = 7
    ref, ref_loss, most = _reference(digits3, sched, n)
    out, loss, first, plan = _engine(digits3, sched, n, chunks=2)
    assert _max_diff(out, ref) <= ATOL
    got = loss[: plan.num_ticks][plan.fwd[:, -1] >= 0]
    np.testing.assert_allclose(got, [float(ref_loss[b]) for b in range(n)], rtol=1e-6)
    # Each stage stores exactly m_k inputs: its queue has m_k slots, and the
    # literal algorithm never keeps more than m_k inputs between ticks.
    for k, st in enumerate(first):
        rings = jax.tree.leaves(st.store)
        assert (not rings and plan.lags[k] == 0) or {r.shape[0] for r in rings} == {plan.lags[k]}
        assert most[k] == min(plan.lags[k], n)
    if "x" in first[0].store:
        # After the first chunk (t0 ticks) stage 0's slot b mod m_0 holds the input of
        # batch b, for the batches forwarded but not yet backpropagated.
        t0, m0 = -(-plan.num_ticks // 2), plan.lags[0]
        ring = np.asarray(first[0].store["x"])
        _, data_key = core.keys(0)
        for b in range(max(0, t0 - m0), min(t0, n)):
            np.testing.assert_array_equal(ring[b % m0], np.asarray(digits3.minibatch(data_key, b)["x"]))


# -- ResNet on CIFAR-10 from tiny files -----------------------------------------------------
@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(4, 3072), dtype=np.uint8)
        with open(root / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": [int(v) for v in rng.integers(0, 10, 4)]}, f)
    return root.parent


def test_resnet_split_into_stages_on_cifar(cifar_dir):
    """The ResNet's blocks split into stages of different shapes; DSP runs on it, and its
    first loss (all stages at their initial weights) is the whole model's loss."""
    ptask = pp.tasks.get("cifar10-resnet20", num_stages=3, batch_size=2, blocks=1, data_dir=cifar_dir)
    assert ptask.task.train_size == 20 and ptask.num_stages == 3
    # 3 basic blocks (one per width) split 1/1/1, stem on the first stage, head on the last
    assert [len(s.layers) for s in ptask.model.stages] == [2, 1, 2]
    params = ptask.init_stage_params(core.keys(0)[0])
    shapes = sim.shapes(ptask, pp.make_plan(pp.backprop(), 3, 1), params)
    assert [tuple(s.shape) for s in shapes] == [(2, 32, 32, 3), (2, 32, 32, 16), (2, 16, 16, 32), (2, 10)]
    _, loss, first, plan = _engine(ptask, pp.dsp((1, 1, 0)), 3)
    losses = loss[plan.fwd[:, -1] >= 0]
    assert np.isfinite(losses).all() and len(losses) == 3
    whole = jax.jit(ptask.task.loss)(pp.join_params(params), ptask.minibatch(core.keys(0)[1], 0))
    np.testing.assert_allclose(losses[0], float(whole), rtol=1e-5)
    assert [jax.tree.leaves(s.store)[0].shape[:2] for s in first[:2]] == [(4, 2), (2, 2)]  # m_k inputs of 2 examples
    with pytest.raises(ValueError, match="num_stages = 4 is more than the model's 3 blocks"):
        pp.tasks.get("cifar10-resnet20", num_stages=4, blocks=1, data_dir=cifar_dir)
