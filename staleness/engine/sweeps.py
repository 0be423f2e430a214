"""Sweeps: many configurations replayed in one compiled call per chunk, on one device or a mesh.

    results = sweep(task, ["asp", "ssp:3"], cluster, seeds=range(4), lrs=[0.03, 0.1], num_updates=2000)
    results = sweep(..., devices=4)          # the configuration axis sharded over 4 local devices

A sweep is prepared once on the host (`prepare`: every schedule, the padding
shared by all configurations, the optimizer) and replayed by
`replay_grid(grid, indices, devices)`: the configurations `indices` (default:
all) in blocks of `block` configurations batched under `vmap`, one block per
device per call. Any split of the grid (over devices, or over processes in
`staleness.engine.distributed`) gives every configuration the same bits.

The names of one public place: `sweep` and `prepare` resolve settings where
`replay` does (`staleness.engine.run`); the batched replay is
`staleness.engine.grid`, and its history, divergence, evaluation and progress
are the one chunk runner's (`staleness.engine.runner`).
"""

from staleness.engine.grid import (DEFAULT_BLOCK, Grid, Settings, compile_seconds, grid_block, needs, pad_plan,
                                   replay_grid, resolve_devices)
from staleness.engine.run import prepare, sweep

__all__ = ["Grid", "Settings", "prepare", "replay_grid", "sweep", "resolve_devices", "compile_seconds", "grid_block",
           "needs", "pad_plan", "DEFAULT_BLOCK"]
