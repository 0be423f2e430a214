"""Checks of the arguments every task constructor shares (name, batch size, workers, partition,
seed), in one module, so the built-in tasks, `from_flax`/`from_functions` and the registry check
them the same way without importing one another.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from staleness.tasks import partitions


def check_name(name: Any) -> str:
    """A task name: a non-empty string."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name = {name!r} must be a non-empty string (the task's name).")
    return name


def check_common(batch_size: Any, num_workers: Any, partition: Any, seed: Any) -> None:
    """Validate the arguments every task shares, with messages that say what is valid."""
    for arg, value in (("batch_size", batch_size), ("num_workers", num_workers), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{arg} must be an int; got {value!r} of type {type(value).__name__}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (examples per worker minibatch); got {batch_size}.")
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1; got {num_workers}.")
    partitions.parse(partition)   # ValueError naming the valid partitions
    if seed < 0:
        raise ValueError(f"seed must be >= 0; got {seed}.")


def check_shard(partition: str, num_workers: int, train_size: int, name: str) -> None:
    """Under `shard` every worker needs at least one example of its own."""
    if partition == "shard" and num_workers > train_size:
        raise ValueError(f"partition='shard' gives each worker a disjoint shard of the {train_size} training "
                         f"examples of {name!r}, so num_workers must be <= {train_size}; got {num_workers}. "
                         f"Use fewer workers or partition='iid'.")
