"""Server checkpoints of a real run, in the one checkpoint format (`staleness.checkpoint`).

A checkpoint directory holds `server.json` (the run's identity, the policy's
`SyncState`, the trace so far, the evaluated history, membership epochs and
the elapsed time, as JSON) and its `.npz` of arrays (parameters and optimizer
state leaves, stored exactly), written atomically by `staleness.checkpoint`
(a crash while writing leaves the previous checkpoint intact).

On resume the server restarts from the checkpointed version: gradients that
were in flight are gone (their workers start the same iteration again, on the
checkpoint's parameters), blocked workers stay blocked, and times continue
from the checkpoint's elapsed time, so the resumed trace is one trace.

The policy's state is plain Python objects of `staleness.policies` (slots,
lists, insertion-ordered dicts with int keys); `_encode` writes them as tagged
JSON and `_decode` rebuilds them, accepting classes of `staleness` modules
only (unlike a pickle, reading a checkpoint runs no code).
"""

from __future__ import annotations

import importlib

import numpy as np

from staleness import checkpoint as _one

__all__ = ["save", "load", "restore", "MATCH_KEYS", "NAME"]

NAME = "server"
# config entries a resume must agree with (the run's identity)
MATCH_KEYS = ("task", "batch_size", "policy", "workers", "seed", "lr", "lr_rule", "optimizer", "sync")


def _encode(x):
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, list):
        return [_encode(v) for v in x]
    if isinstance(x, tuple):
        return {"__tuple__": [_encode(v) for v in x]}
    if isinstance(x, dict):   # keys may be ints; order matters (insertion-ordered buckets)
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in x.items()]}
    cls = type(x)
    if not cls.__module__.startswith("staleness."):
        raise TypeError(f"checkpoint: cannot store a {cls.__module__}.{cls.__qualname__} in the policy state")
    slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
    fields = {s: getattr(x, s) for s in slots if hasattr(x, s)}
    fields.update(getattr(x, "__dict__", {}))
    return {"__object__": f"{cls.__module__}:{cls.__qualname__}", "fields": {k: _encode(v) for k, v in fields.items()}}


def _decode(x):
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "__tuple__" in x:
        return tuple(_decode(v) for v in x["__tuple__"])
    if "__dict__" in x:
        return {_decode(k): _decode(v) for k, v in x["__dict__"]}
    if "__object__" in x:
        module, name = x["__object__"].split(":")
        if not module.startswith("staleness."):
            raise ValueError(f"checkpoint: refusing to build {x['__object__']!r} (not a staleness class)")
        cls = importlib.import_module(module)
        for part in name.split("."):
            cls = getattr(cls, part)
        obj = object.__new__(cls)
        for k, v in x["fields"].items():
            object.__setattr__(obj, k, _decode(v))
        return obj
    return {k: _decode(v) for k, v in x.items()}


def save(path, server, config: dict, evaluate) -> None:
    """Checkpoint `server` (a `runtime.serve.Server`) into directory `path`."""
    from staleness.runtime.result import evaluate_snapshots

    if server.pending_rows():  # cannot happen right after an update; guard the invariant anyway
        raise RuntimeError("checkpoint: gradients are buffered; checkpoints are taken right after an update")
    evaluate_snapshots(server, evaluate, server.rec.update_losses())
    meta = {
        "sync_state": _encode(server.state),
        "recorder": _encode(server.rec.state()),
        "rows": _encode(list(server.rows)),
        "epoch": list(server.epoch),
        "lost_for_real": sorted(server.lost_for_real),
        "elapsed": server.now(),
        "checked": server._checked,
    }
    _one.save(path, (server.params, server.opt_state), meta, match={k: config.get(k) for k in MATCH_KEYS},
              name=NAME)


def load(path, config: dict) -> dict:
    """Read the checkpoint in `path`; checks it belongs to a run with `config`
    (`staleness.checkpoint.CheckpointMismatch`, a ValueError, names what differs).

    Returns a dict: leaves (NumPy arrays of params then optimizer state),
    sync_state, recorder, rows, epoch, lost_for_real, elapsed, checked.
    """
    meta, leaves = _one.load(path, None, match={k: config.get(k) for k in MATCH_KEYS}, name=NAME)
    meta = dict(meta, sync_state=_decode(meta["sync_state"]), recorder=_decode(meta["recorder"]),
                rows=_decode(meta["rows"]))
    meta["leaves"] = leaves
    return meta


def restore(server, meta: dict, put) -> object:
    """Put a loaded checkpoint into `server` (its arrays placed with `put(tree)`);
    returns the SyncState to `start` from."""
    import jax

    from staleness.driver import Recorder

    done = len(meta["recorder"]["update_time"])
    if done > server.num_updates:
        raise ValueError(f"resume: the checkpoint holds {done} updates, more than num_updates = "
                         f"{server.num_updates} (--updates); give num_updates >= {done} to continue it")
    template = (server.params, server.opt_state)
    params, opt_state = put(_one.restore_tree(jax.device_get(template), meta["leaves"]))
    server.params, server.opt_state = params, opt_state
    server.rec = Recorder.from_state(meta["recorder"])
    server.rows = list(meta["rows"])
    server.snapshots = []
    server.epoch = list(meta["epoch"])
    server.lost_for_real = set(meta["lost_for_real"])
    server.t_offset = float(meta["elapsed"])
    server._checked = int(meta["checked"])
    return meta["sync_state"]
