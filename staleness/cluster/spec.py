"""Parsing the ``--cluster`` spec grammar (documented in :mod:`staleness.cluster`).

:meth:`Cluster.describe` writes the same grammar back.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from staleness.infra import specs
from staleness.cluster.model import Cluster, constant, gpus, heterogeneous
from staleness.cluster.network import ALGORITHMS, parse_bandwidth, parse_latency
from staleness.cluster.presets import PRESETS
from staleness.cluster.trace import from_trace_csv

__all__ = ["parse", "register_modifier", "keywords", "grammar", "Value", "Keyword"]

_FLOAT = r"(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EVENT_RE = re.compile(rf"^(\d+)@({_FLOAT})(?:-({_FLOAT})?)?$")
_COUNT_RE = re.compile(r"^\d+$")


def _bad(spec: str, why: str) -> ValueError:
    return ValueError(f"parse: spec = {spec!r}: {why}. See staleness.cluster's docstring "
                      f"for the grammar, e.g. 'gtx1080ti*4,gtx1060*4+jitter=0.1'")


def _pnum(spec: str, what: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise _bad(spec, f"{what} {text!r} is not a number") from None


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


class Value:
    """The text after a modifier's ``NAME=``, split at ':' into `fields`, with parsers whose
    errors quote the whole spec: what a registered modifier's `build` reads."""

    def __init__(self, spec: str, key: str, text: str):
        self.spec, self.key, self.text = spec, key, text
        self.fields = [f.strip() for f in text.split(":")]

    def bad(self, why: str) -> ValueError:
        """The ValueError to raise for a bad value (it quotes the spec and points to the grammar)."""
        return _bad(self.spec, why)

    def count(self, lo: int, hi: int, what: str) -> None:
        """Refuse fewer than `lo` or more than `hi` fields (`what`: the keyword's grammar)."""
        if not lo <= len(self.fields) <= hi:
            raise self.bad(f"{self.key} takes {what}, got {self.text!r}")

    def number(self, i: int, what: str, default: float | None = None) -> float:
        """Field `i` as a float (`default` when there is no field `i`)."""
        if i >= len(self.fields) and default is not None:
            return default
        return _pnum(self.spec, f"{self.key} {what}", self.fields[i])

    def workers(self, i: int) -> list[int] | None:
        """Field `i` as worker ids ('all', or ids/ranges like '0-3,6'; None for all or no field)."""
        return _pworkers(self.spec, self.fields[i]) if i < len(self.fields) else None

    def bandwidth(self, i: int, what: str) -> float:
        """Field `i` as bytes per second (e.g. '1gbps', '100MB/s')."""
        try:
            return parse_bandwidth(self.fields[i], f"{self.key} {what}")
        except ValueError as e:
            raise self.bad(str(e)) from None

    def latency(self, i: int, what: str) -> float:
        """Field `i` as seconds (e.g. '5ms'); 0 when there is no field `i`."""
        if i >= len(self.fields):
            return 0.0
        try:
            return parse_latency(self.fields[i], f"{self.key} {what}")
        except ValueError as e:
            raise self.bad(str(e)) from None


class Keyword(NamedTuple):
    """A spec keyword: ``NAME=VALUE`` builds `build(cluster, Value)`; `grammar` is its value's
    grammar (e.g. ``SIGMA``) and `help` one line on what it does."""

    name: str
    build: Callable[[Cluster, Value], Cluster]
    grammar: str
    help: str = ""
    aliases: tuple[str, ...] = ()


_KEYWORDS: dict[str, Keyword] = {}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def register_modifier(name: str, build: Callable[[Cluster, Value], Cluster], grammar: str, help: str = "",
                      aliases: tuple[str, ...] = (), overwrite: bool = False) -> Keyword:
    """Give a cluster modifier its spec keyword: ``+NAME=VALUE`` calls `build(cluster, value)`
    (`value` a `Value`: fields, number, workers, bandwidth, latency, bad) for the cluster so
    far, which returns the cluster with the modifier (`cluster.with_modifier(...)`). The
    keyword's grammar, help and the "known" list of an unknown keyword come from here. A spec
    names a keyword of a module not imported yet as ``package.module:NAME=VALUE``."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"register_modifier: name = {name!r} must be lower-case letters, digits and '_', "
                         "starting with a letter")
    if not callable(build):
        raise TypeError(f"register_modifier: build = {build!r} must be a function (cluster, value) -> Cluster")
    for n in (name, *aliases):
        if n in _KEYWORDS and not overwrite and _KEYWORDS[n].build is not build:
            raise ValueError(f"register_modifier: {n!r} is already a cluster spec keyword; pass overwrite=True "
                             "to replace it")
    entry = Keyword(name, build, grammar, help, tuple(aliases))
    for n in (name, *aliases):
        _KEYWORDS[n] = entry
    return entry


def keywords() -> dict[str, Keyword]:
    """Every cluster spec keyword by name (aliases not repeated), built-ins first."""
    return {k: e for k, e in _KEYWORDS.items() if k == e.name}


def grammar() -> str:
    """The ``modifier :=`` rule of the spec grammar, one line per registered keyword."""
    lines = [f"'{e.name}=' {e.grammar}" + (f"    {e.help}" if e.help else "") for e in keywords().values()]
    return "modifier  := " + "\n           | ".join(lines)


def _keyword(spec: str, key: str) -> Keyword:
    if ":" in key:
        module, _, name = key.partition(":")
        try:
            specs.import_user_module(module, f"modifier {key!r}")
        except ValueError as e:
            raise _bad(spec, str(e)) from None
        if name not in _KEYWORDS:
            raise _bad(spec, f"importing {module!r} registered no modifier {name!r} (call "
                             "staleness.cluster.register_modifier(name, build, grammar) in it)")
        return _KEYWORDS[name]
    if key not in _KEYWORDS:
        raise _bad(spec, f"unknown modifier {key!r}; known: {', '.join(keywords())}, or package.module:name "
                         "of one your module registers")
    return _KEYWORDS[key]


def _parse_modifier(spec: str, c: Cluster, text: str) -> Cluster:
    key, eq, val = text.partition("=")
    key = key.strip().lower()
    if not eq or not val.strip():
        raise _bad(spec, f"modifier {text!r} must look like name=value")
    entry = _keyword(spec, key)
    return entry.build(c, Value(spec, key.rpartition(":")[2], val))


def _stragglers(c: Cluster, v: Value) -> Cluster:
    v.count(3, 4, "PROB:SLOWDOWN:DURATION[:WORKERS]")
    return c.stragglers(v.number(0, "prob"), v.number(1, "slowdown"), v.number(2, "duration"), v.workers(3))


def _periodic(c: Cluster, v: Value) -> Cluster:
    v.count(3, 5, "PERIOD:DURATION:SLOWDOWN[:WORKERS[:PHASE]]")
    return c.periodic(v.number(0, "period"), v.number(1, "duration"), v.number(2, "slowdown"), v.workers(3),
                      v.number(4, "phase", 0.0))


def _net(c: Cluster, v: Value) -> Cluster:
    # WORKERS may hold commas but no ':'; BANDWIDTH and LATENCY hold neither
    v.count(1, 3, "BANDWIDTH[:LATENCY[:WORKERS]], e.g. net=1gbps:5ms")
    return c.links(v.bandwidth(0, "bandwidth"), v.latency(1, "latency"), v.workers(2))


def _allreduce(c: Cluster, v: Value) -> Cluster:
    v.count(2, 3, "ring|tree:BANDWIDTH[:LATENCY], e.g. allreduce=ring:10gbps:1ms")
    algo = v.fields[0].lower()
    if algo not in ALGORITHMS:
        raise v.bad(f"allreduce algorithm {v.fields[0]!r} must be one of {', '.join(ALGORITHMS)}")
    return c.allreduce(algo, v.bandwidth(1, "bandwidth"), v.latency(2, "latency"))


def _failures(c: Cluster, v: Value) -> Cluster:
    events = []
    for ev in v.text.split(","):
        m = _EVENT_RE.match(ev.strip())
        if not m:
            raise v.bad(f"failure event {ev.strip()!r} must be WORKER@FAIL_AT[-REJOIN_AT], e.g. '3@100-200' or "
                        "'3@100'")
        events.append((int(m.group(1)), float(m.group(2)), None if m.group(3) is None else float(m.group(3))))
    return c.failures(events)


def _chaos(c: Cluster, v: Value) -> Cluster:
    v.count(2, 4, "MTBF:REPAIR[:CHIPS[:WORKERS]], e.g. chaos=3.15e7:60:1000")
    chips = v.number(2, "chips", 1.0)
    if chips != int(chips) or chips < 1:
        raise v.bad(f"chaos chips = {chips:g} must be an integer >= 1 (chips per learner)")
    return c.chaos(v.number(0, "mtbf"), v.number(1, "repair"), int(chips), v.workers(3))


def _elastic(c: Cluster, v: Value) -> Cluster:
    v.count(4, 6, "MTBF:REPAIR:CHIPS:SLICES[:RECONFIG[:WORKERS]], e.g. elastic=3.15e7:60:150000:600:5")
    counts = []
    for k, name in ((2, "chips"), (3, "slices")):
        n = v.number(k, name)
        if n != int(n) or n < 1:
            raise v.bad(f"elastic {name} = {n:g} must be an integer >= 1")
        counts.append(int(n))
    return c.elastic(v.number(0, "mtbf"), v.number(1, "repair"), *counts, v.number(4, "reconfig", 0.0), v.workers(5))


def _jitter(c: Cluster, v: Value) -> Cluster:
    v.count(1, 1, "SIGMA")
    return c.jitter(v.number(0, "sigma"))


def _network(c: Cluster, v: Value) -> Cluster:
    v.count(2, 3, "PUSH:PULL[:JITTER]")
    return c.network(v.number(0, "push"), v.number(1, "pull"), v.number(2, "jitter", 0.0))


def _server(c: Cluster, v: Value) -> Cluster:
    v.count(1, 2, "BANDWIDTH[:LATENCY], e.g. server=10gbps")
    return c.server(v.bandwidth(0, "bandwidth"), v.latency(1, "latency"))


register_modifier("jitter", _jitter, "SIGMA", "lognormal noise of mean 1 on every compute time")
register_modifier("stragglers", _stragglers, "PROB ':' SLOWDOWN ':' DURATION [ ':' WORKERS ]",
                  "random slow episodes")
register_modifier("periodic", _periodic, "PERIOD ':' DURATION ':' SLOWDOWN [ ':' WORKERS [ ':' PHASE ] ]",
                  "a slow window every PERIOD s")
register_modifier("network", _network, "PUSH ':' PULL [ ':' JITTER ]", "fixed transfer seconds")
register_modifier("net", _net, "BANDWIDTH [ ':' LATENCY [ ':' WORKERS ] ]", "per-worker links")
register_modifier("server", _server, "BANDWIDTH [ ':' LATENCY ]", "shared server link")
register_modifier("allreduce", _allreduce, "( 'ring' | 'tree' ) ':' BANDWIDTH [ ':' LATENCY ]", "collective cost")
register_modifier("chaos", _chaos, "MTBF ':' REPAIR [ ':' CHIPS [ ':' WORKERS ] ]",
                  "chips fail (mean MTBF s apart), a learner of CHIPS is down REPAIR s per failure")
register_modifier("elastic", _elastic, "MTBF ':' REPAIR ':' CHIPS ':' SLICES [ ':' RECONFIG [ ':' WORKERS ] ]",
                  "chips fail, a learner of CHIPS loses a slice for REPAIR s and goes on (RECONFIG s stalls)")
register_modifier("fail", _failures, "event ( ',' event )*", "several fail= layers combine (a union)",
                  aliases=("failures",))


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


_PLUS_RE = re.compile(r"(?<![0-9][eE])\+")


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
    base, *mods = _PLUS_RE.split(spec)   # not the '+' of an exponent: chaos=1e+06:30
    c = _parse_base(spec, base)
    for m in mods:
        if not m.strip():
            raise _bad(spec, "empty modifier between '+' signs")
        c = _parse_modifier(spec, c, m.strip())
    return c
