"""The last step of a run: the serve loop's records -> the simulator's `Result`.

History rows are evaluated after serving, from the parameter snapshots the loop
kept (so evaluation never stalls the server; time = wall seconds since the
start); the schedule's meta also records `sync`, `server_busy_s` (the serve
loop's busy time) and `rounds_ahead` (`collective.RunAhead`).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np

from staleness.engine.result import Result

__all__ = ["evaluate_snapshots", "build_result"]


def evaluate_snapshots(server, evaluate: Callable | None, train_loss: np.ndarray, final: bool = False) -> list[dict]:
    """Evaluate `server`'s kept snapshots into its history rows (update, time,
    train_loss, metrics); with final=True also the current version if it has no
    row yet; evaluate=None: rows without metrics (the devices cannot compute: a
    collective step hung on them). Returns the rows (the snapshots are consumed)."""
    rows, rec = server.rows, server.rec
    last = rows[-1]["update"] if rows else None
    u_now = rec.num_updates
    if final and (not server.snapshots or server.snapshots[-1][0] != u_now) and last != u_now:
        server.snapshots.append((u_now, server.params))
    for u, params in server.snapshots:
        if rows and u <= rows[-1]["update"]:
            continue
        prev = rows[-1]["update"] if rows else 0
        metrics = jax.device_get(evaluate(params)) if evaluate is not None else {}
        seg = train_loss[prev:u]
        row = {"update": int(u), "time": float(rec.update_time[u - 1]) if u > 0 else 0.0,
               "train_loss": float(np.mean(seg)) if len(seg) else math.nan}
        row.update({k: float(v) for k, v in metrics.items()})
        rows.append(row)
    server.snapshots = []
    return rows


def build_result(server, spec, config: dict, status: str, evaluate: Callable | None) -> Result:
    """The Result of a (possibly interrupted) run from the serve loop's records
    (evaluate=None: history rows without metrics, see `evaluate_snapshots`)."""
    import pandas as pd

    end_time = server.end_time if server.end_time is not None else (server.now() if server.t0 is not None else 0.0)
    train_loss = server.rec.update_losses()
    rows = evaluate_snapshots(server, evaluate, train_loss, final=True)
    state = server.state
    sched = server.rec.to_schedule(
        num_workers=spec.num_workers, policy=spec.policy,
        cluster=spec.cluster.describe() if spec.cluster else "", seed=spec.seed,
        rstar=state.rstar if state is not None else (), end_time=end_time, pending=server.pending_rows(),
        meta={"max_gap": state.max_gap if state is not None else 0, "recorded": "runtime", "sync": spec.sync,
              "server_busy_s": float(server.busy), "rounds_ahead": int(server.link.rounds_ahead),
              "time_scale": spec.time_scale if spec.cluster else None,
              **({"local_steps": list(spec.local_steps)} if spec.local_steps is not None else {})})
    return Result(pd.DataFrame(rows), sched, jax.device_get(server.params), config, train_loss, status)
