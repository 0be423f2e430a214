"""Shape and byte arithmetic of a parameter pytree, for the works' `payload_bytes` and
their numerics options (the engine's `payload` and `local` use the same functions).

- a pull carries the parameters: every leaf's size times its dtype's itemsize
  (a bfloat16 model moves half the bytes of a float32 one);
- a quantized push carries `bits` bits per value plus one float32 scale per tensor
  (what `engine.local.quantize` sends: each tensor scaled by its largest magnitude);
- Streaming DiLoCo's fragments are the top-level modules, strided (`fragment_keys`).

Only shapes and dtypes are read (leaves may be `jax.ShapeDtypeStruct`s); JAX's pytree
utilities load when a function is called, so `staleness.policies` imports no JAX.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SCALE_BYTES", "fragment_keys", "quantized_bytes", "tree_bytes"]

#: Bytes of the one scale sent with each quantized tensor (a float32).
SCALE_BYTES = 4


def _leaves(tree):
    import jax

    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            leaf = np.asarray(leaf)
        out.append((int(math.prod(leaf.shape)), np.dtype(leaf.dtype).itemsize))
    return out


def tree_bytes(tree) -> int:
    """Bytes of a pytree of arrays (or `jax.ShapeDtypeStruct`s): Σ size · itemsize over its leaves."""
    return sum(n * item for n, item in _leaves(tree))


def quantized_bytes(tree, bits: int) -> int:
    """Bytes of a pytree sent quantized to `bits` bits per value (32: as is, `tree_bytes`):
    Σ over its non-empty leaves of ceil(size · bits / 8) + one float32 scale."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 32:
        raise ValueError(f"quantized_bytes: bits = {bits!r} must be an integer in 1..32")
    if bits >= 32:
        return tree_bytes(tree)
    return sum(-(-n * bits // 8) + SCALE_BYTES for n, _ in _leaves(tree) if n)


def topk_count(n: int, topk: float) -> int:
    """Values kept of a tensor of `n` by a top-k of fraction `topk` (at least one)."""
    return n if topk >= 1.0 else max(1, math.ceil(topk * n))


def sparse_bytes(tree, topk: float, bits: int) -> int:
    """Bytes of a pytree sent as its top-`topk` fraction of values per tensor (each with a
    32-bit index; topk = 1: dense, no index), quantized to `bits` bits (32: as is):
    Σ over its non-empty leaves of ceil(k · (bits + index bits) / 8) (+ a float32 scale when quantized)."""
    if topk >= 1.0 and bits >= 32:
        return tree_bytes(tree)
    index = 32 if topk < 1.0 else 0
    return sum(-(-topk_count(n, topk) * (min(bits, 8 * item) + index) // 8) + (SCALE_BYTES if bits < 32 else 0)
               for n, item in _leaves(tree) if n)


def fragment_keys(params, fragments: int) -> tuple[tuple[str, ...], ...]:
    """Streaming DiLoCo's fragments of a dict of parameters: its top-level modules in
    order, strided (module j in fragment j mod P), as in the paper's default."""
    if not isinstance(params, dict):
        raise ValueError("fragments split the parameters by their top-level modules: the task's params "
                         f"must be a dict, not {type(params).__name__}")
    keys = list(params)
    if len(keys) < fragments:
        raise ValueError(f"fragments = {fragments} but the model has only {len(keys)} top-level "
                         f"modules ({', '.join(map(str, keys))}); use fewer fragments")
    return tuple(tuple(k for j, k in enumerate(keys) if j % fragments == p) for p in range(fragments))
