"""Bytes a transfer carries, counted from the task's actual parameter pytree.

The network model (`staleness.cluster.network`) times a transfer of B bytes as latency +
B / bandwidth; `payload_bytes` says what B is for a task and a policy, for
`simulate_schedule(payload_bytes=, push_bytes=)`: a pull carries the parameters, a push a
gradient or a local-update method's delta of the same shapes and dtypes, and Streaming
DiLoCo one of its P fragments per iteration (quantized pushes, fragments of unequal sizes
timed at their mean size). Only shapes and dtypes are read (`jax.eval_shape`); the
arithmetic is `staleness.policies.payload`'s, where each work's `payload_bytes` uses it.
"""

from __future__ import annotations

import jax

from staleness.policies.payload import SCALE_BYTES, quantized_bytes, tree_bytes   # noqa: F401 (public here too)


__all__ = ["tree_bytes", "quantized_bytes", "payload_bytes", "SCALE_BYTES"]


def payload_bytes(task, policy) -> tuple[int, int]:
    """(pull bytes, push bytes), integers >= 0, of one iteration of `policy` (a
    `staleness.policies.Policy`) training `task` (a `staleness.tasks.Task`: its `init_fn`
    gives the parameter pytree)."""
    return policy.work.payload_bytes(jax.eval_shape(task.init_fn, jax.random.key(0)))
