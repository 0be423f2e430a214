"""The network model: units, all-reduce cost models and a shared link.

A transfer of B bytes over a link of bandwidth b (bytes/s) and latency L
(seconds) takes ``L + B / b``. Several links in series (the worker's own link,
the server's) behave as a fluid path: latencies add and the bandwidth is the
smallest one (the bottleneck). The server's link is shared by every
concurrent transfer through it; :class:`SharedLink` times those transfers by
exact processor sharing, max-min fair when flows have their own caps.

Synchronous rounds can instead aggregate with an all-reduce:

    ring: 2(λ−1)/λ · B / b + 2(λ−1) · L
    tree: 2 · ceil(log2 λ) · (L + B / b)

The ring is reduce-scatter then all-gather, λ−1 steps each, every step moving
B/λ bytes per link. The tree is a binary-tree reduce to a root then a
broadcast back down, ceil(log2 λ) levels each way, every level moving the
whole B bytes over one link (no pipelining of chunks): latency-friendly for
small B, bandwidth-bound for large B. One worker (λ = 1) costs nothing.

Units in the spec grammar: see :mod:`staleness.cluster` (``BANDWIDTH``, ``LATENCY``). Internally every
bandwidth is in bytes per second and every latency in seconds.

Pure Python; nothing here imports JAX.
"""

from __future__ import annotations

import heapq
import math
import re

from staleness.infra.checks import format_number

__all__ = ["allreduce_time", "parse_bandwidth", "parse_latency", "format_bandwidth",
           "format_latency", "SharedLink", "ALGORITHMS"]

#: All-reduce cost models known to :func:`allreduce_time`.
ALGORITHMS = ("ring", "tree")

# unit -> multiplier to bits per second (bit units) or bytes per second (byte units)
_BIT_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}
_BYTE_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12}
_LAT_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6}   # divisors: seconds = value / divisor
_NUM = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_BW_RE = re.compile(rf"^\s*({_NUM})\s*([a-zA-Z/]+)\s*$")
_LAT_RE = re.compile(rf"^\s*({_NUM})\s*([a-zA-Z]*)\s*$")


def _from_unit(value: float, unit: str) -> float | None:
    """Bytes per second of `value` `unit`, or None for an unknown unit."""
    u = unit.lower()
    if u in _BIT_UNITS:
        return value * _BIT_UNITS[u] / 8.0
    if u in _BYTE_UNITS:
        return value * _BYTE_UNITS[u]
    return None


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Bytes per second of a bandwidth such as ``'1gbps'``, ``'100mbps'`` or ``'125MB/s'``.

    Raises ValueError naming `what`, the text and the accepted units.
    """
    m = _BW_RE.match(text) if isinstance(text, str) else None
    out = None if m is None else _from_unit(float(m.group(1)), m.group(2))
    if out is None or not (math.isfinite(out) and out > 0):
        raise ValueError(f"{what} = {text!r} must be a number > 0 with a unit: bps, kbps, mbps, gbps "
                         f"(bits per second) or B/s, kB/s, MB/s, GB/s (bytes per second), e.g. '10gbps'")
    return out


def parse_latency(text: str, what: str = "latency") -> float:
    """Seconds of a latency such as ``'5ms'``, ``'20us'``, ``'0.1s'`` or ``'0.1'`` (seconds)."""
    m = _LAT_RE.match(text) if isinstance(text, str) else None
    unit = m.group(2).lower() if m else None
    if m is None or (unit and unit not in _LAT_UNITS):
        raise ValueError(f"{what} = {text!r} must be a number >= 0, optionally with a unit s, ms or us, e.g. '5ms'")
    x = float(m.group(1))
    return x / _LAT_UNITS[unit] if unit else x


def format_bandwidth(bytes_per_s: float) -> str:
    """The canonical bit-rate text of a bandwidth, which :func:`parse_bandwidth` reads back exactly.

    Engineering form: the largest of bps, kbps, mbps, gbps, tbps in which the
    number is >= 1 and reads back to the same bytes/s ('100mbps', not
    '0.1gbps'; '1.5gbps'); when no such unit reads back exactly, the shortest
    exact text (bps always does: bytes * 8 is exact).
    """
    bits = bytes_per_s * 8.0
    exact = []
    for unit in ("tbps", "gbps", "mbps", "kbps", "bps"):
        text = format_number(bits / _BIT_UNITS[unit])
        if _from_unit(float(text), unit) == bytes_per_s:
            if float(text) >= 1.0:
                return text + unit
            exact.append(text + unit)
    return min(exact, key=len) if exact else format_number(bits) + "bps"


def format_latency(seconds: float) -> str:
    """The canonical text of a latency, which :func:`parse_latency` reads back exactly.

    Engineering form, as :func:`format_bandwidth`: the largest of s, ms, us in
    which the number is >= 1 and reads back exactly ('5ms', '1.5s', '250us');
    otherwise the shortest exact text. 0 is '0'.
    """
    if seconds == 0.0:
        return "0"
    exact = []
    for unit, div in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        text = format_number(seconds * div)
        if float(text) / div == seconds:
            if float(text) >= 1.0:
                return text + unit
            exact.append(text + unit)
    return min(exact, key=len) if exact else format_number(seconds) + "s"


def allreduce_time(algorithm: str, nbytes: float, participants: int, bandwidth: float,
                   latency: float = 0.0) -> float:
    """Seconds of an all-reduce of `nbytes` over `participants` workers.

    Args:
      algorithm: 'ring' (2(λ−1)/λ · B / b + 2(λ−1) · L) or 'tree' (2 · ceil(log2 λ) · (L + B / b)).
      nbytes: bytes each worker contributes (B >= 0).
      participants: λ >= 1 (one worker: 0 s).
      bandwidth: per-link bandwidth in bytes per second (b > 0).
      latency: per-step latency in seconds (L >= 0).
    """
    return sum(allreduce_parts(algorithm, nbytes, participants, bandwidth, latency))


def allreduce_parts(algorithm: str, nbytes: float, participants: int, bandwidth: float,
                    latency: float = 0.0) -> tuple[float, float]:
    """(bandwidth part, latency part) of :func:`allreduce_time`, in seconds."""
    n = participants
    if n <= 1:
        return 0.0, 0.0
    if algorithm == "ring":
        return 2.0 * (n - 1) / n * nbytes / bandwidth, 2.0 * (n - 1) * latency
    if algorithm == "tree":
        steps = 2.0 * math.ceil(math.log2(n))
        return steps * (nbytes / bandwidth), steps * latency
    raise ValueError(f"allreduce: algorithm = {algorithm!r} must be one of {', '.join(ALGORITHMS)}")


class SharedLink:
    """A link of `capacity` bytes/s shared by concurrent flows, timed by exact processor sharing.

    Every flow has its own cap (its worker's link bandwidth; inf: none). The
    capacity is shared max-min fairly (water-filling): flows whose cap is below
    the fair share run at their cap, the others split what is left equally.
    Rates change only when a flow starts or ends; between those instants each
    flow's rate is constant.

    Flows with the same cap always have the same rate, so each cap group keeps
    one virtual clock (bytes served per flow since the group formed) and a heap
    of finish marks: an event costs O(G + log n) for G distinct caps and n flows.

    `token` changes whenever the rates may have changed: a caller that put
    :meth:`next_completion` into its event queue keeps the token beside it and
    skips the entry when the token no longer matches (re-timing in-flight
    transfers without searching the queue).
    """

    def __init__(self, capacity: float):
        if not (isinstance(capacity, (int, float)) and capacity > 0 and not math.isnan(capacity)):
            raise ValueError(f"SharedLink: capacity = {capacity!r} must be a number of bytes/s > 0")
        self.capacity = float(capacity)
        self.token = 0
        self.now = 0.0
        self._groups: dict[float, list] = {}   # cap -> [virtual clock, rate, count, heap of (mark, fid)]
        self._flows: dict[int, tuple] = {}     # fid -> (cap, mark, nbytes, start)
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._flows)

    def _advance(self, now: float) -> None:
        dt = now - self.now
        if dt > 0.0:
            for g in self._groups.values():
                if g[2]:
                    g[0] += g[1] * dt
            self.now = now

    def _reshare(self) -> None:
        """Water-filling: capped groups (ascending cap) first, then an equal share."""
        self.token += 1
        left, n = self.capacity, len(self._flows)
        for cap in sorted(self._groups):
            g = self._groups[cap]
            if not g[2]:
                continue
            if cap * n <= left:
                g[1] = cap
                left -= cap * g[2]
                n -= g[2]
            else:
                share = left / n
                for c2 in sorted(self._groups):
                    if c2 >= cap and self._groups[c2][2]:
                        self._groups[c2][1] = share
                return

    def add(self, now: float, nbytes: float, cap: float = math.inf) -> int:
        """Start a flow of `nbytes` (> 0) at `now` (seconds), capped at `cap` bytes/s; returns its id."""
        self._advance(now)
        g = self._groups.get(cap)
        if g is None:
            g = self._groups[cap] = [0.0, 0.0, 0, []]
        elif not g[2]:
            g[0], g[3] = 0.0, []  # an empty group restarts its clock: marks stay small
        fid = self._next_id
        self._next_id += 1
        mark = g[0] + nbytes
        heapq.heappush(g[3], (mark, fid))
        g[2] += 1
        self._flows[fid] = (cap, mark, nbytes, now)
        self._reshare()
        return fid

    def remaining(self, fid: int, now: float | None = None) -> float:
        """Bytes flow `fid` still has to send (at `now`, default the last event)."""
        if now is not None:
            self._advance(now)
        cap, mark, _, _ = self._flows[fid]
        return max(0.0, mark - self._groups[cap][0])

    def rate(self, fid: int) -> float:
        """Current rate of flow `fid` in bytes/s."""
        return self._groups[self._flows[fid][0]][1]

    def remove(self, now: float, fid: int) -> float:
        """End flow `fid` at `now` (finished or cut off); returns the bytes it had left."""
        self._advance(now)
        cap, mark, _, _ = self._flows.pop(fid)
        g = self._groups[cap]
        g[2] -= 1
        left = max(0.0, mark - g[0])
        self._reshare()
        return left

    def next_completion(self) -> tuple[float, int] | None:
        """(time, flow id) of the flow that finishes first at the current rates, or None."""
        best = None
        flows = self._flows
        for g in self._groups.values():
            if not g[2]:
                continue
            heap = g[3]
            while heap[0][1] not in flows:   # finished or removed flows leave stale marks
                heapq.heappop(heap)
            mark, fid = heap[0]
            t = self.now + max(0.0, mark - g[0]) / g[1]
            if best is None or t < best[0] or (t == best[0] and fid < best[1]):
                best = (t, fid)
        return best
