"""RL tasks (staleness.tasks.rl): rollouts, objectives and their exact expected gradients.

Exact checks first: the bandit's objective gradients, averaged over every joint outcome of a
group with its probability, against a float64 NumPy reference written from the formulas
(off-policy, with clipping active), and the reference itself against the closed-form policy
gradient on-policy; decoupled PPO with π_prox = π_behav is PPO bit for bit. Then invariants of
rollouts (shapes, masks, exactly each prompt's length, determinism, counter-based prompt
indices), the checks at construction, and one plain on-policy training loop per task.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from staleness.tasks import rl
from staleness.tasks.rl import bandit, digits, lengths, objectives


@jax.jit
def _perturb(params, key, scale):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


@pytest.fixture(scope="module")
def bandit_task():
    return rl.get("rl-bandit", objective="reinforce")


@pytest.fixture(scope="module")
def digits_task():
    return rl.get("rl-digits", num_workers=2, objective="decoupled_ppo")   # warm start: 50 supervised steps


@pytest.fixture(scope="module")
def digits_params(digits_task):
    return digits_task.init_params(jax.random.key(0))


@pytest.fixture(scope="module")
def digits_rollout(digits_task, digits_params):
    idx = digits_task.prompt_indices(0, 1, 7)
    return digits_task.generate(digits_params, jax.random.key(3), idx)


# ---------------------------------------------------------------------------
# Exact: the bandit's expected gradients against float64


OFF_POLICY = {"W": 1.0}   # scale of the random params: ratios far enough from 1 that the clip binds


@pytest.mark.parametrize("objective, extra", [("reinforce", {}), ("ppo", {}), ("decoupled_ppo", {}),
                                              ("tis", {}), ("tis", {"c": 1.2}),
                                              ("decoupled_ppo", {"eps": 0.1, "std_advantages": True}),
                                              ("decoupled_ppo", {"cap": 1.3}),
                                              ("decoupled_ppo", {"cap": 1.3, "level": "sequence"}),
                                              ("tis", {"level": "sequence"}),
                                              ("mis", {}), ("mis", {"lo": 0.8, "hi": 1.25})])
def test_bandit_expected_gradient_matches_float64(objective, extra):
    """Σ_outcomes P(outcome) · jax.grad(task.loss) (float32, the task's own loss, logp and
    rollout layout) == bandit.expected_gradient (float64, from the formulas) off-policy.

    Tolerance: max |error| <= 1e-5 · max |reference|. Each outcome's float32 gradient carries a
    relative rounding error of a few ulp (~1e-7: a log-softmax, an exp, a product); the weighted
    sum of 4^4 = 256 outcomes keeps it at ~1e-7 of the terms' scale (observed ~2e-7 of the
    result), so 1e-5 leaves a 50x margin while a wrong sign, branch or (1 - 1/G) factor is off
    by >= 1e-2 of the scale."""
    task = rl.get("rl-bandit", objective=objective, **extra)
    key = jax.random.key(11)
    params = _perturb({"W": jnp.zeros((8, 4))}, key, OFF_POLICY["W"])
    behavior = _perturb(params, jax.random.fold_in(key, 1), 0.7)
    prox = jax.tree.map(lambda a, b: 0.5 * (a + b), params, behavior)
    use_prox = objective == "decoupled_ppo"
    prompts = [0, 5, 9, 33]
    ref = bandit.expected_gradient(task, params, prompts, behavior_params=behavior,
                                   prox_params=prox if use_prox else None)["W"]
    grads, clipped, masked = [], [], []
    for p in prompts:
        rollouts, weight = bandit.enumerated(task, behavior, p)
        prox_logp = jax.vmap(task.logp, (None, 0))(prox, rollouts) if use_prox else None
        g = jax.vmap(jax.grad(task.loss), (None, 0, 0 if use_prox else None))(params, rollouts, prox_logp)["W"]
        grads.append(np.einsum("m,mij->ij", weight, np.asarray(g, np.float64)))
        lp_new = jax.vmap(task.logp, (None, 0))(params, rollouts)
        _, aux = jax.vmap(task.objective.loss_aux, (0, 0, 0 if use_prox else None, 0, 0))(
            lp_new, rollouts.logp, prox_logp, rollouts.mask, rollouts.rewards)
        clipped.append(float(np.max(aux["clip_fraction"])))
        masked.append(float(np.max(aux["masked_fraction"])))
    got = np.mean(grads, axis=0)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), (np.abs(got - ref).max(), np.abs(ref).max())
    assert np.abs(ref).max() > 1e-3
    if objective in ("ppo", "decoupled_ppo"):
        assert max(clipped) > 0.05   # the clip binds on part of the outcomes: its branch is tested too
    if "cap" in extra or objective == "mis":
        assert max(masked) > 0.05    # the mask drops part of the tokens: its branch is tested too


@pytest.mark.parametrize("objective", rl.OBJECTIVES)
def test_bandit_on_policy_expected_gradient_is_scaled_policy_gradient(objective):
    """On-policy every objective's expected gradient is −(1 − 1/G) ∇ E_π[r] (the group mean includes
    the sample itself); both sides float64, so to 1e-12."""
    task = rl.get("rl-bandit", objective=objective)
    params = _perturb({"W": jnp.zeros((8, 4))}, jax.random.key(5), 1.0)
    idx = np.arange(16)
    got = bandit.expected_gradient(task, params, idx)["W"]
    want = -(1.0 - 1.0 / task.group_size) * bandit.policy_gradient(task, params, idx)["W"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_bandit_sampled_gradient_agrees_with_expectation(bandit_task):
    """The mean of jax.grad(loss) over 4096 rollouts the task itself generates (off-policy, tis)
    lies within 5 standard errors of the exact expectation in every coordinate: `generate` samples
    the behavior policy and records its log-probs (a Monte-Carlo check, fixed seed)."""
    task = dataclasses.replace(bandit_task, objective=objectives.make("tis", c=1.5))
    params = _perturb({"W": jnp.zeros((8, 4))}, jax.random.key(2), 1.0)
    behavior = _perturb(params, jax.random.key(3), 0.5)
    idx = jnp.arange(8, dtype=jnp.int32)
    n = 4096

    @jax.jit
    def grads(keys):
        return jax.vmap(lambda k: jax.grad(task.loss)(params, task.generate(behavior, k, idx))["W"])(keys)

    g = np.asarray(grads(jax.random.split(jax.random.key(0), n)), np.float64)
    ref = bandit.expected_gradient(task, params, np.arange(8), behavior_params=behavior)["W"]
    se = g.std(axis=0) / np.sqrt(n)
    assert np.all(np.abs(g.mean(axis=0) - ref) <= 5 * se + 1e-7)


# ---------------------------------------------------------------------------
# Objectives


def test_decoupled_ppo_with_behavior_prox_is_ppo_exactly(digits_task, digits_params, digits_rollout):
    """π_prox = π_behav: decoupled PPO's loss and gradient equal naive PPO's bit for bit, at
    learner params where the clip binds; another π_prox changes them."""
    learner = _perturb(digits_params, jax.random.key(9), 0.01)
    ppo = dataclasses.replace(digits_task, objective=objectives.make("ppo"))
    lp_new = digits_task.logp(learner, digits_rollout)
    clip = ppo.objective.loss_aux(lp_new, digits_rollout.logp, None, digits_rollout.mask,
                                  digits_rollout.rewards)[1]["clip_fraction"]
    assert float(clip) > 0.01
    # separately compiled programs, so equality is the arithmetic's, not a shared subexpression's
    want_loss, want_grad = jax.jit(jax.value_and_grad(ppo.loss))(learner, digits_rollout)
    decoupled = jax.jit(jax.value_and_grad(digits_task.loss))
    for prox in (None, digits_rollout.logp):
        loss, grad = decoupled(learner, digits_rollout, prox)
        assert np.asarray(loss) == np.asarray(want_loss)
        jax.tree.map(np.testing.assert_array_equal, grad, want_grad)
    other = digits_task.logp(_perturb(digits_params, jax.random.key(4), 0.01), digits_rollout)
    assert decoupled(learner, digits_rollout, other)[0] != want_loss


def test_objective_formulas_on_small_arrays():
    """Each loss against its formula written out in NumPy on a hand-sized rollout (float32 vs
    float64: 1e-6)."""
    rng = np.random.default_rng(0)
    b, g, t = 2, 3, 4
    new, behav, prox = (rng.normal(-1.0, 0.3, (b, g, t)) for _ in range(3))
    mask = (np.arange(t) < np.array([2, 4])[:, None, None]) * np.ones((b, g, t))
    r = rng.uniform(size=(b, g))
    adv = (r - r.mean(-1, keepdims=True))[..., None]
    rho, rho_p, w = np.exp(new - behav), np.exp(new - prox), np.exp(prox - behav)
    mean = lambda x: np.sum(x * mask) / np.sum(mask)   # noqa: E731
    want = {"reinforce": -mean(adv * new),
            "ppo": -mean(np.minimum(rho * adv, np.clip(rho, 0.8, 1.2) * adv)),
            "decoupled_ppo": -mean(w * np.minimum(rho_p * adv, np.clip(rho_p, 0.8, 1.2) * adv)),
            "tis": -mean(np.minimum(rho, 2.0) * adv * new),
            "mis": -mean(np.where((rho >= 0.5) & (rho <= 5.0), rho, 0.0) * adv * new)}
    args = [jnp.asarray(a, jnp.float32) for a in (new, behav, prox, mask, r)]
    for name in rl.OBJECTIVES:
        np.testing.assert_allclose(float(objectives.make(name).loss(*args)), want[name], rtol=1e-6, atol=1e-6)
    # AReaL's behaviour-weight cap: tokens with w > cap count 0 in the sum, 1 in the denominator
    cap = float(np.median(w[mask > 0]))
    kept = np.where(w > cap, 0.0, w)
    loss, aux = objectives.make("decoupled_ppo", cap=cap).loss_aux(*args)
    np.testing.assert_allclose(float(loss), -mean(kept * np.minimum(rho_p * adv, np.clip(rho_p, 0.8, 1.2) * adv)),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(float(aux["masked_fraction"]), mean(w > cap), rtol=1e-6)
    std = objectives.group_advantages(jnp.asarray(r, jnp.float32), std_advantages=True)
    np.testing.assert_allclose(std, (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6), rtol=1e-5)


def test_sequence_level_ratio_on_a_hand_case():
    """GSPO's sequence ratio: exp of the mean over a completion's real tokens of the token
    log-ratio, shared by all its tokens. One prompt, two completions of 3 tokens (the second
    of 2: its padding is not averaged), A = ±0.5."""
    new = np.array([[[-1.0, -2.0, -0.5], [-0.2, -0.4, 0.0]]])
    behav = np.array([[[-1.3, -1.7, -0.8], [-0.5, -0.5, 0.0]]])
    mask = np.array([[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]])
    r = np.array([[1.0, 0.0]])
    s = np.exp([np.mean([0.3, -0.3, 0.3]), np.mean([0.3, 0.1])])            # [1.105.., 1.221..]
    adv = np.array([0.5, -0.5])
    # tis at level sequence: sg(min(s, c)) A log π_θ, token mean over the 5 real tokens
    want_tis = -(min(s[0], 1.15) * adv[0] * new[0, 0].sum() + min(s[1], 1.15) * adv[1] * new[0, 1, :2].sum()) / 5
    args = [jnp.asarray(a, jnp.float32) for a in (new, behav, behav, mask, r)]
    got = objectives.make("tis", c=1.15, level="sequence").loss(*args)
    np.testing.assert_allclose(float(got), want_tis, rtol=1e-6)
    # mis at level sequence with [0.9, 1.2]: the second completion (s = 1.22) is masked whole
    loss, aux = objectives.make("mis", lo=0.9, hi=1.2, level="sequence").loss_aux(*args)
    np.testing.assert_allclose(float(loss), -(s[0] * adv[0] * new[0, 0].sum()) / 5, rtol=1e-6)
    np.testing.assert_allclose(float(aux["masked_fraction"]), 2 / 5, rtol=1e-6)
    # decoupled_ppo at level sequence, π_prox = π_behav: w = 1, ρ' = s, clipped at 1 ± 0.1
    got = objectives.make("decoupled_ppo", eps=0.1, level="sequence").loss(*args)
    want = -(3 * min(s[0] * adv[0], np.clip(s[0], 0.9, 1.1) * adv[0])
             + 2 * min(s[1] * adv[1], np.clip(s[1], 0.9, 1.1) * adv[1])) / 5
    np.testing.assert_allclose(float(got), want, rtol=1e-6)


@pytest.mark.parametrize("group", [3, 8, 16])
@pytest.mark.parametrize("value", [2 / 3, 0.1, 1.0, 3 / 7])
def test_equal_rewards_give_advantage_zero(group, value):
    """A group of equal rewards has advantage 0 exactly, also divided by the group's std (the
    float32 mean of eight 2/3 used to differ from them, and 1e-8 / (std + 1e-6) gave +0.056)."""
    r = jnp.full((2, group), value, jnp.float32)
    for std in (False, True):
        assert np.array_equal(np.asarray(objectives.group_advantages(r, std_advantages=std)), np.zeros((2, group)))


# ---------------------------------------------------------------------------
# Rollouts


def test_digits_rollout_shapes_masks_and_lengths(digits_task, digits_params, digits_rollout):
    ro, task = digits_rollout, digits_task
    b, g, t = task.prompts_per_rollout, task.group_size, task.max_length
    assert ro.tokens.shape == ro.logp.shape == ro.mask.shape == (b, g, t)
    assert ro.rewards.shape == (b, g) and ro.prompt_idx.shape == ro.lengths.shape == (b,)
    assert (ro.tokens.dtype, ro.logp.dtype, ro.mask.dtype, ro.rewards.dtype) == (jnp.int32, jnp.float32,
                                                                               jnp.float32, jnp.float32)
    idx = np.asarray(ro.prompt_idx)
    want_len = task.completion_lengths[idx]
    np.testing.assert_array_equal(ro.lengths, want_len)
    np.testing.assert_array_equal(task.prompts["length"][idx], want_len)   # the prompt's own digit count
    live = np.arange(t) < want_len[:, None, None]                          # [B, 1, T]
    np.testing.assert_array_equal(ro.mask, np.broadcast_to(live, (b, g, t)).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(ro.mask).sum(-1), np.broadcast_to(want_len[:, None], (b, g)))
    tokens, logp = np.asarray(ro.tokens), np.asarray(ro.logp)
    assert np.all(np.where(live, tokens < digits.NUM_DIGITS, tokens == digits.PAD))   # exactly L digits, then PAD
    assert np.all(np.where(live, logp < 0, logp == 0))
    # rewards: the fraction of correct positions, recomputed here
    prompt = task.prompts["digits"][idx]                                   # [B, T]
    target = prompt[:, ::-1]
    right = (tokens == target[:, None, :]) & live
    np.testing.assert_allclose(ro.rewards, right.sum(-1) / want_len[:, None], rtol=1e-6)
    # behavior log-probs = the learner's log-probs at the same params (scan recompute vs one pass)
    np.testing.assert_allclose(task.logp(digits_params, ro), logp, rtol=0, atol=2e-5)


def test_bandit_rollout_shapes(bandit_task):
    task = bandit_task
    params = task.init_params(jax.random.key(0))
    ro = task.generate(params, jax.random.key(1), task.prompt_indices(0, 0, 0))
    assert ro.tokens.shape == (8, 4, 1) and ro.rewards.shape == (8, 4)
    np.testing.assert_array_equal(ro.mask, np.ones((8, 4, 1), np.float32))
    np.testing.assert_array_equal(ro.rewards, task.prompts["r"][np.asarray(ro.prompt_idx)[:, None], ro.tokens[..., 0]])
    np.testing.assert_allclose(task.logp(params, ro), ro.logp, rtol=0, atol=1e-6)


def test_generate_is_deterministic_in_the_key(digits_task, digits_params, digits_rollout):
    again = digits_task.generate(digits_params, jax.random.key(3), digits_rollout.prompt_idx)
    jax.tree.map(np.testing.assert_array_equal, again, digits_rollout)
    other = digits_task.generate(digits_params, jax.random.key(4), digits_rollout.prompt_idx)
    assert not np.array_equal(other.tokens, digits_rollout.tokens)
    # as a jit argument (the task is a pytree: prompts are inputs, functions static): the same rollout
    jitted = jax.jit(lambda task, p, k, i: task.generate(p, k, i))(digits_task, digits_params, jax.random.key(3),
                                                                   digits_rollout.prompt_idx)
    jax.tree.map(np.testing.assert_array_equal, jitted, digits_rollout)


def test_generate_and_loss_do_not_retrace():
    """New keys, prompt indices and params reuse the compiled generate, logp and evaluate: the
    policy function is traced by the first calls only (counted in Python at trace time)."""
    traces = []

    def logits_fn(p, prompt, c):
        traces.append(1)
        return jnp.broadcast_to(prompt["x"] @ p["w"], (4, 5))

    task = _user_task(logits_fn=logits_fn)
    grad = jax.jit(jax.grad(task.loss))
    for i in range(3):
        params = {"w": jnp.full((3, 5), 0.1 * i)}
        rollout = task.generate(params, jax.random.key(i), task.prompt_indices(0, 0, i))
        grad(params, rollout)
        task.evaluate(params)
        if i == 0:
            first = len(traces)
    assert len(traces) == first


def test_lengths_are_drawn_once_from_the_seed():
    a, b = rl.get("rl-bandit", seed=3), rl.get("rl-bandit", seed=3)
    c = rl.get("rl-bandit", seed=4)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    jax.tree.map(np.testing.assert_array_equal, a.prompts, b.prompts)
    assert not np.array_equal(a.lengths, c.lengths)
    assert a.max_length == 1 and np.all(a.completion_lengths == 1)
    assert a.lengths.min() >= 1 and a.lengths.max() <= 1024
    assert np.percentile(a.lengths, 99) > 3 * np.median(a.lengths)   # long-tailed
    idx = a.prompt_indices(0, 2, 5)
    assert a.decode_tokens(idx) == a.lengths[idx].max()
    np.testing.assert_array_equal(a.decode_tokens(np.stack([idx, idx + 1])), [a.lengths[idx].max(),
                                                                              a.lengths[idx + 1].max()])


def test_prompt_indices_are_counter_based(bandit_task):
    task = bandit_task
    host = task.prompt_indices(7, np.arange(4)[:, None], np.arange(5)[None, :])      # [4, 5, B]
    assert host.shape == (4, 5, task.prompts_per_rollout) and host.dtype == np.int32
    assert host.min() >= 0 and host.max() < task.num_prompts
    traced = jax.jit(lambda a, i: task.prompt_indices(7, a, i))(jnp.arange(4)[:, None], jnp.arange(5)[None, :])
    np.testing.assert_array_equal(traced, host)
    np.testing.assert_array_equal(task.prompt_indices(jax.random.key(7), 1, 2), host[1, 2])
    np.testing.assert_array_equal(jax.jit(task.prompt_indices)(jnp.uint32(7), 1, 2), host[1, 2])
    np.testing.assert_array_equal(jax.jit(task.prompt_indices)(jax.random.key(7), 1, 2), host[1, 2])
    np.testing.assert_array_equal(task.prompt_indices(7, 1, 2), host[1, 2])
    assert not np.array_equal(host[0, 0], host[0, 1])
    with pytest.raises(ValueError, match="actor = 4 is out of range"):
        task.prompt_indices(7, 4, 0)


def test_evaluate_config_and_metrics(bandit_task):
    params = bandit_task.init_params(jax.random.key(0))
    out = bandit_task.evaluate(params)
    assert set(out) == set(bandit_task.metric_names) == {"reward", "greedy_reward"}
    assert 0.0 <= float(out["reward"]) <= 1.0
    assert bandit_task.evaluate(params)["reward"] == out["reward"]       # a fixed key
    assert bandit_task.metric("reward").goal == "higher"
    config = bandit_task.config()
    json.dumps(config)
    assert config["objective"] == "reinforce" and config["group_size"] == 4 and config["max_length"] == 1


# ---------------------------------------------------------------------------
# A plain on-policy loop improves the reward


def _on_policy(task, params, opt, steps, seed=0):
    """`steps` updates in one jitted lax.scan: prompt indices (traced iteration), generate with the
    current params, jax.grad(task.loss), the optax update. Returns (params, mean rollout reward [steps])."""

    @jax.jit
    def run(params):
        def step(carry, it):
            params, state = carry
            idx = task.prompt_indices(seed, jnp.int32(0), it)
            rollout = task.generate(params, jax.random.fold_in(jax.random.key(seed), it), idx)
            updates, state = opt.update(jax.grad(task.loss)(params, rollout), state, params)
            return (optax.apply_updates(params, updates), state), jnp.mean(rollout.rewards)

        (params, _), rewards = jax.lax.scan(step, (params, opt.init(params)), jnp.arange(steps))
        return params, rewards

    return run(params)


def test_on_policy_loop_improves_bandit_reward(bandit_task):
    params = bandit_task.init_params(jax.random.key(0))
    before = bandit.expected_reward(bandit_task, params)
    trained, _ = _on_policy(bandit_task, params, optax.sgd(1.0), 100)
    after = bandit.expected_reward(bandit_task, trained)
    assert before < 0.6 and after > 0.85, (before, after)          # observed 0.50 -> 0.93
    assert float(bandit_task.evaluate(trained)["reward"]) > 0.85


def test_on_policy_loop_improves_digits_reward(digits_task, digits_params):
    before = float(digits_task.evaluate(digits_params)["reward"])
    trained, rewards = _on_policy(digits_task, digits_params, optax.adam(1e-3), 100)
    after = float(digits_task.evaluate(trained)["reward"])
    assert 0.12 < before < 0.4 and after > before + 0.2, (before, after)   # observed 0.20 -> 0.70
    assert float(jnp.mean(rewards[-10:])) > float(jnp.mean(rewards[:10])) + 0.2


# ---------------------------------------------------------------------------
# Checks at construction: one-line ValueErrors naming the argument


def _user_task(logits_fn=None, reward_fn=None, length_rule=lengths.lognormal(2, 0.5, high=4), prompts=None,
               **kw):
    policy = rl.Policy(init_fn=lambda key: {"w": jnp.zeros((3, 5))},
                       logits_fn=logits_fn or (lambda p, prompt, c: jnp.broadcast_to(prompt["x"] @ p["w"], (4, 5))),
                       max_length=4)
    prompt_set = rl.PromptSet(prompts={"x": np.ones((10, 3), np.float32)} if prompts is None else prompts,
                              length_rule=length_rule)
    return rl.from_functions(policy, prompt_set, reward_fn or (lambda prompt, c, n: jnp.mean((c == 1) * 1.0)), **kw)


def test_from_functions_builds_a_working_task():
    task = _user_task(objective="tis", c=3.0, group_size=2, prompts_per_rollout=3)
    ro = task.generate(task.init_params(jax.random.key(0)), jax.random.key(1), task.prompt_indices(0, 0, 0))
    assert ro.tokens.shape == (3, 2, 4)
    np.testing.assert_array_equal(ro.mask.sum(-1), task.completion_lengths[np.asarray(ro.prompt_idx)][:, None]
                                  * np.ones((1, 2)))
    assert np.isfinite(float(task.loss(task.init_params(jax.random.key(0)), ro)))


@pytest.mark.parametrize("build, arg", [
    (lambda: rl.get("rl-bandit", objective="grpo"), "objective = 'grpo'"),
    (lambda: rl.get("rl-bandit", objective="ppo", eps=1.5), "eps = 1.5"),
    (lambda: rl.get("rl-bandit", objective="ppo", eps=0.0), "eps = 0.0"),
    (lambda: rl.get("rl-bandit", objective="decoupled_ppo", eps=-0.1), "eps = -0.1"),
    (lambda: rl.get("rl-bandit", objective="tis", c=0.5), "c = 0.5"),
    (lambda: rl.get("rl-bandit", objective="tis", c=float("inf")), "c = inf"),
    (lambda: rl.get("rl-bandit", objective="ppo", c=2.0), "c = 2.0"),
    (lambda: rl.get("rl-bandit", group_sise=4), "group_sise = 4"),
    (lambda: rl.get("rl-bandit", group_size=1), "group_size = 1"),
    (lambda: rl.get("rl-cartpole"), "name = 'rl-cartpole'"),
    (lambda: _user_task(reward_fn=lambda prompt, c, n: (c == 1) * 1.0), "reward_fn"),
    (lambda: _user_task(logits_fn=lambda p, prompt, c: prompt["x"] @ p["w"]), "logits_fn"),
    (lambda: _user_task(length_rule=lengths.lognormal(2, 0.5, high=9)), "length_rule"),
    (lambda: _user_task(length_rule=lambda prompts, rng: np.full(10, 7)), "length_rule"),
    (lambda: _user_task(length_rule=lambda prompts, rng: np.full(3, 2)), "length_rule"),
    (lambda: _user_task(prompts={"x": np.ones((10, 3)), "y": np.ones(9)}), "prompts"),
    (lambda: rl.get("rl-digits", max_digits=4, length_rule=lengths.zipf(1.5, high=6), warm_start_steps=0),
     "length_rule"),
    (lambda: rl.get("rl-digits", target="shuffle", warm_start_steps=0), "target = 'shuffle'"),
    (lambda: rl.get("rl-digits", d_model=30, num_heads=4), "d_model = 30"),
    (lambda: rl.get("rl-digits", max_digit=4), "max_digit = 4"),
    (lambda: _user_task(group_size=2, objective="ppo", eps=2.0), "eps = 2.0"),
])
def test_bad_inputs_are_one_line_value_errors(build, arg):
    with pytest.raises(ValueError) as err:
        build()
    message = str(err.value)
    assert arg in message and "\n" not in message, message


def test_a_model_context_shorter_than_max_length_is_an_error():
    """A policy whose context cannot hold max_length completion tokens fails at construction."""
    config = digits.DigitsConfig(max_digits=4)
    init_fn, logits_fn, reward_fn = digits.policy_fns(config)
    prompts = digits.make_prompts(np.random.default_rng(0), np.array([1, 2, 3]), 6)   # 6 digits: context 8 < 12
    with pytest.raises(ValueError, match="logits_fn failed on a completion of max_length = 6") as err:
        rl.from_functions(rl.Policy(init_fn, logits_fn, max_length=6),
                          rl.PromptSet(prompts, lengths.from_prompts("length")), reward_fn)
    assert "\n" not in str(err.value)
