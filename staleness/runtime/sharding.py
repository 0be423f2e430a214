"""Where the parameter server keeps parameters and optimizer state: sharded over devices.

With an asynchronous policy's state on one device, that device receives every
gradient and does every update. Here each leaf (the optimizer state follows the
parameters' layout through `jit`) is split along its leading axis over a 1-D
mesh of the server's devices when that axis divides evenly, else replicated.
Elementwise optimizer steps (SGD, momentum, Adam without global-norm clipping)
give the same bits sharded or not, so traces still replay bitwise on CPU.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["ServerPlacement"]

AXIS = "server"


class ServerPlacement:
    """The server's layout over `devices` (a list of jax devices; one device: no sharding).

    `of(tree)`: the pytree of shardings of `tree` (leading axis split where it divides
    len(devices), else replicated); `scalar`: the replicated sharding of small inputs
    (staleness, masks), so they live where the update runs."""

    def __init__(self, devices):
        devices = list(devices)
        if not devices:
            raise ValueError("devices = [] : the server needs at least one device")
        self.devices = devices
        self.mesh = Mesh(np.asarray(devices), (AXIS,))
        self.scalar = NamedSharding(self.mesh, PartitionSpec())
        self.sharded = len(devices) > 1

    def leaf(self, x) -> NamedSharding:
        n = len(self.devices)
        shape = np.shape(x)
        if n > 1 and len(shape) >= 1 and shape[0] % n == 0:
            return NamedSharding(self.mesh, PartitionSpec(AXIS))
        return self.scalar

    def of(self, tree):
        return jax.tree.map(self.leaf, tree)

    def put(self, tree):
        """`tree` in this layout."""
        return jax.device_put(tree, self.of(tree))

    def describe(self) -> str:
        return f"{len(self.devices)} device(s): {', '.join(str(d) for d in self.devices)}"
