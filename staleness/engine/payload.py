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

Only shapes and dtypes are read (`jax.eval_shape`): nothing is computed. The arithmetic
(`tree_bytes`, `quantized_bytes`) is `staleness.policies.payload`'s, where each work's
`payload_bytes` uses it.
"""

from __future__ import annotations

import jax

from staleness.policies.payload import SCALE_BYTES, quantized_bytes, tree_bytes   # noqa: F401 (public here too)


__all__ = ["tree_bytes", "quantized_bytes", "payload_bytes", "SCALE_BYTES"]


def payload_bytes(task, policy) -> tuple[int, int]:
    """(pull bytes, push bytes) of one iteration of `policy` training `task`.

    Args:
      task: a `staleness.tasks.Task` (its `init_fn` gives the parameter pytree).
      policy: a `staleness.policies.Policy`.
    Returns: integers >= 0, for `simulate_schedule(payload_bytes=, push_bytes=)`.
    """
    return policy.work.payload_bytes(jax.eval_shape(task.init_fn, jax.random.key(0)))
