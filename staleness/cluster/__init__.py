"""Worker speed models: how long each worker takes per iteration.

A :class:`Cluster` is a small immutable value describing the workers of a
simulated (or delay-injected real) run: a *base* speed per worker, plus a stack
of *modifiers* (noise, stragglers, periodic slowdowns, the network, failures).
Composition methods return a new ``Cluster``; modifiers stack in the order
they were added and compose as wrappers: each one's sampler layer calls the
layer it wraps (:mod:`staleness.cluster.layers`). ``Cluster.sampler(seed)``
turns the description into a :class:`ClusterSampler`, the fast, seeded object
the simulator queries once per event.

Units: every time is in (simulated) seconds; iterations are counted per worker
from 0 (the worker's clock when it starts that iteration).

Bases (``Cluster.base``: a :class:`Seconds`, :class:`Gpus` or :class:`Trace`)::

    constant(8)                      8 workers, 1.0 s per iteration each
    heterogeneous([1, 1, 2.6, 2.6])  mean seconds per iteration, per worker
    gpus(["gtx1080ti"] * 4 + ["gtx1060"] * 4)   seconds / PRESETS[name]
    from_trace_csv("speeds.csv")     recorded per-iteration compute seconds

Modifiers (each returns a new Cluster; ``Cluster.modifiers`` holds them as
:class:`Jitter`, :class:`Stragglers`, :class:`Periodic`, :class:`Network`,
:class:`Links`, :class:`Server`, :class:`AllReduce`, :class:`Failures`)::

    .jitter(sigma)                       lognormal noise with mean 1
    .stragglers(prob, slowdown, duration, workers=None)
    .periodic(period, duration, slowdown, workers=None, phase=0.0)
    .network(push=0.0, pull=0.0, jitter=0.0)   a latency-only link
    .links(bandwidth, latency=0.0, workers=None) each worker's own link
    .server(bandwidth, latency=0.0)              the server's link, shared by concurrent transfers
    .allreduce('ring' | 'tree', bandwidth, latency=0.0)   synchronous rounds all-reduce
    .failures([(worker, fail_at, rejoin_at_or_None), ...])
    .chaos(mtbf, repair, chips)          a chip's failure takes its learner down
    .elastic(mtbf, repair, chips, slices, reconfig)   ... only its slice (the learner goes on)

Membership (:mod:`staleness.cluster.membership`): a worker is up only when every
layer has it up (``fail=3@10-50+fail=3@20-30`` keeps worker 3 down from 10 s to
50 s); :meth:`ClusterSampler.membership` generates the changes lazily,
``membership_events(until=)`` lists them.

Network model (:mod:`staleness.cluster.network`): a transfer of B bytes takes
latency + B / bandwidth. Bytes come from the caller
(``simulate_schedule(..., payload_bytes=, push_bytes=)``); without them every
transfer takes its latency only, as the plain ``network`` modifier does.

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
    modifier  := 'jitter=' SIGMA                    (grammar() lists every registered keyword)
               | 'stragglers=' PROB ':' SLOWDOWN ':' DURATION [ ':' WORKERS ]
               | 'periodic=' PERIOD ':' DURATION ':' SLOWDOWN [ ':' WORKERS [ ':' PHASE ] ]
               | 'network=' PUSH ':' PULL [ ':' JITTER ]          seconds
               | 'net=' BANDWIDTH [ ':' LATENCY [ ':' WORKERS ] ]  per-worker links
               | 'server=' BANDWIDTH [ ':' LATENCY ]              shared server link
               | 'allreduce=' ( 'ring' | 'tree' ) ':' BANDWIDTH [ ':' LATENCY ]
               | 'fail=' event ( ',' event )*       several fail= layers combine (a union)
    BANDWIDTH := NUMBER UNIT   UNIT: bps kbps mbps gbps (bits/s) or B/s kB/s MB/s GB/s (bytes/s)
    LATENCY   := NUMBER [ 's' | 'ms' | 'us' ]   a bare number is seconds
    event     := WORKER '@' FAIL_AT [ '-' [ REJOIN_AT ] ]   no REJOIN_AT: never rejoins
    WORKERS   := 'all' | range ( ',' range )*   with range := ID [ '-' ID ] (inclusive)

A new modifier gets its keyword with :func:`register_modifier` (ARCHITECTURE.md, recipe
3); a spec names one of a module not imported yet as ``package.module:NAME=VALUE``.

Examples: ``"gtx1080ti*4,gtx1060*4+jitter=0.1+stragglers=0.01:4:5"
"+network=0.01:0.01+periodic=100:10:3+fail=3@100-200"``;
``"1*8+net=1gbps:5ms+server=10gbps"`` (8 workers on 1 Gbit/s links of 5 ms
behind a 10 Gbit/s server link); ``"1*8+net=100mbps:20ms:4-7"`` (only workers
4..7 on slow links); ``"1*8+allreduce=ring:10gbps:1ms"``.

Determinism: every random draw for (worker, iteration) is a pure function of (seed, worker, stream,
iteration), each modifier owning its streams (numbered by its position in the stack). Draws come in blocks
of :data:`GROUP` workers x :data:`CHUNK` iterations, block (g, c) drawn from its own
``np.random.SeedSequence([seed, stream, g, c])`` on first use: neither the order of the queries (e.g.
after a worker rejoins) nor the number of workers changes a worker's draws, and blocks (rather than one
generator per worker) keep the ~12 us generator set-up affordable with many workers and few iterations.
Straggler episodes are the one piece of per-worker state (in simulated time): deterministic as long as
each worker's iterations are queried in order of their start times, as a simulator does.

Pure NumPy; nothing here imports JAX.
"""

# Re-exports: ``from staleness import cluster as C`` is the one import users need.
from staleness.cluster.bases import Gpus, Seconds, Trace
from staleness.cluster.model import Cluster, constant, default, gpus, heterogeneous
from staleness.cluster.modifiers import AllReduce, Failures, Jitter, Links, Network, Periodic, Server, Stragglers
from staleness.cluster.network import (SharedLink, allreduce_time, format_bandwidth, format_latency, parse_bandwidth,
                                       parse_latency)
from staleness.cluster.presets import PRESETS
from staleness.cluster.sampler import CHUNK, GROUP, ClusterSampler
from staleness.cluster.spec import grammar, keywords, parse, register_modifier, resolve
from staleness.cluster.trace import from_trace_csv

__all__ = [
    # the value, its constructors and its sampler
    "Cluster", "ClusterSampler", "constant", "default", "from_trace_csv", "gpus", "heterogeneous", "parse",
    "resolve", "register_modifier", "keywords", "grammar", "PRESETS", "CHUNK", "GROUP",
    # Cluster.base: one of these
    "Gpus", "Seconds", "Trace",
    # Cluster.modifiers: a tuple of these
    "AllReduce", "Failures", "Jitter", "Links", "Network", "Periodic", "Server", "Stragglers",
    # the network model
    "SharedLink", "allreduce_time", "format_bandwidth", "format_latency", "parse_bandwidth", "parse_latency",
]

# The submodules, documented by name (e.g. :mod:`staleness.cluster.network`).
_SUBMODULES = ("bases", "layers", "membership", "model", "modifiers", "network", "presets", "sampler", "spec",
               "trace")

# The term types were private (``_Failures``) while this package was a single
# module; the old names still resolve, for isinstance checks and for pickles
# made then, but are not listed by dir().
_FORMER_NAMES = {
    "_Seconds": Seconds, "_Gpus": Gpus, "_Trace": Trace,
    "_Jitter": Jitter, "_Stragglers": Stragglers, "_Periodic": Periodic, "_Network": Network,
    "_Links": Links, "_Server": Server, "_AllReduce": AllReduce, "_Failures": Failures,
}


def __getattr__(name):
    try:
        return _FORMER_NAMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__():
    return sorted([*__all__, *_SUBMODULES])
