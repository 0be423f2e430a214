"""The worker loop: wait at the gate, pull, compute, push, over and over.

One thread runs `worker_loop` per worker; JAX releases the GIL while a compiled
step runs, so workers on different devices overlap for real. Heterogeneity on
homogeneous hardware comes from the cluster models (`Delays`): a worker sleeps
its pull transfer after its parameters arrive, computes, sleeps until its
injected compute time has passed since its compute started (an iteration takes
max(real, injected) seconds) and sleeps its push transfer. A shared server link
is each transfer's bottleneck, not shared among concurrent transfers (the
simulator shares it). An actor with in-flight weight updates decodes through
`runtime.inflight`. Every sleep wakes up early when the run stops.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import traceback

import jax

from staleness.runtime import inflight
from staleness.runtime.messages import Push
from staleness.runtime.transport import WorkerLink

__all__ = ["Delays", "worker_loop", "summary", "failure_message", "POLL_SECONDS"]

POLL_SECONDS = 0.1  # how often an idle worker checks for a stop request


@dataclasses.dataclass
class Delays:
    """Injected delays of one run: a cluster sampler and a time scale.

    sampler: `Cluster.sampler(seed)`; its times are simulated seconds.
    time_scale: real seconds per simulated second (e.g. 0.01).
    t0: the run's start on the worker's `time.monotonic()` clock (seconds);
      the simulated start time of an iteration (stragglers, periodic windows)
      is (now - t0) / time_scale.
    """

    sampler: object
    time_scale: float
    t0: float = 0.0
    steps: tuple | None = None   # local-update methods: inner steps per iteration of each worker
    sizes: object = None         # asynchronous RL: sizes(worker, iteration) -> its rollout's steps (tokens)
    pull_bytes: int = 0          # bytes of a pull (the parameters) and of a push (the method's payload):
    push_bytes: int = 0          # a transfer takes latency + bytes / bandwidth, as in the simulator
    inflight: bool = False       # asynchronous RL with in-flight weight updates (`runtime.inflight`)
    refill: float | None = None  # partial rollouts: token-times an interruption re-prefills (None: none)

    def pull(self, worker: int, iteration: int) -> float:
        return self.sampler.transfer_time(worker, iteration, self.pull_bytes, "pull") * self.time_scale

    def compute(self, worker: int, iteration: int, now: float) -> float:
        sim_start = (now - self.t0) / self.time_scale
        steps = 1 if self.steps is None else self.steps[worker]
        if self.sizes is not None:
            steps = self.sizes(worker, iteration)
        return steps * self.sampler.compute_time(worker, iteration, sim_start) * self.time_scale

    def push(self, worker: int, iteration: int) -> float:
        return self.sampler.transfer_time(worker, iteration, self.push_bytes, "push") * self.time_scale


def _sleep_until(deadline: float, stopped: threading.Event) -> None:
    left = deadline - time.monotonic()
    if left > 0:
        stopped.wait(left)


def summary(e: BaseException, limit: int = 400) -> str:
    """One line naming an exception: its type, first line and, when its text spans
    several lines (e.g. an error raised inside a compiled step), its last line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    if len(lines) > 1:
        text += f" ... {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failure_message(e: BaseException) -> str:
    """What a worker that raised `e` reports (`WorkerFailed.message`): its one-line
    summary, then the traceback being handled."""
    return f"{summary(e)}\n{traceback.format_exc()}"


def worker_loop(worker: int, link: WorkerLink, numerics, device, delays: Delays | None = None) -> None:
    """Run `worker` on `device` until the link is stopped: the body of one worker thread.

    Any exception is reported to the server through `link.fail` (with the
    traceback) and ends this worker; the server then stops the run.
    """
    stopped = link.stopped
    clock = time.monotonic
    try:
        while not stopped.is_set():
            got = link.wait_release(worker, POLL_SECONDS)
            if got is None:
                continue
            rel, offer = got
            t_recv = clock()
            params = jax.block_until_ready(link.fetch(worker, offer))
            it = rel.iteration
            if delays is not None:
                _sleep_until(clock() + delays.pull(worker, it), stopped)
            t_start = clock()
            segments = ()
            if delays is not None and delays.inflight:   # an actor taking new versions mid-rollout
                out = inflight.decode(worker, rel, params, link, numerics, device, delays, stopped, POLL_SECONDS,
                                      clock)
                if out is None:
                    return
                loss, grad, segments = out
                jax.block_until_ready((loss, grad))
            else:
                loss, grad = numerics.gradient(params, worker, it, device)
                jax.block_until_ready((loss, grad))
                if delays is not None:
                    _sleep_until(t_start + delays.compute(worker, it, t_start), stopped)
            t_end = clock()
            if delays is not None:
                _sleep_until(t_end + delays.push(worker, it), stopped)
            if stopped.is_set():
                return
            t_sent = clock()
            link.push(Push(worker, it, rel.version, rel.epoch, t_sent - t_recv, t_sent - t_start, t_sent - t_end,
                           segments=segments), loss, grad)
    except BaseException as e:  # noqa: BLE001 - reported to the server, which re-raises it
        try:
            link.fail(worker, failure_message(e), e)
        finally:
            if not isinstance(e, Exception):
                raise
