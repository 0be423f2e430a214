"""Any optax optimizer on the server: differential tests against plain optax loops.

The replay runs one server update per schedule update (`engine.update`); with one
ASP worker that is exactly a plain optax training loop over the same minibatches,
and with BSP it is the loop on the λ workers' concatenated batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import staleness as st
from staleness.engine import update


@pytest.fixture(scope="module")
def digits1():
    return st.tasks.get("digits-mlp", batch_size=16, num_workers=1)


def _plain_loop(task, tx, n, seed, workers=1):
    """The loop a user writes: init, then per step the mean gradient of the λ workers'
    minibatches of that step, tx.update, optax.apply_updates."""
    init_key, data_key = st.engine.keys(seed)
    params = task.init_params(init_key)
    state = tx.init(params)

    @jax.jit
    def step(params, state, i):
        batch = st.tasks.concat_batches([task.minibatch(data_key, w, i) for w in range(workers)])
        g = jax.grad(task.loss)(params, batch)
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    for i in range(n):
        params, state = step(params, state, jnp.int32(i))
    return params


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _bitwise(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a), _leaves(b), strict=True))


@pytest.mark.parametrize("make", [
    lambda n: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1)),
    lambda n: optax.sgd(optax.cosine_decay_schedule(0.1, n)),
    lambda n: optax.inject_hyperparams(optax.adam)(learning_rate=3e-3),
], ids=["adamw+clip", "sgd+cosine-schedule", "inject_hyperparams-adam"])
def test_one_asp_worker_is_a_plain_optax_loop_bitwise(digits1, make):
    n, seed = 25, 2
    tx = make(n)
    res = st.simulate(digits1, "asp", st.cluster.constant(1).jitter(0.3), num_updates=n, seed=seed, optimizer=tx,
                      eval_every=10)
    assert res.config["optimizer"] == "optax"
    assert _bitwise(res.params, _plain_loop(digits1, tx, n, seed))


def test_spec_adamw_is_optax_adamw_bitwise(digits1):
    n = 20
    a = st.simulate(digits1, "asp", st.cluster.constant(1), num_updates=n, seed=0, optimizer="adamw:lr=1e-3,wd=0.1")
    b = st.simulate(digits1, "asp", st.cluster.constant(1), num_updates=n, seed=0,
                    optimizer=optax.adamw(1e-3, weight_decay=0.1))
    assert _bitwise(a.params, b.params) and a.config["lr"] == 1e-3
    c = st.simulate(digits1, "asp", st.cluster.constant(1), num_updates=n, seed=0,
                    optimizer="adamw:wd=0.1,clip=1,warmup=5+cosine", lr=1e-3)
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(), optax.add_decayed_weights(0.1),
                      optax.scale_by_schedule(optax.join_schedules(
                          [optax.linear_schedule(0.0, 1.0, 5), optax.cosine_decay_schedule(1.0, n - 5)], [5])),
                      optax.scale(-1e-3))
    np.testing.assert_allclose(np.concatenate([x.ravel() for x in _leaves(c.params)]),
                               np.concatenate([x.ravel() for x in _leaves(_plain_loop(digits1, ref, n, 0))]),
                               rtol=1e-5, atol=1e-7)


def test_bsp_with_adamw_is_the_plain_loop_on_the_concatenated_batch():
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    n = 12
    res = st.simulate(task, "bsp", st.cluster.heterogeneous([1, 1.5, 2, 3]).jitter(0.2), num_updates=n, seed=1,
                      optimizer=tx)
    ref = _plain_loop(task, tx, n, 1, workers=4)
    # the engine averages λ per-worker gradients (vmap + tensordot); the loop takes one
    # mean over 32 examples: the same math summed in another order (float32)
    for x, y in zip(_leaves(res.params), _leaves(ref)):
        np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-6)


def test_sweep_varies_an_injected_learning_rate_in_one_compiled_program():
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)
    cluster = st.cluster.heterogeneous([1, 1, 2, 2])
    out = st.sweep(task, ["asp"], cluster, seeds=[0], lrs=[1e-3, 3e-3], num_updates=30, optimizer=tx)
    assert [r.config["lr"] for r in out] == [1e-3, 3e-3]
    for r, rate in zip(out, [1e-3, 3e-3]):
        one = st.simulate(task, "asp", cluster, num_updates=30, seed=0, optimizer=tx, lr=rate)
        assert _bitwise(r.params, one.params)
    assert not _bitwise(out[0].params, out[1].params)


def test_lr_for_an_optimizer_without_a_learning_rate_in_its_state_is_an_error(digits1):
    with pytest.raises(ValueError, match="cannot be applied to this optax optimizer"):
        st.simulate(digits1, "asp", st.cluster.constant(1), num_updates=2, optimizer=optax.adamw(1e-3), lr=0.1)
    with pytest.raises(ValueError, match="names lr=0.001 and lr = 0.1"):
        st.simulate(digits1, "asp", st.cluster.constant(1), num_updates=2, optimizer="adamw:lr=1e-3", lr=0.1)


def test_staleness_rule_with_adamw_and_scale_by_staleness():
    """α0/τ with AdamW: the rule scales each gradient before Adam sees it; for one
    gradient per update that is `scale_by_staleness(rule)` first in the chain."""
    rule = st.lr.per_gradient()
    tx = optax.chain(update.scale_by_staleness(rule), optax.sgd(0.1))
    g = {"w": jnp.ones(3)}
    u, _ = tx.update(g, tx.init(g), g, staleness=4)
    np.testing.assert_allclose(u["w"], -0.1 / 4 * np.ones(3), rtol=1e-7)
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
    sched = st.simulate_schedule(st.policies.asp(), st.cluster.heterogeneous([1, 1, 2, 3]).jitter(0.2),
                                 num_updates=30, seed=0)
    res = st.engine.replay(sched, task, optimizer=optax.adamw(1e-3), lr_rule="per_gradient", seed=0)
    assert res.config["lr_rule"] == "per_gradient" and sched.summary()["staleness_max"] >= 2
    # the same updates by hand: each gradient on the version it pulled, then
    # chain(scale_by_staleness(rule), adamw) with its staleness
    by_hand = optax.chain(update.scale_by_staleness(rule), optax.adamw(1e-3))
    init_key, data_key = st.engine.keys(0)
    versions = {0: task.init_params(init_key)}
    state = by_hand.init(versions[0])
    grad = jax.jit(lambda p, w, i: jax.grad(task.loss)(p, task.minibatch(data_key, w, i)))
    step = jax.jit(lambda p, s, g, tau: (lambda u, s: (optax.apply_updates(p, u), s))(
        *by_hand.update(g, s, p, staleness=tau)))
    index, mask = sched.update_members()
    f = sched.columns
    for u in range(sched.num_updates):
        (row,) = index[u][mask[u]]
        g = grad(versions[int(f["pull_version"][row])], int(f["worker"][row]), int(f["iteration"][row]))
        versions[u + 1], state = step(versions[u], state, g, jnp.int32(sched.staleness[row]))
    for x, y in zip(_leaves(res.params), _leaves(versions[sched.num_updates])):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_muon_is_optax_contrib_muon_and_an_inner_optimizer():
    """`muon:lr=...` (issue 38, MuLoCo's inner optimizer) follows `optax.contrib.muon` update
    for update (to float32 rounding: the rate is in the state, a traced value), keeps its rate
    in the state like every spec (so a sweep over rates compiles once), and runs as DiLoCo's
    inner optimizer."""
    from staleness.tasks import optim

    params = {"w": jnp.ones((4, 3)) * 0.3, "b": jnp.arange(3.0)}
    ours, ref = optim.resolve("muon:lr=0.02"), optax.contrib.muon(0.02)
    s, r = ours.init(params), ref.init(params)
    p, q = params, params
    for k in range(5):
        g = {"w": jnp.sin(jnp.arange(12.0) + k).reshape(4, 3), "b": jnp.cos(jnp.arange(3.0) + k)}
        u, s = ours.tx.update(g, s, p)
        v, r = ref.update(g, r, q)
        p, q = optax.apply_updates(p, u), optax.apply_updates(q, v)
    for k in p:
        np.testing.assert_allclose(p[k], q[k], rtol=0, atol=2e-6)
    assert optim.has_lr(ours.tx, params) and optim.get("muon:lr=0.02,wd=0.1").describe() == "muon:lr=0.02,wd=0.1"
    res = st.simulate("digits-mlp", "diloco:4", "1*2", num_updates=3, inner_optimizer="muon:lr=0.02", num_evals=1)
    assert res.status == "complete" and res.config["inner_optimizer"] == "muon:lr=0.02"
    assert res.final["loss"] < res.history["loss"].iloc[0]
