"""Parsing the ``--cluster`` spec grammar (documented in :mod:`staleness.cluster`).

:meth:`Cluster.describe` writes the same grammar back.
"""

from __future__ import annotations

import re

from staleness.cluster.model import Cluster, constant, gpus, heterogeneous
from staleness.cluster.network import ALGORITHMS, parse_bandwidth, parse_latency
from staleness.cluster.presets import PRESETS
from staleness.cluster.trace import from_trace_csv

__all__ = ["parse"]

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
    def bw(text, what):
        try:
            return parse_bandwidth(text, what)
        except ValueError as e:
            raise _bad(spec, str(e)) from None

    def lat(text, what):
        try:
            return parse_latency(text, what)
        except ValueError as e:
            raise _bad(spec, str(e)) from None

    if key == "net":
        # WORKERS may hold commas but no ':'; BANDWIDTH and LATENCY hold neither
        nums(1, 3, "BANDWIDTH[:LATENCY[:WORKERS]], e.g. net=1gbps:5ms")
        w = _pworkers(spec, fields[2]) if len(fields) > 2 else None
        return c.links(bw(fields[0], "net bandwidth"),
                       lat(fields[1], "net latency") if len(fields) > 1 else 0.0, w)
    if key == "server":
        nums(1, 2, "BANDWIDTH[:LATENCY], e.g. server=10gbps")
        return c.server(bw(fields[0], "server bandwidth"),
                        lat(fields[1], "server latency") if len(fields) > 1 else 0.0)
    if key == "allreduce":
        nums(2, 3, "ring|tree:BANDWIDTH[:LATENCY], e.g. allreduce=ring:10gbps:1ms")
        algo = fields[0].lower()
        if algo not in ALGORITHMS:
            raise _bad(spec, f"allreduce algorithm {fields[0]!r} must be one of {', '.join(ALGORITHMS)}")
        return c.allreduce(algo, bw(fields[1], "allreduce bandwidth"),
                           lat(fields[2], "allreduce latency") if len(fields) > 2 else 0.0)
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
                     f"network, net, server, allreduce, fail")


def resolve(cluster, *, allow_none: bool = False) -> Cluster | None:
    """A Cluster given as a value or a spec string (parsed here, once, at an entry point);
    None passes with `allow_none` (a real run without injected delays). A TypeError
    names the argument for anything else."""
    if isinstance(cluster, str):
        return parse(cluster)
    if isinstance(cluster, Cluster) or (cluster is None and allow_none):
        return cluster
    none = "None (no injected delays), " if allow_none else ""
    raise TypeError(f"cluster = {cluster!r} must be {none}a staleness.cluster.Cluster or a spec string such as "
                    "'1*4,2.6*4' (see staleness.cluster)")


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
