"""Server checkpoints of a real run: write every k updates, resume from the last.

A checkpoint directory holds `server.npz` (parameters and optimizer state
leaves) and `server.pkl` (the policy's `SyncState`, the trace so far, the
evaluated history, membership epochs and the elapsed time). Both are written
to temporary names and renamed, so a crash while writing leaves the previous
checkpoint intact.

On resume the server restarts from the checkpointed version: gradients that
were in flight are gone (their workers start the same iteration again, on the
checkpoint's parameters), blocked workers stay blocked, and times continue
from the checkpoint's elapsed time, so the resumed trace is one trace.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import jax
import numpy as np

__all__ = ["save", "load", "FORMAT_VERSION", "MATCH_KEYS"]

FORMAT_VERSION = 1
# config entries a resume must agree with (the run's identity)
MATCH_KEYS = ("task", "batch_size", "policy", "workers", "seed", "lr", "lr_rule", "optimizer")


def save(path, server, config: dict, evaluate) -> None:
    """Checkpoint `server` (a `runtime.server.Server`) into directory `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if server.pending_rows():  # cannot happen right after an update; guard the invariant anyway
        raise RuntimeError("checkpoint: gradients are buffered; checkpoints are taken right after an update")
    server.evaluate_snapshots(evaluate, server.rec.update_losses())
    leaves = jax.device_get(jax.tree.leaves((server.params, server.opt_state)))
    meta = {
        "format_version": FORMAT_VERSION,
        "config": {k: config.get(k) for k in MATCH_KEYS},
        "sync_state": server.state,
        "recorder": server.rec.state(),
        "rows": list(server.rows),
        "epoch": list(server.epoch),
        "lost_for_real": sorted(server.lost_for_real),
        "elapsed": server.now(),
        "checked": server._checked,
    }
    with open(path / "server.tmp.npz", "wb") as fh:
        np.savez(fh, *leaves)
    (path / "server.tmp.pkl").write_bytes(pickle.dumps(meta))
    (path / "server.tmp.npz").replace(path / "server.npz")
    (path / "server.tmp.pkl").replace(path / "server.pkl")


def load(path, config: dict) -> dict:
    """Read the checkpoint in `path`; checks it belongs to a run with `config`.

    Returns a dict: leaves (NumPy arrays of params then optimizer state),
    sync_state, recorder, rows, epoch, lost_for_real, elapsed, checked.
    """
    path = Path(path)
    pkl, npz = path / "server.pkl", path / "server.npz"
    if not pkl.exists() or not npz.exists():
        raise FileNotFoundError(f"checkpoint = {str(path)!r}: no server checkpoint there to resume from")
    meta = pickle.loads(pkl.read_bytes())
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"checkpoint = {str(path)!r}: format_version {meta.get('format_version')!r} "
                         f"is not supported (this build reads {FORMAT_VERSION})")
    want = {k: config.get(k) for k in MATCH_KEYS}
    if meta["config"] != want:
        diff = {k: (meta["config"].get(k), want[k]) for k in MATCH_KEYS if meta["config"].get(k) != want[k]}
        raise ValueError(f"checkpoint = {str(path)!r} was written by another run: (checkpoint, now) = {diff}")
    with np.load(npz) as z:
        meta["leaves"] = [z[f"arr_{i}"] for i in range(len(z.files))]
    return meta


def restore(server, meta: dict, device) -> object:
    """Put a loaded checkpoint into `server`; returns the SyncState to `start` from."""
    from staleness.driver import Recorder

    treedef = jax.tree.structure((server.params, server.opt_state))
    params, opt_state = jax.tree.unflatten(treedef, [jax.device_put(x, device) for x in meta["leaves"]])
    server.params, server.opt_state = params, opt_state
    server.rec = Recorder.from_state(meta["recorder"])
    server.rows = list(meta["rows"])
    server.snapshots = []
    server.epoch = list(meta["epoch"])
    server.lost_for_real = set(meta["lost_for_real"])
    server.t_offset = float(meta["elapsed"])
    server._checked = int(meta["checked"])
    return meta["sync_state"]
