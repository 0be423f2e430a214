"""Cluster bases: the mean compute time of each worker before any modifier (``Cluster.base``).

Each base builds the bare workers' sampler layer (``layer()``) and writes itself back in the spec grammar
of :mod:`staleness.cluster` (``describe()``). The values are checked by the constructors, not here.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from staleness.infra.checks import format_number
from staleness.cluster import layers
from staleness.cluster.presets import PRESETS

__all__ = ["Gpus", "Seconds", "Trace"]


def _runs(values: Sequence, text) -> list[str]:
    """Spec items of `values`, each run of equal values as one ``TEXT*COUNT`` item
    (``TEXT`` alone for a run of one)."""
    items = []
    for v, run in itertools.groupby(values):
        n = len(list(run))
        items.append(text(v) + (f"*{n}" if n > 1 else ""))
    return items


@dataclass(frozen=True)
class Seconds:
    """Workers with given mean seconds per iteration (``"1,1,2.6,2.6"``, ``"8"``).

    Attributes:
      seconds: [W] mean compute seconds per iteration of each worker.
    """

    seconds: tuple[float, ...]

    def describe(self) -> str:
        """``"8"`` for 8 one-second workers, else the run-length list ``"1*4,2.6*4"``."""
        if all(s == 1.0 for s in self.seconds):
            return str(len(self.seconds))
        items = _runs(self.seconds, format_number)
        text = ",".join(items)
        if len(items) == 1 and "*" not in text and "." not in text and "e" not in text:
            text += "*1"  # "3" alone would read back as constant(3)
        return text

    def layer(self) -> layers.Layer:
        return layers.base_layer(self.seconds)


@dataclass(frozen=True)
class Gpus:
    """Workers named by GPU preset (``"gtx1080ti*4,gtx1060*4@0.5"``).

    Attributes:
      names: [W] preset names (keys of :data:`~staleness.cluster.PRESETS`).
      seconds: seconds per iteration of the reference GPU (gtx1080ti).
    """

    names: tuple[str, ...]
    seconds: float

    @property
    def per_worker(self) -> tuple[float, ...]:
        """[W] mean seconds per iteration: ``seconds / PRESETS[name]``."""
        return tuple(self.seconds / PRESETS[n] for n in self.names)

    def describe(self) -> str:
        text = ",".join(_runs(self.names, str))
        return text if self.seconds == 1.0 else f"{text}@{format_number(self.seconds)}"

    def layer(self) -> layers.Layer:
        return layers.base_layer(self.per_worker)


@dataclass(frozen=True)
class Trace:
    """Workers replaying recorded compute times (``"trace:speeds.csv"``).

    Attributes:
      path: the CSV file the times were read from (written back by ``describe``).
      seconds: [W][n_w] compute seconds of each worker's iterations; iteration
        i of worker w takes ``seconds[w][i % n_w]``.
    """

    path: str
    seconds: tuple[tuple[float, ...], ...]

    def describe(self) -> str:
        return f"trace:{self.path}"

    def layer(self) -> layers.Layer:
        return layers.base_layer(traces=self.seconds)
