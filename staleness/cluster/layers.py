"""Sampler layers: a cluster's base and each modifier, composed as wrappers.

A :class:`Layer` answers the simulator's questions about one worker and one
iteration. The base layer answers them for the bare workers; each modifier
wraps the layer below it (as brax's environment wrappers wrap an ``Env``),
replacing only the answers it changes. ``Cluster.sampler(seed)`` builds the
stack base -> modifier 1 -> ... -> modifier n and queries the outermost layer.

Answers are closures stored as attributes rather than methods: the simulator
calls ``compute_time`` once per gradient, and a closure over the inner
closure is one attribute lookup cheaper per layer than ``self.inner.method``.

Random draws: see :mod:`staleness.cluster` for the determinism contract. Layers
that keep state (straggler episodes) keep it in the layer, explicitly, per worker.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable

import numpy as np

from staleness.cluster.membership import Outages

__all__ = ["CHUNK", "GROUP", "Layer", "Outages", "base_layer", "jitter", "stragglers", "periodic",
           "latency", "links", "server", "allreduce", "failures", "chaos", "elastic", "elapsed"]

#: Iterations per pre-drawn random block (a power of two: index with shifts).
CHUNK = 64
#: Workers per pre-drawn random block (a power of two).
GROUP = 16
_CSHIFT, _CMASK = CHUNK.bit_length() - 1, CHUNK - 1
_GSHIFT, _GMASK = GROUP.bit_length() - 1, GROUP - 1


def _block_draw(seed: int, stream: int, group: int, chunk: int, kind: str,
                sigma: float) -> list[list[float]]:
    """[GROUP][CHUNK] values of one stream for one worker group and chunk."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, stream, group, chunk]))
    if kind == "lognormal":
        return rng.lognormal(-0.5 * sigma * sigma, sigma, (GROUP, CHUNK)).tolist()
    return rng.random((GROUP, CHUNK)).tolist()


def _stream(seed: int, stream: int, num_workers: int, kind: str,
            sigma: float = 0.0) -> Callable[[int, int], float]:
    """``get(worker, iteration) -> value`` of one random stream.

    kind: "lognormal" (mean 1, log-sd sigma) or "uniform" ([0, 1)). Blocks are
    drawn on first use and cached, so access can be in any order.
    """
    cache: list[dict[int, list[list[float]]]] = [{} for _ in range((num_workers + GROUP - 1) // GROUP)]
    gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK  # closure cells beat globals

    def get(w: int, i: int) -> float:
        d = cache[w >> gs]
        ch = d.get(i >> cs)
        if ch is None:
            ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, kind, sigma)
        return ch[w & gm][i & cm]
    return get


def _zero(worker: int, iteration: int) -> float:
    return 0.0


class Layer:
    """One layer of a sampler; by default every answer is the inner layer's.

    Attributes (each a plain value or a closure):
      num_workers: number of workers.
      compute_time(worker, iteration, start) -> seconds of compute (> 0).
      push_latency(worker, iteration) -> seconds a push spends in flight besides its bytes.
      pull_latency(worker, iteration) -> the same for a pull.
      bandwidth: [W] bytes/s of each worker's link (inf: no limit).
      server: None, or (bandwidth bytes/s, latency s) of the server's shared link.
      allreduce: None, or (algorithm, bandwidth bytes/s, latency s).
      outages: every layer's down intervals so far, one
        :class:`~staleness.cluster.membership.Outages` per (layer, worker): a layer that
        takes workers down adds its own (``inner.outages + (...)``).
      constant_seconds, base_compute_time: the bare workers' [W] seconds (None for
        traces) and the base's compute_time: a layer whose compute_time is still
        the base's may read the seconds directly (see :func:`jitter`).
      useful(worker, a, b) -> the seconds of a worker's full compute done between a and b
        (b - a, except inside :func:`elastic`'s learners, which lose slices).
    """

    def __init__(self, inner: Layer | None = None):
        self.inner = inner
        if inner is not None:
            self.num_workers = inner.num_workers
            self.compute_time = inner.compute_time
            self.push_latency = inner.push_latency
            self.pull_latency = inner.pull_latency
            self.bandwidth = inner.bandwidth
            self.server = inner.server
            self.allreduce = inner.allreduce
            self.outages = inner.outages
            self.constant_seconds = inner.constant_seconds
            self.base_compute_time = inner.base_compute_time
            self.useful = inner.useful


def base_layer(per_worker: list[float] | None = None,
               traces: list[list[float]] | None = None) -> Layer:
    """The bare workers: constant seconds per iteration, or recorded traces (cyclic)."""
    layer = Layer()
    if traces is not None:
        traces = [list(t) for t in traces]
        lengths = [len(t) for t in traces]

        def compute_time(worker: int, iteration: int, start: float) -> float:
            return traces[worker][iteration % lengths[worker]]
        layer.num_workers = len(traces)
        layer.constant_seconds = None
    else:
        seconds = list(per_worker)

        def compute_time(worker: int, iteration: int, start: float) -> float:
            return seconds[worker]
        layer.num_workers = len(seconds)
        layer.constant_seconds = seconds
    layer.compute_time = layer.base_compute_time = compute_time
    layer.push_latency = layer.pull_latency = _zero
    layer.bandwidth = (math.inf,) * layer.num_workers
    layer.server = layer.allreduce = None
    layer.outages = ()
    layer.useful = elapsed
    return layer


def elapsed(worker: int, a: float, b: float) -> float:
    """A worker's full-rate compute between a and b: all of it (`Layer.useful` of the base)."""
    return b - a


def _affected(workers, num_workers: int) -> list[bool] | None:
    """[W] whether each worker is affected (None: all of them)."""
    if workers is None:
        return None
    mask = [False] * num_workers
    for w in workers:
        mask[w] = True
    return mask


def jitter(inner: Layer, seed: int, stream: int, sigma: float) -> Layer:
    """Compute times times a mean-1 lognormal factor of log-sd `sigma`.

    The random block lookup is inlined (not a call to a `_stream` getter), and
    directly over the bare workers' constant seconds the base's call is fused
    in too: jitter on constant speeds is the common cluster, and this is the
    simulator's hottest call. Same values, in the same order, either way.
    """
    if sigma <= 0.0:
        return inner
    layer = Layer(inner)
    cache: list[dict[int, list[list[float]]]] = [{} for _ in range((inner.num_workers + GROUP - 1) // GROUP)]
    gs, gm, cs, cm = _GSHIFT, _GMASK, _CSHIFT, _CMASK  # closure cells beat globals
    ct = inner.compute_time
    seconds = inner.constant_seconds if ct is inner.base_compute_time else None

    if seconds is not None:
        def compute_time(w, i, s):
            d = cache[w >> gs]
            ch = d.get(i >> cs)
            if ch is None:
                ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, "lognormal", sigma)
            return seconds[w] * ch[w & gm][i & cm]
    else:
        def compute_time(w, i, s):
            t = ct(w, i, s)
            d = cache[w >> gs]
            ch = d.get(i >> cs)
            if ch is None:
                ch = d[i >> cs] = _block_draw(seed, stream, w >> gs, i >> cs, "lognormal", sigma)
            return t * ch[w & gm][i & cm]
    layer.compute_time = compute_time
    return layer


def stragglers(inner: Layer, seed: int, stream: int, prob: float, slowdown: float,
               duration: float, workers) -> Layer:
    """Straggler episodes; the end time of each worker's current episode is this layer's state."""
    if prob <= 0.0 or slowdown <= 1.0:
        return inner
    layer = Layer(inner)
    W = inner.num_workers
    get = _stream(seed, stream, W, "uniform")
    ends = layer.episode_end = [-math.inf] * W   # [W] seconds: end of each worker's current episode
    mask = _affected(workers, W)
    ct = inner.compute_time

    def slowed(w, i, s, t):
        if s < ends[w]:
            return t * slowdown
        if get(w, i) < prob:
            ends[w] = s + duration
            return t * slowdown
        return t

    if mask is None:
        def compute_time(w, i, s):
            return slowed(w, i, s, ct(w, i, s))
    else:
        def compute_time(w, i, s):
            t = ct(w, i, s)
            return slowed(w, i, s, t) if mask[w] else t
    layer.compute_time = compute_time
    return layer


def periodic(inner: Layer, period: float, duration: float, slowdown: float, phase: float,
             workers) -> Layer:
    """Compute times times `slowdown` for iterations starting inside a periodic window."""
    if slowdown <= 1.0:
        return inner
    layer = Layer(inner)
    mask = _affected(workers, inner.num_workers)
    ct = inner.compute_time

    def compute_time(w, i, s):
        t = ct(w, i, s)
        if mask is not None and not mask[w]:
            return t
        # Python's float % has the sign of the divisor: the offset is in [0, period).
        return t * slowdown if (s - phase) % period < duration else t
    layer.compute_time = compute_time
    return layer


def latency(inner: Layer, seed: int, stream: int, push: float, pull: float, sigma: float) -> Layer:
    """A latency-only link: push and pull latencies, each times its own mean-1 lognormal factor
    (streams `stream` and `stream + 1`) when `sigma` > 0. Added to the inner layer's latencies."""
    layer = Layer(inner)
    W = inner.num_workers
    for name, mean, sub in (("push_latency", push, 0), ("pull_latency", pull, 1)):
        if mean <= 0.0:
            continue
        below = getattr(inner, name)
        if sigma > 0.0:
            get = _stream(seed, stream + sub, W, "lognormal", sigma)

            def lat(w, i, _below=below, _get=get, _mean=mean):
                return _below(w, i) + _mean * _get(w, i)
        else:
            def lat(w, i, _below=below, _mean=mean):
                return _below(w, i) + _mean
        setattr(layer, name, lat)
    return layer


def links(inner: Layer, bandwidth: float, lat: float, workers) -> Layer:
    """Each (selected) worker's own link: `bandwidth` bytes/s and `lat` seconds, in series with
    the inner layer's path (the bandwidth is the smaller one, the latencies add)."""
    layer = Layer(inner)
    mask = _affected(workers, inner.num_workers)
    layer.bandwidth = tuple(min(b, bandwidth) if mask is None or mask[w] else b
                            for w, b in enumerate(inner.bandwidth))
    if lat > 0.0:
        layer.push_latency, layer.pull_latency = _plus(inner, lat, mask)
    return layer


def _plus(inner: Layer, lat: float, mask=None) -> tuple:
    """(push_latency, pull_latency): the inner layer's plus `lat` seconds (for the workers in `mask`; None: all)."""
    push, pull = inner.push_latency, inner.pull_latency
    if mask is None:
        return (lambda w, i: push(w, i) + lat), (lambda w, i: pull(w, i) + lat)
    return (lambda w, i: push(w, i) + lat if mask[w] else push(w, i)), \
        (lambda w, i: pull(w, i) + lat if mask[w] else pull(w, i))


def server(inner: Layer, bandwidth: float, lat: float) -> Layer:
    """The parameter server's link: `bandwidth` bytes/s shared by every concurrent push and pull,
    and `lat` seconds added to each of them."""
    layer = Layer(inner)
    layer.server = (bandwidth, lat)
    if lat > 0.0:
        layer.push_latency, layer.pull_latency = _plus(inner, lat)
    return layer


def allreduce(inner: Layer, algorithm: str, bandwidth: float, lat: float) -> Layer:
    """Synchronous rounds aggregate with an all-reduce of this cost model."""
    layer = Layer(inner)
    layer.allreduce = (algorithm, bandwidth, lat)
    return layer


def failures(inner: Layer, events) -> Layer:
    """Workers that fail at given times and possibly rejoin: `events` holds
    ``(worker, fail_at, rejoin_at_or_None)``; one Outages per worker, in order of fail_at."""
    layer = Layer(inner)
    by_worker: dict[int, list] = {}
    for w, f, r in events:
        by_worker.setdefault(w, []).append((f, r))
    layer.outages = inner.outages + tuple(Outages(w, functools.partial(iter, tuple(sorted(iv, key=lambda x: x[0]))))
                                          for w, iv in sorted(by_worker.items()))
    return layer


def chaos(inner: Layer, seed: int, stream: int, mtbf: float, repair: float, chips: int, workers) -> Layer:
    """Chip failures: each worker (a learner of `chips` chips, each failing as a Poisson process
    of mean `mtbf` seconds between failures) fails after an exponential time of mean
    mtbf / chips and is down `repair` seconds; one uniform draw per failure, lazily (endless)."""
    uniform = _stream(seed, stream, inner.num_workers, "uniform")
    mean_up = mtbf / chips

    def outages(w: int) -> Outages:
        def intervals():
            t, k = 0.0, 0
            while True:
                t += -mean_up * math.log1p(-uniform(w, k))
                yield t, t + repair
                t += repair
                k += 1
        return Outages(w, intervals, endless=True)

    layer = Layer(inner)
    layer.outages = inner.outages + tuple(outages(w) for w in (range(inner.num_workers) if workers is None
                                                                else workers))
    return layer


def elastic(inner: Layer, seed: int, stream: int, mtbf: float, repair: float, chips: int, slices: int,
            reconfig: float, workers) -> Layer:
    """Elastic learners: each worker (a learner of `chips` chips in `slices` equal slices, each
    chip failing as a Poisson process of mean `mtbf` seconds between failures) loses a slice
    for `repair` seconds when one of its chips fails, and goes on with the others: it computes
    at the rate live slices / slices, and not at all for `reconfig` seconds after a slice
    leaves or rejoins (the job reconfigures). Its compute times stretch accordingly (an
    iteration is done once its full-rate seconds are); `useful` gives the full-rate seconds
    done in an interval (what goodput counts). A slice down cannot fail again, so the next
    failure is drawn at every change, at the rate of the live chips: one uniform draw each,
    lazily (endless). No worker goes down: a learner of no live slice waits for one."""
    uniform = _stream(seed, stream, inner.num_workers, "uniform")
    per_slice = chips / slices
    mask = _affected(workers, inner.num_workers)
    ct, inner_useful = inner.compute_time, inner.useful
    lines: dict[int, tuple[list, list, object]] = {}   # worker -> (segment starts, segments, generator)

    def segments(w: int):
        """(start, end, rate) of worker w's piecewise-constant compute rate, in time order."""
        t, live, rejoins, k, blocked = 0.0, slices, [], 0, 0.0
        while True:
            nxt = math.inf
            if live:   # draw k: with one slice and no reconfiguration, `chaos`'s failures exactly
                nxt = t + -(mtbf / (live * per_slice)) * math.log1p(-uniform(w, k))
                k += 1
            event = min(nxt, rejoins[0] if rejoins else math.inf)
            if blocked > t:
                yield t, min(blocked, event), 0.0
            if event > max(t, blocked):
                yield max(t, blocked), event, live / slices
            t = event
            if nxt <= (rejoins[0] if rejoins else math.inf):
                live -= 1
                rejoins.append(t + repair)
            else:
                live += 1
                rejoins.pop(0)
            blocked = max(blocked, t + reconfig)

    def covering(w: int, until: float):
        """Worker w's segments, generated at least up to `until`."""
        starts, segs, gen = lines.get(w) or lines.setdefault(w, ([], [], segments(w)))
        while not segs or segs[-1][1] < until:
            seg = next(gen)
            starts.append(seg[0])
            segs.append(seg)
        return starts, segs

    def stretched(w: int, s: float, t: float) -> float:
        starts, segs = covering(w, s)
        k = max(0, bisect.bisect_right(starts, s) - 1)
        cur, left, span = s, t, 0.0   # span: seconds before `cur` (summed, so full rate throughout gives t)
        while True:
            if k == len(segs):
                starts, segs = covering(w, segs[-1][1] + 1.0)
            a, b, rate = segs[k]
            if b > cur:
                if rate > 0.0 and (b - cur) * rate >= left:
                    return span + left / rate
                left -= (b - cur) * rate
                span += b - cur
                cur = b
            k += 1

    def done(w: int, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        starts, segs = covering(w, b)
        k = max(0, bisect.bisect_right(starts, a) - 1)
        total = 0.0
        while k < len(segs) and segs[k][0] < b:
            lo, hi, rate = segs[k]
            total += max(0.0, min(b, hi) - max(a, lo)) * rate
            k += 1
        return total

    layer = Layer(inner)

    def compute_time(w, i, s):
        t = ct(w, i, s)
        return t if mask is not None and not mask[w] else stretched(w, s, t)

    def useful(w, a, b):
        return inner_useful(w, a, b) if mask is not None and not mask[w] else done(w, a, b)
    layer.compute_time, layer.useful = compute_time, useful
    return layer
