"""Server checkpoints of a real run, in the one checkpoint format (`staleness.infra.checkpoint`).

    checkpoint.save(path, server.saved_state(), config)
    saved = checkpoint.load(path, config, num_updates)      # identity checked, nothing placed
    server.restore(checkpoint.restore(saved, (params, opt_state), put))

`server.json` holds the run's identity and the serve loop's `ServerState` as plain
JSON, its `.npz` the parameters and optimizer state, written atomically. No
object is stored: the policy's state is rebuilt by making its recorded calls
again (`serve.PolicyCalls`), so reading a checkpoint runs no code, and a user's
policy resumes too (what a resume restarts: `serve.Server.start`).
"""

from __future__ import annotations

import numpy as np

from staleness.infra import checkpoint as _one
from staleness.driver import Recorder
from staleness.runtime.serve import ServerState

__all__ = ["save", "load", "restore", "MATCH_KEYS", "NAME"]

NAME = "server"
# config entries a resume must agree with (the run's identity)
MATCH_KEYS = ("task", "batch_size", "policy", "workers", "seed", "lr", "lr_rule", "optimizer", "sync")


def _plain(x):
    """`x` (numbers, strings, lists, tuples, str-keyed dicts) as JSON values."""
    for kinds, plain in (((bool, np.bool_), bool), ((int, np.integer), int), ((float, np.floating), float)):
        if isinstance(x, kinds):
            return plain(x)
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if x is None or isinstance(x, str):
        return x
    raise TypeError(f"checkpoint: cannot store a {type(x).__name__} ({x!r})")


def save(path, state: ServerState, config: dict) -> None:
    """Write `state` (`Server.saved_state()`) of a run with `config` into directory `path`."""
    meta = {
        "policy": {"start": state.policy_start, "calls": _plain(state.policy_calls)},
        "recorder": _plain(state.recorder.state()),
        "rows": _plain(state.rows),
        "epoch": _plain(state.epoch),
        "lost_for_real": _plain(state.lost_for_real),
        "elapsed": float(state.elapsed),
        "checked": int(state.checked),
        "inner": [[int(w), int(state.inner[w][0])] for w in sorted(state.inner)],
    }
    inner = tuple(state.inner[w][1] for w in sorted(state.inner))   # after the server's arrays
    _one.save(path, (state.params, state.opt_state, inner), meta, match={k: config.get(k) for k in MATCH_KEYS},
              name=NAME)


def load(path, config: dict, num_updates: int) -> dict:
    """Read the checkpoint in `path`; checks it belongs to a run with `config`
    (`staleness.infra.checkpoint.CheckpointMismatch`, a ValueError, names what differs) and
    that it holds no more than `num_updates` updates. Nothing is placed on a device.

    Returns a dict: leaves (NumPy arrays of params then optimizer state), policy
    ({start, calls}), recorder, rows, epoch, lost_for_real, elapsed, checked.
    """
    meta, leaves = _one.load(path, None, match={k: config.get(k) for k in MATCH_KEYS}, name=NAME)
    if "policy" not in meta:
        raise ValueError(f"checkpoint = {str(path)!r} was written by an earlier version of staleness (its policy "
                         "state stored as objects); start the run again without resuming")
    done = len(meta["recorder"]["update_time"])
    if done > num_updates:
        raise ValueError(f"resume: the checkpoint holds {done} updates, more than num_updates = "
                         f"{num_updates} (--updates); give num_updates >= {done} to continue it")
    return dict(meta, leaves=leaves)


def restore(saved: dict, template, put, inner=None) -> ServerState:
    """The `ServerState` of a loaded checkpoint: its arrays in the structure of
    `template` ((params, opt_state)), placed with `put(tree)`; `inner`: one worker's inner
    state (`Numerics.inner_template`) when the run's method keeps one, its workers' states
    read back in that structure (NumPy, for `Numerics.restore_inner` to place)."""
    import jax

    n = len(jax.tree.leaves(template))
    workers = [(int(w), int(it)) for w, it in saved.get("inner", [])]
    if workers and inner is None:
        raise ValueError("resume: the checkpoint holds workers' inner states, this run's method keeps none")
    states = _one.restore_tree(tuple([jax.device_get(inner)] * len(workers)), saved["leaves"][n:])
    params, opt_state = put(_one.restore_tree(jax.device_get(template), saved["leaves"][:n]))
    policy = saved["policy"]
    return ServerState(params=params, opt_state=opt_state, policy_start=float(policy["start"]),
                       policy_calls=[_call(c) for c in policy["calls"]],
                       recorder=Recorder.from_state(saved["recorder"]), rows=list(saved["rows"]),
                       epoch=[int(e) for e in saved["epoch"]], lost_for_real=[int(w) for w in saved["lost_for_real"]],
                       elapsed=float(saved["elapsed"]), checked=int(saved["checked"]),
                       inner={w: (it, st) for (w, it), st in zip(workers, states)})


def _call(c: list) -> tuple:
    """A policy call read back: ('push', worker, pull_version, now), ('fail' | 'join', worker, now)
    or ('merge', now)."""
    if c[0] == "merge":
        return "merge", float(c[1])
    kind, worker, *rest = c
    if kind == "push":
        return kind, int(worker), int(rest[0]), float(rest[1])
    return kind, int(worker), float(rest[0])
