"""Control messages between the server and its workers, whatever carries them.

Times inside a `Push` are durations on the worker's own clock, measured back
from the moment it sent the push (`since_recv`, `since_start`, `since_end`), so
worker and server clocks never need to agree (hosts do not share
`time.monotonic()`). The server knows when it released the worker and when the
push arrived; the difference minus `since_recv` is the time both messages spent
in transit, which it splits evenly between them (as NTP does) to place `start`
and `end` on its own clock.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NamedTuple

__all__ = ["Release", "Published", "from_server", "Push", "WorkerFailed", "WorkerLost", "WorkerJoined", "LateLoss",
           "RoundGradient", "STOP"]

STOP = -1  # worker id of a release that stops every worker of a process


@dataclasses.dataclass(frozen=True)
class Release:
    """Server -> worker: compute `iteration` (the worker's clock) on `version`.

    epoch: the worker's membership epoch; the server ignores a push whose epoch
      is stale (its worker was declared lost after it was released).
    handle: transport-specific reference to the offered parameters.
    """

    worker: int
    iteration: int
    version: int
    epoch: int
    handle: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.astuple(self))

    @classmethod
    def from_json(cls, text: str) -> "Release":
        return cls(*json.loads(text))


@dataclasses.dataclass(frozen=True)
class Published:
    """Server -> worker: version `version` is complete and offered to actor `worker` mid-rollout
    (in-flight weight updates); handle: transport-specific reference to the offered parameters.
    Travels on the release channel, which `from_server` reads."""

    worker: int
    version: int
    handle: int = 0

    def to_json(self) -> str:
        return json.dumps({"published": dataclasses.astuple(self)})


def from_server(text: str) -> "Release | Published":
    """A message of the server -> worker channel read back: a `Release` or a `Published`."""
    value = json.loads(text)
    if isinstance(value, dict):
        return Published(*value["published"])
    return Release(*value)


@dataclasses.dataclass(frozen=True)
class Push:
    """Worker -> server: the gradient of (worker, iteration) on `version` is ready.

    since_recv / since_start / since_end: seconds between receiving the release /
      compute start (parameters arrived) / compute end and sending this push, on
      the worker's clock (since_recv >= since_start >= since_end >= 0).
    handle: transport-specific reference to the offered (loss, gradient).
    error: set instead of a gradient when the worker raised: its message.
    segments: an actor's in-flight switches (`rl_inflight`, `rl_partial`): ((first decoded
      token, version), ...) of the versions that reached it mid-rollout (`inflight.Decode`).
    """

    worker: int
    iteration: int
    version: int
    epoch: int
    since_recv: float = 0.0
    since_start: float = 0.0
    since_end: float = 0.0
    handle: int = 0
    error: str | None = None
    segments: tuple = ()

    def to_json(self) -> str:
        return json.dumps(dataclasses.astuple(self))

    @classmethod
    def from_json(cls, text: str) -> "Push":
        *head, segments = json.loads(text)
        return cls(*head, tuple((int(k), int(v)) for k, v in segments))


@dataclasses.dataclass(frozen=True)
class WorkerFailed:
    """A worker raised: `message` is its error (type, text and traceback)."""

    worker: int
    message: str
    exception: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class WorkerLost:
    """A worker is gone (its process died or left); `reason` says how it was seen."""

    worker: int
    reason: str


@dataclasses.dataclass(frozen=True)
class WorkerJoined:
    """A lost worker is back (its process was restarted and rejoined the job);
    the server lets it in with `policy.join`. `reason` says how."""

    worker: int
    reason: str


class LateLoss(NamedTuple):
    """A gradient's loss still on the devices: element `index` of `array` (a round's
    losses), fetched later with others (`Server._settle`). (A NamedTuple: one per gradient.)"""

    array: Any
    index: int


class RoundGradient(NamedTuple):
    """A worker's gradient of collective round `round`: it never leaves the devices
    (the round's step sums it); the update applies the round's outputs."""

    round: int
