"""Which examples a worker's minibatch holds: a pure function of (seed, worker, iteration).

Example j of the minibatch of `worker` at its `iteration` is position

    h_j = mix(mix(mix(k0 ^ worker·G0) ^ k1 ^ iteration·G1) + j·G2)     (uint32)
    index_j = order[lo + h_j mod (hi − lo)]                             (lo, hi: the worker's slice)

of the training set, where (k0, k1) are the 32-bit words of the run's data key, `mix` is a 32-bit
integer finalizer ("lowbias32": two multiply-xorshift rounds), G0..G2 are odd constants, and (order,
bounds) is the partition layout (`order` lists the training indices worker by worker, worker w owns
order[bounds[w]:bounds[w+1]]; iid: every worker owns the whole set in its natural order). The same
few integer operations run in NumPy (to build a chunk's index table on the host, [K, C, μ], that the
compiled replay reads like a plain training loop reads its precomputed batches) and in JAX (for
`task.minibatch` inside `jit`); uint32 arithmetic wraps identically in both, so both give exactly
the same indices. The modulo's bias is below size / 2^32 (< 3e-4 relative for a million examples).
"""

from __future__ import annotations

import numpy as np

__all__ = ["draws", "positions", "host_indices", "layout_of"]

_G0, _G1, _G2 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_M0, _M1 = 0x7FEB352D, 0x846CA68B


def _u32(xp, value):
    return xp.asarray(value, dtype=xp.uint32)


def _mix(xp, h):
    h = h ^ (h >> _u32(xp, 16))
    h = h * _u32(xp, _M0)
    h = h ^ (h >> _u32(xp, 15))
    h = h * _u32(xp, _M1)
    return h ^ (h >> _u32(xp, 16))


def draws(xp, bits, worker, iteration, batch_size: int):
    """[..., μ] uint32 hashes; `bits` the 2 uint32 words of the data key, `worker` and
    `iteration` integer arrays of one shape (or scalars). xp: numpy or jax.numpy."""
    k0, k1 = _u32(xp, bits[0]), _u32(xp, bits[1])
    w = xp.asarray(worker).astype(xp.uint32)
    i = xp.asarray(iteration).astype(xp.uint32)
    h = _mix(xp, k0 ^ (w * _u32(xp, _G0)))
    h = _mix(xp, h ^ k1 ^ (i * _u32(xp, _G1)))
    j = xp.arange(batch_size, dtype=xp.uint32) * _u32(xp, _G2)
    return _mix(xp, h[..., None] + j)


def positions(xp, d, worker, train_size: int, order=None, bounds=None):
    """Training-set indices (int32) of draws `d` ([..., μ] uint32) of `worker` ([...]):
    uniform over the whole set (order None) or over the worker's slice of `order`."""
    if order is None:
        return (d % _u32(xp, train_size)).astype(xp.int32)
    w = xp.asarray(worker).astype(xp.int32)
    lo, hi = bounds[w], bounds[w + 1]
    size = (hi - lo).astype(xp.uint32)[..., None]
    return order[lo[..., None] + (d % size).astype(xp.int32)]


def host_indices(bits: np.ndarray, worker: np.ndarray, iteration: np.ndarray, batch_size: int, train_size: int,
                 layout=None) -> np.ndarray:
    """[..., μ] int32 indices on the host (NumPy); `layout` is (order, bounds) or None."""
    with np.errstate(over="ignore"):
        d = draws(np, np.asarray(bits, np.uint32), worker, iteration, batch_size)
        order, bounds = layout if layout is not None else (None, None)
        return positions(np, d, worker, train_size, order, bounds)


def layout_of(data) -> tuple[np.ndarray, np.ndarray] | None:
    """(order, bounds) NumPy copies of a task's partition layout, or None (iid)."""
    if not isinstance(data, dict) or "order" not in data:
        return None
    order = np.asarray(data["order"], np.int32)
    bounds = np.asarray(data["shard_bounds"], np.int32)
    return order, bounds
