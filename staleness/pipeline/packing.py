"""Pack differently shaped per-stage pytrees into same-shaped flat buffers.

On K devices every device runs the same SPMD program, so a value that differs
in structure from stage to stage (parameters, stored inputs, activations)
travels as one flat buffer per dtype, padded to the largest stage; each stage's
own code (a branch of `lax.switch`) unpacks it with its `Layout`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Layout", "union_sizes", "zeros"]

Buffers = dict[str, jax.Array]  # dtype name -> [size] flat buffer


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """Where each leaf of a pytree lives in per-dtype flat buffers."""

    treedef: Any
    leaves: tuple[tuple[str, tuple[int, ...], int], ...]  # (dtype name, shape, offset)
    sizes: dict[str, int]                                   # dtype name -> elements used

    @classmethod
    def of(cls, tree) -> Layout:
        """Layout of `tree` (arrays or ShapeDtypeStructs)."""
        flat, treedef = jax.tree.flatten(tree)
        sizes: dict[str, int] = {}
        leaves = []
        for leaf in flat:
            name = np.dtype(leaf.dtype).name
            n = math.prod(leaf.shape)
            leaves.append((name, tuple(leaf.shape), sizes.get(name, 0)))
            sizes[name] = sizes.get(name, 0) + n
        return cls(treedef, tuple(leaves), sizes)

    def pack(self, tree, sizes: dict[str, int]) -> Buffers:
        """Flat buffers of the sizes `sizes` (>= this layout's), zero-padded."""
        flat = jax.tree.leaves(tree)
        parts: dict[str, list] = {name: [] for name in sizes}
        for leaf, (name, _, _) in zip(flat, self.leaves, strict=True):
            parts[name].append(jnp.ravel(leaf))
        out = {}
        for name, size in sizes.items():
            used = self.sizes.get(name, 0)
            if used < size:
                parts[name].append(jnp.zeros((size - used,), name))
            out[name] = jnp.concatenate(parts[name]) if len(parts[name]) > 1 else parts[name][0]
        return out

    def unpack(self, buffers: Buffers):
        leaves = [buffers[name][off: off + math.prod(shape)].reshape(shape) for name, shape, off in self.leaves]
        return jax.tree.unflatten(self.treedef, leaves)


def union_sizes(layouts: Sequence[Layout]) -> dict[str, int]:
    """Per dtype, the largest size any layout needs (dtypes sorted by name; at least 1 element)."""
    names = sorted({name for lay in layouts for name in lay.sizes})
    return {name: max(1, max(lay.sizes.get(name, 0) for lay in layouts)) for name in names}


def zeros(sizes: dict[str, int], lead: tuple[int, ...] = ()) -> Buffers:
    return {name: jnp.zeros((*lead, size), name) for name, size in sizes.items()}
