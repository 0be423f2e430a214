"""Local-update methods (Local SGD, DiLoCo, async DiLoCo): differential tests against
the methods they reduce to, the real runtime's traces, and sweeps over H."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import staleness as st
from staleness.engine import local as L

CLUSTER = st.cluster.heterogeneous([1.0, 1.0, 2.0, 2.0])


@pytest.fixture(scope="module")
def digits4():
    return st.tasks.get("digits-mlp", batch_size=8, num_workers=4)


def _leaves(t):
    return [np.asarray(x) for x in jax.tree.leaves(t)]


def _max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(_leaves(a), _leaves(b), strict=True))


def test_local_sgd_with_one_step_is_bsp(digits4):
    """One inner SGD step then parameter averaging = one large-batch SGD step. The
    delta's subtraction and the mean of parameters round differently from the mean of
    gradients: stated tolerance 1e-6 after 20 updates (weights of order 0.1)."""
    a = st.simulate(digits4, "local_sgd:1", CLUSTER, num_updates=20, seed=0, inner_optimizer="sgd:lr=0.1")
    b = st.simulate(digits4, "bsp", CLUSTER, num_updates=20, seed=0, lr=0.1)
    assert _max_diff(a.params, b.params) < 1e-6
    assert a.config["optimizer"] == "sgd:lr=1" and a.config["inner_optimizer"] == "sgd:lr=0.1"


def test_diloco_with_one_worker_and_outer_sgd_1_is_h_inner_steps():
    """θ − 1·(θ − θ_H) = θ_H up to one rounding per update: H AdamW steps, by hand."""
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=1)
    h, rounds = 5, 4
    res = st.simulate(task, f"diloco:{h}", st.cluster.constant(1), num_updates=rounds, seed=0,
                      optimizer="sgd:lr=1", inner_optimizer=optax.adamw(1e-3))
    init_key, data_key = st.engine.keys(0)
    params = task.init_params(init_key)
    tx = optax.adamw(1e-3)
    state = tx.init(params)
    step = jax.jit(lambda p, s, i: (lambda g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p)))(
        jax.grad(task.loss)(p, task.minibatch(data_key, 0, i))))
    for i in range(rounds * h):       # round r, inner step k uses the minibatch of iteration r·H + k
        params, state = step(params, state, jnp.int32(i))
    assert _max_diff(res.params, params) < 2e-6


def test_diloco_with_outer_sgd_1_is_local_sgd(digits4):
    a = st.simulate(digits4, "diloco:3", CLUSTER, num_updates=8, seed=1, optimizer="sgd:lr=1",
                    inner_optimizer="adamw:lr=1e-3")
    b = st.simulate(digits4, "local_sgd:3", CLUSTER, num_updates=8, seed=1, inner_optimizer="adamw:lr=1e-3")
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.params), _leaves(b.params)))


def test_inner_states_persist_per_worker_across_rounds():
    """With momentum as inner optimizer, a worker's second round continues its trace:
    running the rounds with a fresh state each time gives other parameters."""
    task = st.tasks.get("digits-mlp", batch_size=8, num_workers=1)
    res = st.simulate(task, "diloco:3", st.cluster.constant(1), num_updates=2, seed=0, optimizer="sgd:lr=1",
                      inner_optimizer="momentum:0.9,lr=0.1")
    inner = st.engine.optimizer("momentum:0.9,lr=0.1")
    loc = L.Local(inner.tx, 3, False)
    init_key, key = st.engine.keys(0)
    p = task.init_params(init_key)
    fresh = p
    for r in range(2):
        _, d, _ = L.local_delta(task, loc, fresh, inner.init(fresh), key, 0, r, 3)
        fresh = jax.tree.map(lambda a, b: a - b, fresh, d)
    assert _max_diff(res.params, fresh) > 1e-4


def test_dynamic_local_updates_give_slow_workers_fewer_steps():
    cl = st.cluster.heterogeneous([0.58, 0.75, 1.51, 3.33])   # the asynchronous Local-SGD toy setting
    s = st.simulate_schedule(st.policies.async_diloco(20, dynamic=True), cl, num_updates=40, seed=0)
    assert s.meta["local_steps"] == [20, 15, 8, 3]
    ends = [s.columns["end"][s.columns["worker"] == w][0] - s.columns["start"][s.columns["worker"] == w][0]
            for w in range(4)]
    # every worker's round takes about as long (steps are rounded: 3 steps of 3.33 s vs 8 of 1.51 s)
    assert max(ends) / min(ends) < 1.3


def test_a_learning_rate_given_to_a_run_replaces_the_policys_own(digits4):
    """DiLoCo's outer 'nesterov:0.9,lr=0.7' is a default: lr= (and a sweep's or compare's
    rates) set its learning rate instead of failing with "names lr=0.7 and lr = ... was
    given too"; a None rate in a sweep is the policy's 0.7."""
    kw = dict(num_updates=6, seed=0, inner_optimizer="adamw:lr=1e-3", num_evals=1)
    a = st.simulate(digits4, "diloco:3", CLUSTER, lr=0.5, **kw)
    b = st.simulate(digits4, "diloco:3", CLUSTER, optimizer="nesterov:0.9,lr=0.5", **kw)
    assert a.config["lr"] == 0.5 and a.config["optimizer"] == "nesterov:0.9"
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.params), _leaves(b.params)))
    out = st.sweep(digits4, ["diloco:3"], CLUSTER, lrs=[None, 0.5], num_updates=6, num_evals=1,
                   inner_optimizer="adamw:lr=1e-3")
    assert [r.config["lr"] for r in out] == [0.7, 0.5]
    own = st.simulate(digits4, "diloco:3", CLUSTER, **kw)
    assert _max_diff(out[0].params, own.params) == 0 and _max_diff(out[1].params, a.params) == 0
    assert st.runtime.run(digits4, "local_sgd:2", None, num_workers=4, num_updates=3, lr=0.5,
                          inner_optimizer="sgd:lr=0.1").config["lr"] == 0.5
    with pytest.raises(ValueError, match="names lr=0.7 and lr = 0.5"):   # a spec the user names pins its lr
        st.simulate(digits4, "diloco:3", CLUSTER, lr=0.5, optimizer="nesterov:0.9,lr=0.7", **kw)


def test_sweep_over_h_in_one_compiled_call(digits4):
    from staleness.engine import core

    before = core.run_chunk_batched._cache_size()
    out = st.sweep(digits4, ["diloco:2", "diloco:5"], CLUSTER, seeds=[0, 1], num_updates=6, num_evals=1,
                   inner_optimizer="adamw:lr=1e-3")
    assert core.run_chunk_batched._cache_size() == before + 1
    assert [r.config["local_steps"] for r in out] == [[2] * 4, [2] * 4, [5] * 4, [5] * 4]
    one = st.simulate(digits4, "diloco:5", CLUSTER, num_updates=6, seed=1, num_evals=1,
                      inner_optimizer="adamw:lr=1e-3")
    assert _max_diff(out[3].params, one.params) == 0   # each configuration runs its own replay's ops


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy, inner", [("local_sgd:3", "sgd:lr=0.1"), ("diloco:3", "adamw:lr=1e-3"),
                                           ("async_diloco:3:dynamic", "momentum:0.9,lr=0.1"),
                                           ("async_diloco:2:bound=1", "adamw:lr=1e-3"),
                                           ("diloco:3:topk=0.1:bits=4:error_feedback", "adamw:lr=1e-3")])
def test_real_runs_of_local_methods_replay_bitwise(digits4, policy, inner):
    from staleness.runtime.replay import replay_trace

    res = st.runtime.run(digits4, policy, "0.5,0.75,1.5,3.3", num_updates=10, time_scale=0.002,
                         inner_optimizer=inner)
    assert res.status == "complete" and res.config["inner_optimizer"] == st.engine.optim.get(inner).describe()
    assert replay_trace(res)[1].bitwise


def _resumed(task, policy, tmp_path, cluster="0.5,0.75,1.5,3.3"):
    """(first run, resumed run) of `policy`: 5 updates checkpointed every 2, then resumed to 7."""
    kw = dict(time_scale=0.01, inner_optimizer="adamw:lr=1e-3", worker_timeout=120, seed=1,
              checkpoint=tmp_path / "ckpt")
    first = st.runtime.run(task, policy, cluster, num_updates=5, checkpoint_every=2, **kw)
    return first, st.runtime.run(task, policy, cluster, num_updates=7, resume=True, **kw)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["diloco:4", "async_diloco:4", "streaming_diloco:4",
                                    "diloco:4:topk=0.1:error_feedback"])
def test_a_resumed_local_update_run_keeps_its_workers_inner_states(digits4, tmp_path, policy):
    """A checkpoint kept the server's state only: the resumed workers started with fresh inner
    optimizers (and Streaming DiLoCo's own parameters, error-feedback buffers at zero), so the
    resumed run's trace did not replay (diloco:4 on 2 workers: 0.022 apart, async 0.027,
    streaming 0.012). Each worker's state after its last recorded push is kept now."""
    from staleness.runtime.replay import replay_trace

    first, res = _resumed(digits4, policy, tmp_path)
    assert first.status == res.status == "complete" and res.schedule.num_updates == 7
    f0, f1 = first.schedule.columns, res.schedule.columns
    k = int(np.flatnonzero(f0["apply_version"] == 3)[-1]) + 1   # the trace up to the checkpoint (update 4)
    assert all(np.array_equal(f1[c][:k], f0[c][:k]) for c in f0)
    assert replay_trace(res)[1].bitwise


def test_the_inner_state_a_checkpoint_keeps_is_the_one_after_the_last_recorded_push(digits4):
    """A worker in flight at a checkpoint has already computed its next iteration's inner steps:
    the checkpoint keeps the state before them (the resumed run restarts that iteration)."""
    from staleness.runtime.numerics import Numerics
    from staleness.runtime.spec import make_spec

    spec = make_spec(digits4, "diloco:2", num_workers=4, num_updates=2, inner_optimizer="adamw:lr=1e-3")
    num = Numerics(spec.task, spec.opt, spec.rule, spec.slots, jax.random.key(3), spec.local, spec.inner,
                   spec.local_steps)
    params = spec.task.init_params(jax.random.key(0))
    dev = jax.devices()[0]
    num.gradient(params, 1, 0, dev)
    after0 = jax.tree.map(np.asarray, num._inner_states[1])
    delta1 = num.gradient(params, 1, 1, dev)[1]                     # iteration 1 computed, not yet recorded
    kept = num.inner_at({1: 0, 2: 5})                                # worker 2 never computed: left out
    assert list(kept) == [1] and kept[1][0] == 0 and _max_diff(kept[1][1], after0) == 0
    assert _max_diff(num.inner_at({1: 1})[1][1], num._inner_states[1]) == 0
    fresh = Numerics(spec.task, spec.opt, spec.rule, spec.slots, jax.random.key(3), spec.local, spec.inner,
                     spec.local_steps)
    fresh.restore_inner(kept, {1: dev})
    assert _max_diff(fresh.gradient(params, 1, 1, dev)[1], delta1) == 0   # iteration 1 again, as in the run


def test_checkpoints_of_a_local_update_method_over_processes_are_refused(digits4):
    from staleness.runtime.spec import make_spec

    with pytest.raises(ValueError, match="inner states live in their processes"):
        make_spec(digits4, "diloco:4", num_workers=4, num_updates=2, checkpoint="/tmp/x", checkpoint_every=1,
                  processes=2)


def test_inner_optimizer_is_refused_for_gradient_policies(digits4):
    with pytest.raises(ValueError, match="inner_optimizer is for local-update methods"):
        st.simulate(digits4, "asp", CLUSTER, num_updates=2, inner_optimizer="sgd")


def test_delayed_nesterov_with_n_synchronous_arrivals_is_one_nesterov_step():
    """Liu et al.'s Delayed Nesterov (c = 0): N arrivals of the same outer gradient g add
    up to one Nesterov SGD step on g (DiLoCo's synchronous outer step), round after round."""
    dn = st.engine.optimizer("delayed_nesterov:4,lr=0.7")
    nest = optax.sgd(0.7, momentum=0.9, nesterov=True)
    p = q = {"w": jnp.linspace(-1.0, 1.0, 5)}
    s_dn, s_n = dn.init(p), nest.init(p)
    rng = np.random.default_rng(0)
    for _ in range(3):
        g = {"w": jnp.asarray(rng.normal(size=5), jnp.float32)}
        for _ in range(4):
            u, s_dn = dn.tx.update(g, s_dn, p)
            p = optax.apply_updates(p, u)
        u, s_n = nest.update(g, s_n, q)
        q = optax.apply_updates(q, u)
    np.testing.assert_allclose(np.asarray(p["w"]), np.asarray(q["w"]), rtol=1e-5, atol=1e-6)


def test_async_diloco_with_delayed_nesterov_trains(digits4):
    res = st.simulate(digits4, "async_diloco:3:dynamic", st.cluster.heterogeneous([0.58, 0.75, 1.51, 3.33]),
                      num_updates=40, seed=0, optimizer="delayed_nesterov:4,lr=0.7", inner_optimizer="adamw:lr=1e-3")
    assert res.status == "complete" and res.final["accuracy"] > res.history["accuracy"].iloc[0]


def test_async_diloco_bound_0_with_delayed_nesterov_is_diloco_in_time_and_parameters(digits4):
    """async_diloco(H, bound=0): every worker waits at the barrier after its delta, so a
    round's λ deltas are all computed on the same version; Delayed Nesterov with N = λ
    applies each as g/N and folds the round's mean into the momentum at the λ-th, so
    the round adds up to DiLoCo's one Nesterov step on the mean delta. Update times:
    async update (k+1)·λ − 1 is DiLoCo's update k, exactly (the same simulated pushes).
    Parameters: equal up to float32 rounding of the order of the sums (λ separate
    g/λ additions against one mean): rtol 1e-5 after 5 rounds."""
    cluster = st.cluster.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1)
    rounds, lam = 5, 4
    inner = "sgd:lr=0.05"
    a = st.simulate(digits4, st.policies.async_diloco(3, bound=0), cluster, num_updates=rounds * lam, seed=0,
                    optimizer=f"delayed_nesterov:{lam},lr=0.7", inner_optimizer=inner)
    b = st.simulate(digits4, st.policies.diloco(3), cluster, num_updates=rounds, seed=0, inner_optimizer=inner)
    np.testing.assert_array_equal(a.schedule.update_time[lam - 1::lam], b.schedule.update_time)
    assert (a.schedule.staleness[a.schedule.applied] < lam).all()
    for x, y in zip(_leaves(a.params), _leaves(b.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_streaming_diloco_with_one_fragment_no_overlap_alpha_0_full_precision_is_diloco(digits4):
    a = st.simulate(digits4, "streaming_diloco:4:fragments=1:overlap=0:alpha=0:bits=32", CLUSTER, num_updates=6,
                    seed=0, inner_optimizer="adamw:lr=1e-3")
    b = st.simulate(digits4, "diloco:4", CLUSTER, num_updates=6, seed=0, inner_optimizer="adamw:lr=1e-3")
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.params), _leaves(b.params)))


def test_streaming_diloco_synchronizes_one_fragment_per_update(digits4):
    """Two fragments (Dense_0, Dense_1): update u changes only fragment u mod 2 of the
    global parameters."""
    sched = st.simulate_schedule(st.policies.parse("streaming_diloco:4:fragments=2"), CLUSTER, num_updates=3,
                                 seed=0)
    before = None
    for u in range(1, 4):
        part = st.Schedule(columns={k: v[sched.columns["apply_version"] < u] for k, v in sched.columns.items()},
                           update_time=sched.update_time[:u], num_workers=4, policy=sched.policy, meta=sched.meta)
        params = st.engine.replay(part, digits4, inner_optimizer="adamw:lr=1e-3", num_evals=1).params
        if before is not None:
            changed = {k for k in params if not all(np.array_equal(x, y) for x, y in
                                                    zip(_leaves(params[k]), _leaves(before[k])))}
            assert changed == {"Dense_0" if (u - 1) % 2 == 0 else "Dense_1"}, (u, changed)
        before = params


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_quantize_is_a_signed_power_of_two_of_the_largest_magnitude(bits):
    x = jnp.asarray(np.random.default_rng(bits).normal(size=200), jnp.float32)
    q = np.asarray(L.quantize(x, bits))
    scale = float(jnp.max(jnp.abs(x)))
    levels = 2 ** (bits - 1) - 1
    nz = q != 0
    assert np.all(np.sign(q[nz]) == np.sign(np.asarray(x)[nz]))
    k = np.log2(np.abs(q[nz]) / scale)
    assert np.allclose(k, np.round(k)) and k.min() >= -(levels - 1) and k.max() <= 0
    assert len(np.unique(np.abs(q))) <= levels + 1       # the codes: levels magnitudes and zero
    assert np.array_equal(np.asarray(L.quantize(x, 32)), np.asarray(x))


def test_streaming_diloco_needs_enough_modules_and_valid_settings(digits4):
    with pytest.raises(ValueError, match="fragments = 3 but the model has only 2 top-level modules"):
        st.simulate(digits4, "streaming_diloco:6:fragments=3", CLUSTER, num_updates=2)
    with pytest.raises(ValueError, match="multiple of fragments"):
        st.policies.parse("streaming_diloco:5:fragments=2")
    with pytest.raises(ValueError, match="overlap = 4 must be <"):
        st.policies.parse("streaming_diloco:8:fragments=2:overlap=4")


@pytest.mark.timeout(180)
def test_a_real_streaming_diloco_run_replays_bitwise(digits4):
    from staleness.runtime.replay import replay_trace

    res = st.runtime.run(digits4, "streaming_diloco:4:fragments=2:overlap=1:alpha=0.5:bits=4", "1,1,2,2",
                         num_updates=8, time_scale=0.002, inner_optimizer="adamw:lr=1e-3")
    assert res.status == "complete" and replay_trace(res)[1].bitwise
