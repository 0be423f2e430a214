"""The one checkpoint format: a JSON file of metadata beside an .npz file of arrays.

    checkpoint.save(path, tree, {"next_chunk": 3, "rows": rows}, match={"seed": 0, "lr": 0.1})
    meta, tree = checkpoint.load(path, template, match={"seed": 0, "lr": 0.1})

A checkpoint directory holds `NAME.json` (format version, the run's identity
`match`, the caller's JSON metadata, and the name of the arrays file) and
`NAME-<token>.npz` (the pytree's leaves). The arrays are written first under a
fresh token, then the JSON that names them is renamed into place, then the
previous arrays file is removed: a crash at any point leaves the previous
checkpoint or the new one. Arrays and floats (JSON's shortest round-trip repr)
are stored exactly, so a resume continues bitwise.

Why not orbax (installed, and also exact): small pytrees plus plain metadata once per evaluation chunk need
no background threads, tensorstore layout or extra dependency, and `load` checks the run's identity before
any array is read.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jax
import numpy as np

from staleness.infra import files

__all__ = ["FORMAT_VERSION", "save", "load", "exists", "restore_tree", "CheckpointMismatch"]

FORMAT_VERSION = 2   # 1: the engine's state.json + carry.npz and the runtime's server.pkl + server.npz


class CheckpointMismatch(ValueError):
    """A checkpoint written by another run (its identity differs), or for another state layout."""


def exists(path, name: str = "state") -> bool:
    """Whether directory `path` holds checkpoint `name`."""
    return (Path(path) / f"{name}.json").is_file()


def save(path, tree, meta: dict, *, match: dict | None = None, name: str = "state") -> Path:
    """Write checkpoint `name` of `tree` (any pytree of arrays) into directory `path`.

    Args:
      tree: the state; its leaves are fetched to the host and stored as they are.
      meta: JSON-serializable metadata (history rows, counters); NaN allowed.
      match: the run's identity (JSON-serializable): `load` refuses a checkpoint whose
        `match` differs from the caller's.
      name: file stem, so one directory can hold several checkpoints.
    Returns the JSON file's path.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.device_get(jax.tree.leaves(tree))]
    old = _arrays_name(path, name)
    arrays = f"{name}-{uuid.uuid4().hex[:12]}.npz"
    files.write_with(path / arrays, lambda tmp: _savez(tmp, leaves))
    doc = {"format_version": FORMAT_VERSION, "arrays": arrays, "num_leaves": len(leaves),
           "match": match or {}, "meta": meta}
    try:
        text = json.dumps(doc)
    except TypeError as e:
        (path / arrays).unlink(missing_ok=True)
        raise TypeError(f"checkpoint {name!r}: metadata must be JSON-serializable ({e})") from None
    out = files.write_text(path / f"{name}.json", text)
    if old is not None and old != arrays:
        (path / old).unlink(missing_ok=True)
    return out


def _savez(tmp: Path, leaves) -> None:
    with open(tmp, "wb") as fh:   # a file object: np.savez would append '.npz' to a bare name
        np.savez(fh, *leaves)


def _arrays_name(path: Path, name: str) -> str | None:
    try:
        return json.loads((path / f"{name}.json").read_text()).get("arrays")
    except (OSError, ValueError, AttributeError):
        return None


def load(path, template=None, *, match: dict | None = None, name: str = "state"):
    """Read checkpoint `name` from directory `path`.

    Args:
      template: a pytree with the layout of the saved one (e.g. the freshly
        initialized state): the leaves are put back into its structure, each on
        the template leaf's sharding (so a state laid out over devices comes back
        the same way). None returns the leaves as a list of NumPy arrays.
      match: the caller's identity; must equal the one saved (else CheckpointMismatch
        naming the entries that differ).
    Returns (meta, tree or leaves). Raises FileNotFoundError if there is no
    checkpoint, ValueError for another format version or a damaged file.
    """
    path = Path(path)
    doc_file = path / f"{name}.json"
    if not doc_file.is_file():
        raise FileNotFoundError(f"checkpoint = {str(path)!r}: no {name}.json there to resume from")
    try:
        doc = json.loads(doc_file.read_text())
    except ValueError as e:
        raise ValueError(f"checkpoint = {str(path)!r}: {name}.json is damaged ({e})") from None
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if version != FORMAT_VERSION:
        raise ValueError(f"checkpoint = {str(path)!r}: format_version {version!r} is not supported (this build "
                         f"reads {FORMAT_VERSION}); start the run again without resuming")
    want = json.loads(json.dumps(match or {}))   # compare as JSON sees it (tuples as lists)
    if doc["match"] != want:
        keys = sorted(set(doc["match"]) | set(want))
        diff = {k: (doc["match"].get(k), want.get(k)) for k in keys if doc["match"].get(k) != want.get(k)}
        raise CheckpointMismatch(f"checkpoint = {str(path)!r} was written by another run, written with "
                                 f"(checkpoint, now) = {diff}; resume with the same settings or choose another "
                                 "directory")
    arrays = path / doc["arrays"]
    try:
        with np.load(arrays) as z:
            leaves = [z[f"arr_{i}"] for i in range(int(doc["num_leaves"]))]
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"checkpoint = {str(path)!r}: {doc['arrays']} is missing or damaged ({e})") from None
    if template is None:
        return doc["meta"], leaves
    return doc["meta"], restore_tree(template, leaves, where=str(path))


def restore_tree(template, leaves, *, where: str = "checkpoint"):
    """`leaves` (NumPy) put into `template`'s structure, each with the template leaf's
    shape and dtype checked and placed on its sharding (jax arrays) or kept NumPy."""
    t_leaves, treedef = jax.tree.flatten(template)
    if len(t_leaves) != len(leaves):
        raise CheckpointMismatch(f"{where}: the checkpoint holds {len(leaves)} arrays, this run's state has "
                                 f"{len(t_leaves)}; it was written for another model or method")
    out = []
    for i, (t, x) in enumerate(zip(t_leaves, leaves)):
        shape, dtype = np.shape(t), np.asarray(x).dtype
        want_dtype = t.dtype if hasattr(t, "dtype") else np.asarray(t).dtype
        if tuple(np.shape(x)) != tuple(shape) or dtype != want_dtype:
            raise CheckpointMismatch(f"{where}: array {i} is {dtype}{list(np.shape(x))}, this run's state has "
                                     f"{want_dtype}{list(shape)}; it was written for another model or layout")
        out.append(jax.device_put(x, t.sharding) if isinstance(t, jax.Array) else x)
    return jax.tree.unflatten(treedef, out)


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
