"""Which token of a decoding rollout a new version reaches: in-flight weight updates.

One rule for the simulator (`sim`) and the real actors (`runtime.inflight`). An actor
decodes `size` tokens (its rollout's size in the simulator's units, prefill included) of
`tau` seconds each from `start`. A version that reaches it at `arrive` is taken before the
first token that starts at or after `arrive` (the token in progress finishes), so the
rollout's tokens from there on are that version's: a switch (first decoded token,
version). Two versions before the same token: the newer one decodes it. A version that
arrives by the decode's start costs nothing: the rollout starts on it (token 0).

PipelineRL's in-flight updates (`pause` = 0): the transfer overlaps the decode, the
rollout's end does not move. AReaL's partial rollouts (`pause` > 0): each such version
interrupts the decode, which pauses `pause` seconds (weight load and re-prefill) before the
token, so every later token starts later; the index of the token a version reaches is
counted on the decode's own clock (a version arriving during a pause interrupts again,
before the same token).

    d = Decode(start, end, size, pause)
    d.arrive(t, v)      # True if it paused the decode (its `end` moved)
    d.switches          # [(first decoded token, version), ...]

Arrivals must come in time order.
"""

from __future__ import annotations

import math

__all__ = ["Decode"]


class Decode:
    """One rollout's decode: `size` tokens from `start` to `end` (without pauses), each
    version arriving mid-decode pausing it `pause` seconds (0: in-flight, no pause)."""

    __slots__ = ("start", "end0", "size", "tau", "pause", "paused", "switches")

    def __init__(self, start: float, end: float, size: float, pause: float = 0.0):
        self.start, self.end0, self.size, self.pause = start, end, size, pause
        self.tau = (end - start) / size if size > 0 else 0.0
        self.paused = 0                         # interruptions so far
        self.switches: list = []                # [(first decoded token, version), ...]

    @property
    def end(self) -> float:
        """When its last token is decoded, after the pauses so far."""
        return self.end0 + self.paused * self.pause

    def arrive(self, when: float, version: int) -> bool:
        """`version` reaches the actor at `when` (not before an earlier arrival): record its
        switch; True if it paused the decode (`end` moved later)."""
        if when >= self.end or self.tau <= 0.0:
            return False
        if when <= self.start:   # before its first token: it starts on the new version, nothing to redo
            self._switch(0, version)
            return False
        k = max(self.switches[-1][0] if self.switches else 0,
                math.ceil((when - self.start - self.paused * self.pause) / self.tau))
        if k >= self.size:
            return False
        self._switch(k, version)
        self.paused += 1
        return self.pause > 0.0

    def _switch(self, k: int, version: int) -> None:
        if self.switches and self.switches[-1][0] == k:
            self.switches[-1] = (k, version)   # again before the same token: the newer one decodes it
        else:
            self.switches.append((k, version))
