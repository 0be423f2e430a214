"""Sweeps: many configurations replayed in one compiled call per chunk, on one device or a mesh.

    results = sweep(task, ["asp", "ssp:3"], cluster, seeds=range(4), lrs=[0.03, 0.1], num_updates=2000)
    results = sweep(..., devices=4)          # the configuration axis sharded over 4 local devices

One public place for the names of `engine.run` (`sweep`, `prepare`: every schedule, the
padding shared by all configurations, the optimizer, prepared once on the host) and of
`engine.grid` (`replay_grid(grid, indices, devices)`: the batched replay, in blocks of
`block` configurations per device per call). Any split of the grid (over devices, or over
processes in `engine.distributed`) gives every configuration the same bits.
"""

from staleness.engine.grid import (DEFAULT_BLOCK, Grid, Settings, compile_seconds, grid_block, needs, pad_plan,
                                   replay_grid, resolve_devices)
from staleness.engine.run import prepare, sweep

__all__ = ["Grid", "Settings", "prepare", "replay_grid", "sweep", "resolve_devices", "compile_seconds", "grid_block",
           "needs", "pad_plan", "DEFAULT_BLOCK"]
