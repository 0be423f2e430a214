"""A user's cluster layer in its own file (ARCHITECTURE.md, recipe 3): periodic spot
preemption, with its spec keyword. `--cluster '1*4+user_clusters:preempt=3:40:10:5'`
imports this module; once imported, `preempt=...` works too."""

import dataclasses
import itertools

from staleness import cluster
from staleness.cluster import layers


@dataclasses.dataclass(frozen=True)
class Preempt:   # spot preemption: each of `workers` is down `down` s every `period` s, from `phase` s
    workers: tuple
    period: float
    down: float
    phase: float = 0.0

    def describe(self):
        return f"{__name__}:preempt={','.join(map(str, self.workers))}:{self.period:g}:{self.down:g}:{self.phase:g}"

    def wrap(self, inner, seed, stream):
        intervals = lambda: ((t, t + self.down) for t in (self.phase + k * self.period for k in itertools.count()))
        layer = layers.Layer(inner)
        layer.outages = inner.outages + tuple(layers.Outages(w, intervals, endless=True) for w in self.workers)
        return layer


def _preempt(c, v):
    v.count(3, 4, "WORKERS:PERIOD:DOWN[:PHASE]")
    period, down = v.number(1, "period"), v.number(2, "down")
    if not 0 < down < period:
        raise v.bad(f"preempt down = {down:g} must be > 0 and < period = {period:g}")
    return c.with_modifier(Preempt(tuple(v.workers(0) or range(c.num_workers)), period, down, v.number(3, "phase", 0.0)))


cluster.register_modifier("preempt", _preempt, "WORKERS ':' PERIOD ':' DOWN [ ':' PHASE ]",
                          "each of WORKERS down DOWN s every PERIOD s")
