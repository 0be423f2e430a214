"""KV-cached generation: the same tokens as the uncached sampler for the same key, and the two
rules of an in-flight weight update (PipelineRL keeps the earlier tokens' cache, AReaL's partial
rollouts re-prefill) against a float64 reference of the transformer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness as st
from staleness.engine import core, rollout
from staleness.tasks import rl
from staleness.tasks.rl import digits as D

SMALL = dict(max_digits=4, num_layers=2, d_model=16, num_heads=2, num_prompts=32, num_eval_prompts=8,
             prompts_per_rollout=4, group_size=3, warm_start_steps=0)


def _task(**kw):
    return rl.get("rl-digits", num_workers=2, **{**SMALL, **kw})


@pytest.mark.parametrize("greedy", [False, True])
def test_cached_tokens_are_the_uncached_ones(greedy):
    """rl-digits (default size): for the same keys the KV-cached sampler draws the same tokens
    as the one that recomputes every prefix, and their log-probs agree to float32 rounding."""
    cached, plain = (rl.get("rl-digits", num_workers=2, warm_start_steps=20, num_eval_prompts=16, kv_cache=c)
                     for c in (True, False))
    params = cached.init_params(jax.random.key(0))
    if greedy:
        a, b = cached.evaluate(params), plain.evaluate(params)
        assert float(a["greedy_reward"]) == float(b["greedy_reward"]) and float(a["reward"]) == float(b["reward"])
        return
    for w, i in ((0, 0), (1, 7), (0, 3)):
        x, y = (rollout.generate_rollout(t, params, core.keys(0)[1], w, i) for t in (cached, plain))
        assert np.array_equal(np.asarray(x.tokens), np.asarray(y.tokens))
        np.testing.assert_allclose(np.asarray(x.logp), np.asarray(y.logp), rtol=0, atol=2e-6)


def test_a_users_cached_policy():
    """A user's own policy with a KV cache (a bigram table: the cache is the last token):
    the cached sampler draws the uncached sampler's tokens; a half-given cache is refused."""
    vocab, t = 5, 6

    def init_fn(key):
        return {"W": jax.random.normal(key, (vocab + 1, vocab)), "b": jnp.zeros(vocab)}

    def logits_fn(params, prompt, completion):
        prev = jnp.concatenate([prompt["start"][None], completion[:-1]])       # token before each position
        return params["W"][prev] + params["b"]

    def init_cache(params, prompt, completion, upto):
        prev = jnp.where(upto == 0, prompt["start"], completion[jnp.maximum(upto - 1, 0)])
        return params["W"][prev] + params["b"], prev

    def step(params, cache, token, i):
        return params["W"][token] + params["b"], token

    prompts = {"start": np.arange(8, dtype=np.int32) % vocab}
    reward = lambda prompt, completion, length: jnp.mean((completion == prompt["start"]).astype(jnp.float32))  # noqa: E731
    make = lambda **kw: rl.from_functions(rl.Policy(init_fn, logits_fn, t, pad_token=vocab, **kw),  # noqa: E731
                                          rl.PromptSet(prompts, rl.lengths.constant(t)), reward, num_workers=2,
                                          group_size=3, prompts_per_rollout=4)
    cached, plain = make(init_cache=init_cache, step=step), make()
    assert cached.cached and not plain.cached
    params = init_fn(jax.random.key(1))
    idx = jnp.arange(4, dtype=jnp.int32)
    x, y = cached.generate(params, jax.random.key(2), idx), plain.generate(params, jax.random.key(2), idx)
    assert np.array_equal(np.asarray(x.tokens), np.asarray(y.tokens))
    np.testing.assert_allclose(np.asarray(x.logp), np.asarray(y.logp), rtol=0, atol=1e-6)
    with pytest.raises(Exception, match="init_cache and step come together"):
        make(init_cache=init_cache)


# -- in-flight updates: kept cache vs re-prefill, against float64 ----------------------------------
def _np(params):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), params)


def _ln(p, x):
    mean = x.mean(-1, keepdims=True)
    var = (x * x).mean(-1, keepdims=True) - mean ** 2
    return (x - mean) / np.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _dense(p, x):
    return x @ p["kernel"] + p["bias"]


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _reference_logits(versions, who, seq, heads):
    """float64 logits [N, V] of `seq` [N] where index i is processed (its hidden states, keys
    and values computed) by version who[i], attending over the keys and values each earlier
    index got from its own version: the KV cache an in-flight update keeps."""
    n = len(seq)
    layers = len([k for k in versions[0] if k.startswith("block_")])
    keys = [[None] * n for _ in range(layers)]
    vals = [[None] * n for _ in range(layers)]
    out = []
    for i in range(n):
        p = versions[who[i]]
        x = p["embed"]["tokens"]["embedding"][seq[i]] + p["embed"]["positions"][i]
        for li in range(layers):
            b = p[f"block_{li}"]
            d = x.shape[-1]
            q, k, v = _dense(b["attn"]["qkv"], _ln(b["ln_attn"], x)).reshape(3, heads, d // heads)
            keys[li][i], vals[li][i] = k, v
            kk, vv = np.stack(keys[li][:i + 1]), np.stack(vals[li][:i + 1])           # [i+1, H, Dh]
            s = np.einsum("hd,khd->hk", q, kk) / np.sqrt(d // heads)
            w = np.exp(s - s.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            x = x + _dense(b["attn"]["out"], np.einsum("hk,khd->hd", w, vv).reshape(d))
            x = x + _dense(b["mlp_out"], _gelu(_dense(b["mlp_in"], _ln(b["ln_mlp"], x))))
        out.append(_dense(p["head"]["logits"], _ln(p["head"]["ln_f"], x)))
    return np.stack(out)


def _logsoftmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("keep", [True, False])
def test_inflight_updates_keep_or_refill_the_cache_as_the_float64_reference(keep):
    """Segments [0, 2): positions 0-1 sampled with version a, 2-3 with b. Kept cache
    (PipelineRL): the prompt, SEP and token 0 were encoded by a, so b's position 2 attends over
    a's keys and values for them; re-prefill (AReaL): b encodes the whole prefix again. The
    behaviour log-probs of the sampled tokens match a float64 transformer run under each rule
    (1e-5), and the two rules differ where the cache matters."""
    task = _task()
    a = task.init_params(jax.random.key(1))
    b = jax.tree.map(lambda x, y: x + 0.5 * y, a, task.init_params(jax.random.key(2)))
    stacked = jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)
    starts = jnp.asarray([0, 2], jnp.int32)
    idx = jnp.arange(4, dtype=jnp.int32)
    out = task.generate(stacked, jax.random.key(5), idx, starts, keep_cache=keep)
    other = task.generate(stacked, jax.random.key(5), idx, starts, keep_cache=not keep)
    t = task.max_length
    versions = [_np(a), _np(b)]
    prompts = np.asarray(task.prompts["digits"])
    got, want = np.asarray(out.logp), np.zeros(out.logp.shape)
    for bi in range(out.tokens.shape[0]):
        for g in range(out.tokens.shape[1]):
            tokens = np.asarray(out.tokens[bi, g])
            seq = np.concatenate([prompts[int(idx[bi])], [D.SEP], tokens[:-1]])           # [2T]
            seg = lambda pos: int(np.sum(np.asarray(starts) <= pos)) - 1   # noqa: E731
            if keep:   # index i <= T: the prefill's version; index T + 1 + j: token j, by position j + 1's
                who = [seg(0)] * (t + 1) + [seg(j + 1) for j in range(t - 1)]
                lg = _reference_logits(versions, who, seq, 2)[t:, :D.NUM_DIGITS]
            else:      # position j: version s(j) on the whole prefix
                lg = np.stack([_reference_logits(versions, [seg(j)] * len(seq), seq, 2)[t + j, :D.NUM_DIGITS]
                               for j in range(t)])
            lp = _logsoftmax(lg)[np.arange(t), np.where(tokens < D.NUM_DIGITS, tokens, 0)]   # (pads: masked)
            want[bi, g] = np.where(np.asarray(out.mask[bi, g]) > 0, lp, 0.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    diff = np.abs(np.asarray(other.logp) - got)[:, :, 2:]
    assert np.array_equal(np.asarray(other.tokens), np.asarray(out.tokens)) or diff.max() > 0
    assert diff.max() > 1e-4   # keeping the cache is not re-prefilling


def test_inflight_and_partial_runs_replay_bitwise():
    """rl_inflight keeps the cache, rl_partial re-prefills: both are recorded in the learner's
    configuration and a simulated run of each replays bitwise (one call per slot)."""
    task = _task()
    cluster = st.cluster.heterogeneous([1.0, 1.2, 3.0]).jitter(0.3)
    task = rl.get("rl-digits", num_workers=3, **SMALL)
    for spec, refill in (("rl_inflight:1", False), ("rl_partial:1", True)):
        pol = st.policies.parse(spec)
        assert st.engine.local.configure(pol.work).reprefill is refill
        res = st.simulate(task, pol, cluster, num_updates=8, eval_every=4, lr=0.1)
        assert res.schedule.meta.get("segments"), spec
        again = st.engine.replay(res.schedule, task, slot_mode="map", eval_every=4, lr=0.1)
        assert all(np.array_equal(np.asarray(x), np.asarray(y))
                   for x, y in zip(jax.tree.leaves(again.params), jax.tree.leaves(res.params))), spec
