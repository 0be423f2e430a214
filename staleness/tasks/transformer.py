"""A small decoder-only (GPT-style) transformer in flax.linen, built from stage-sized parts.

    model  = Transformer(num_layers=2, d_model=128, num_heads=4, context=64)
    logits = model.apply({"params": params}, tokens)     # tokens [B, T] int, T <= context -> [B, T, vocab]

Three parts, each an ordinary module (`TokenEmbed`; `Block`: pre-LayerNorm, x + Attn(LN(x)),
then x + MLP(LN(x)), MLP 4x with GELU; `LMHead`), so the pipeline splitter can put `TokenEmbed`
with the first block(s) on stage 0 and `LMHead` with the last block(s) on stage K-1
(`staleness.pipeline.tasks`).

The output projection is not tied to the token embedding: tied weights would live on the first
and the last pipeline stage at once, and a pipeline stage owns its parameters. No mutable
collections (LayerNorm only) and no dropout (see `staleness.tasks.models`).

Initialisation as GPT-2: weights N(0, 0.02), the two residual projections of each block
N(0, 0.02 / sqrt(2 * num_layers)), biases 0, so the loss starts near ln(vocab).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["TokenEmbed", "Block", "LMHead", "Transformer", "VOCAB", "parts", "prefill", "decode_step"]

VOCAB = 256
"""Byte-level vocabulary."""

_MASKED = -1e9  # a finite "minus infinity": every row keeps its diagonal, so softmax never sees an all-masked row


def _normal(std: float):
    return nn.initializers.normal(stddev=std)


class TokenEmbed(nn.Module):
    """Tokens [B, T] (int) -> token embedding + positional embedding [B, T, d_model]."""

    vocab: int
    d_model: int
    context: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        t = tokens.shape[-1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the model's context = {self.context}")
        tok = nn.Embed(self.vocab, self.d_model, embedding_init=_normal(0.02), name="tokens")(tokens)
        pos = self.param("positions", _normal(0.02), (self.context, self.d_model), jnp.float32)
        return tok + pos[:t]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position i attends to positions <= i."""

    num_heads: int
    out_std: float = 0.02

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        h = self.num_heads
        qkv = nn.Dense(3 * d, kernel_init=_normal(0.02), name="qkv")(x).reshape(b, t, 3, h, d // h)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]              # [B, T, H, Dh]
        self.sow("cache", "kv", (k, v))   # the keys and values a KV-cached decode keeps (`prefill`)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // h)  # [B, H, T, T]
        causal = jnp.tril(jnp.ones((t, t), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, _MASKED), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return nn.Dense(d, kernel_init=_normal(self.out_std), name="out")(out)


class Block(nn.Module):
    """Pre-LayerNorm transformer block on [B, T, d_model]; width preserved."""

    d_model: int
    num_heads: int
    num_layers: int = 1   # of the whole model: scales the residual projections' init
    mlp_ratio: int = 4

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        out_std = 0.02 / math.sqrt(2 * self.num_layers)
        x = x + CausalSelfAttention(self.num_heads, out_std, name="attn")(nn.LayerNorm(name="ln_attn")(x))
        h = nn.Dense(self.mlp_ratio * self.d_model, kernel_init=_normal(0.02), name="mlp_in")(
            nn.LayerNorm(name="ln_mlp")(x))
        return x + nn.Dense(self.d_model, kernel_init=_normal(out_std), name="mlp_out")(nn.gelu(h))


class LMHead(nn.Module):
    """[B, T, d_model] -> logits [B, T, vocab]: final LayerNorm, then an (untied) projection."""

    vocab: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(self.vocab, kernel_init=_normal(0.02), name="logits")(nn.LayerNorm(name="ln_f")(x))


class Transformer(nn.Module):
    """Decoder-only transformer: params {"embed", "block_0", ..., "block_{N-1}", "head"}."""

    num_layers: int
    d_model: int
    num_heads: int
    context: int
    vocab: int = VOCAB

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = TokenEmbed(self.vocab, self.d_model, self.context, name="embed")(tokens)
        for i in range(self.num_layers):
            x = Block(self.d_model, self.num_heads, self.num_layers, name=f"block_{i}")(x)
        return LMHead(self.vocab, name="head")(x)


def parts(num_layers: int, d_model: int, num_heads: int, context: int, vocab: int = VOCAB
          ) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    """The `Transformer`'s (embed, blocks, head) as unbound modules, for `staleness.pipeline.model.split`
    (the same modules and initialisers, so a split model computes the same function)."""
    return (TokenEmbed(vocab, d_model, context),
            [Block(d_model, num_heads, num_layers) for _ in range(num_layers)],
            LMHead(vocab))


# -- KV-cached decoding ------------------------------------------------------------------------
def prefill(model: Transformer, params, tokens: jax.Array):
    """(logits [T, vocab], cache) of one sequence `tokens` [T] (T <= context): the ordinary
    forward pass, which also returns every layer's keys and values, padded to the context:
    cache = ((K [context, H, Dh], V [context, H, Dh]) per layer). Rows past T are zeros; a
    decode (`decode_step`) writes each new position before attending to it."""
    logits, state = model.apply({"params": params}, tokens[None], mutable=["cache"])
    t = tokens.shape[0]
    pad = lambda a: jnp.pad(a[0], ((0, model.context - t), (0, 0), (0, 0)))   # noqa: E731
    cache = tuple((pad(state["cache"][f"block_{i}"]["attn"]["kv"][0][0]),
                   pad(state["cache"][f"block_{i}"]["attn"]["kv"][0][1])) for i in range(model.num_layers))
    return logits[0], cache


def decode_step(model: Transformer, params, cache, token: jax.Array, pos: jax.Array):
    """(logits [vocab] at position `pos`, cache) after feeding `token` at position `pos`
    (traced): the transformer's forward for one new position, attending over the cached keys
    and values of positions < pos (whatever version computed them: an in-flight weight
    update keeps them, PipelineRL's rule) and its own, which it writes into the cache.
    The same modules and parameters as `Transformer.__call__`, so it computes the same
    function as the full pass (up to float rounding)."""
    d, h = model.d_model, model.num_heads
    e = params["embed"]
    x = (jnp.take(e["tokens"]["embedding"], token, axis=0) + e["positions"][pos])[None]             # [1, d]
    new = []
    for i, (keys, values) in enumerate(cache):
        p = params[f"block_{i}"]
        a = nn.LayerNorm().apply({"params": p["ln_attn"]}, x)
        qkv = nn.Dense(3 * d).apply({"params": p["attn"]["qkv"]}, a).reshape(3, h, d // h)
        keys = jax.lax.dynamic_update_index_in_dim(keys, qkv[1], pos, 0)                             # [C, H, Dh]
        values = jax.lax.dynamic_update_index_in_dim(values, qkv[2], pos, 0)
        scores = jnp.einsum("hd,khd->hk", qkv[0], keys) / math.sqrt(d // h)                          # [H, C]
        weights = jax.nn.softmax(jnp.where(jnp.arange(keys.shape[0]) <= pos, scores, _MASKED), axis=-1)
        out = jnp.einsum("hk,khd->hd", weights, values).reshape(1, d)
        x = x + nn.Dense(d).apply({"params": p["attn"]["out"]}, out)
        m = nn.Dense(p["mlp_in"]["kernel"].shape[-1]).apply(
            {"params": p["mlp_in"]}, nn.LayerNorm().apply({"params": p["ln_mlp"]}, x))
        x = x + nn.Dense(d).apply({"params": p["mlp_out"]}, nn.gelu(m))
        new.append((keys, values))
    logits = nn.Dense(model.vocab).apply({"params": params["head"]["logits"]},
                                         nn.LayerNorm().apply({"params": params["head"]["ln_f"]}, x))
    return logits[0], tuple(new)
