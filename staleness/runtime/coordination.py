"""The multi-process transport: `jax.distributed`'s coordination service for
control messages and liveness, `jax.experimental.transfer` for tensors.

This is the one module that touches these young (partly private) APIs; tested
with jax/jaxlib 0.10.2 on CPU. Everything else in the runtime sees only the
`ServerLink` / `WorkerLink` interface of `staleness.runtime.transport`.

Layout (process 0 hosts the server; worker w lives on process w % N):

- Control messages are JSON strings in the coordination service's key-value
  store, one key per message on a per-process, per-direction sequence:
  `staleness/rel/{p}/...` (server -> process p: releases, or STOP) and
  `staleness/push/{p}/...` (process p -> server: pushes, or a worker's error).
  One dispatcher thread per direction and process reads its sequence with
  `blocking_key_value_get` (bounded: `POLL_MS`) and deletes what it read,
  a directory of `BLOCK` messages at a time.
- Tensors move point-to-point and pull-based through each process's transfer
  server: the sender offers arrays under a fresh id (`await_pull`), announces
  the id in the control message, and the receiver pulls them onto its device
  (`TransferConnection.pull`). A push is therefore an offer plus a pull by the
  server; a release is an offer by the server plus a pull by the worker.
  Offers always precede their announcement, so a pull only waits on a live
  peer; if the peer dies mid-pull, the pulling thread is abandoned (it is a
  daemon) while the server's own loop learns of the death from liveness.
- Liveness: `jax_enable_recoverability` is set before
  `jax.distributed.initialize(heartbeat_timeout_seconds=...)`, so one dead
  process no longer aborts the job; a monitor thread in every process calls
  the coordination client's `get_live_nodes` in a loop (it is a barrier over
  the live processes, so every process must keep calling it; a dead process
  drops out after the heartbeat timeout, a process that shut down drops out
  at once). The server turns a lost process into `WorkerLost` events for its
  workers; a worker process that loses process 0 stops.

`jax.experimental.transfer`'s own pull timeout is not used: it did not fire
on CPU in JAX 0.10 (see DESIGN.md); every wait here is bounded by the poll
timeout plus the liveness check instead.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import queue
import socket
import threading
import time

import jax
import jax.numpy as jnp

from staleness.runtime.messages import STOP, Push, Release, WorkerFailed, WorkerLost
from staleness.runtime.transport import Arrival, ServerLink, WorkerLink

__all__ = ["Coordination", "initialize", "DistributedServerLink", "DistributedWorkerLink", "POLL_MS"]

PREFIX = "staleness"
POLL_MS = 200          # longest single blocking read of the key-value store
LIVENESS_SECONDS = 0.2  # pause between liveness rounds
BLOCK = 256            # messages per key directory; a read block is deleted with one call


def _msg_key(kind: str, process: int, k: int) -> str:
    """Key of message k on a channel. Messages are grouped in directories of BLOCK
    so that reading them costs no delete call on the critical path."""
    return f"{kind}/{process}/{k // BLOCK}/{k % BLOCK}"


def _consumed(coord: "Coordination", kind: str, process: int, k: int) -> None:
    if k % BLOCK == BLOCK - 1:
        coord.delete(f"{kind}/{process}/{k // BLOCK}")


def _is_deadline(e: Exception) -> bool:
    return "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e)


def _local_host_for(coordinator: str) -> str:
    """The address of this host that reaches the coordinator (loopback for a local job)."""
    host = coordinator.rsplit(":", 1)[0].strip("[]")
    try:
        if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
            return "127.0.0.1"
    except (OSError, ValueError):
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))  # UDP: no packet is sent
        return s.getsockname()[0]


def initialize(coordinator: str, num_processes: int, process_id: int, *, heartbeat_timeout: int,
               init_timeout: int = 120) -> "Coordination":
    """Join the `jax.distributed` job (recoverable) and start this process's services.

    Must run before any other JAX operation of the process.
    """
    jax.config.update("jax_enable_recoverability", True)
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               heartbeat_timeout_seconds=int(heartbeat_timeout),
                               initialization_timeout=int(init_timeout))
    return Coordination(process_id, num_processes, _local_host_for(coordinator))


class Coordination:
    """This process's view of the job: key-value helpers, transfer server, liveness.

    Args:
      process_id, num_processes: of the `jax.distributed` job (already initialized).
      host: the address this process's transfer server binds and advertises.
    """

    def __init__(self, process_id: int, num_processes: int, host: str):
        from jax._src import distributed  # the coordination client has no public accessor
        from jax.experimental import transfer

        self.client = distributed.global_state.client
        if self.client is None:
            raise RuntimeError("jax.distributed is not initialized")
        self.process_id = process_id
        self.num_processes = num_processes
        device = jax.local_devices()[0]
        self.transfer = transfer.start_transfer_server(device.client, f"{host}:0", [f"{host}:0"])
        self.set(f"addr/{process_id}", self.transfer.address())
        self.live = set(range(num_processes))
        self._lost_listeners = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._liveness, name="staleness-liveness", daemon=True)
        self._monitor.start()
        self._ids = itertools.count(1)

    # -- key-value store ---------------------------------------------------------------
    def key(self, name: str) -> str:
        return f"{PREFIX}/{name}"

    def set(self, name: str, value: str) -> None:
        self.client.key_value_set(self.key(name), value)

    def get(self, name: str, timeout_ms: int = POLL_MS) -> str | None:
        """The value of `name`, or None if it is not set within `timeout_ms`."""
        try:
            return self.client.blocking_key_value_get(self.key(name), int(timeout_ms))
        except Exception as e:  # noqa: BLE001 - jaxlib raises a plain runtime error
            if _is_deadline(e):
                return None
            raise

    def delete(self, name: str) -> None:
        self.client.key_value_delete(self.key(name))

    def barrier(self, name: str, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until every process reached `name`."""
        self.client.wait_at_barrier(self.key(name), int(timeout * 1000))

    def address(self, process: int, timeout: float) -> str:
        value = self.get(f"addr/{process}", int(timeout * 1000))
        if value is None:
            raise TimeoutError(f"process {process} did not publish its transfer address within {timeout:g} s")
        return value

    def new_id(self) -> int:
        """A fresh transfer id (unique on this process's transfer server)."""
        return next(self._ids)

    # -- liveness ----------------------------------------------------------------------------
    def on_lost(self, callback) -> None:
        """Call `callback(process, reason)` when a process leaves the live set."""
        self._lost_listeners.append(callback)

    def is_live(self, process: int) -> bool:
        return process in self.live

    def _liveness(self) -> None:
        everyone = list(range(self.num_processes))
        while not self._stop.is_set():
            try:
                now_live = set(self.client.get_live_nodes(everyone))
            except Exception as e:  # noqa: BLE001 - the service is gone: everyone else is lost
                now_live = {self.process_id}
                reason = f"coordination service unreachable ({str(e).splitlines()[0][:120]})"
            else:
                reason = "process left the job (died or shut down; heartbeat timeout or disconnect)"
            with self._lock:
                gone = sorted(self.live - now_live)
                self.live = now_live
            for p in gone:
                for cb in self._lost_listeners:
                    cb(p, reason)
            if reason.startswith("coordination service unreachable"):
                return
            self._stop.wait(LIVENESS_SECONDS)

    def wait_others_left(self, timeout: float) -> bool:
        """Wait until this is the only live process (others shut down); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.live <= {self.process_id}:
                return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        """Leave the job: stop the liveness monitor, then disconnect."""
        self._stop.set()
        self._monitor.join(timeout=5.0)
        jax.distributed.shutdown()


def _avals(tree, device):
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


class DistributedServerLink(ServerLink):
    """The server's end on process 0.

    Args:
      coord: this process's Coordination.
      worker_process: [λ] the process of each worker.
      device: the server's device (gradients are pulled onto it).
      params_shape: a params-shaped pytree of arrays or ShapeDtypeStructs.
    """

    def __init__(self, coord: Coordination, worker_process: list[int], device, params_shape):
        self.coord = coord
        self.worker_process = list(worker_process)
        self.processes = sorted(set(worker_process))
        self._payload = (_avals(jax.ShapeDtypeStruct((), jnp.float32), device), _avals(params_shape, device))
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._seq = {p: 0 for p in self.processes}
        self._stopped = threading.Event()
        self._conns = {}
        coord.on_lost(self._lost)
        self._threads = [threading.Thread(target=self._receive, args=(p,), name=f"staleness-recv-{p}", daemon=True)
                         for p in self.processes]
        for t in self._threads:
            t.start()

    def _lost(self, process: int, reason: str) -> None:
        for w, p in enumerate(self.worker_process):
            if p == process:
                self._events.put(WorkerLost(w, f"process {process}: {reason}"))

    def _connection(self, process: int):
        if process not in self._conns:
            self._conns[process] = self.coord.transfer.connect(self.coord.address(process, 30.0))
        return self._conns[process]

    def _receive(self, process: int) -> None:
        seq = 0
        while not self._stopped.is_set() and self.coord.is_live(process):
            try:
                text = self.coord.get(_msg_key("push", process, seq))
            except Exception:  # noqa: BLE001 - service gone; liveness reports it
                return
            if text is None:
                continue
            _consumed(self.coord, "push", process, seq)
            seq += 1
            msg = Push.from_json(text)
            if msg.error is not None:
                self._events.put(WorkerFailed(msg.worker, msg.error))
                continue
            try:
                loss, grad = self._connection(process).pull(msg.handle, self._payload)
            except Exception as e:  # noqa: BLE001 - the peer died mid-transfer
                self._events.put(WorkerLost(msg.worker, f"process {process}: pull failed ({str(e)[:200]})"))
                return
            self._events.put(Arrival(msg, loss, grad))

    def release(self, msg: Release, params) -> None:
        handle = self.coord.new_id()
        self.coord.transfer.await_pull(handle, params)
        p = self.worker_process[msg.worker]
        if not self.coord.is_live(p):
            return
        k = self._seq[p]
        self._seq[p] = k + 1
        rel = Release(msg.worker, msg.iteration, msg.version, msg.epoch, handle)
        self.coord.set(_msg_key("rel", p, k), rel.to_json())

    def poll(self, timeout: float):
        try:
            return self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        for p in self.processes:
            if self.coord.is_live(p):
                k = self._seq[p]
                self._seq[p] = k + 1
                try:
                    self.coord.set(_msg_key("rel", p, k), Release(STOP, 0, 0, 0).to_json())
                except Exception:  # noqa: BLE001 - best effort: a dead process needs no stop
                    pass


class DistributedWorkerLink(WorkerLink):
    """The end shared by the worker threads of one process.

    Args:
      coord: this process's Coordination.
      worker_devices: {worker: device} of the workers hosted here.
      params_shape: a params-shaped pytree (arrays or ShapeDtypeStructs).
      server_process: the process hosting the server (0).
    """

    def __init__(self, coord: Coordination, worker_devices: dict, params_shape, server_process: int = 0):
        self.coord = coord
        self.devices = dict(worker_devices)
        self.server_process = server_process
        self.stopped = threading.Event()
        self.server_lost: str | None = None
        self._avals = {w: _avals(params_shape, d) for w, d in self.devices.items()}
        self._queues = {w: queue.SimpleQueue() for w in self.devices}
        self._push_lock = threading.Lock()
        self._push_seq = 0
        self._local = threading.local()
        coord.on_lost(self._lost)
        self._dispatcher = threading.Thread(target=self._dispatch, name="staleness-dispatch", daemon=True)
        self._dispatcher.start()

    def _lost(self, process: int, reason: str) -> None:
        if process == self.server_process:
            self.server_lost = reason
            self.stopped.set()

    def _dispatch(self) -> None:
        me = self.coord.process_id
        seq = 0
        while not self.stopped.is_set():
            try:
                text = self.coord.get(_msg_key("rel", me, seq))
            except Exception as e:  # noqa: BLE001 - the service (process 0) is gone
                self.server_lost = f"coordination service unreachable ({str(e).splitlines()[0][:120]})"
                self.stopped.set()
                return
            if text is None:
                continue
            _consumed(self.coord, "rel", me, seq)
            seq += 1
            msg = Release.from_json(text)
            if msg.worker == STOP:
                self.stopped.set()
                return
            self._queues[msg.worker].put(msg)

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.coord.transfer.connect(self.coord.address(self.server_process, 30.0))
        return conn

    def wait_release(self, worker: int, timeout: float):
        try:
            msg = self._queues[worker].get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        return msg, msg.handle

    def fetch(self, worker: int, offer):
        return self._connection().pull(offer, self._avals[worker])

    def _send(self, msg: Push) -> None:
        with self._push_lock:
            k = self._push_seq
            self._push_seq = k + 1
            self.coord.set(_msg_key("push", self.coord.process_id, k), msg.to_json())

    def push(self, msg: Push, loss, grad) -> None:
        handle = self.coord.new_id()
        self.coord.transfer.await_pull(handle, (loss, grad))
        self._send(dataclasses.replace(msg, handle=handle))

    def fail(self, worker: int, message: str, exception: BaseException | None = None) -> None:
        self._send(Push(worker, 0, 0, 0, error=message[-8000:]))
