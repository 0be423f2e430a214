"""The Transport interface between the server and its workers, and the
in-process transport (threads of one process, tensors moved by `jax.device_put`).

The serve loop and the worker loop are written against `ServerLink` and
`WorkerLink` only, so a transport can be swapped without touching them:
`LocalTransport` here, `staleness.runtime.coordination` for several processes.
A release hands the worker an opaque offer that `fetch` turns into parameters
on its device, so the worker can time the message and the transfer apart. Every
blocking call takes a timeout (seconds) and returns None when it expires, so
that the caller can check for stop requests and liveness.
"""

from __future__ import annotations

import abc
import queue
import threading
from typing import Any, NamedTuple

import jax

from staleness.runtime.messages import Push, Release, WorkerFailed, WorkerLost

__all__ = ["Arrival", "ServerLink", "WorkerLink", "LocalTransport", "Event"]


class Arrival(NamedTuple):
    """A gradient at the server: its `Push` message, its loss as a Python float and its
    gradient pytree on the server's device (emitted only once both are there, so the
    server never waits on the worker that sent them). Collective rounds keep both on
    the devices: a `messages.LateLoss` and a `messages.RoundGradient`."""

    push: Push
    loss: Any
    grad: Any


Event = Arrival | WorkerFailed | WorkerLost


class ServerLink(abc.ABC):
    """The server's end of a transport. Besides the abstract methods, a transport may
    change what the serve loop does through the defaults below: `times_rounds` (True:
    the transport times out its own work, so the loop checks no per-worker deadlines)
    and `agreed_stop` (a status once set: the loop stops there)."""

    times_rounds = False
    agreed_stop: str | None = None
    rounds_ahead = 0   # rounds computed before the policy released them, then released (collectives)

    @abc.abstractmethod
    def release(self, msg: Release, params) -> None:
        """Let `msg.worker` start `msg.iteration` on `params` (version `msg.version`)."""

    @abc.abstractmethod
    def poll(self, timeout: float) -> Event | None:
        """The next event, or None if none came within `timeout` seconds."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Ask every worker to stop (idempotent, never blocks for long)."""

    def started(self, origin: float) -> None:
        """The serve loop's clock started: `origin` is the reading of the loop's clock
        at the run's time 0 (a resumed run's lies before now)."""

    def fetch(self, arrays: list) -> list:
        """Host copies of `arrays` (losses the loop fetches late, `Server._settle`)."""
        return jax.device_get(arrays)

    def finish(self) -> "WorkerLost | None":
        """Called once the loop stops serving: nothing is in flight here."""
        return None

    def publish(self, version: int, params, to: list[int]) -> None:
        """Version `version` (`params`) is complete: offer it to the actors `to`, which are
        mid-rollout on an older version (in-flight weight updates). Only transports whose
        `WorkerLink.newer` works are asked to."""
        raise NotImplementedError(f"{type(self).__name__} does not send versions to workers mid-rollout")


class WorkerLink(abc.ABC):
    """A worker's end of a transport (shared by the worker threads of a process)."""

    stopped: threading.Event  # set when the workers must stop

    @abc.abstractmethod
    def wait_release(self, worker: int, timeout: float) -> tuple[Release, Any] | None:
        """(release, offer), or None if no release came within `timeout` seconds."""

    @abc.abstractmethod
    def fetch(self, worker: int, offer) -> Any:
        """The offered parameters, on `worker`'s device (a pull)."""

    @abc.abstractmethod
    def push(self, msg: Push, loss, grad) -> None:
        """Send the gradient of `msg` (loss: scalar array; grad: params-shaped pytree)."""

    @abc.abstractmethod
    def fail(self, worker: int, message: str, exception: BaseException | None = None) -> None:
        """Report that `worker` raised (`message`: type, text and traceback)."""

    def newer(self, worker: int, version: int, timeout: float) -> tuple[int, Any] | None:
        """(v, offer) of a version v > `version` the server published to `worker`
        (`ServerLink.publish`), else None after `timeout` seconds: in-flight weight updates.
        Either the newest one, or, where every offer must be taken (the multi-process
        transport), the next one in order; `fetch(worker, offer)` takes it."""
        raise NotImplementedError(f"{type(self).__name__} does not send versions to workers mid-rollout")


class LocalTransport(ServerLink, WorkerLink):
    """Both ends in one process: queues for messages, `jax.device_put` for tensors.

    Args:
      server_device: where the server keeps parameters and receives gradients.
      worker_devices: [λ] the device of each worker (devices may repeat).
    """

    def __init__(self, server_device, worker_devices):
        self.server_device = server_device
        self.worker_devices = list(worker_devices)
        self._releases = [queue.SimpleQueue() for _ in self.worker_devices]
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.stopped = threading.Event()
        self._newest: tuple[int, Any] = (-1, None)    # the last published (version, params)
        self._published = threading.Condition()

    # -- server end ------------------------------------------------------------
    def release(self, msg: Release, params) -> None:
        self._releases[msg.worker].put((msg, params))

    def poll(self, timeout: float) -> Event | None:
        try:
            return self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def stop(self) -> None:
        self.stopped.set()
        with self._published:
            self._published.notify_all()

    def publish(self, version: int, params, to: list[int]) -> None:
        with self._published:   # every actor reads the newest: nothing is kept per actor
            self._newest = (version, params)
            self._published.notify_all()

    # -- worker end --------------------------------------------------------------
    def wait_release(self, worker: int, timeout: float):
        try:
            return self._releases[worker].get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def newer(self, worker: int, version: int, timeout: float):
        with self._published:
            if self._newest[0] <= version and not self.stopped.is_set():
                self._published.wait(max(timeout, 0.0))
            return self._newest if self._newest[0] > version else None

    def fetch(self, worker: int, offer):
        return jax.device_put(offer, self.worker_devices[worker])

    def push(self, msg: Push, loss, grad) -> None:
        # float(): the loss reaches the server as a host float, fetched here in the
        # worker's thread (the server's loop must not block on it).
        self._events.put(Arrival(msg, float(loss), jax.device_put(grad, self.server_device)))

    def fail(self, worker: int, message: str, exception: BaseException | None = None) -> None:
        self._events.put(WorkerFailed(worker, message, exception))

    def lose(self, worker: int, reason: str) -> None:
        """Report `worker` as lost (fault injection)."""
        self._events.put(WorkerLost(worker, reason))
