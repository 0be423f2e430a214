"""Shared pieces of the command line: errors, argument parsing, tables."""

from __future__ import annotations

import argparse
import math
import os
import sys

__all__ = ["UsageError", "Parser", "print_table", "count", "natural", "positive", "nonnegative", "check_out",
           "add_task_option", "task_options", "build_task", "rl_task_name", "is_rl_policy", "check_pairing",
           "declared_optimizer", "DEFAULT_RL_POLICIES", "add_yes", "check_scale", "check_processes",
           "add_log", "log_callbacks"]

from staleness.results.compare import DEFAULT_RL_POLICIES   # noqa: E402 - the policies compare runs on an RL task


class UsageError(ValueError):
    """A bad command-line argument: one line on stderr, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors (exit 2) that records each option's
    flag by its destination (`flags`), so a library's `checks.ArgumentError` about
    keyword argument `name` is shown with the flag it came from (`flag_of`)."""

    def __init__(self, *args, **kwargs):
        self.flags: dict[str, str] = {}   # destination -> its longest flag
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.option_strings:
            self.flags[action.dest] = max(action.option_strings, key=len)
        return action

    def flag_of(self, name: str) -> str:
        """The flag of keyword argument `name` ('max_time' -> '--max-time', 'num_updates'
        -> '--updates'); `name` itself when no option has it."""
        return self.flags.get(name) or self.flags.get(name.removeprefix("num_")) or name

    def error(self, message):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _number(text: str, kind):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be finite")
    return value


def _bounded(text: str, kind, ok, must: str):
    value = _number(text, kind)
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be {must}")
    return value


def count(text: str) -> int:
    """argparse type: an integer >= 1 (updates, workers, batch sizes)."""
    return _bounded(text, int, lambda v: v >= 1, "an integer >= 1")


def natural(text: str) -> int:
    """argparse type: an integer >= 0 (seeds)."""
    return _bounded(text, int, lambda v: v >= 0, "an integer >= 0")


def positive(text: str) -> float:
    """argparse type: a finite number > 0 (seconds, learning rates)."""
    return _bounded(text, float, lambda v: v > 0, "a number > 0")


def nonnegative(text: str) -> float:
    """argparse type: a finite number >= 0 (tolerances, costs)."""
    return _bounded(text, float, lambda v: v >= 0, "a number >= 0")


def check_out(args, default=None):
    """--out as a validated Path (before any computation), or None: creatable,
    writable, not a file, and not existing staleness output unless --overwrite."""
    from staleness.infra import files

    out = args.out if args.out is not None else default
    if out is None:
        return None
    return files.check_out(out, overwrite=bool(getattr(args, "overwrite", False)
                                               or getattr(args, "resume_compare", False)))


def header_lines(parts: list[str], width: int = 100) -> list[str]:
    """`parts` of a header joined with '; ' into lines of at most `width` columns."""
    lines, line = [], ""
    for part in parts:
        if line and len(line) + 2 + len(part) > width:
            lines.append(line + ";")
            line = part
        else:
            line = f"{line}; {part}" if line else part
    return lines + [line] if line else lines


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict], file=None) -> None:
    """Print dicts as an aligned text table (columns = keys of the first row)."""
    file = file or sys.stdout
    if not rows:
        return
    keys = list(rows[0])
    cells = [[_fmt(r.get(k, "")) for k in keys] for r in rows]
    width = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, width)), file=file)
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, width)), file=file)


# -- sizes: refuse what cannot finish, unless --yes ------------------------------------
ROW_BYTES = 531
"""Peak bytes per schedule row while simulating (tracemalloc, 200,000 rows of asp on 8 workers)."""
ROWS_PER_S = 1e6
"""An upper bound on the simulator's speed (measured 120,000-160,000 rows/s on a 2-core CPU)."""
PROCESS_BYTES = 206 * 2**20
"""Resident memory of one process that imported staleness and JAX (measured: 206 MiB)."""
MAX_SECONDS = 3600.0


def add_yes(p) -> None:
    p.add_argument("--yes", action="store_true", help="go on with a run estimated to need more than half the "
                   "memory or more than an hour (refused otherwise)")


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):   # pragma: no cover - not POSIX
        return math.inf


def _human(n: float, unit: str) -> str:
    if unit == "B":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
            if n < 1024 or suffix == "PiB":
                return f"{n:.3g} {suffix}"
            n /= 1024
    if n < 3600:
        return f"{n:.3g} s"
    return f"{n / 3600:.3g} h" if n < 3600 * 24 * 365 else f"{n / (3600 * 24 * 365):.3g} years"


def check_scale(args, cluster, updates, max_time, runs: int = 1) -> None:
    """Refuse (UsageError, one line) a budget whose schedules alone would need more than half
    the machine's memory or more than an hour to simulate, with the estimate; --yes goes on.
    Rows: at least one gradient per update; with --max-time, every worker's gradients at its
    mean speed."""
    if getattr(args, "yes", False):
        return
    rows = (float(updates) if updates is not None
            else float(max_time) * sum(1.0 / t for t in cluster.mean_seconds if t > 0)) * runs
    memory, seconds = rows * ROW_BYTES, rows / ROWS_PER_S
    if memory > _memory_bytes() / 2 or seconds > MAX_SECONDS:
        budget = f"--updates {updates}" if updates is not None else f"--max-time {max_time:g}"
        if not math.isfinite(rows):
            raise UsageError(f"{budget} is more gradients than any machine can simulate; give a smaller budget")
        raise UsageError(f"{budget} means about {rows:.3g} gradients in {runs} run(s): about "
                         f"{_human(memory, 'B')} of schedules (of {_human(_memory_bytes(), 'B')}) and at least "
                         f"{_human(seconds, 's')} of simulation alone; give a smaller budget, or --yes to go on")


def rl_estimate(task, updates, runs: int = 1, rollouts_per_update: int | None = None) -> str | None:
    """`RLTask.estimate_note` of an RL task (None for the others): the line a command prints
    before a run of about two minutes or more of RL numerics."""
    return task.estimate_note(updates, runs, rollouts_per_update) if hasattr(task, "estimate_note") else None


def check_processes(args, n: int) -> None:
    """Refuse starting `n` processes that would need more than half the memory, unless --yes."""
    need = n * PROCESS_BYTES
    if not getattr(args, "yes", False) and need > _memory_bytes() / 2:
        raise UsageError(f"--local {n} would start {n} JAX processes, about {_human(need, 'B')} of memory (of "
                         f"{_human(_memory_bytes(), 'B')}) before any work; use fewer, or --yes to go on")


# -- experiment tracking --------------------------------------------------------------
def add_log(p) -> None:
    p.add_argument("--log", action="append", default=None, metavar="SPEC",
                   help="log every evaluation as it happens (repeatable): tensorboard:DIR (TensorBoard event "
                   "files, one run per subdirectory) or wandb:PROJECT (Weights & Biases; pip install "
                   "'staleness[wandb]'; WANDB_MODE=offline works without a network)")


def log_callbacks(args) -> list:
    """The `staleness.infra.tracking` writers of --log, built (lazily: no file yet) before any run."""
    from staleness.infra import tracking

    try:
        return [tracking.parse(spec, what="--log") for spec in getattr(args, "log", None) or []]
    except (ValueError, ImportError) as e:
        raise UsageError(str(e)) from None


# -- tasks: options, RL or supervised ----------------------------------------------------
def add_task_option(p) -> None:
    p.add_argument("--task-option", action="append", default=None, metavar="KEY=VALUE",
                   help="a task option (repeatable), e.g. objective=ppo, eps=0.2, group_size=4 for the RL tasks "
                   "(see staleness.tasks.rl.get), num_samples=2000 for mnist1d-*; VALUE is read as an integer, "
                   "a number, true/false or none where it is one, else as text")


def _value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def task_options(args) -> dict:
    """--task-option KEY=VALUE pairs as keyword arguments (UsageError for a malformed one)."""
    out: dict = {}
    for item in getattr(args, "task_option", None) or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"--task-option = {item!r} must be KEY=VALUE, e.g. objective=ppo")
        flag = {"num_workers": "--cluster", "batch_size": "--batch-size", "partition": "--partition",
                "data_dir": "--data-dir", "seed": "--seed", "name": "--task"}.get(key)
        if flag:
            raise UsageError(f"--task-option {key}: set by the run ({flag}), not an option")
        if key in out:
            raise UsageError(f"--task-option {key} is given twice")
        out[key] = _value(value)
    return out


def build_task(args, num_workers: int):
    """The task of --task for `num_workers` workers, with --batch-size, --data-dir,
    --partition and --task-option (an unknown option is one line, exit 2)."""
    from staleness import tasks
    from staleness.engine import resolve_task

    options = task_options(args)
    batch_size, data_dir, partition = (getattr(args, k, None) for k in ("batch_size", "data_dir", "partition"))
    if batch_size is not None and "prompts_per_rollout" in options:
        raise UsageError("--batch-size is an RL task's prompts per rollout; give it or --task-option "
                         "prompts_per_rollout, not both")
    if not options:
        return resolve_task(args.task, num_workers, batch_size, data_dir, partition)
    given = {k: v for k, v in (("batch_size", batch_size), ("data_dir", data_dir), ("partition", partition))
             if v is not None}
    try:
        return tasks.get(args.task, num_workers=num_workers, **given, **options)
    except TypeError as e:   # tasks.get: an option the task does not take
        raise UsageError(f"--task-option: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def rl_task_name(name) -> bool | None:
    """Whether task name `name` is an RL task (without building it): True for the
    built-in RL tasks, False for the other built-in and registered ones, None for a
    'package.module:factory' (known once built)."""
    from staleness.tasks import registry, rl

    if name in rl.NAMES:
        return True
    if name in registry.names():
        return False
    return None


def is_rl_task(task) -> bool:
    """Whether `task` (built, or a name) is an RL task (`staleness.tasks.rl.is_task`)."""
    from staleness.tasks import rl

    return rl.is_task(task)


def is_rl_policy(policy) -> bool:
    """Whether `policy` trains on rollouts (asynchronous RL: the rl_* policies)."""
    return policy.learner


def check_pairing(policies, task, rl: bool | None = None) -> None:
    """UsageError (one line) when an RL policy meets a supervised task or the other way
    round. `task`: the --task name (`rl` None: from the name) or a built task."""
    if not isinstance(task, str):
        name, rl = task.name, is_rl_task(task)
    else:
        name, rl = task, rl_task_name(task) if rl is None else rl
    if rl is None:
        return
    for p in policies:
        if is_rl_policy(p) and not rl:
            raise UsageError(f"--policy {p.describe()} trains on rollouts (asynchronous RL) but --task {name} is "
                             "not an RL task; use --task rl-bandit or rl-digits, or a gradient policy (bsp, asp, "
                             "ssp:3, ...)")
        if rl and not is_rl_policy(p):
            raise UsageError(f"--task {name} is an RL task but --policy {p.describe()} does not generate rollouts; "
                             "use rl_sync, rl_one_step_off, rl_async[:ETA], rl_inflight[:ETA] or rl_partial[:ETA]")


def declared_optimizer(name: str):
    """`staleness.tasks.registry.declared_optimizer`, also for the built-in RL tasks
    (rl-digits trains with adam): the optimizer task `name` trains with by default, or
    None (plain sgd, or not known without building the task)."""
    from staleness.tasks import registry, rl

    if name in rl.NAMES:
        own = {m.NAME: getattr(m, "OPTIMIZER", None) for m in (rl.bandit, rl.digits)}
        return own.get(name)
    return registry.declared_optimizer(name)
