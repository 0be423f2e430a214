"""Shared helpers of the benchmark and reproduction scripts (run as
`python benchmarks/<script>.py`, so this directory is on sys.path).

Agreement of two paths (`Agreement`, `difference`, `finish`): the project rule is that a
benchmark script comparing two paths (sweep vs simulate, sharded vs one device, replay vs
real run, ours vs a reference loop, ...) fails, with a non-zero exit status, when they
disagree beyond the documented tolerance: printing a difference is not checking it. A
script measures each comparison as an `Agreement` and ends with `finish(summary, checks)`,
which prints the final JSON line (with "agree" and "agreement" fields, so what was measured
is kept), then one line on stderr per comparison beyond its tolerance, and exits with
status 1 if there is one."""

import dataclasses
import json
import math
import os
import platform
import sys

import numpy as np


def versions() -> dict:
    """Versions and machine facts recorded in every results file."""
    import flax
    import jax
    import optax

    import staleness as st

    return {"python": platform.python_version(), "platform": platform.platform(), "jax": jax.__version__,
            "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else "", "flax": flax.__version__,
            "optax": optax.__version__, "numpy": np.__version__, "staleness": st.__version__,
            "backend": jax.default_backend(), "cpus": os.cpu_count()}


# -- learning-rate tuning, verdict bookkeeping (added for the tuned re-runs) ---------------
def tune(task, policy, cluster, *, base_lr: float, factors=None, seeds=None, extend: int = 1, **kw) -> dict:
    """Choose `policy`'s learning rate with `staleness.results.compare.tune_lr` (one `st.sweep`
    over grid × seeds on the task's validation split) on the grid base_lr × factors
    (default `compare.GRID_FACTORS`), extended by one step at a time, up to `extend`
    times, while the choice is at an edge. kw: tune_lr's remaining arguments
    (metric, max_time, num_updates, lr_rule, optimizer, inner_optimizer, num_evals).
    Returns tune_lr's record plus 'runs' (tuning runs spent) and 'policy'."""
    import staleness as st
    from staleness.results import compare

    pol = st.policies.parse(policy) if isinstance(policy, str) else policy
    seeds = list(compare.TUNE_SEEDS if seeds is None else seeds)
    grid = [base_lr * f for f in (compare.GRID_FACTORS if factors is None else factors)]
    runs = 0
    for _ in range(extend + 2):   # every value diverged: look a step below the grid
        try:
            t = compare.tune_lr(task, pol, cluster, grid=grid, seeds=seeds, **kw)
            runs += len(grid) * len(seeds)
            break
        except ValueError as e:
            if "diverged" not in str(e):
                raise
            runs += len(grid) * len(seeds)
            grid = [grid[0] * grid[0] / grid[1]] + grid
    else:
        raise ValueError(f"tune: {pol.describe()}: every learning rate down to {grid[0]:.3g} diverged on the "
                         "validation split; give a smaller base_lr")
    for _ in range(extend):
        if not t["edge"]:
            break
        step = grid[1] / grid[0]
        grid = [grid[0] / step] + grid if t["lr"] == grid[0] else grid + [grid[-1] * step]
        t = compare.tune_lr(task, pol, cluster, grid=grid, seeds=seeds, **kw)
        runs += len(grid) * len(seeds)
    return {**t, "runs": runs, "policy": pol.describe(), "seeds": seeds}


def lr_text(t: dict) -> str:
    """A chosen learning rate for a table: '0.316', '0.01 (grid edge)'."""
    return f"{t['lr']:.3g}" + (" (grid edge)" if t["edge"] else "")


def previous_verdicts(md_path) -> dict:
    """{claim: verdict} from the summary table of a results file written earlier
    (rows '| claim | verdict |' after a '| claim ' header), {} if there is none."""
    from pathlib import Path

    p = Path(md_path)
    if not p.is_file():
        return {}
    out, inside = {}, False
    for line in p.read_text().splitlines():
        if line.startswith("| claim "):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            cols = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cols) >= 2 and not set(cols[0]) <= {"-"}:
                out[cols[0]] = cols[1]
    return out


# -- agreement of two paths --------------------------------------------------------------------
BITWISE = 0.0   # the tolerance of paths documented to be bitwise equal


@dataclasses.dataclass(frozen=True)
class Agreement:
    """One comparison of two paths: `measured` (how far apart they are, as `what` says)
    against `tolerance` (the largest accepted value; 0 with `difference`: bitwise).
    `why` says where the tolerance comes from; `detail`, where the worst case is."""

    first: str
    second: str
    measured: float
    tolerance: float
    what: str = "max |difference|"
    why: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.measured <= self.tolerance)   # NaN: not ok

    def line(self) -> str:
        """The one line that names the two paths, the measured difference and the tolerance."""
        return (f"{self.first} vs {self.second} disagree: {self.what} {self.measured:.3g} > tolerance "
                f"{self.tolerance:g}" + (f" ({self.why})" if self.why else "")
                + (f"; {self.detail}" if self.detail else ""))

    def record(self) -> dict:
        return {"first": self.first, "second": self.second, "what": self.what, "measured": self.measured,
                "tolerance": self.tolerance, "agree": self.ok, **({"detail": self.detail} if self.detail else {})}


def difference(a, b) -> float:
    """max |a - b| (in float64) over the leaves of two pytrees, or two arrays, of numbers.

    0.0 exactly when they are bitwise equal (same structure, shapes, dtypes and bytes), so
    that a tolerance of 0 checks bitwise equality: leaves equal in value but not in bits
    (-0.0 and 0.0, NaN payloads) count as the smallest positive float64; inf where the
    structures, shapes or dtypes differ or a NaN (an infinity) stands against a number."""
    import jax

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb) or jax.tree.structure(a) != jax.tree.structure(b):
        return math.inf
    worst = 0.0
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            return math.inf
        if x.tobytes() == y.tobytes():
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        same = (x64 == y64) | (np.isnan(x64) & np.isnan(y64))
        with np.errstate(invalid="ignore"):
            d = np.where(same, 0.0, np.abs(x64 - y64))
        d = np.where(np.isnan(d), math.inf, d)
        worst = max(worst, float(d.max()) if d.size else 0.0, np.finfo(np.float64).tiny)
    return worst


def finish(summary: dict, checks) -> None:
    """Print `summary` as the final JSON line, with "agree" (every check within its
    tolerance) and "agreement" (each check's record); then, if a check is beyond its
    tolerance, one line per such check on stderr (the two paths, the measured difference,
    the tolerance) and exit with status 1."""
    checks = list(checks)
    agree = all(c.ok for c in checks)
    print(json.dumps({**summary, "agree": agree, "agreement": [c.record() for c in checks]}), flush=True)
    if not agree:
        name = os.path.basename(sys.argv[0]) or "benchmark"
        for c in checks:
            if not c.ok:
                print(f"{name}: FAILED: {c.line()}", file=sys.stderr, flush=True)
        sys.exit(1)
