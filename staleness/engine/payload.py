"""Bytes a transfer carries, counted from the task's actual parameter pytree.

The network model (`staleness.cluster.network`) times a transfer of B bytes as
latency + B / bandwidth; this module says what B is for a task and a policy,
so `staleness.simulate` can pass it to `simulate_schedule(payload_bytes=,
push_bytes=)`:

- a pull carries the parameters: every leaf's size times its dtype's itemsize
  (a bfloat16 model moves half the bytes of a float32 one);
- a push carries a gradient, or a local-update method's delta, of the same
  shapes and dtypes;
- Streaming DiLoCo synchronizes one of its P fragments per iteration: a pull
  carries one fragment's parameters, a push one fragment's outer gradient,
  quantized to `bits` bits per value plus one float32 scale per tensor (what
  `engine.local.quantize` sends: each tensor scaled by its largest
  magnitude). Fragments of unequal sizes are timed at their mean size (the
  total over P, rounded up), so P syncs move the whole model's bytes (up to
  the rounding) and peak bandwidth falls as 1/P.

Only shapes and dtypes are read (`jax.eval_shape`): nothing is computed.
"""

from __future__ import annotations

import math

import jax
import numpy as np


__all__ = ["tree_bytes", "quantized_bytes", "payload_bytes"]

#: Bytes of the one scale sent with each quantized tensor (a float32).
SCALE_BYTES = 4


def _leaves(tree):
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


def payload_bytes(task, policy) -> tuple[int, int]:
    """(pull bytes, push bytes) of one iteration of `policy` training `task`.

    Args:
      task: a `staleness.tasks.Task` (its `init_fn` gives the parameter pytree).
      policy: a `staleness.policies.Policy`.
    Returns: integers >= 0, for `simulate_schedule(payload_bytes=, push_bytes=)`.
    """
    return policy.work.payload_bytes(jax.eval_shape(task.init_fn, jax.random.key(0)))
