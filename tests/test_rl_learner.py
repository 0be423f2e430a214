"""The learner as the anchors run it: M optimizer steps per version on M minibatches, π_prox
recomputed once per version (AReaL), and the diagnostics RL systems log per update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
from staleness.engine import core, rollout
from staleness.engine import update as U
from staleness.tasks import rl
from staleness.tasks.rl import bandit, objectives


def _bitwise(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _perturb(params, key, scale):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return tree.unflatten([a + scale * jax.random.normal(k, a.shape, a.dtype) for a, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def digits():
    """rl-digits (3 actors), its warm-started params, an Adam optimizer and three rollouts
    generated on slightly older params (stale: π_behav != π_θ)."""
    task = rl.get("rl-digits", num_workers=3, objective="decoupled_ppo", prompts_per_rollout=4, group_size=4,
                  num_eval_prompts=16, warm_start_steps=20)
    params = task.init_params(jax.random.key(0))
    behavior = _perturb(params, jax.random.key(1), 0.02)
    key = core.keys(0)[1]
    outs = [rollout.generate_rollout(task, behavior, key, w, i) for w, i in ((0, 0), (1, 3), (2, 1))]
    rollouts = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
    opt = st.engine.run.resolve_optimizer("adam:lr=3e-2", None, 10, task)
    return task, params, opt, rollouts


def _update(task, opt, params, rollouts, minibatches):
    tau, mask = jnp.array([1, 0, 2], jnp.int32), jnp.ones(3, bool)
    fn = jax.jit(lambda p, s, r: rollout.learner_update(task, opt.tx, (st.lr.get("constant"),), 0, p, s, r, tau, mask,
                                                        minibatches))
    return fn(params, opt.init(params), rollouts)


def test_one_minibatch_is_the_single_step(digits):
    """M = 1 is the learner as it was: each rollout's gradient at θ with π_prox = θ
    (`learner_gradient`), their mean, one optimizer step; bitwise."""
    task, params, opt, rollouts = digits
    p1, s1, losses, _ = _update(task, opt, params, rollouts, 1)

    @jax.jit
    def before(p, s, r):
        losses, grads = jax.lax.map(lambda x: rollout.learner_gradient(task, p, x), r)
        return (*U.apply(opt.tx, p, s, U.aggregate(grads, jnp.array([1, 0, 2]), jnp.ones(3, bool),
                                                   (st.lr.get("constant"),)), True), losses)

    p0, s0, l0 = before(params, opt.init(params), rollouts)
    assert _bitwise(p1, p0) and _bitwise(s1, s0) and np.array_equal(np.asarray(losses), np.asarray(l0))


def _step(task, opt, params, state, batch, prox):
    losses, grads = jax.lax.map(lambda a: jax.value_and_grad(task.loss)(params, *a), (batch, prox))
    return (*U.apply(opt.tx, params, state, U.aggregate(grads, jnp.array([1, 0, 2]), jnp.ones(3, bool),
                                                        (st.lr.get("constant"),)), True), losses)


def _half(r, m):
    return jax.tree.map(lambda a: a[:, 2 * m:2 * m + 2], r)


def test_two_minibatches_step_twice_around_one_prox(digits):
    """M = 2: π_prox is the log-probs at the version's params, once; the first step trains on
    the first half of every rollout's prompts, the second on the other half at the new θ,
    around the same π_prox. The clip never binds at the first step (ρ' = 1 exactly) and binds
    at the second; the first step is naive PPO's (on these barely stale rollouts, whose
    behaviour weights lie inside the clip range)."""
    task, params, opt, rollouts = digits
    got, _, _, _ = _update(task, opt, params, rollouts, 2)
    prox = jax.lax.map(lambda r: jax.lax.stop_gradient(task.logp(params, r)), rollouts)
    p1, s1, _ = jax.jit(lambda p, s: _step(task, opt, p, s, _half(rollouts, 0), _half(prox, 0)))(
        params, opt.init(params))
    p2, _, _ = jax.jit(lambda p, s: _step(task, opt, p, s, _half(rollouts, 1), _half(prox, 1)))(p1, s1)
    np.testing.assert_allclose(np.concatenate([np.ravel(x) for x in jax.tree.leaves(got)]),
                               np.concatenate([np.ravel(x) for x in jax.tree.leaves(p2)]), rtol=0, atol=1e-6)

    def clip(p, m):
        r, lp = _half(rollouts, m), _half(prox, m)
        aux = jax.vmap(lambda x, q: task.objective.loss_aux(task.logp(p, x), x.logp, q, x.mask, x.rewards)[1])(r, lp)
        return float(np.max(aux["clip_fraction"]))

    assert clip(params, 0) == 0.0 and clip(p1, 1) > 0.02
    # on-policy rollouts (rl_sync): π_behav is π_θ up to the rounding of the actor's decode, so
    # the first step of decoupled PPO is naive PPO's
    key = core.keys(0)[1]
    fresh = jax.tree.map(lambda *xs: jnp.stack(xs), *[rollout.generate_rollout(task, params, key, w, 0)
                                                      for w in range(3)])
    prox = jax.lax.map(lambda r: jax.lax.stop_gradient(task.logp(params, r)), fresh)
    ppo = rl.get("rl-digits", num_workers=3, objective="ppo", prompts_per_rollout=4, group_size=4,
                 num_eval_prompts=16, warm_start_steps=20)
    sgd = st.engine.run.resolve_optimizer("sgd:lr=1", None, 10, task)   # the step is the gradient itself
    firsts = [jax.jit(lambda p, s, t=t: _step(t, sgd, p, s, _half(fresh, 0), _half(prox, 0)))(params, sgd.init(params))
              for t in (task, ppo)]
    step = [np.concatenate([np.ravel(np.asarray(x) - np.asarray(y)) for x, y in zip(jax.tree.leaves(f[0]),
                                                                                     jax.tree.leaves(params))])
            for f in firsts]
    assert np.abs(step[0] - step[1]).max() <= 1e-4 * np.abs(step[1]).max()


def test_minibatches_must_divide_the_prompts(digits):
    task, params, opt, rollouts = digits
    with pytest.raises(ValueError, match="minibatches = 3 must divide the prompts per rollout"):
        _update(task, opt, params, rollouts, 3)


def test_a_simulated_run_with_minibatches_replays_bitwise():
    """rl_async:2:minibatches=2 on rl-bandit: simulate, sweep and replay (slot_mode 'map') agree
    bit for bit, and the steps move the parameters differently from one step per version."""
    task = rl.get("rl-bandit", num_workers=3, prompts_per_rollout=8)
    cluster = st.cluster.heterogeneous([1.0, 1.5, 2.5]).jitter(0.2)
    kw = dict(num_updates=8, eval_every=4, lr=0.5)
    two = st.simulate(task, "rl_async:2:minibatches=2", cluster, **kw)
    one = st.simulate(task, "rl_async:2", cluster, **kw)
    assert two.schedule.to_frame().equals(one.schedule.to_frame())
    assert not _bitwise(two.params, one.params)
    again = st.engine.replay(two.schedule, task, slot_mode="map", eval_every=4, lr=0.5)
    assert _bitwise(again.params, two.params)
    swept = st.sweep(task, ["rl_async:2:minibatches=2", "rl_async:2"], cluster, lrs=[0.5], num_updates=8,
                     eval_every=4)
    assert _bitwise(swept[0].params, two.params) and _bitwise(swept[1].params, one.params)


# -- diagnostics -------------------------------------------------------------------------------
def test_diagnostics_against_a_hand_computation():
    """kl_behav (k3), is_weight_mean/max, ess and entropy over the real tokens of a hand-sized
    rollout, against NumPy float64."""
    rng = np.random.default_rng(3)
    new, behav = rng.normal(-1.0, 0.4, (2, 3, 4)), rng.normal(-1.0, 0.4, (2, 3, 4))
    mask = (np.arange(4) < np.array([2, 4])[:, None, None]) * np.ones((2, 3, 4))
    ent = rng.uniform(0.1, 2.0, (2, 3, 4))
    live = mask > 0
    r = np.exp(new - behav)[live]
    got = jax.jit(objectives.diagnostics)(*(jnp.asarray(a, jnp.float32) for a in (new, behav, mask, ent)))
    want = {"kl_behav": np.mean(r - 1 - np.log(r)), "is_weight_mean": r.mean(), "is_weight_max": r.max(),
            "ess": r.sum() ** 2 / (len(r) * np.sum(r ** 2)), "entropy": ent[live].mean()}
    for k, v in want.items():
        np.testing.assert_allclose(float(got[k]), v, rtol=2e-6, err_msg=k)


def test_version_kl_is_the_exact_kl_on_the_probe():
    """rl-bandit (T = 1): `version_kl` is the mean over the probe prompts of the exact
    KL(π_a ‖ π_b) of the two softmax policies (float64 reference); 0 for one version."""
    task = rl.get("rl-bandit", num_workers=2)
    a = _perturb({"W": jnp.zeros((8, 4))}, jax.random.key(0), 1.0)
    b = _perturb(a, jax.random.key(1), 0.3)
    probe = task.probe(a)
    n = probe[0].shape[0]
    x = np.asarray(task.eval_prompts["x"])[:n]
    pa, pb = bandit.probs(a, x), bandit.probs(b, x)
    want = np.mean(np.sum(pa * np.log(pa / pb), axis=-1))
    np.testing.assert_allclose(float(task.version_kl(a, b, probe)), want, rtol=1e-5)
    assert float(task.version_kl(a, a, probe)) == 0.0


def test_a_run_records_its_diagnostics_per_update(tmp_path):
    """The Result's per-update diagnostics: every name, staleness_mean the mean staleness of
    each update's rollouts, dropped the rollouts dropped in each update's interval; the history
    rows hold their means over each evaluation interval; saved and loaded with the Result."""
    task = rl.get("rl-bandit", num_workers=3)
    res = st.simulate(task, "rl_async:1:mode=drop", st.cluster.heterogeneous([1.0, 1.0, 4.0]).jitter(0.3),
                      num_updates=12, eval_every=4, lr=0.5)
    d = res.diagnostics
    assert list(d["update"]) == list(range(1, 13))
    for name in (*rollout.DIAGNOSTICS, "staleness_mean", "dropped"):
        assert name in d and np.all(np.isfinite(d[name])), name
    sched = res.schedule
    a = sched.applied
    mean = np.bincount(sched.columns["apply_version"][a], weights=sched.staleness[a], minlength=12)
    count = np.bincount(sched.columns["apply_version"][a], minlength=12)
    np.testing.assert_allclose(d["staleness_mean"], mean / count)
    assert d["dropped"].sum() == sched.columns["dropped"].sum() > 0
    np.testing.assert_allclose(res.history["kl_behav"].iloc[1], d["kl_behav"][:4].mean(), rtol=1e-12)
    assert (d["ess"] <= 1 + 1e-6).all() and (d["kl_behav"] >= 0).all()
    loaded = st.Result.load(res.save(tmp_path / "r"))
    assert np.allclose(loaded.diagnostics.to_numpy(), d.to_numpy(), equal_nan=True)


# -- training–inference mismatch -----------------------------------------------------------------
def test_bf16_actors_record_a_bf16_forward_and_the_learner_computes_in_float32():
    """actor_dtype='bfloat16': an actor's tokens and behaviour log-probs are those of the
    sampler run on bfloat16 params and prompts (one completion rebuilt by hand, bitwise); the
    learner's log-probs are the float32 task's, bit for bit; so even on-policy (one version)
    π_behav differs from π_θ (kl_behav > 0), while float32 actors agree with the learner to
    float32 rounding. A simulated run with bf16 actors replays bitwise."""
    from staleness.tasks.rl import decode
    from staleness.tasks.rl import digits as D

    kw = dict(num_workers=2, prompts_per_rollout=2, group_size=2, num_eval_prompts=16, warm_start_steps=20)
    t16, t32 = rl.get("rl-digits", actor_dtype="bfloat16", **kw), rl.get("rl-digits", **kw)
    params = t32.init_params(jax.random.key(0))
    key = core.keys(0)[1]
    r16, r32 = (rollout.generate_rollout(t, params, key, 1, 2) for t in (t16, t32))
    # completion (b=1, g=0) by hand: the key of item b·G + g of the rollout's generation key
    keys = jax.random.split(rollout.generation_key(key, 1, 2), 4)
    prompt = jax.tree.map(lambda a: jnp.asarray(a)[int(r16.prompt_idx[1])], t16.prompts)
    cast = lambda tree: jax.tree.map(lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating)  # noqa: E731
                                     else a, tree)
    init_cache, step = D.cache_fns(D.DigitsConfig())   # the actors' KV-cached decode
    tokens, logp = jax.jit(lambda p, k, x, n: decode.sample_cached(init_cache, step, p, k, x, n,
                                                                   max_length=t16.max_length, pad_token=t16.pad_token))(
        cast(params), keys[2], cast(prompt), r16.lengths[1])
    assert np.array_equal(np.asarray(tokens), np.asarray(r16.tokens[1, 0]))
    assert np.array_equal(np.asarray(logp), np.asarray(r16.logp[1, 0]))
    assert _bitwise(t16.logp(params, r16), t32.logp(params, r16))   # the learner: float32 either way
    m = np.asarray(r32.mask) > 0
    assert np.abs(np.asarray(r32.logp) - np.asarray(t32.logp(params, r32)))[m].max() < 1e-5
    assert np.abs(np.asarray(r16.logp) - np.asarray(t16.logp(params, r16)))[np.asarray(r16.mask) > 0].max() > 1e-4
    res = st.simulate(t16, "rl_sync", st.cluster.heterogeneous([1.0, 1.3]), num_updates=3, eval_every=3)
    assert (res.diagnostics["kl_behav"] > 0).all()
    assert _bitwise(st.engine.replay(res.schedule, t16, slot_mode="map", eval_every=3).params, res.params)


def test_a_separate_actor_implementation_is_what_actors_sample_with():
    """actor_logits_fn: the actors sample with their own implementation of the policy (here
    the bandit's logits computed as a sum of products instead of a matmul) and the learner
    with logits_fn; checked like logits_fn at construction."""
    base = rl.get("rl-bandit", num_workers=2)
    from staleness.tasks.rl import builders

    def actor_logits(params, prompt, completion):
        return jnp.sum(prompt["x"][:, None] * params["W"], axis=0)[None, :]

    task = builders.from_functions(
        rl.Policy(base.init_fn, base.logits_fn, 1), rl.PromptSet(base.prompts, rl.lengths.constant(1)),
        base.reward_fn, num_workers=2, actor_logits_fn=actor_logits)
    assert task.actor_logits_fn is actor_logits and task.config()["actor_logits_fn"]
    params = {"W": jax.random.normal(jax.random.key(0), (8, 4))}
    r = task.generate(params, jax.random.key(1), jnp.arange(4, dtype=jnp.int32))
    np.testing.assert_allclose(np.asarray(r.logp), np.asarray(task.logp(params, r)), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="actor_logits_fn"):
        builders.from_functions(rl.Policy(base.init_fn, base.logits_fn, 1),
                                rl.PromptSet(base.prompts, rl.lengths.constant(1)), base.reward_fn,
                                actor_logits_fn=lambda p, x, c: jnp.zeros((3,)))
    with pytest.raises(Exception, match="actor_dtype = 'int8' must be one of"):
        rl.get("rl-bandit", actor_dtype="int8")
