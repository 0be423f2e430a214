"""Shared helpers of the reproduction scripts (run as `python benchmarks/<script>.py`,
so this directory is on sys.path)."""

import os
import platform

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
