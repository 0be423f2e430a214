"""An actor's rollout under in-flight weight updates in a real run (`rl_inflight`, `rl_partial`).

The actor decodes for its injected decode time (`Delays.compute`) while it takes the
versions the server publishes (`WorkerLink.newer`): it fetches each one (the real
transfer) and the version reaches it `Delays.pull` later, at the token the
simulator's rule gives (`staleness.sim.inflight.Decode`; partial rollouts also
pause the decode for the transfer and `refill` token-times). When the decode ends,
the rollout is generated with one version per segment (`Numerics.generate`, the
replay's `decode.sample(starts=)`), and the push carries the switches
(`Push.segments`) for the trace. The generation's own compute comes after the
decode window here (an accelerator's actor computes while it decodes).
"""

from __future__ import annotations

import threading
import time

import jax

from staleness.sim.inflight import Decode

__all__ = ["decode"]


def decode(worker: int, rel, params, link, numerics, device, delays, stopped: threading.Event, poll: float,
           clock=time.monotonic):
    """(loss, rollout, switches) of `worker`'s rollout of `rel` (a `Release`) started on
    `params` (its pulled version, on `device`) now, taking the versions the server
    publishes while it decodes; None if the run stopped meanwhile. switches: ((first
    decoded token, version), ...) after the pulled version."""
    it = rel.iteration
    start = clock()
    size = float(delays.sizes(worker, it))
    end = start + delays.compute(worker, it, start)
    tau = (end - start) / size if size > 0 else 0.0
    transfer = delays.pull(worker, it)
    d = Decode(start, end, size, 0.0 if delays.refill is None else transfer + delays.refill * tau)
    held = {rel.version: params}
    seen = rel.version
    while True:
        left = d.end - clock()
        if left <= 0:
            break
        if stopped.is_set():
            return None
        got = link.newer(worker, seen, min(left, poll))
        if got is None:
            continue
        seen, offer = got
        fetched = jax.block_until_ready(link.fetch(worker, offer))
        d.arrive(clock() + transfer, seen)
        if d.switches and d.switches[-1][1] == seen:
            held[seen] = fetched
    if stopped.is_set():
        return None
    switches = tuple(d.switches)
    versions = [params] + [held[v] for _, v in switches]
    loss, rollout = numerics.generate(versions, [0] + [k for k, _ in switches], worker, it, device)
    return loss, rollout, switches
