"""Differential tests of the compiled replay against plain SGD and closed forms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
from staleness import cluster as C
from staleness import policies as P
from staleness.engine import core
from staleness.engine.result import DivergenceError, Result
from staleness.schedule import Schedule


@pytest.fixture(scope="module")
def digits4():
    return st.tasks.get("digits-mlp", batch_size=8, num_workers=4)


def _allclose_tree(a, b, rtol, atol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _equal_tree(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_asp_one_worker_is_sequential_sgd_bitwise():
    task = st.tasks.get("digits-mlp", batch_size=16, num_workers=1)
    lr, seed, n = 0.1, 3, 37
    res = st.simulate(task, P.asp(), C.constant(1).jitter(0.3), num_updates=n, seed=seed, lr=lr, eval_every=10)
    init_key, data_key = st.engine.keys(seed)
    params = task.init_params(init_key)

    @jax.jit
    def sgd_step(params, i):
        g = jax.grad(task.loss)(params, task.minibatch(data_key, 0, i))
        return jax.tree.map(lambda p, g: p - lr * g, params, g)

    for i in range(n):
        params = sgd_step(params, i)
    assert _equal_tree(res.params, params)


def test_bsp_equals_large_batch_sgd(digits4):
    # λ = 4 workers × μ = 8 vs SGD on the 32 examples of each round. The replay
    # averages 4 per-worker mean gradients (vmap + tensordot); the reference takes
    # one mean over 32 examples: same math, different summation order, so float32
    # rounding differs by a few ulps per step. Tolerance: rtol 1e-5 after 25 updates.
    lr, seed, n, lam = 0.2, 1, 25, 4
    res = st.simulate(digits4, P.bsp(), C.heterogeneous([1, 1.5, 2, 2.6]), num_updates=n, seed=seed, lr=lr)
    init_key, data_key = st.engine.keys(seed)
    params = digits4.init_params(init_key)

    @jax.jit
    def big_step(params, i):
        batch = st.tasks.concat_batches([digits4.minibatch(data_key, w, i) for w in range(lam)])
        g = jax.grad(digits4.loss)(params, batch)
        return jax.tree.map(lambda p, g: p - lr * g, params, g)

    for i in range(n):
        params = big_step(params, i)
    _allclose_tree(res.params, params, rtol=1e-5, atol=1e-6)
    assert res.schedule.summary()["gradients_per_update"] == lam


def _hand_schedule(staleness, num_workers=1):
    """One gradient per update; update u applies a gradient computed on version u - τ_u."""
    u = np.arange(len(staleness))
    tau = np.asarray(staleness)
    assert np.all(tau <= u)
    n = len(u)
    cols = {
        "worker": np.zeros(n, np.int32), "iteration": u.astype(np.int64),
        "pull_version": (u - tau).astype(np.int64), "apply_version": u.astype(np.int64),
        "pull_time": u.astype(float), "start": u.astype(float), "end": u + 0.5, "push_time": u + 0.5,
        "wait": np.zeros(n), "dropped": np.zeros(n, bool), "lost": np.zeros(n, bool),
    }
    return Schedule(columns=cols, update_time=u + 0.5, num_workers=num_workers, policy="hand", seed=0,
                    end_time=float(n))


def test_hand_schedule_matches_delayed_recurrence():
    task = st.tasks.get("quadratic", num_workers=1)
    rng = np.random.default_rng(0)
    n = 60
    tau = np.minimum(rng.integers(0, 6, n), np.arange(n))
    alpha = 0.05
    res = st.engine.replay(_hand_schedule(tau), task, lr=alpha, seed=0, eval_every=7)
    # closed form in float64: θ_{u+1} = θ_u − α ∇f(θ_{u−τ_u}),  ∇f(θ) = A(θ − θ*)
    a = np.asarray(task.hessian, np.float64)
    opt = np.concatenate([np.ravel(x) for x in jax.tree.leaves(task.optimum)]).astype(np.float64)
    theta = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(task.init_params(st.engine.keys(0)[0]))]).astype(np.float64)]
    for u in range(n):
        theta.append(theta[u] - alpha * a @ (theta[u - tau[u]] - opt))
    got = np.concatenate([np.ravel(x) for x in jax.tree.leaves(res.params)])
    # float32 replay vs float64 recurrence: relative error ~1e-6 per step
    np.testing.assert_allclose(got, theta[-1], rtol=1e-4, atol=1e-5)
    assert np.array_equal(res.schedule.staleness, tau)


def test_changing_only_the_run_length_does_not_recompile(digits4):
    """A user's BSP run compiled again when num_updates went from 300 to 600 (the chunk,
    ceil(U / num_evals) updates, was the scan's length). The number of updates a chunk runs
    is now an input: 300, 600 and 310 updates (its last chunk partly padding) share one program."""
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6])
    st.simulate(digits4, "bsp", cluster, num_updates=300, lr=0.1, seed=0)
    before = core.run_chunk._cache_size()
    for n in (600, 310):
        r = st.simulate(digits4, "bsp", cluster, num_updates=n, lr=0.1, seed=0)
        assert r.schedule.num_updates == n and len(r.history) == 21 and np.all(np.isfinite(r.train_loss))
    assert core.run_chunk._cache_size() == before, "the replay recompiled when only num_updates changed"


@pytest.mark.parametrize("policy, n, chunk", [("bsp", 37, 8), ("asp", 40, 16), ("softsync:2", 33, 16)])
def test_the_chunk_loop_is_bitwise_a_scan_of_the_same_step(digits4, policy, n, chunk):
    """The loop with the number of updates as an input gives bitwise what a `lax.scan` of the
    same step over the chunk's updates gives (the replay before the change), the last chunk
    partly padding included (the scan ran its padding updates; the loop stops before them)."""
    import functools

    from staleness.engine import plan as engine_plan

    sched = st.simulate_schedule(policy, C.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.2), num_updates=n, seed=3)
    opt = st.engine.run.resolve_optimizer(None, 0.1, n, digits4)
    plan = engine_plan.make_plan(sched, chunk)
    consts = {"data_key": core.keys(0)[1], "rule": jnp.int32(0)}
    rules = (st.lr.get("constant"),)
    a = b = core.init_carry(digits4, 0, opt, plan.ring)
    scan = jax.jit(lambda c, xs: jax.lax.scan(functools.partial(core._step, digits4, core.Static(
        opt.tx, rules, "vmap", None, True), consts), c, xs))
    for k in range(plan.num_chunks):
        xs = engine_plan.chunk_inputs(digits4, plan, k, consts["data_key"])
        a, (la, _) = scan(a, xs)
        b, (lb, diag) = core.run_chunk(digits4, b, core.pad_chunk(xs, min(chunk, n - k * chunk)), consts,
                                       opt=opt.tx, rules=rules, padded=True)
        assert diag == {}   # per-update diagnostics are an RL learner's
        real = min(chunk, n - k * chunk)
        np.testing.assert_array_equal(np.asarray(la)[:real], np.asarray(lb)[:real])
        assert np.all(np.isnan(np.asarray(lb)[real:]))
    assert _equal_tree(a.params, b.params) and _equal_tree(a.opt_state, b.opt_state)


def test_two_replays_identical_and_no_recompile(digits4):
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.2)
    kw = dict(num_updates=64, seed=5, lr=0.1, eval_every=16)
    a = st.simulate(digits4, P.softsync(2), cluster, **kw)
    before = core.run_chunk._cache_size()
    b = st.simulate(digits4, P.softsync(2), cluster, **kw)
    assert core.run_chunk._cache_size() == before, "the replay recompiled on an identical second call"
    assert _equal_tree(a.params, b.params)
    assert a.history.equals(b.history)


def test_sweep_equals_individual_runs(digits4):
    cluster = C.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1)
    pols = [P.asp(), P.softsync(2)]
    rules = ["constant", "per_gradient"]
    kw = dict(num_updates=48, eval_every=12)
    swept = st.sweep(digits4, pols, cluster, seeds=[0, 1], lr_rules=rules, lrs=[0.1], **kw)
    assert len(swept) == 8
    i = 0
    for pol in pols:
        for seed in [0, 1]:
            for rule in rules:
                single = st.simulate(digits4, pol, cluster, seed=seed, lr_rule=rule, lr=0.1, **kw)
                got = swept[i]
                assert got.config["policy"] == pol.describe() and got.config["seed"] == seed
                # vmap over configurations pads ASP's single slot to two and sums in
                # another order: agreement to float32 rounding, accumulated over 48 updates
                _allclose_tree(got.params, single.params, rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(got.history["accuracy"], single.history["accuracy"], atol=1e-6)
                i += 1


def test_checkpoint_resume_is_bitwise(tmp_path, digits4):
    cluster = C.heterogeneous([1.0, 1.0, 2.6, 2.6]).jitter(0.2)
    sched = st.simulate_schedule(P.ssp(2), cluster, num_updates=90, seed=2)
    kw = dict(lr=0.1, lr_rule="per_gradient", optimizer="momentum:0.9", eval_every=20)
    full = st.engine.replay(sched, digits4, **kw)
    part = st.engine.replay(sched, digits4, checkpoint=tmp_path / "ck", stop_after=40, **kw)
    assert part.status == "stopped" and part.history["update"].iloc[-1] == 40
    resumed = st.engine.replay(sched, digits4, checkpoint=tmp_path / "ck", resume=True, **kw)
    assert resumed.status == "complete"
    assert _equal_tree(resumed.params, full.params)
    assert resumed.history.equals(full.history)
    with pytest.raises(ValueError, match="written with"):
        st.engine.replay(sched, digits4, checkpoint=tmp_path / "ck", resume=True, **{**kw, "lr": 0.2})


def test_divergence_names_update_worker_and_staleness():
    task = st.tasks.get("quadratic", num_workers=4)
    with pytest.raises(DivergenceError, match=r"update \d+ \(gradient of worker \d, iteration \d+, staleness \d+\)") as e:
        st.simulate(task, P.asp(), C.constant(4).jitter(0.1), num_updates=400, seed=0, lr=50.0, eval_every=10)
    r = e.value.result
    assert isinstance(r, Result) and r.status == "diverged"
    assert len(r.history) >= 1 and np.isfinite(r.history["loss"]).all()


def test_result_save_load_roundtrip(tmp_path, digits4):
    r = st.simulate(digits4, P.dssp(1, 3), C.default().jitter(0.1) if False else C.heterogeneous([1, 1, 2.6, 2.6]),
                    num_updates=30, seed=0, eval_every=10)
    r.save(tmp_path / "run")
    back = Result.load(tmp_path / "run")
    assert back.schedule.equals(r.schedule)
    assert _equal_tree(back.params, r.params)
    np.testing.assert_allclose(back.history.to_numpy(float), r.history.to_numpy(float))
    assert back.config["policy"] == "dssp:1:3"


def test_bad_arguments(digits4):
    sched = st.simulate_schedule(P.asp(), C.constant(4), num_updates=5)
    with pytest.raises(ValueError, match="lr = -1"):
        st.engine.replay(sched, digits4, lr=-1)
    with pytest.raises(ValueError, match="optimizer = 'rmsprop'"):
        st.engine.replay(sched, digits4, optimizer="rmsprop")
    with pytest.raises(ValueError, match="eval_every = 0"):
        st.engine.replay(sched, digits4, eval_every=0)
    with pytest.raises(ValueError, match="lr_rule|valid"):
        st.engine.replay(sched, digits4, lr_rule="bogus")


def test_map_slot_mode_is_bitwise_a_loop_of_per_gradient_calls(digits4):
    """The contract the real runtime relies on: with slot_mode='map' a replay
    equals, bit for bit, workers calling the jitted `core.gradient` one by one and
    a server calling the jitted `engine.update.server_update` on the stacked gradients."""
    from staleness.engine import update

    cluster = C.heterogeneous([1.0, 1.2, 2.0, 2.6]).jitter(0.2)
    sched = st.simulate_schedule(P.softsync(2), cluster, num_updates=30, seed=4)
    res = st.engine.replay(sched, digits4, lr=0.1, lr_rule="per_gradient", optimizer="momentum:0.9",
                           slot_mode="map", eval_every=10)
    opt = st.engine.optimizer("momentum:0.9", 0.1)
    rules = (st.lr.get("per_gradient"),)
    init_key, data_key = st.engine.keys(sched.seed)
    grad_fn = jax.jit(lambda p, w, i: core.gradient(digits4, p, data_key, w, i))
    step_fn = jax.jit(lambda p, s, g, tau, m, u: update.server_update(opt.tx, rules, p, s, g, tau, m))
    params = digits4.init_params(init_key)
    opt_state = opt.init(params)
    versions = {0: params}
    index, mask = sched.update_members()
    f = sched.columns
    for u in range(sched.num_updates):
        rows = index[u][mask[u]]
        grads = [grad_fn(versions[int(f["pull_version"][g])], int(f["worker"][g]), int(f["iteration"][g]))[1]
                 for g in rows]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *grads)
        tau = jnp.asarray(sched.staleness[rows], jnp.int32)
        params, opt_state = step_fn(params, opt_state, stacked, tau, jnp.ones(len(rows), bool), jnp.int32(u))
        versions[u + 1] = params
    assert _equal_tree(res.params, params)
    vm = st.engine.replay(sched, digits4, lr=0.1, lr_rule="per_gradient", optimizer="momentum:0.9", eval_every=10)
    _allclose_tree(vm.params, params, rtol=1e-4, atol=1e-6)  # vmap: same math, other rounding
