"""Worker speed models: how long each worker takes per iteration.

A :class:`Cluster` is a small immutable value describing the workers of a
simulated (or delay-injected real) run: a *base* speed per worker, plus a stack
of *modifiers* (noise, stragglers, periodic slowdowns, network latency,
failures). Composition methods return a new ``Cluster``; modifiers stack in
the order they were added. ``Cluster.sampler(seed)`` turns the description
into a :class:`ClusterSampler`, the fast, seeded object the simulator queries
once per event.

Units: every time is in (simulated) seconds; iterations are counted per worker
from 0 (the worker's clock when it starts that iteration).

Bases::

    constant(8)                      8 workers, 1.0 s per iteration each
    heterogeneous([1, 1, 2.6, 2.6])  mean seconds per iteration, per worker
    gpus(["gtx1080ti"] * 4 + ["gtx1060"] * 4)   seconds / PRESETS[name]
    from_trace_csv("speeds.csv")     recorded per-iteration compute seconds

Modifiers (each returns a new Cluster)::

    .jitter(sigma)                       lognormal noise with mean 1
    .stragglers(prob, slowdown, duration, workers=None)
    .periodic(period, duration, slowdown, workers=None, phase=0.0)
    .network(push=0.0, pull=0.0, jitter=0.0)
    .failures([(worker, fail_at, rejoin_at_or_None), ...])

Spec grammar (the CLI's ``--cluster``; :func:`parse`, and
:meth:`Cluster.describe` writes it back)::

    spec      := base ( '+' modifier )*
    base      := COUNT                          constant(COUNT), 1.0 s each; e.g. "8"
               | item ( ',' item )*  [ '@' SECONDS ]
               | 'trace:' PATH                  from_trace_csv(PATH); PATH may not contain '+'
    item      := (NUMBER | GPU) [ '*' COUNT ]   value repeated COUNT times (default 1)
               - all items NUMBER: heterogeneous(...) with those mean seconds,
                 e.g. "1,1,2.6,2.6" or "1*4,2.6*4" (a single number item needs a
                 '.' or '*': "3" is constant(3), "3*1" or "3.0" is one 3-second worker)
               - all items GPU (names from PRESETS, case-insensitive):
                 gpus(...), e.g. "gtx1080ti*4,gtx1060*4"; the optional '@SECONDS'
                 sets the reference GPU's seconds per iteration (default 1):
                 "v100*8@0.25"
    modifier  := 'jitter=' SIGMA
               | 'stragglers=' PROB ':' SLOWDOWN ':' DURATION [ ':' WORKERS ]
               | 'periodic=' PERIOD ':' DURATION ':' SLOWDOWN [ ':' WORKERS [ ':' PHASE ] ]
               | 'network=' PUSH ':' PULL [ ':' JITTER ]
               | 'fail=' event ( ',' event )*
    event     := WORKER '@' FAIL_AT [ '-' [ REJOIN_AT ] ]   no REJOIN_AT: never rejoins
    WORKERS   := 'all' | range ( ',' range )*   with range := ID [ '-' ID ] (inclusive)

Example: ``"gtx1080ti*4,gtx1060*4+jitter=0.1+stragglers=0.01:4:5"
"+network=0.01:0.01+periodic=100:10:3+fail=3@100-200"``.

Determinism: every random draw for (worker, iteration) is a pure function of
(seed, worker, stream, iteration), where each modifier owns its streams
(numbered by its position in the stack). Draws are made in blocks of
:data:`GROUP` workers x :data:`CHUNK` iterations, block (g, c) holding workers
``g*GROUP ..`` and iterations ``c*CHUNK ..`` and drawn from its own
``np.random.SeedSequence([seed, stream, g, c])`` on first use. So the order in
which the simulator visits workers does not matter, the draws of a worker do
not depend on how many workers the cluster has, and iterations may be accessed
in any order (e.g. after a worker rejoins). Blocks (rather than one generator
per worker) keep the ~12 us generator set-up affordable when a run has many
workers and few iterations each.
Straggler episodes are the one piece of per-worker state (they live in
simulated time); they are deterministic as long as each worker's iterations
are queried in order of their start times, which is how a simulator calls them.

Pure NumPy; nothing here imports JAX.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CHUNK",
    "GROUP",
    "PRESETS",
    "Cluster",
    "ClusterSampler",
    "constant",
    "default",
    "from_trace_csv",
    "gpus",
    "heterogeneous",
    "parse",
]

#: Iterations per pre-drawn random block (a power of two: index with shifts).
CHUNK = 64
#: Workers per pre-drawn random block (a power of two).
GROUP = 16
_CSHIFT, _CMASK = CHUNK.bit_length() - 1, CHUNK - 1
_GSHIFT, _GMASK = GROUP.bit_length() - 1, GROUP - 1

# Largest accepted lognormal sigma. With mean 1 the median is exp(-sigma^2/2);
# past sigma = 5 the median is below 4e-6 of the mean and draws can underflow
# to 0 s, which is no longer a model of anything physical.
_MAX_SIGMA = 5.0

# ---------------------------------------------------------------------------
# GPU presets
# ---------------------------------------------------------------------------
# Relative *training throughput* (images/s on ResNet-50 at the framework's
# default single-GPU precision), normalized to the GTX 1080 Ti = 1.0. A GPU
# with preset r takes seconds / r per iteration. These are approximate: ratios
# between GPUs depend on the model, batch size, precision and software
# version (+-20 % is typical between published benchmark rounds).
#
# Source A: Lambda Labs, "deeplearning-benchmark" repository
#   (github.com/lambdal/deeplearning-benchmark), file
#   pytorch/pytorch-train-throughput-fp32.csv at commit e167f02c (its
#   2020-2021 rounds: NVIDIA DeepLearningExamples ResNet-50 in NGC PyTorch
#   20.x-era containers, one GPU, column `resnet50`, images/s; the GTX 1080 Ti
#   raw log in pytorch/results/1080Ti shows ImageNet, batch 100, 196 img/s).
#   On Ampere GPUs "fp32" runs use TF32 tensor cores (PyTorch's default for
#   convolutions), so the A100 / RTX 30xx ratios are default-precision ones.
_LAMBDA_PT_2020 = {
    "gtx1080ti": 196.0,  # "GTX 1080Ti"
    "rtx2080ti": 275.0,  # "RTX 2080Ti"
    "v100": 368.0,  # "V100 32GB"
    "rtx3080": 384.0,  # "RTX 3080"
    "rtx3090": 471.0,  # "RTX 3090"
    "a100": 798.0,  # "A100 40GB SXM4"
}
# Source B: the same file in its 2023-2024 rounds (e.g. at commit 0551cb70;
#   NGC PyTorch 22.09 and later), which has no GTX 1080 Ti row. Used only for
#   GPUs missing from source A, bridged through the closest GPU present in both
#   rounds (H100 via A100, RTX 4090 via RTX 3090): between rounds the V100
#   stayed at 368-369 img/s but the A100 went from 798 (40GB) to 1066 (80GB),
#   so a bridge through the V100 would credit the newer software to the newer
#   GPUs.
_LAMBDA_PT_2023 = {
    "v100": 369.0,  # "LambdaCloud V100 16GB"
    "rtx3090": 513.0,  # "RTX 3090"
    "a100": 1066.0,  # "A100 80GB SXM4"
    "rtx4090": 721.0,  # "RTX 4090"
    "h100": 1753.0,  # "H100 80GB SXM5"
}
# Cross-check (not used): Lambda's 2019 TensorFlow blog post "Deep Learning GPU
#   Benchmarks - V100 vs 2080 Ti vs 1080 Ti vs Titan V", ResNet-50 FP32 img/s:
#   1080 Ti 209, 2080 Ti 294, V100 405 -> 1.41 and 1.94, within 4 % of source A.
# No preset for GPUs without a row in these sources (e.g. T4, P100).


def _rel(name: str) -> float:
    return _LAMBDA_PT_2020[name] / _LAMBDA_PT_2020["gtx1080ti"]


PRESETS: dict[str, float] = {
    # DSSP paper (Zhao et al., ICDCS 2019): GTX 1060 vs GTX 1080 Ti
    # "throughput ratio about 1:2.6".
    "gtx1060": 1.0 / 2.6,
    "gtx1080ti": 1.0,  # reference
    "rtx2080ti": _rel("rtx2080ti"),  # 275 / 196 = 1.40
    "v100": _rel("v100"),  # 368 / 196 = 1.88
    "rtx3080": _rel("rtx3080"),  # 384 / 196 = 1.96
    "rtx3090": _rel("rtx3090"),  # 471 / 196 = 2.40
    "a100": _rel("a100"),  # 798 / 196 = 4.07
    # 2.40 * 721 / 513 = 3.38
    "rtx4090": _rel("rtx3090") * _LAMBDA_PT_2023["rtx4090"] / _LAMBDA_PT_2023["rtx3090"],
    # 4.07 * 1753 / 1066 = 6.69
    "h100": _rel("a100") * _LAMBDA_PT_2023["h100"] / _LAMBDA_PT_2023["a100"],
}


# ---------------------------------------------------------------------------
# Validation helpers (boundary checks; every failure is a ValueError that names
# the function, the argument, the value and what would be valid).
# ---------------------------------------------------------------------------
def _number(fn: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{fn}: {name} = {value!r} must be a real number")
    return float(value)


def _finite(fn: str, name: str, value, *, low: float | None = None,
            low_ok: bool = True, high: float | None = None) -> float:
    """A finite float with optional bounds (low inclusive if low_ok)."""
    x = _number(fn, name, value)
    bad = not math.isfinite(x)
    if low is not None:
        bad = bad or (x < low if low_ok else x <= low)
    if high is not None:
        bad = bad or x > high
    if bad:
        parts = []
        if low is not None:
            parts.append(f"{'>=' if low_ok else '>'} {_fmt(low)}")
        if high is not None:
            parts.append(f"<= {_fmt(high)}")
        rng = " and ".join(parts)
        raise ValueError(f"{fn}: {name} = {value!r} must be a finite number"
                         + (f" {rng}" if rng else ""))
    return x


def _positive(fn: str, name: str, value) -> float:
    return _finite(fn, name, value, low=0.0, low_ok=False)


def _int(fn: str, name: str, value, *, low: int = 0) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        i = operator.index(value)
    except TypeError:
        raise ValueError(f"{fn}: {name} = {value!r} must be an integer >= {low}") from None
    if i < low:
        raise ValueError(f"{fn}: {name} = {value!r} must be an integer >= {low}")
    return i


def _workers(fn: str, workers, num_workers: int) -> tuple[int, ...] | None:
    """None (all workers) or a sorted tuple of distinct worker ids in range."""
    if workers is None:
        return None
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Iterable):
        raise ValueError(f"{fn}: workers = {workers!r} must be None (all workers) "
                         f"or a sequence of worker ids in 0..{num_workers - 1}")
    out = set()
    for k, w in enumerate(workers):
        try:
            if isinstance(w, bool):
                raise TypeError
            i = operator.index(w)
        except TypeError:
            i = None
        if i is None or not 0 <= i < num_workers:
            raise ValueError(f"{fn}: workers[{k}] = {w!r} is not a worker id; "
                             f"valid ids are 0..{num_workers - 1}")
        out.add(i)
    if not out:
        raise ValueError(f"{fn}: workers = {workers!r} is empty; pass None for all "
                         f"workers or at least one id in 0..{num_workers - 1}")
    return tuple(sorted(out))


def _fmt(x: float) -> str:
    """Shortest text that parses back to exactly x ("100" for 100.0)."""
    r = repr(float(x)).replace("e+", "e")  # '+' separates modifiers in a spec
    return r[:-2] if r.endswith(".0") else r


def _fmt_workers(workers: tuple[int, ...]) -> str:
    parts = []
    i = 0
    while i < len(workers):
        j = i
        while j + 1 < len(workers) and workers[j + 1] == workers[j] + 1:
            j += 1
        parts.append(str(workers[i]) if i == j else f"{workers[i]}-{workers[j]}")
        i = j + 1
    return ",".join(parts)


# ---------------------------------------------------------------------------
# Bases: the mean compute time of each worker before modifiers.
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Seconds:
    seconds: tuple[float, ...]  # [W] mean seconds per iteration

    def describe(self) -> str:
        if all(s == 1.0 for s in self.seconds):
            return str(len(self.seconds))
        items = []
        i = 0
        while i < len(self.seconds):
            j = i
            while j + 1 < len(self.seconds) and self.seconds[j + 1] == self.seconds[i]:
                j += 1
            n = j - i + 1
            items.append(_fmt(self.seconds[i]) + (f"*{n}" if n > 1 else ""))
            i = j + 1
        text = ",".join(items)
        if len(items) == 1 and "*" not in text and "." not in text and "e" not in text:
            text += "*1"  # "3" alone would read back as constant(3)
        return text


@dataclass(frozen=True)
class _Gpus:
    names: tuple[str, ...]  # [W] preset names
    seconds: float  # seconds per iteration of the reference GPU (gtx1080ti)

    @property
    def per_worker(self) -> tuple[float, ...]:
        return tuple(self.seconds / PRESETS[n] for n in self.names)

    def describe(self) -> str:
        items = []
        i = 0
        while i < len(self.names):
            j = i
            while j + 1 < len(self.names) and self.names[j + 1] == self.names[i]:
                j += 1
            n = j - i + 1
            items.append(self.names[i] + (f"*{n}" if n > 1 else ""))
            i = j + 1
        text = ",".join(items)
        return text if self.seconds == 1.0 else f"{text}@{_fmt(self.seconds)}"


@dataclass(frozen=True)
class _Trace:
    path: str
    seconds: tuple[tuple[float, ...], ...]  # [W][n_w] compute seconds by iteration

    def describe(self) -> str:
        return f"trace:{self.path}"


# ---------------------------------------------------------------------------
# Modifiers
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Jitter:
    sigma: float

    def describe(self) -> str:
        return f"jitter={_fmt(self.sigma)}"


@dataclass(frozen=True)
class _Stragglers:
    prob: float
    slowdown: float
    duration: float
    workers: tuple[int, ...] | None

    def describe(self) -> str:
        text = f"stragglers={_fmt(self.prob)}:{_fmt(self.slowdown)}:{_fmt(self.duration)}"
        return text if self.workers is None else f"{text}:{_fmt_workers(self.workers)}"


@dataclass(frozen=True)
class _Periodic:
    period: float
    duration: float
    slowdown: float
    workers: tuple[int, ...] | None
    phase: float

    def describe(self) -> str:
        text = f"periodic={_fmt(self.period)}:{_fmt(self.duration)}:{_fmt(self.slowdown)}"
        if self.workers is None and self.phase == 0.0:
            return text
        text += ":" + ("all" if self.workers is None else _fmt_workers(self.workers))
        return text if self.phase == 0.0 else f"{text}:{_fmt(self.phase)}"


@dataclass(frozen=True)
class _Network:
    push: float
    pull: float
    jitter: float

    def describe(self) -> str:
        text = f"network={_fmt(self.push)}:{_fmt(self.pull)}"
        return text if self.jitter == 0.0 else f"{text}:{_fmt(self.jitter)}"


@dataclass(frozen=True)
class _Failures:
    events: tuple[tuple[int, float, float | None], ...]  # (worker, fail_at, rejoin_at)

    def describe(self) -> str:
        parts = []
        for w, f, r in self.events:
            parts.append(f"{w}@{_fmt(f)}" + ("" if r is None else f"-{_fmt(r)}"))
        return "fail=" + ",".join(parts)


# ---------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """An immutable speed model of ``num_workers`` workers.

    Build one with :func:`constant`, :func:`heterogeneous`, :func:`gpus`,
    :func:`from_trace_csv` or :func:`parse`, then stack modifiers with the
    methods below (each returns a new Cluster). Call :meth:`sampler` to draw
    concrete times.

    Attributes:
      num_workers: number of workers (>= 1).
      base: the per-worker mean speeds (internal representation).
      modifiers: the stacked modifiers, oldest first (internal representation).
    """

    num_workers: int
    base: _Seconds | _Gpus | _Trace
    modifiers: tuple = ()

    def __post_init__(self):
        n = {_Seconds: lambda b: len(b.seconds), _Gpus: lambda b: len(b.names),
             _Trace: lambda b: len(b.seconds)}[type(self.base)](self.base)
        if n != self.num_workers or n < 1:
            raise ValueError(f"Cluster: num_workers = {self.num_workers!r} does not match "
                             f"the {n} workers of its base")

    # -- inspection ---------------------------------------------------------
    @property
    def mean_seconds(self) -> tuple[float, ...]:
        """Mean compute seconds per iteration of each worker, before modifiers."""
        b = self.base
        if isinstance(b, _Seconds):
            return b.seconds
        if isinstance(b, _Gpus):
            return b.per_worker
        return tuple(math.fsum(t) / len(t) for t in b.seconds)

    def describe(self) -> str:
        """One line in the :func:`parse` grammar; ``parse(c.describe()) == c``
        (for a trace cluster, as long as the CSV file is still at its path)."""
        return "+".join([self.base.describe()] + [m.describe() for m in self.modifiers])

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        # The field-wise repr would print whole traces.
        return f"staleness.cluster.parse({self.describe()!r})"

    # -- composition --------------------------------------------------------
    def _add(self, mod) -> Cluster:
        return dataclasses.replace(self, modifiers=self.modifiers + (mod,))

    def jitter(self, sigma: float) -> Cluster:
        """Multiply every compute time by lognormal noise of mean 1.

        Args:
          sigma: standard deviation of the log of the factor (dimensionless,
            0 <= sigma <= 5); the factor is exp(N(-sigma^2/2, sigma^2)), so its
            mean is exactly 1 and the mean compute time is unchanged.
        """
        s = _finite("jitter", "sigma", sigma, low=0.0, high=_MAX_SIGMA)
        return self._add(_Jitter(s))

    def stragglers(self, prob: float, slowdown: float, duration: float,
                   workers: Sequence[int] | None = None) -> Cluster:
        """Transient straggler episodes.

        At the start of each iteration of a worker that is not already in an
        episode, an episode starts with probability ``prob`` and lasts
        ``duration`` seconds of simulated time; iterations that *start* inside
        an episode (including the one that started it) take ``slowdown`` times
        longer.

        Args:
          prob: per-iteration probability of starting an episode, in [0, 1].
          slowdown: compute-time factor inside an episode, finite and >= 1.
          duration: episode length in seconds, finite and > 0.
          workers: worker ids affected (default: all).
        """
        fn = "stragglers"
        p = _finite(fn, "prob", prob, low=0.0, high=1.0)
        s = _finite(fn, "slowdown", slowdown, low=1.0)
        d = _positive(fn, "duration", duration)
        return self._add(_Stragglers(p, s, d, _workers(fn, workers, self.num_workers)))

    def periodic(self, period: float, duration: float, slowdown: float,
                 workers: Sequence[int] | None = None, phase: float = 0.0) -> Cluster:
        """Deterministic periodic slowdowns (e.g. a co-located batch job).

        Iterations starting in ``[phase + k*period, phase + k*period + duration)``
        for any integer k take ``slowdown`` times longer.

        Args:
          period: seconds between window starts, finite and > 0.
          duration: window length in seconds, in (0, period].
          slowdown: compute-time factor inside a window, finite and >= 1.
          workers: worker ids affected (default: all).
          phase: start of the window k = 0, in seconds (any finite number).
        """
        fn = "periodic"
        p = _positive(fn, "period", period)
        d = _finite(fn, "duration", duration, low=0.0, low_ok=False, high=p)
        s = _finite(fn, "slowdown", slowdown, low=1.0)
        ph = _finite(fn, "phase", phase)
        return self._add(_Periodic(p, d, s, _workers(fn, workers, self.num_workers), ph))

    def network(self, push: float = 0.0, pull: float = 0.0, jitter: float = 0.0) -> Cluster:
        """Network latency for every worker.

        Args:
          push: seconds for a gradient to go from a worker to the server, >= 0.
          pull: seconds for parameters to go from the server to a worker, >= 0.
          jitter: lognormal sigma (mean-1 factor, as in :meth:`jitter`) applied
            independently to each push and pull, in [0, 5].
        Several ``network`` modifiers add up.
        """
        fn = "network"
        return self._add(_Network(_finite(fn, "push", push, low=0.0),
                                  _finite(fn, "pull", pull, low=0.0),
                                  _finite(fn, "jitter", jitter, low=0.0, high=_MAX_SIGMA)))

    def failures(self, events: Iterable[tuple[int, float, float | None]]) -> Cluster:
        """Workers that fail and possibly rejoin.

        Args:
          events: iterable of ``(worker, fail_at, rejoin_at)``: the worker is
            gone from ``fail_at`` seconds until ``rejoin_at`` seconds
            (``None``: never rejoins). ``0 <= fail_at < rejoin_at``, both
            finite. A worker may fail several times, but its down intervals
            (including those of earlier ``failures`` calls) must not overlap.
        The simulator reads them from :meth:`ClusterSampler.membership_events`.
        """
        fn = "failures"
        if isinstance(events, (str, bytes)) or not isinstance(events, Iterable):
            raise ValueError(f"{fn}: events = {events!r} must be an iterable of "
                             f"(worker, fail_at, rejoin_at_or_None) tuples")
        new = []
        for k, ev in enumerate(events):
            try:
                w, f, r = ev
            except (TypeError, ValueError):
                raise ValueError(f"{fn}: events[{k}] = {ev!r} must be a tuple "
                                 f"(worker, fail_at, rejoin_at_or_None)") from None
            try:
                if isinstance(w, bool):
                    raise TypeError
                wi = operator.index(w)
            except TypeError:
                wi = None
            if wi is None or not 0 <= wi < self.num_workers:
                raise ValueError(f"{fn}: events[{k}] worker = {w!r} is not a worker id; "
                                 f"valid ids are 0..{self.num_workers - 1}")
            fa = _finite(fn, f"events[{k}] fail_at", f, low=0.0)
            ra = None
            if r is not None:
                ra = _finite(fn, f"events[{k}] rejoin_at", r)
                if ra <= fa:
                    raise ValueError(f"{fn}: events[{k}] rejoin_at = {r!r} must be > "
                                     f"fail_at = {f!r} (or None: never rejoins)")
            new.append((wi, fa, ra))
        if not new:
            raise ValueError(f"{fn}: events is empty; give at least one "
                             f"(worker, fail_at, rejoin_at_or_None)")
        # Overlap check over this call's events and every earlier failures().
        old = [e for m in self.modifiers if isinstance(m, _Failures) for e in m.events]
        by_worker: dict[int, list] = {}
        for e in old + new:
            by_worker.setdefault(e[0], []).append(e)
        for w, evs in by_worker.items():
            evs.sort(key=lambda e: e[1])
            for a, b in zip(evs, evs[1:]):
                end = math.inf if a[2] is None else a[2]
                if b[1] < end:
                    raise ValueError(
                        f"{fn}: worker {w} has overlapping down intervals "
                        f"[{_fmt(a[1])}, {'never' if a[2] is None else _fmt(a[2])}) and "
                        f"[{_fmt(b[1])}, {'never' if b[2] is None else _fmt(b[2])}); "
                        f"a worker must rejoin before it can fail again")
        return self._add(_Failures(tuple(new)))

    # -- sampling -----------------------------------------------------------
    def sampler(self, seed: int) -> ClusterSampler:
        """A fresh :class:`ClusterSampler` drawing this cluster's times.

        Args:
          seed: integer >= 0; same seed gives identical times.
        """
        return ClusterSampler(self, _int("Cluster.sampler", "seed", seed))


# ---------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------
def _block_draw(seed: int, stream: int, group: int, chunk: int, kind: str,
                sigma: float) -> list[list[float]]:
    """[GROUP][CHUNK] values of one stream for one worker group and chunk."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream, group, chunk]))
    if kind == "lognormal":
        return rng.lognormal(-0.5 * sigma * sigma, sigma, (GROUP, CHUNK)).tolist()
    return rng.random((GROUP, CHUNK)).tolist()


class _Stream:
    """Random values of one stream, one per (worker, iteration).

    ``getter()(w, i)`` returns worker w's value for iteration i. Blocks are
    drawn on first use and cached, so access can be in any order.
    kind: "lognormal" (mean 1, log-sd sigma) or "uniform" ([0, 1)).
    """

    __slots__ = ("seed", "stream", "kind", "sigma", "cache")

    def __init__(self, seed: int, stream: int, num_workers: int, kind: str, sigma: float = 0.0):
        self.seed, self.stream, self.kind, self.sigma = seed, stream, kind, sigma
        # cache[g][c] = block of worker group g, chunk c
        self.cache: list[dict[int, list[list[float]]]] = [
            {} for _ in range((num_workers + GROUP - 1) // GROUP)]

    def getter(self) -> Callable[[int, int], float]:
        """A closure ``get(worker, iteration) -> value`` (closures beat bound
        methods in the hot path)."""
        cache, seed, stream, kind, sigma = self.cache, self.seed, self.stream, self.kind, self.sigma
        gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK

        def get(w: int, i: int) -> float:
            d = cache[w >> gs]
            ch = d.get(i >> cs)
            if ch is None:
                ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, kind, sigma)
            return ch[w & gm][i & cm]
        return get


def _jitter_op(st: _Stream) -> Callable:
    cache, seed, stream, sigma = st.cache, st.seed, st.stream, st.sigma
    gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK  # closure cells beat globals

    def op(w, i, s, t):
        d = cache[w >> gs]
        ch = d.get(i >> cs)
        if ch is None:
            ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, "lognormal", sigma)
        return t * ch[w & gm][i & cm]
    return op


def _straggler_op(st: _Stream, prob: float, slowdown: float, duration: float,
                  ends: list[float]) -> Callable:
    get = st.getter()

    def op(w, i, s, t):
        if s < ends[w]:
            return t * slowdown
        if get(w, i) < prob:
            ends[w] = s + duration
            return t * slowdown
        return t
    return op


def _periodic_op(period: float, duration: float, slowdown: float, phase: float) -> Callable:
    def op(w, i, s, t):
        # Python's float % has the sign of the divisor: the offset is in [0, period).
        return t * slowdown if (s - phase) % period < duration else t
    return op


class ClusterSampler:
    """Concrete, seeded times of one :class:`Cluster`; made by ``Cluster.sampler(seed)``.

    The simulator calls these once per event, so they are plain Python over
    pre-drawn blocks (about a microsecond per call). Arguments are not
    validated here: ``0 <= worker < num_workers`` and ``iteration >= 0`` are
    the caller's job.

    Attributes:
      num_workers: number of workers.
      cluster: the Cluster this sampler draws from.
      seed: the seed.
    """

    def __init__(self, cluster: Cluster, seed: int):
        self.cluster = cluster
        self.seed = seed
        self.num_workers = W = cluster.num_workers
        base = cluster.base
        ops: list[list[Callable]] = [[] for _ in range(W)]
        # (mean seconds, getter of the mean-1 lognormal factor or None)
        self._push: list[tuple[float, Callable[[int, int], float] | None]] = []
        self._pull: list[tuple[float, Callable[[int, int], float] | None]] = []
        events = []
        for k, m in enumerate(cluster.modifiers):
            stream = 16 * (k + 1)  # each modifier owns streams 16(k+1) .. 16(k+1)+15
            if isinstance(m, _Jitter):
                if m.sigma > 0.0:
                    op = _jitter_op(_Stream(seed, stream, W, "lognormal", m.sigma))
                    for w in range(W):
                        ops[w].append(op)
            elif isinstance(m, _Stragglers):
                if m.prob > 0.0 and m.slowdown > 1.0:
                    ends = [-math.inf] * W  # per worker: end time of its current episode
                    op = _straggler_op(_Stream(seed, stream, W, "uniform"),
                                       m.prob, m.slowdown, m.duration, ends)
                    for w in (range(W) if m.workers is None else m.workers):
                        ops[w].append(op)
            elif isinstance(m, _Periodic):
                if m.slowdown > 1.0:
                    op = _periodic_op(m.period, m.duration, m.slowdown, m.phase)
                    for w in (range(W) if m.workers is None else m.workers):
                        ops[w].append(op)
            elif isinstance(m, _Network):
                for lst, mean, sub in ((self._push, m.push, 0), (self._pull, m.pull, 1)):
                    if mean > 0.0:
                        get = (_Stream(seed, stream + sub, W, "lognormal", m.jitter).getter()
                               if m.jitter > 0.0 else None)
                        lst.append((mean, get))
            elif isinstance(m, _Failures):
                for w, f, r in m.events:
                    events.append((f, "fail", w))
                    if r is not None:
                        events.append((r, "join", w))
        # At equal times a join sorts before a fail (a worker that rejoins at t
        # and fails again at t is down throughout), then by worker id.
        events.sort(key=lambda e: (e[0], e[1] != "join", e[2]))
        self._events = events

        ops_t = [tuple(o) for o in ops]
        if isinstance(base, _Trace):
            traces = [list(t) for t in base.seconds]
            lengths = [len(t) for t in traces]

            def compute_time(worker: int, iteration: int, start: float) -> float:
                t = traces[worker][iteration % lengths[worker]]
                for op in ops_t[worker]:
                    t = op(worker, iteration, start, t)
                return t
        else:
            seconds = list(base.seconds if isinstance(base, _Seconds) else base.per_worker)
            if not any(ops_t):
                def compute_time(worker: int, iteration: int, start: float) -> float:
                    return seconds[worker]
            else:
                def compute_time(worker: int, iteration: int, start: float) -> float:
                    t = seconds[worker]
                    for op in ops_t[worker]:
                        t = op(worker, iteration, start, t)
                    return t
        # The per-instance closure shadows the documented method below; it
        # avoids attribute lookups in the simulator's hottest call.
        self.compute_time = compute_time

    def compute_time(self, worker: int, iteration: int, start: float) -> float:  # noqa: F811
        """Compute seconds (finite, > 0) of ``worker``'s ``iteration``.

        Args:
          worker: worker id, 0 <= worker < num_workers.
          iteration: the worker's iteration index (its clock), >= 0.
          start: simulated time in seconds at which the iteration starts;
            straggler episodes and periodic windows are decided from it. Query
            each worker's iterations in order of start time.
        """
        raise AssertionError("replaced in __init__")  # pragma: no cover

    def push_delay(self, worker: int, iteration: int) -> float:
        """Seconds (>= 0) for ``worker``'s gradient of ``iteration`` to reach the server."""
        total = 0.0
        for mean, get in self._push:
            total += mean if get is None else mean * get(worker, iteration)
        return total

    def pull_delay(self, worker: int, iteration: int) -> float:
        """Seconds (>= 0) for the parameters pulled before ``iteration`` to reach ``worker``."""
        total = 0.0
        for mean, get in self._pull:
            total += mean if get is None else mean * get(worker, iteration)
        return total

    def membership_events(self) -> list[tuple[float, str, int]]:
        """``(time_seconds, 'fail' | 'join', worker)`` sorted by time (a new list)."""
        return list(self._events)

    def __repr__(self) -> str:
        return f"ClusterSampler({self.cluster.describe()!r}, seed={self.seed})"


# ---------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------
def constant(num_workers: int, seconds: float = 1.0) -> Cluster:
    """``num_workers`` identical workers taking ``seconds`` (> 0) per iteration."""
    n = _int("constant", "num_workers", num_workers, low=1)
    s = _positive("constant", "seconds", seconds)
    return Cluster(n, _Seconds((s,) * n))


def heterogeneous(seconds: Sequence[float]) -> Cluster:
    """One worker per entry of ``seconds``: its mean seconds per iteration (> 0)."""
    fn = "heterogeneous"
    if isinstance(seconds, (str, bytes)) or not isinstance(seconds, Iterable):
        raise ValueError(f"{fn}: seconds = {seconds!r} must be a sequence of numbers > 0")
    vals = list(seconds)
    if not vals:
        raise ValueError(f"{fn}: seconds is empty; need at least one worker")
    return Cluster(len(vals), _Seconds(tuple(
        _positive(fn, f"seconds[{k}]", v) for k, v in enumerate(vals))))


def gpus(names: Sequence[str], seconds: float = 1.0) -> Cluster:
    """One worker per GPU name; worker i takes ``seconds / PRESETS[names[i]]``.

    Args:
      names: preset names (case-insensitive), one per worker; see :data:`PRESETS`.
      seconds: seconds per iteration of the reference GPU (gtx1080ti), > 0.
    """
    fn = "gpus"
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ValueError(f"{fn}: names = {names!r} must be a sequence of GPU names")
    vals = list(names)
    if not vals:
        raise ValueError(f"{fn}: names is empty; need at least one worker")
    out = []
    for k, n in enumerate(vals):
        key = n.strip().lower() if isinstance(n, str) else None
        if key not in PRESETS:
            raise ValueError(f"{fn}: names[{k}] = {n!r} is not a known GPU; "
                             f"known: {', '.join(sorted(PRESETS))}")
        out.append(key)
    return Cluster(len(out), _Gpus(tuple(out), _positive(fn, "seconds", seconds)))


def from_trace_csv(path: str | os.PathLike) -> Cluster:
    """Per-iteration compute seconds recorded from real workers.

    The CSV has a header with (at least) the columns ``worker``, ``iteration``
    and ``seconds``. Worker ids must be 0..W-1, all present; each worker's
    iterations must be 0..n_w-1 exactly once (in any row order); seconds must
    be finite and > 0. Iteration i of worker w takes
    ``seconds[w][i % n_w]``: traces wrap around cyclically.
    """
    fn = "from_trace_csv"
    p = os.fspath(path)
    try:
        f = open(p, newline="")
    except OSError as e:
        raise ValueError(f"{fn}: path = {p!r} cannot be read: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{fn}: {p!r} is empty; expected a header "
                             f"'worker,iteration,seconds'")
        cols = [h.strip().lower() for h in header]
        missing = [c for c in ("worker", "iteration", "seconds") if c not in cols]
        if missing:
            raise ValueError(f"{fn}: {p!r} header {header!r} lacks column(s) "
                             f"{', '.join(missing)}; need worker,iteration,seconds")
        iw, ii, isec = cols.index("worker"), cols.index("iteration"), cols.index("seconds")
        data: dict[int, dict[int, float]] = {}
        for row in reader:
            line = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) < len(cols):
                raise ValueError(f"{fn}: {p!r} line {line}: {row!r} has {len(row)} fields, "
                                 f"expected {len(cols)}")
            try:
                w = int(row[iw])
                it = int(row[ii])
                s = float(row[isec])
            except ValueError:
                raise ValueError(f"{fn}: {p!r} line {line}: {row!r} is not numeric "
                                 f"(worker and iteration must be integers, seconds "
                                 f"a number)") from None
            if w < 0 or it < 0:
                raise ValueError(f"{fn}: {p!r} line {line}: worker = {w} and iteration = "
                                 f"{it} must be integers >= 0")
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"{fn}: {p!r} line {line}: seconds = {row[isec]!r} must "
                                 f"be a finite number > 0")
            d = data.setdefault(w, {})
            if it in d:
                raise ValueError(f"{fn}: {p!r} line {line}: worker {w} iteration {it} "
                                 f"appears twice")
            d[it] = s
    if not data:
        raise ValueError(f"{fn}: {p!r} has a header but no rows")
    W = max(data) + 1
    absent = [w for w in range(W) if w not in data]
    if absent:
        raise ValueError(f"{fn}: {p!r} has no rows for worker(s) {absent[:10]}"
                         f"{'...' if len(absent) > 10 else ''}; worker ids must be "
                         f"0..{W - 1}, all present")
    traces = []
    for w in range(W):
        d = data[w]
        n = len(d)
        if max(d) != n - 1:
            gap = next(i for i in range(n) if i not in d)
            raise ValueError(f"{fn}: {p!r} worker {w} lacks iteration {gap}; each "
                             f"worker's iterations must be 0..n-1")
        traces.append(tuple(d[i] for i in range(n)))
    return Cluster(W, _Trace(p, tuple(traces)))


def default() -> Cluster:
    """The README main job's cluster: 4 fast (1.0 s) and 4 slow (2.6 s) workers,
    the DSSP paper's GTX 1080 Ti : GTX 1060 throughput ratio."""
    return heterogeneous([1.0] * 4 + [2.6] * 4)


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------
_FLOAT = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EVENT_RE = re.compile(rf"^(\d+)@({_FLOAT})(?:-({_FLOAT})?)?$")
_COUNT_RE = re.compile(r"^\d+$")


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"parse: spec = {spec!r}: {why}. See staleness.cluster's docstring "
                      f"for the grammar, e.g. 'gtx1080ti*4,gtx1060*4+jitter=0.1'")


def _pnum(spec: str, what: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise _bad(spec, f"{what} {text!r} is not a number") from None
    return x


def _pworkers(spec: str, text: str) -> list[int] | None:
    if text.strip().lower() in ("all", "*"):
        return None
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise _bad(spec, f"workers {text!r} must be 'all' or ids/ranges like '0-3,6'")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        if b < a:
            raise _bad(spec, f"worker range {part.strip()!r} is empty")
        out.extend(range(a, b + 1))
    return out


def _parse_base(spec: str, text: str) -> Cluster:
    text = text.strip()
    if not text:
        raise _bad(spec, "the base (workers) is empty")
    if text.lower().startswith("trace:"):
        path = text[len("trace:"):].strip()
        if not path:
            raise _bad(spec, "'trace:' needs a CSV path")
        return from_trace_csv(path)
    if _COUNT_RE.match(text):
        n = int(text)
        if n < 1:
            raise _bad(spec, "the number of workers must be >= 1")
        return constant(n)
    seconds_at = None
    if "@" in text:
        text, at = text.rsplit("@", 1)
        seconds_at = _pnum(spec, "reference seconds", at.strip())
    values: list = []
    kinds = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise _bad(spec, "empty item in the worker list")
        name, _, count = item.partition("*")
        name = name.strip()
        n = 1
        if _:
            if not _COUNT_RE.match(count.strip()) or int(count) < 1:
                raise _bad(spec, f"count in {item!r} must be an integer >= 1")
            n = int(count)
        try:
            v = float(name)
            kinds.add("seconds")
        except ValueError:
            v = name.lower()
            if v not in PRESETS:
                raise _bad(spec, f"{name!r} is neither a number nor a known GPU "
                                 f"({', '.join(sorted(PRESETS))})") from None
            kinds.add("gpu")
        values.extend([v] * n)
    if len(kinds) > 1:
        raise _bad(spec, "mixes seconds and GPU names in one worker list")
    if kinds == {"gpu"}:
        return gpus(values, 1.0 if seconds_at is None else seconds_at)
    if seconds_at is not None:
        raise _bad(spec, "'@SECONDS' applies only to a list of GPU names")
    return heterogeneous(values)


def _parse_modifier(spec: str, c: Cluster, text: str) -> Cluster:
    key, eq, val = text.partition("=")
    key = key.strip().lower()
    if not eq or not val.strip():
        raise _bad(spec, f"modifier {text!r} must look like name=value")
    fields = [f.strip() for f in val.split(":")]

    def nums(lo, hi, what):
        if not lo <= len(fields) <= hi:
            raise _bad(spec, f"{key} takes {what}, got {val!r}")

    if key == "jitter":
        nums(1, 1, "SIGMA")
        return c.jitter(_pnum(spec, "jitter sigma", fields[0]))
    if key == "stragglers":
        nums(3, 4, "PROB:SLOWDOWN:DURATION[:WORKERS]")
        p, s, d = (_pnum(spec, f"stragglers {n}", x)
                   for n, x in zip(("prob", "slowdown", "duration"), fields))
        w = _pworkers(spec, fields[3]) if len(fields) > 3 else None
        return c.stragglers(p, s, d, w)
    if key == "periodic":
        nums(3, 5, "PERIOD:DURATION:SLOWDOWN[:WORKERS[:PHASE]]")
        p, d, s = (_pnum(spec, f"periodic {n}", x)
                   for n, x in zip(("period", "duration", "slowdown"), fields))
        w = _pworkers(spec, fields[3]) if len(fields) > 3 else None
        ph = _pnum(spec, "periodic phase", fields[4]) if len(fields) > 4 else 0.0
        return c.periodic(p, d, s, w, ph)
    if key == "network":
        nums(2, 3, "PUSH:PULL[:JITTER]")
        vals = [_pnum(spec, f"network {n}", x) for n, x in zip(("push", "pull", "jitter"), fields)]
        return c.network(*vals)
    if key in ("fail", "failures"):
        events = []
        for ev in val.split(","):
            m = _EVENT_RE.match(ev.strip())
            if not m:
                raise _bad(spec, f"failure event {ev.strip()!r} must be WORKER@FAIL_AT"
                                 f"[-REJOIN_AT], e.g. '3@100-200' or '3@100'")
            events.append((int(m.group(1)), float(m.group(2)),
                           None if m.group(3) is None else float(m.group(3))))
        return c.failures(events)
    raise _bad(spec, f"unknown modifier {key!r}; known: jitter, stragglers, periodic, "
                     f"network, fail")


def parse(spec: str) -> Cluster:
    """Build a Cluster from the CLI grammar documented in this module's docstring.

    Examples: ``"8"``, ``"1,1,2.6,2.6"``, ``"1*4,2.6*4"``,
    ``"gtx1080ti*4,gtx1060*4+jitter=0.1+fail=3@100-200"``, ``"trace:speeds.csv"``.
    Raises ValueError naming the bad part.
    """
    if not isinstance(spec, str):
        raise ValueError(f"parse: spec = {spec!r} must be a string")
    if not spec.strip():
        raise _bad(spec, "it is empty")
    base, *mods = spec.split("+")
    c = _parse_base(spec, base)
    for m in mods:
        if not m.strip():
            raise _bad(spec, "empty modifier between '+' signs")
        c = _parse_modifier(spec, c, m.strip())
    return c
