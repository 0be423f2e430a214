"""Workers without worker threads: the server's thread dispatches their steps.

A run at the hardware's speed (no cluster: nothing to sleep) needs no thread per
worker: JAX dispatches asynchronously, and one Python thread driving every device
is how a JAX program uses several devices. Worker threads dispatching their own
steps compete for the GIL and the host's cores (digits-mlp on 8 virtual CPU
devices, 2 cores: 8 threads computed about 950 gradients/s in all, one thread
dispatching for every device about 4,000-5,000).

On CPU, XLA runs a small program inline in the dispatching thread, so a step that
hangs there holds the serve loop (its deadlines then cannot fire); on
accelerators dispatch returns at once and a hung step is a silent worker.
"""

from __future__ import annotations

import time

import jax

from staleness.runtime.messages import Push, Release, WorkerFailed
from staleness.runtime.transport import Arrival, Event, ServerLink
from staleness.runtime.worker import failure_message

__all__ = ["DispatchTransport", "PAUSE_SECONDS"]

PAUSE_SECONDS = 5e-4  # longest sleep between two looks at the dispatched steps


class DispatchTransport(ServerLink):
    """The serve loop's thread dispatches every worker's step: a release dispatches the
    pull, the gradient and the push onto the server's device without waiting; `poll`
    hands over the first step computed (`is_ready`, oldest first) as an `Arrival`. A
    step that raises (at dispatch or on the device) is the worker's `WorkerFailed`.

    Args:
      numerics: the run's `Numerics` (its jitted gradient).
      server_device: where gradients are pushed (a device, or a pytree of shardings).
      worker_devices: [λ] the device of each worker (devices may repeat).
"""

    def __init__(self, numerics, server_device, worker_devices):
        self.numerics = numerics
        self.server_device = server_device
        self.worker_devices = list(worker_devices)
        self._pending: dict[int, tuple] = {}   # worker -> (release, dispatch time, loss, grad), in dispatch order
        self._failed: list[WorkerFailed] = []

    def release(self, msg: Release, params) -> None:
        w = msg.worker
        device = self.worker_devices[w]
        t_recv = time.monotonic()
        try:
            pulled = jax.device_put(params, device)
            loss, grad = self.numerics.gradient(pulled, w, msg.iteration, device)
            grad = jax.device_put(grad, self.server_device)
        except Exception as e:  # noqa: BLE001 - the worker's failure, reported as a worker thread's
            self._failed.append(_failure(w, e))
            return
        self._pending[w] = (msg, t_recv, loss, grad)

    def poll(self, timeout: float) -> Event | None:
        deadline = time.monotonic() + max(timeout, 0.0)
        pause = 0.0
        while True:
            if self._failed:
                return self._failed.pop(0)
            for w, (msg, t_recv, loss, grad) in self._pending.items():
                if loss.is_ready() and all(x.is_ready() for x in jax.tree.leaves(grad)):
                    del self._pending[w]
                    return self._arrival(w, msg, t_recv, loss, grad)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            pause = min(2 * pause + 2e-5, PAUSE_SECONDS, left)
            time.sleep(pause)   # releases the GIL for the dispatched steps

    def _arrival(self, w, msg, t_recv, loss, grad):
        try:
            loss = float(loss)   # ready: the loss reaches the serve loop as a host float
        except Exception as e:  # noqa: BLE001 - a step that raised on the device
            return _failure(w, e)
        since = time.monotonic() - t_recv   # dispatched at the release: no wait before the pull
        return Arrival(Push(w, msg.iteration, msg.version, msg.epoch, since, since, 0.0), loss, grad)

    def stop(self) -> None:
        self._pending.clear()


def _failure(worker: int, e: BaseException) -> WorkerFailed:
    return WorkerFailed(worker, failure_message(e), e)
