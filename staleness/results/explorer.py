"""The policy explorer's model (notebook 05): settings -> runs -> one figure and a table,
and the `staleness compare` command line that reproduces the settings.

    s = Settings(task="digits-mlp", policies=("dssp:3:12", "bsp"), cluster="1*4,2.6*4+jitter=0.1",
                 seeds=(0, 1, 2), lr=0.05, lr_rule="constant", max_time=80.0)
    s.cli()                    # "staleness compare --task digits-mlp --policy dssp:3:12 --policy bsp ..."
    cache = {}
    results = run(s, cache)    # one `st.sweep` (one compiled call over the seeds) per policy
    fig = figure(s, results)   # curves with bands over seeds | staleness histogram and timelines
    table(s, results)          # `staleness.results.compare`'s table: medians with intervals over seeds

The explorer's `st.sweep` and the command line's `staleness compare` (one `simulate` per
seed) train bitwise alike on CPU: both evaluate `NUM_EVALS` times, at a fixed learning rate
(`--lr`, so compare does not tune it), with the task's default optimizer, batch size and
partition. The widgets live in the notebook; everything here is plain functions of values,
so the tests can check it without a kernel.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import shlex

from staleness import cluster as _cluster
from staleness import lr as _lr
from staleness import policies as _policies

__all__ = [
    "Settings", "POLICY_KINDS", "TASKS", "LR_RULES", "NUM_EVALS", "TIMELINE_SECONDS",
    "policy_spec", "cluster_spec", "run", "figure", "table",
]

# The policy menu comes from the policy registry (`policy_kinds`): each kind's parameters are
# set from the explorer's s / r_max / n controls (CONTROLS), the others keep their defaults.
CONTROLS = {"staleness": "s", "s_low": "s", "r_max": "r_max", "n": "n"}
# Built-in tasks small enough to re-run on every change of a control (seconds on a laptop CPU).
TASKS = ("digits-mlp", "mnist1d-mlp", "linreg", "quadratic")
LR_RULES = ("constant", "per_gradient", "per_update", "delay_adaptive")   # delay_adaptive: N = the workers
NUM_EVALS = 40            # evaluations per run: `staleness.results.compare.compare`'s default (a test keeps them equal)
TIMELINE_SECONDS = 40.0   # simulated seconds shown in each worker timeline
STRAGGLER_SLOWDOWN = 4.0  # a straggling iteration takes this many times longer ...
STRAGGLER_SECONDS = 10.0  # ... for this many simulated seconds (the cluster's `stragglers` modifier)


def policy_kinds() -> tuple[str, ...]:
    """The explorer's policy menu: every registered policy (built-ins first) that trains with
    gradients (`work.numerics == "gradient"`) and builds from its defaults, plus a
    "NAME (no FLAG)" entry for each boolean parameter that is on by default (e.g. "dssp (no cap)")."""
    out = []
    for name in _policies.names():
        try:
            ok = _policies.parse(name).work.numerics == "gradient"
        except (ValueError, TypeError):
            ok = False
        if ok:
            out.append(name)
            out += [f"{name} (no {k})" for k, p in inspect.signature(_policies.factory(name)).parameters.items()
                    if p.default is True]
    return tuple(out)


def __getattr__(name: str):
    if name == "POLICY_KINDS":   # the menu as it is now (a module registered later adds its policies)
        return policy_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def policy_spec(kind: str, s: int = 3, r_max: int = 12, n: int = 4, num_workers: int = 8) -> str:
    """The policy spec (`staleness.policies.parse` grammar) of one of `policy_kinds()` with
    the explorer's parameters (CONTROLS): s is SSP's bound and DSSP's s_low (clocks), r_max
    DSSP's range (clocks), n softsync's n (clamped to `num_workers`); a parameter without a
    control keeps its default. Returns e.g. 'dssp:3:12'."""
    kinds = policy_kinds()
    if kind not in kinds:
        raise ValueError(f"policy_spec: kind = {kind!r} must be one of {kinds}")
    name, _, flag = kind.partition(" (no ")
    values = {"s": s, "r_max": r_max, "n": min(n, num_workers)}
    factory = _policies.factory(name)
    params = inspect.signature(factory).parameters
    kwargs = {k: values[c] for k, c in CONTROLS.items() if k in params}
    if flag:
        kwargs[flag.rstrip(")")] = False
    return factory(**kwargs).describe()


def cluster_spec(fast: int, slow_seconds: float, jitter: float = 0.0, straggler_rate: float = 0.0,
                 num_workers: int = 8) -> str:
    """The cluster spec (`staleness.cluster.parse` grammar) of `num_workers` workers:
    `fast` of them at 1 s per iteration, the others at `slow_seconds`, lognormal
    `jitter` σ on every iteration (0: none) and, with probability `straggler_rate` per
    iteration, a straggler episode of STRAGGLER_SECONDS at STRAGGLER_SLOWDOWN x.
    Returns e.g. '1*4,2.6*4+jitter=0.1+stragglers=0.02:4:10'."""
    if isinstance(fast, bool) or not isinstance(fast, int) or not 0 <= fast <= num_workers:
        raise ValueError(f"cluster_spec: fast = {fast!r} must be an integer in [0, {num_workers}]")
    c = _cluster.heterogeneous([1.0] * fast + [float(slow_seconds)] * (num_workers - fast))
    if jitter > 0:
        c = c.jitter(float(jitter))
    if straggler_rate > 0:
        c = c.stragglers(prob=float(straggler_rate), slowdown=STRAGGLER_SLOWDOWN, duration=STRAGGLER_SECONDS)
    return c.describe()


@dataclasses.dataclass(frozen=True)
class Settings:
    """One setting of the explorer's controls, in the command line's own terms. Specs are
    checked and written in their canonical form (`describe()`), so equal settings compare equal."""

    task: str = "digits-mlp"                             # a task name (`staleness.tasks.names()`)
    policies: tuple[str, ...] = ("dssp:3:12", "bsp")     # one or two specs, drawn overlaid (a repeat once)
    cluster: str = "1*4,2.6*4+jitter=0.1+stragglers=0.02:4:10"
    seeds: tuple[int, ...] = (0, 1, 2)                   # the runs of each policy (bands over them)
    lr: float = 0.05                                     # the fixed learning rate
    lr_rule: str = "constant"                            # 'delay_adaptive' alone takes N = the cluster's workers
    max_time: float = 80.0                               # simulated seconds per run

    def __post_init__(self):
        if not isinstance(self.task, str) or not self.task:
            raise ValueError(f"Settings: task = {self.task!r} must be a task name, e.g. 'digits-mlp'")
        c = _cluster.parse(self.cluster)
        specs = tuple(dict.fromkeys(_policies.parse(p).describe() for p in self.policies))
        if not specs:
            raise ValueError("Settings: policies is empty; give one or two policy specs")
        for p in specs:
            _policies.parse(p).init(c.num_workers)   # e.g. softsync:n with n > workers fails here
        seeds = tuple(self.seeds)
        if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
            raise ValueError(f"Settings: seeds = {self.seeds!r} must be a non-empty list of integers >= 0")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"Settings: seeds = {self.seeds!r} repeats a seed")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not (
                math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Settings: lr = {self.lr!r} must be a finite learning rate > 0")
        rule = self.lr_rule
        if rule == "delay_adaptive":
            rule = f"delay_adaptive:{c.num_workers}"
        rule = _lr.get(rule).describe()
        if isinstance(self.max_time, bool) or not isinstance(self.max_time, (int, float)) or not (
                math.isfinite(self.max_time) and self.max_time > 0):
            raise ValueError(f"Settings: max_time = {self.max_time!r} must be a finite number of seconds > 0")
        canonical = {"cluster": c.describe(), "policies": specs, "seeds": seeds, "lr": float(self.lr),
                     "lr_rule": rule, "max_time": float(self.max_time)}
        for name, value in canonical.items():   # frozen: write the canonical forms once, here
            object.__setattr__(self, name, value)

    def argv(self) -> list[str]:
        """The arguments of `staleness` (after the program name) that run these settings."""
        argv = ["compare", "--task", self.task]
        for p in self.policies:
            argv += ["--policy", p]
        return argv + ["--cluster", self.cluster, "--max-time", _num(self.max_time),
                       "--seeds", ",".join(map(str, self.seeds)), "--lr", _num(self.lr), "--lr-rule", self.lr_rule]

    def cli(self) -> str:
        """The shell command line (quoted for a POSIX shell) that reproduces these settings."""
        return shlex.join(["staleness", *self.argv()])


def _num(x: float) -> str:
    """Shortest text that reads back as exactly `x`."""
    return repr(float(x)) if x != int(x) else str(int(x))


def run(settings: Settings, cache: dict | None = None) -> list:
    """Train every policy × seed of `settings`: one `st.sweep` (one compiled call over the
    seeds) per policy. `cache` (a dict the caller keeps) holds built tasks and finished
    sweeps, so a change of one control re-runs only what it changes.
    Returns the Results, policy major, seed minor."""
    import staleness as st

    cache = {} if cache is None else cache
    c = _cluster.parse(settings.cluster)
    tkey = ("task", settings.task, c.num_workers)
    if tkey not in cache:
        cache[tkey] = st.tasks.get(settings.task, num_workers=c.num_workers)
    task = cache[tkey]
    out = []
    for p in settings.policies:
        key = ("sweep", settings.task, p, settings.cluster, settings.seeds, settings.lr, settings.lr_rule,
               settings.max_time)
        if key not in cache:
            cache[key] = st.sweep(task, [p], c, seeds=list(settings.seeds), lr_rules=[settings.lr_rule],
                                  lrs=[settings.lr], max_time=settings.max_time, num_evals=NUM_EVALS)
        out.extend(cache[key])
    return out


def _metrics(results) -> tuple[str, str]:
    """(first, second) metrics to draw: the task's default (accuracy where it has one), then
    the held-out loss, or the training loss when the first is the loss."""
    first = "accuracy" if all("accuracy" in r.history for r in results) else "loss"
    second = "loss" if first != "loss" else "train_loss"
    return first, second


def figure(settings: Settings, results, *, timeline_seconds: float = TIMELINE_SECONDS):
    """The explorer's figure of `run(settings)`'s results: on the left the first metric and
    the loss over simulated time (median over seeds with a min-max band, one colour per
    policy); on the right the staleness histogram (seeds pooled) and each policy's worker
    timeline (its first seed, the first `timeline_seconds` s). A bare matplotlib Figure
    (not pyplot's, so a notebook shows it only where it is displayed)."""
    from matplotlib.figure import Figure

    from staleness.results import plots

    if not results:
        raise ValueError("figure: results is empty; pass run(settings)'s results")
    by = {p: [r for r in results if r.config["policy"] == p] for p in settings.policies}
    first, second = _metrics(results)
    fig = Figure(figsize=(13.0, 8.0), layout="constrained")
    outer = fig.add_gridspec(1, 2, width_ratios=[1.0, 1.15])
    left = outer[0].subgridspec(2, 1)
    right = outer[1].subgridspec(1 + len(by), 1, height_ratios=[1.3] + [1.0] * len(by))
    label = lambda r: r.config["policy"]   # noqa: E731 (seeds of a policy share its label: one band)
    for row, metric in enumerate((first, second)):
        ax = fig.add_subplot(left[row])
        plots.metric_vs_time(results, metric, ax=ax, label_fn=label)
        if "loss" in metric and all((r.history[metric].dropna() > 0).all() for r in results):
            ax.set_yscale("log")   # losses span decades (and a diverging run would flatten the rest)
    ax = fig.add_subplot(right[0])
    plots.staleness_histogram(results, ax=ax, label_fn=label)
    ax.set_title("staleness of applied gradients (seeds pooled)", fontsize="medium", loc="left")
    for k, (p, runs) in enumerate(by.items()):
        ax = fig.add_subplot(right[1 + k])
        plots.worker_timeline(runs[0], ax=ax, max_time=min(timeline_seconds, settings.max_time))
        ax.set_title(f"{p}, seed {runs[0].config['seed']}", fontsize="medium", loc="left")
    fig.suptitle(f"{settings.task} on {settings.cluster}: lr {settings.lr:g}, lr rule {settings.lr_rule}, "
                 f"seeds {','.join(map(str, settings.seeds))}, {settings.max_time:g} simulated s")
    return fig


def table(settings: Settings, results):
    """`staleness.results.compare`'s table of the results (pandas, one row per policy), trimmed
    to the columns the explorer shows: the final metric's median over seeds with its interval,
    updates, staleness and waiting."""
    from staleness.results.compare import Comparison

    first, _ = _metrics(results)
    planned = [(p, s) for p in settings.policies for s in settings.seeds]
    t = Comparison(list(results), first, None, planned).table()
    keep = ["policy", "seeds", "lr", f"final_{first}", "final_ci_low", "final_ci_high", "interval", "updates",
            "staleness_mean", "staleness_max", "wait_fraction_mean", "diverged"]
    return t[[k for k in keep if k in t.columns]].set_index("policy")


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
