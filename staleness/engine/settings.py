"""The settings of a simulated run (`Settings`) and of a sweep (`SweepSettings`): one value,
checked once (`check`, `check_sweep`: `checks.ArgumentError` naming the field, the value and
what would be valid), passed down whole. What depends on the task or the schedule is
checked where it is known. The command line generates its flags from the fields' metadata
(`staleness.infra.settings`, `staleness.cli.config_flags`) and calls `check` before it
starts JAX. Pure Python: nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from staleness.infra import checks
from staleness.infra.settings import flag, no_flag

__all__ = ["Settings", "check", "SweepSettings", "check_sweep", "SLOT_MODES"]

SLOT_MODES = ("vmap", "map")

_field = dataclasses.field


@dataclasses.dataclass(frozen=True)
class Settings:
    """A simulated run's settings (see `engine.run.simulate` and `engine.run.replay` for
    each field's meaning); `num_updates` and `max_time` bound `simulate`'s schedule and
    `replay` has none. Each field's metadata describes its command-line flag, or says
    what sets it instead."""

    num_updates: Any = _field(default=None, metadata=flag("server updates per run (instead of --max-time)", int,
                                                          flag="--updates"))
    max_time: Any = _field(default=None, metadata=flag("simulated seconds per run", float))
    seed: Any = _field(default=None, metadata=flag("seed of parameters and minibatches (and of the cluster's "
                                                   "draws)", int, default=0))
    lr: Any = _field(default=None, metadata=flag("learning rate (default 0.1, or the lr= the --optimizer spec "
                                                 "names)", float))
    lr_rule: Any = _field(default="constant", metadata=flag("constant, per_gradient, per_update, "
                                                            "delay_adaptive:N"))
    optimizer: Any = _field(default=None, metadata=flag(
        "server optimizer spec: sgd, momentum[:0.9], nesterov[:0.9], adam, adamw, muon, delayed_nesterov[:N], "
        "clocked_nesterov[:0.9] (local-update merges), with KEY=VALUE options lr, wd, "
        "clip, warmup (b1, b2, eps for adam/adamw) and +cosine or +linear, e.g. "
        "'adamw:lr=1e-3,wd=0.1,clip=1,warmup=100+cosine' (default: the task's, else sgd)"))
    inner_optimizer: Any = _field(default=None, metadata=flag(
        "local-update methods (local_sgd, diloco, async_diloco): the workers' inner optimizer spec (default: the "
        "task's, else sgd); --optimizer is then the outer one"))
    eval_every: Any = _field(default=None, metadata=flag("updates between evaluations (default: 20 rows)", int))
    num_evals: Any = _field(default=20, metadata=no_flag("the command line keeps 20 rows (--eval-every where "
                                                         "a command offers it)"))
    batch_size: Any = _field(default=None, metadata=flag(
        "per-worker minibatch μ (default 32, or the task factory's own); RL tasks: prompts per rollout B "
        "(default 8)", int))
    progress: Any = _field(default=False, metadata=no_flag("--no-progress"))
    checkpoint: Any = _field(default=None, metadata=flag("directory to checkpoint into after every evaluation"))
    resume: Any = _field(default=False, metadata=flag("continue from the checkpoint in --checkpoint", bool))
    stop_after: Any = _field(default=None, metadata=no_flag("the library only (stop after this many updates)"))
    slot_mode: Any = _field(default="vmap", metadata=no_flag("`staleness replay` picks 'map' for a recorded "
                                                             "run's trace"))
    config: Any = _field(default=None, metadata=no_flag("the library only (extra config entries)"))
    callbacks: Any = _field(default=None, metadata=no_flag("--log"))


def check(s: Settings) -> Settings:
    """`s` with each value checked on its own and normalised (ints, floats); what needs
    the task, the optimizer or the schedule is checked where they are known."""
    if s.slot_mode not in SLOT_MODES:
        raise checks.ArgumentError("slot_mode", s.slot_mode, "must be 'vmap' or 'map'")
    return dataclasses.replace(
        s, num_updates=checks.at_least("num_updates", s.num_updates, 1, allow_none=True),
        max_time=checks.seconds("max_time", s.max_time, allow_none=True),
        seed=checks.at_least("seed", s.seed, 0, allow_none=True),
        lr=checks.learning_rate(s.lr, allow_none=True),
        eval_every=checks.at_least("eval_every", s.eval_every, 1, allow_none=True, what=" (updates)"),
        num_evals=checks.at_least("num_evals", s.num_evals, 1),
        batch_size=checks.at_least("batch_size", s.batch_size, 1, allow_none=True),
        stop_after=checks.at_least("stop_after", s.stop_after, 1, allow_none=True, what=" (updates)"))


@dataclasses.dataclass(frozen=True)
class SweepSettings:
    """A sweep's settings, as `engine.run.sweep` takes them (see there): the grid's axes
    (seeds, lr rules, rates), the budget and optimizers as `Settings`, and the padding a
    grid may pin (ring, slots); checked by `check_sweep`. Each field's metadata describes
    its command-line flag (`staleness sweep`), or says what sets it instead."""

    seeds: Any = _field(default=(0,), metadata=no_flag("--seeds (a comma-separated list)"))
    lr_rules: Any = _field(default=("constant",), metadata=no_flag("--lr-rules (a comma-separated list)"))
    lrs: Any = _field(default=(None,), metadata=no_flag("--lrs (a comma-separated list)"))
    num_updates: Any = _field(default=None, metadata=no_flag("--updates (`Settings.num_updates`)"))
    max_time: Any = _field(default=None, metadata=no_flag("--max-time (`Settings.max_time`)"))
    optimizer: Any = _field(default=None, metadata=no_flag("--optimizer (`Settings.optimizer`)"))
    inner_optimizer: Any = _field(default=None, metadata=no_flag("--inner-optimizer (`Settings.inner_optimizer`)"))
    eval_every: Any = _field(default=None, metadata=no_flag("--eval-every (`Settings.eval_every`)"))
    num_evals: Any = _field(default=20, metadata=no_flag("the command line keeps 20 rows"))
    batch_size: Any = _field(default=None, metadata=no_flag("--batch-size (`Settings.batch_size`)"))
    ring: Any = _field(default=None, metadata=flag("parameter versions kept (>= largest staleness + 1); pin it "
                                                   "(and --slots) so grids share one compiled replay", int))
    slots: Any = _field(default=None, metadata=flag("gradient slots per update (>= the largest update)", int))


def check_sweep(s: SweepSettings) -> SweepSettings:
    """`s` with the values `check` checks for a simulated run, and the pinned ring and
    slots (integers >= 1; whether they are large enough is known once the schedules are)."""
    one = check(Settings(num_updates=s.num_updates, max_time=s.max_time, eval_every=s.eval_every,
                         num_evals=s.num_evals, batch_size=s.batch_size))
    return dataclasses.replace(
        s, num_updates=one.num_updates, max_time=one.max_time, eval_every=one.eval_every, num_evals=one.num_evals,
        batch_size=one.batch_size, ring=checks.at_least("ring", s.ring, 1, allow_none=True),
        slots=checks.at_least("slots", s.slots, 1, allow_none=True))
