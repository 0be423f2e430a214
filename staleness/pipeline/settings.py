"""The settings of a pipeline run: one value, checked once, passed down whole.

`RunArgs` is what `staleness.pipeline.train` and `multiprocess.train_distributed` share, as given;
`check` checks each value on its own, in `training.set_up` and (`staleness pipeline`) before JAX starts.

Pure Python: nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from staleness.infra import checks
from staleness.infra.settings import flag, no_flag

__all__ = ["DEFAULT_OPTIMIZER", "RunArgs", "check"]

DEFAULT_OPTIMIZER = "momentum:0.9"

_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class RunArgs:
    """What to run: the arguments of `staleness.pipeline.train` that every driver shares
    (meanings as there), checked by `check`. Each field's metadata describes its
    command-line flag, or says what sets it instead."""

    schedule: Any = _field(metadata=no_flag("--schedule, --delays, --microbatches, --stash"))
    num_batches: Any = _field(metadata=flag("batches to train", int, flag="--batches"))
    cluster: Any = _field(default=None, metadata=flag(
        "per-stage speeds, one worker per stage, e.g. '1,1,2,1' or '4+stragglers=0.05:4:3' (default: K stages at "
        "1 s per batch)"))
    seed: Any = _field(default=0, metadata=flag("seed of parameters, minibatches and the cluster's draws "
                                                "(default 0)", int))
    lr: Any = _field(default=None, metadata=flag("base learning rate", float))
    optimizer: Any = _field(default=DEFAULT_OPTIMIZER, metadata=flag(
        f"per-stage optimizer (default {DEFAULT_OPTIMIZER})"))
    eval_every: Any = _field(default=None, metadata=flag("batches between evaluations (default batches/10)", int))
    num_evals: Any = _field(default=10, metadata=no_flag("the command line keeps 10 rows; --eval-every sets "
                                                         "their spacing"))
    backward_ratio: Any = _field(default=2.0, metadata=flag("backward / forward cost (default 2)", float))
    recompute_cost: Any = _field(default=1.0, metadata=flag(
        "cost of a stale backward's recomputed forward, in forwards (default 1; 0 = overlapped)", float))


def check(args: RunArgs) -> RunArgs:
    """`args` with each value checked on its own and normalised; the schedule, the cluster
    and the optimizer are parsed where the task's stage count is known (`training.set_up`)."""
    return dataclasses.replace(
        args, num_batches=checks.positive_int("num_batches", args.num_batches),
        seed=checks.at_least("seed", args.seed, 0), lr=checks.learning_rate(args.lr, allow_none=True),
        eval_every=None if args.eval_every is None else checks.positive_int("eval_every", args.eval_every),
        num_evals=checks.positive_int("num_evals", args.num_evals),
        backward_ratio=checks.number_at_least("backward_ratio", args.backward_ratio, 0, strict=True),
        recompute_cost=checks.number_at_least("recompute_cost", args.recompute_cost, 0))

