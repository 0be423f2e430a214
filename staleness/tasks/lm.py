"""stdlib-lm: a byte-level transformer language model on the Python standard library's source.

    task = staleness.tasks.get("stdlib-lm", batch_size=32, num_workers=8)
    batch = task.minibatch(key, worker, iteration)   # {"x": [μ, T] int32, "y": [μ, T] int32, "index": [μ]}
    task.evaluate(params)                            # {"loss": nats/byte, "bits_per_byte": loss / ln 2}

Data every machine has offline: the `.py` files of the running interpreter's standard library
(`stdlib_files`; left out: test, tests, idle_test, __pycache__, site-packages, dist-packages,
config-* and `_sysconfigdata*`), read as bytes (vocab 256), ordered by the SHA-256 of their relative
path (any prefix is a varied sample). A file is held out when that hash is 0 mod `HELDOUT_MOD`
(about 1 in 20), so the split of a file does not depend on which others exist. Training files are
concatenated, each followed by `SEPARATOR`, and cut at `corpus_bytes`; the held-out ones in full. An
example is a window of context + 1 bytes at one of the len(stream) - context offsets
(`batch["index"]`), drawn by `staleness.tasks.sampling`, so the engine's host index tables apply.
Partitions: `region_layout` ("dirichlet" needs class labels, which a byte stream has not: an error).

Reproducibility: the corpus depends on the Python version and distribution (CPython 3.11.7
here); `fingerprint(task)` records what was read. Compare Results only across equal
fingerprints. The corpus is read once per process per `corpus_bytes` (about 0.05 s for 4 MiB).

Cost on a shared 2-core CPU (default config, μ = 32): about 0.15 s per gradient; `st.simulate`
of ASP with 16 workers compiles in about 11 s. After 300 updates BSP with 4 workers reaches 2.6
held-out bits/byte, ASP with 4 workers 4.3 and with 8 workers 4.8 (unigram entropy: 4.58).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import platform
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from staleness.tasks import data as _data
from staleness.tasks import partitions as _partitions
from staleness.tasks.base import Task
from staleness.tasks.batches import Batch, PyTree
from staleness.tasks.checks import check_common
from staleness.tasks.transformer import VOCAB, Transformer

__all__ = ["Corpus", "DEFAULT_OPTIMIZER", "corpus", "fingerprint", "lm_task", "stdlib_files", "stdlib_lm"]

NAME = "stdlib-lm"
DEFAULT_OPTIMIZER = "adamw:lr=1e-3,wd=0.1"
"""The optimizer stdlib-lm trains with when a run names none. Chosen on the default config
(one worker, 200 updates of 32 windows, held-out bits/byte): 3.24 at lr=1e-3 against 3.57
at 3e-3 and 3.83 at 1e-2 (all with clip=1; b2=0.99 changed nothing). No warmup, so it
needs no run length. No gradient clipping: clip=1 gave 3.19 here, but a real run's
trace with clip_by_global_norm does not replay bitwise in the engine (any task; the
global norm rounds differently in the standalone server update than in the scan)."""
DEFAULT_CORPUS_BYTES = 4 * 2**20
HELDOUT_MOD = 20
SEPARATOR = b"\x1c"   # ASCII "file separator", after every file
PARTITIONS = ("iid", "shard", "sizes:F1,...,Fλ")

_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"})
_FINGERPRINT_FIELDS = ("train_bytes", "train_files", "heldout_bytes", "heldout_files")


# -- Corpus ------------------------------------------------------------------------------------


def _path_hash(relpath: str) -> bytes:
    return hashlib.sha256(relpath.encode("utf-8")).digest()


def _held_out(relpath: str) -> bool:
    return int.from_bytes(_path_hash(relpath)[:8], "big") % HELDOUT_MOD == 0


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


@functools.cache
def stdlib_files(root: str | None = None) -> tuple[str, ...]:
    """The corpus files: paths (POSIX, relative to `root`, default `stdlib_root()`) of the
    standard library's .py files outside test and install directories, in hash order."""
    root_path = Path(root) if root is not None else stdlib_root()
    if not root_path.is_dir():
        raise FileNotFoundError(f"the standard library directory {str(root_path)!r} does not exist; "
                                "stdlib-lm reads its corpus from there")
    found = []
    for dirpath, dirnames, filenames in os.walk(root_path):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("config-"))
        for f in filenames:
            if f.endswith(".py") and not f.startswith("_sysconfigdata"):
                found.append((Path(dirpath) / f).relative_to(root_path).as_posix())
    return tuple(sorted(found, key=lambda p: (_path_hash(p), p)))


class Corpus(NamedTuple):
    """The byte streams of the corpus (read-only NumPy uint8 arrays) and what they hold."""

    train: np.ndarray              # [N] uint8, N <= corpus_bytes
    heldout: np.ndarray            # [M] uint8
    train_files: tuple[str, ...]   # the last one may be cut
    heldout_files: tuple[str, ...]
    python: str                    # e.g. "3.11.7 CPython"

    @property
    def fingerprint(self) -> dict[str, Any]:
        """What a Result should record so that runs on different machines can be compared."""
        return {"python": self.python, "train_sha256": hashlib.sha256(self.train.tobytes()).hexdigest(),
                "heldout_sha256": hashlib.sha256(self.heldout.tobytes()).hexdigest(),
                "train_bytes": int(self.train.size), "train_files": len(self.train_files),
                "heldout_bytes": int(self.heldout.size), "heldout_files": len(self.heldout_files)}


def _frozen_bytes(chunks: list[bytes]) -> np.ndarray:
    a = np.frombuffer(b"".join(chunks), np.uint8).copy()
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=8)
def corpus(corpus_bytes: int = DEFAULT_CORPUS_BYTES, root: str | None = None) -> Corpus:
    """The training stream (at most `corpus_bytes` bytes) and the full held-out stream.

    Cached per process: tasks built with the same `corpus_bytes` share the arrays.
    """
    root_path = Path(root) if root is not None else stdlib_root()
    train, heldout, train_files, heldout_files = [], [], [], []
    size = 0
    for rel in stdlib_files(None if root is None else str(root_path)):
        is_test = _held_out(rel)
        if not is_test and size >= corpus_bytes:
            continue
        text = (root_path / rel).read_bytes() + SEPARATOR
        if is_test:
            heldout.append(text)
            heldout_files.append(rel)
        else:
            text = text[: corpus_bytes - size]
            train.append(text)
            train_files.append(rel)
            size += len(text)
    python = f"{platform.python_version()} {platform.python_implementation()}"
    return Corpus(_frozen_bytes(train), _frozen_bytes(heldout), tuple(train_files), tuple(heldout_files), python)


def fingerprint(task: Task) -> dict[str, Any]:
    """The corpus fingerprint a stdlib-lm task was built from (see `Corpus.fingerprint`):
    python, the two streams' SHA-256 and their byte and file counts."""
    fp = task.data.get("fingerprint") if isinstance(task.data, dict) else None
    if fp is None:
        raise ValueError(f"task {task.name!r} is not a stdlib-lm task (its data have no corpus fingerprint)")
    values = np.asarray(fp["counts"]).tolist()
    return {"python": bytes(np.asarray(fp["python"])).rstrip(b"\0").decode(),
            "train_sha256": bytes(np.asarray(fp["train_sha256"])).hex(),
            "heldout_sha256": bytes(np.asarray(fp["heldout_sha256"])).hex(),
            **dict(zip(_FINGERPRINT_FIELDS, (int(v) for v in values), strict=True))}


def _fingerprint_arrays(c: Corpus) -> dict[str, np.ndarray]:
    """The fingerprint as small arrays, so that it travels inside the Task (its data)."""
    fp = c.fingerprint
    python = fp["python"].encode()[:32].ljust(32, b"\0")
    return {"python": np.frombuffer(python, np.uint8).copy(),
            "train_sha256": np.frombuffer(bytes.fromhex(fp["train_sha256"]), np.uint8).copy(),
            "heldout_sha256": np.frombuffer(bytes.fromhex(fp["heldout_sha256"]), np.uint8).copy(),
            "counts": np.array([fp[k] for k in _FINGERPRINT_FIELDS], np.int32)}


# -- Sampling: offsets -> windows --------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def make_gather_fn(context: int) -> Callable[[PyTree, jax.Array, jax.Array, Any, Any], Batch]:
    """`gather_fn(data, index, key, worker, iteration)`: the windows starting at offsets
    `index` ([μ] int32) of data["train"], as x = bytes [o, o+T) and y = bytes [o+1, o+T+1)."""

    def gather_fn(data: PyTree, index: jax.Array, key: jax.Array, worker: Any, iteration: Any) -> Batch:
        del key, worker, iteration  # no augmentation: the window is the example
        windows = jax.vmap(lambda o: jax.lax.dynamic_slice(data["train"], (o,), (context + 1,)))(index)
        windows = windows.astype(jnp.int32)
        return {"x": windows[:, :-1], "y": windows[:, 1:], "index": index}

    return gather_fn


@functools.lru_cache(maxsize=64)
def make_sample_fn(batch_size: int, partition: str, train_size: int, context: int):
    """`sample_fn(data, key, worker, iteration)`: `staleness.tasks.sampling`'s offsets for
    (key, worker, iteration), then `make_gather_fn(context)`. Jitted and cached."""
    return _data.sample_fn_for(make_gather_fn(context), batch_size, partition, train_size)


def region_layout(stream_bytes: int, num_workers: int, context: int, fractions=None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds) of the "shard" (fractions None: equal) and "sizes" partitions: worker w
    owns the offsets of the windows that lie wholly inside its contiguous byte region of the
    training stream, [w·N/λ, (w+1)·N/λ) for shard, regions of the given fractions for sizes."""
    if fractions is None:
        edges = (np.arange(num_workers + 1, dtype=np.int64) * stream_bytes) // num_workers
        what = f"partition='shard' cuts the {stream_bytes}-byte training stream into {num_workers} regions"
    else:
        cum = np.concatenate([[0.0], np.cumsum(np.asarray(fractions, np.float64))])
        edges = np.rint(cum / cum[-1] * stream_bytes).astype(np.int64)
        what = f"partition='sizes:...' cuts the {stream_bytes}-byte training stream into regions of {list(fractions)}"
    counts = np.diff(edges) - context
    if counts.min() < 1:
        raise ValueError(
            f"{what}; each needs at least context + 1 = {context + 1} bytes, region {int(np.argmin(counts))} has "
            f"{int(np.diff(edges).min())}: use at most {stream_bytes // (context + 1)} equal workers, larger "
            f"fractions, a larger corpus_bytes, or partition='iid'.")
    order = np.concatenate([np.arange(lo, lo + n) for lo, n in zip(edges[:-1], counts, strict=True)])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return order.astype(np.int32), bounds.astype(np.int32)


# -- Model functions ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _lm_fns(model: nn.Module, context: int):
    """(jitted init_fn, loss_fn, per_example) for a module mapping tokens [B, T] to logits [B, T, V]."""

    def init_fn(key: jax.Array) -> PyTree:
        return model.init(key, jnp.zeros((1, context), jnp.int32))["params"]

    def loss_fn(params: PyTree, batch: Batch) -> jax.Array:
        logits = model.apply({"params": params}, batch["x"])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]))

    def per_example(params: PyTree, x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
        logits = model.apply({"params": params}, x)
        loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y), axis=-1)  # [chunk]
        return {"loss": loss, "bits_per_byte": loss / math.log(2.0)}

    return jax.jit(init_fn), loss_fn, per_example


def _check_int(name: str, value: Any, low: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low} ({what}); got {value!r}.")
    return int(value)


def lm_task(name: str, model: nn.Module, *, context: int, batch_size: int, num_workers: int = 1,
            partition: str = "iid", seed: int = 0, corpus_bytes: int = DEFAULT_CORPUS_BYTES,
            eval_windows: int = 256, eval_chunk: int = 64) -> Task:
    """A next-byte prediction Task on the stdlib corpus for any flax module.

    Args:
      name, batch_size (windows), num_workers: as `Task`'s.
      model: flax.linen module mapping tokens [B, T] (int32, T = context) to
        logits [B, T, 256]; causal, no mutable collections.
      context: T, bytes of input per example (windows are context + 1 bytes).
      partition: "iid", "shard" or "sizes:F1,...,Fλ" (contiguous regions, see `region_layout`).
      seed: recorded; the corpus and the split do not depend on it.
      corpus_bytes: cap on the training stream, in bytes.
      eval_windows: held-out windows `evaluate` averages over (fixed offsets).
      eval_chunk: windows per step of the chunked evaluation loop.

    Returns:
      A `Task` with metric_names ("loss", "bits_per_byte"), train_size = number of valid
      training offsets, test_size = eval_windows, and the optimizer `DEFAULT_OPTIMIZER`.
    """
    check_common(batch_size, num_workers, partition, seed)
    part = _partitions.parse(partition)
    if part.kind == "dirichlet":
        raise ValueError(f"partition = {partition!r} splits class labels, and the examples of {name!r} are windows "
                         f"of a byte stream without labels; valid: {', '.join(PARTITIONS)} ('shard' and 'sizes' "
                         "give each worker a contiguous region of the stream).")
    if part.kind == "sizes" and len(part.sizes) != num_workers:
        raise ValueError(f"partition = {partition!r} gives {len(part.sizes)} fractions for num_workers = "
                         f"{num_workers}; give one per worker.")
    context = _check_int("context", context, 1, "bytes of input per example")
    corpus_bytes = _check_int("corpus_bytes", corpus_bytes, 2 * (context + 1), "cap on the training stream")
    eval_windows = _check_int("eval_windows", eval_windows, 1, "held-out windows per evaluation")
    eval_chunk = _check_int("eval_chunk", eval_chunk, 1, "held-out windows per evaluation step")
    c = corpus(corpus_bytes)
    init_fn, loss_fn, per_example = _lm_fns(model, context)
    task = Task(
        name=name, batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=("loss", "bits_per_byte"), train_size=0, test_size=0, seed=seed,
        init_fn=init_fn, loss_fn=loss_fn, sample_fn=None, gather_fn=make_gather_fn(context), eval_fn=None,
        optimizer=DEFAULT_OPTIMIZER,
        holdout_fn=functools.partial(_holdout, c.train, context, eval_windows, eval_chunk, per_example))
    data = _data.device_data(_fingerprint_arrays(c))
    return _on_streams(task, c.train, c.heldout, context, eval_windows, eval_chunk, per_example, data)


def _on_streams(task: Task, train: np.ndarray, heldout: np.ndarray, context: int, eval_windows: int,
                eval_chunk: int, per_example, fingerprint) -> Task:
    """`task` training on windows of byte stream `train`, evaluated on `eval_windows` fixed
    windows of `heldout` (the data layout and functions that depend on the streams)."""
    if heldout.size < context + 1:
        raise ValueError(f"the held-out stream has {heldout.size} bytes, fewer than context + 1 = {context + 1}")
    train_size = int(train.size) - context
    if train_size < 1:
        raise ValueError(f"the training stream has {train.size} bytes; it needs more than context = {context}")
    starts = np.linspace(0, heldout.size - (context + 1), eval_windows).round().astype(np.int64)
    windows = heldout[starts[:, None] + np.arange(context + 1)].astype(np.int32)   # [eval_windows, T + 1]
    arrays: dict[str, Any] = {"train": train, **_data.chunked_test_data(windows[:, :-1], windows[:, 1:], eval_chunk)}
    part = _partitions.parse(task.partition)
    if part.kind != "iid":
        arrays["order"], arrays["shard_bounds"] = region_layout(int(train.size), task.num_workers, context,
                                                                part.sizes)
    task_data = _data.device_data(arrays)
    task_data["fingerprint"] = fingerprint
    return dataclasses.replace(
        task, train_size=train_size, test_size=eval_windows, data=task_data,
        sample_fn=make_sample_fn(task.batch_size, task.partition, train_size, context),
        eval_fn=_data.make_eval_fn(per_example, eval_windows))


def _holdout(train: np.ndarray, context: int, eval_windows: int, eval_chunk: int, per_example,
             task: Task, fraction: float, seed: int) -> Task:
    """The validation task of an LM: the last `fraction` of the training stream becomes the
    held-out stream (windows never straddle the cut: the two streams are disjoint bytes),
    the rest the training stream; the test files are not used. The split is contiguous, so
    `seed` is not used (a random choice of windows would share bytes between the two)."""
    del seed
    cut = int(round(train.size * (1.0 - fraction)))
    if cut - context < task.num_workers or train.size - cut < context + 1:
        raise ValueError(f"holdout: a training stream of {train.size} bytes is too short to hold out "
                         f"fraction = {fraction} with context = {context}")
    return _on_streams(dataclasses.replace(task, name=f"{task.name}[validation]", holdout_fn=None),
                       train[:cut], train[cut:], context, eval_windows, eval_chunk, per_example,
                       task.data["fingerprint"])


def check_model_options(num_layers: Any, d_model: Any, num_heads: Any, context: Any) -> None:
    """ValueError naming the first invalid transformer option."""
    _check_int("num_layers", num_layers, 1, "transformer blocks")
    _check_int("num_heads", num_heads, 1, "attention heads")
    _check_int("d_model", d_model, 1, "model width")
    _check_int("context", context, 1, "bytes of input per example")
    if d_model % num_heads:
        raise ValueError(f"d_model = {d_model} must be a multiple of num_heads = {num_heads}.")


def stdlib_lm(batch_size: int, num_workers: int, partition: str, seed: int, *, num_layers: int = 2,
              d_model: int = 128, num_heads: int = 4, context: int = 64,
              corpus_bytes: int = DEFAULT_CORPUS_BYTES, eval_windows: int = 256) -> Task:
    """stdlib-lm: byte-level decoder-only transformer (2 pre-LN blocks, d_model 128, 4 heads,
    context 64 by default) on the Python standard library's source (4 MiB train, fixed held-out files)."""
    check_model_options(num_layers, d_model, num_heads, context)
    model = Transformer(num_layers=int(num_layers), d_model=int(d_model), num_heads=int(num_heads),
                        context=int(context), vocab=VOCAB)
    return lm_task(NAME, model, context=int(context), batch_size=batch_size, num_workers=num_workers,
                   partition=partition, seed=seed, corpus_bytes=corpus_bytes, eval_windows=eval_windows)


stdlib_lm.optimizer = DEFAULT_OPTIMIZER  # read by registry.declared_optimizer without building
