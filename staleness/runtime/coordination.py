"""The multi-process transport: `jax.distributed`'s coordination service for
control messages and liveness, `jax.experimental.transfer` for tensors.

The one module that touches these young (partly private) APIs; tested with
jax/jaxlib 0.10.2 on CPU. The rest of the runtime sees only `ServerLink` /
`WorkerLink` (`staleness.runtime.transport`). Process 0 hosts the server;
worker w lives on process w % N.

- The coordination service runs in a small child process of process 0
  (`_ServiceProcess`): a JAX 0.10.2 client whose service disappears aborts its
  process (SIGABRT within milliseconds; the Python `missed_heartbeat_callback`
  crashes with std::bad_cast). With the service outside, the death of process 0
  is an ordinary task failure the others see through liveness. The service
  leaves after process 0 once no other client is connected (`_service_linger`).
- Incarnations: 1 at the job's start, incremented in the key-value store each
  time a process with the same id starts again. Channels and transfer addresses
  are per incarnation, so a restarted process rejoins on fresh channels.
- Control messages are JSON strings in the key-value store, one key per message
  on a per-process, per-incarnation sequence: `staleness/rel/{p}.{inc}/...`
  (server -> process p: releases, or STOP) and `staleness/push/{p}.{inc}/...`
  (pushes, or a worker's error). One thread per direction and process reads its
  sequence (`blocking_key_value_get`, bounded by `POLL_MS`) and deletes what it
  read, `BLOCK` messages at a time.
- Tensors move pull-based through each process's transfer server: the sender
  offers arrays under a fresh id (`await_pull`) before it announces the id, and
  the receiver pulls them (`TransferConnection.pull`). A pull returns before the
  data arrived and its arrays fail later if the peer dies, so the server's
  receiving thread waits until (loss, gradient) are materialized: a failed pull
  becomes `WorkerLost`, and nothing the Result needs is fetched from a peer
  later. A pull that never returns abandons its (daemon) thread.
- Liveness: `jax_enable_recoverability` is set, so one dead process does not
  abort the job; a monitor thread in every process calls `get_live_nodes` in a
  loop (a barrier over the live processes: every process must keep calling
  it). A dead process drops out after the heartbeat timeout, one that shut down
  at once; a restarted one comes back with a new incarnation id. The server
  turns a lost process into `WorkerLost` for its workers and a rejoined one (it
  announces `join/{p}` once compiled) into `WorkerJoined`; a worker process that
  loses process 0 stops.

`jax.experimental.transfer`'s own pull timeout did not fire on CPU in JAX 0.10
(DESIGN.md): every wait here is bounded by the poll timeout plus liveness.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp

from staleness.runtime.errors import RunFailure
from staleness.runtime.messages import (STOP, Published, Push, Release, WorkerFailed, WorkerJoined, WorkerLost,
                                        from_server)
from staleness.runtime.transport import Arrival, ServerLink, WorkerLink

__all__ = ["Coordination", "initialize", "DistributedServerLink", "DistributedWorkerLink", "POLL_MS"]

PREFIX = "staleness"
POLL_MS = 200            # longest single blocking read of the key-value store
LIVENESS_SECONDS = 0.2   # pause between liveness rounds
JOIN_POLL_SECONDS = 0.25  # how often the server looks for restarted processes
BLOCK = 256              # messages per key directory; a read block is deleted with one call
SERVICE_START_SECONDS = 60.0  # how long process 0 waits for its coordination service to listen
SERVICE_STOP_SECONDS = 5.0    # how long process 0's shutdown waits for the service to leave
SERVICE_LINGER_SECONDS = 60.0  # the service outlives process 0 by at most this (or 4 heartbeats, if longer)


def _service_linger(heartbeat_timeout: int) -> float:
    """Longest time the service outlives process 0 (dead or shut down), waiting
    for the other processes to notice (about a heartbeat timeout) and leave."""
    return max(SERVICE_LINGER_SECONDS, 4.0 * heartbeat_timeout)


def _msg_key(kind: str, process: int, incarnation: int, k: int) -> str:
    """Key of message k on a channel. Messages are grouped in directories of BLOCK
    so that reading them costs no delete call on the critical path."""
    return f"{kind}/{process}.{incarnation}/{k // BLOCK}/{k % BLOCK}"


def _consumed(coord: "Coordination", kind: str, process: int, incarnation: int, k: int) -> None:
    if k % BLOCK == BLOCK - 1:
        coord.delete(f"{kind}/{process}.{incarnation}/{k // BLOCK}")


def _is_deadline(e: Exception) -> bool:
    return "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e)


def _first_line(e: BaseException, limit: int = 200) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return (lines[0] if lines else type(e).__name__)[:limit]


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


# -- the coordination service, in a process of its own ---------------------------------------
# Runs with `python -c`, importing jaxlib only (a quarter of a second). On 'stop' or end-of-file
# on its stdin (process 0 shut down or died) it stays until no other client is connected (its
# accepted TCP connections in /proc/net, less process 0's), at most `linger` seconds, so that a
# process still running can see the job end and exit with a message instead of a JAX abort.
_SERVICE_PROGRAM = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to process 0, which stops us
bind, num_processes, heartbeat, port, linger = sys.argv[1:6]
port, parent = int(port), os.getppid()
try:
    from jaxlib import _jax
    service = _jax.get_distributed_runtime_service(bind, int(num_processes), heartbeat_timeout=int(heartbeat),
                                                   recoverable=True)
except Exception as e:
    print("error " + ((str(e).strip().splitlines() or [type(e).__name__])[0]), flush=True)
    os._exit(1)
print("ready", flush=True)

def sockets(pid):
    found = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                found.add(link[8:-1])
    except OSError:
        pass
    return found

def others():
    # clients connected to the service, other than process 0; -1 if unknown
    accepted, own, mine = 0, 0, sockets(parent)
    try:
        for name in ("/proc/net/tcp", "/proc/net/tcp6"):
            if not os.path.exists(name):
                continue
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] != "01":
                        continue
                    if int(fields[1].rsplit(":", 1)[1], 16) == port:
                        accepted += 1
                    elif int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in mine:
                        own += 1
    except (OSError, ValueError, IndexError, StopIteration):
        return -1
    return accepted - own

sys.stdin.readline()
deadline = time.monotonic() + float(linger)
quiet = 0
while quiet < 3 and time.monotonic() < deadline:
    quiet = quiet + 1 if others() == 0 else 0
    time.sleep(0.1)
os._exit(0)
"""


class _ServiceProcess:
    """The job's coordination service, run by process 0 in a child process.

    Args:
      port: the coordinator's port (bound on every address, as JAX does, unless
        JAX_COORDINATOR_BIND_ADDRESS says otherwise).
      num_processes: the job's size.
      heartbeat_timeout: seconds (the clients use the same).
    """

    def __init__(self, port: int, num_processes: int, heartbeat_timeout: int):
        bind = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS", f"[::]:{port}")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVICE_PROGRAM, bind, str(num_processes), str(heartbeat_timeout), str(port),
             str(_service_linger(heartbeat_timeout))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = ""
        ready, _, _ = select.select([self.proc.stdout], [], [], SERVICE_START_SECONDS)
        if ready:
            line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            self.proc.wait(timeout=10.0)
            why = line[len("error "):] if line.startswith("error ") else f"no answer within {SERVICE_START_SECONDS:g} s"
            raise RunFailure(f"process 0 could not start the coordination service on {bind}: {why} (is "
                               "another job, or an earlier process 0 of this job, still using the port? "
                               "process 0 cannot rejoin a running job: restart the whole job, with --resume "
                               "from a checkpoint to continue)")

    def stop(self, wait: float = SERVICE_STOP_SECONDS) -> None:
        """Process 0 shuts down: the service leaves once no other process is connected.
        Waits at most `wait` seconds for that (then it leaves by itself, later)."""
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def _connect(coordinator: str, num_processes: int, process_id: int, heartbeat_timeout: int,
             init_timeout: int) -> None:
    """`jax.distributed.initialize` without starting a service in this process
    (it fills the same `global_state`, so the CPU backend, `jax.process_index()`
    and `jax.distributed.shutdown()` work as usual)."""
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("the multi-process runtime must be initialized before any JAX operation "
                           "(jax.devices, jax.device_put, any computation) in this process")
    state = distributed.global_state
    if state.client is not None:
        raise RuntimeError("jax.distributed is already initialized in this process")
    client = _jax.get_distributed_runtime_client(coordinator, process_id, init_timeout=int(init_timeout),
                                                 use_compression=True, heartbeat_timeout=int(heartbeat_timeout))
    client.connect()
    state.coordinator_address = coordinator
    state.process_id = process_id
    state.num_processes = num_processes
    state.client = client
    state.initialize_preemption_sync_manager()


def _wait_for_service(coordinator: str, timeout: float) -> None:
    """Wait until the coordinator accepts TCP connections. (A JAX 0.10.2 client
    that cannot register aborts its process after its init timeout, SIGABRT, so
    an unreachable coordinator is reported here instead, as a RunFailure.)"""
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RunFailure(f"no coordination service at {coordinator} within {timeout:g} s ({e}): "
                                 "process 0 has not started, or the job is over") from None
            time.sleep(0.2)


def initialize(coordinator: str, num_processes: int, process_id: int, *, heartbeat_timeout: int,
               init_timeout: int = 120) -> "Coordination":
    """Join the `jax.distributed` job (recoverable) and start this process's services.

    Process 0 first starts the coordination service (in a child process); the
    others wait (at most `init_timeout` seconds) until it listens. Must run
    before any other JAX operation of the process. Raises `RunFailure` if the
    service cannot be started or reached.
    """
    jax.config.update("jax_enable_recoverability", True)
    service = None
    if process_id == 0:
        service = _ServiceProcess(int(coordinator.rsplit(":", 1)[1]), num_processes, int(heartbeat_timeout))
    else:
        _wait_for_service(coordinator, init_timeout)
    try:
        _connect(coordinator, num_processes, process_id, heartbeat_timeout, init_timeout)
        return Coordination(process_id, num_processes, _local_host_for(coordinator), service)
    except BaseException:
        if service is not None:
            service.stop()
        raise


class Coordination:
    """This process's view of the job: key-value helpers, transfer server, liveness.

    Args:
      process_id, num_processes: of the `jax.distributed` job (already initialized).
      host: the address this process's transfer server binds and advertises.
      service: process 0's `_ServiceProcess` (stopped by `shutdown`), else None.

    Attributes:
      incarnation: 1 for a process of the job's start, k for its (k-1)-th restart.
      live: {process: JAX incarnation id} of the live processes (id None until seen).
      declared_dead: the service counts this process as dead (e.g. it was paused
        longer than the heartbeat timeout); it cannot come back in-process.
    """

    def __init__(self, process_id: int, num_processes: int, host: str, service: _ServiceProcess | None = None):
        from jax._src import distributed  # the coordination client has no public accessor
        from jax.experimental import transfer

        self.client = distributed.global_state.client
        if self.client is None:
            raise RuntimeError("jax.distributed is not initialized")
        self.process_id = process_id
        self.num_processes = num_processes
        self.service = service
        self.incarnation = int(self.client.key_value_increment(self.key(f"incarnation/{process_id}"), 1))
        device = jax.local_devices()[0]
        self.transfer = transfer.start_transfer_server(device.client, f"{host}:0", [f"{host}:0"])
        self.set(f"addr/{process_id}.{self.incarnation}", self.transfer.address())
        self.live: dict[int, int | None] = {p: None for p in range(num_processes)}
        self.declared_dead = False
        self._seen_self = threading.Event()
        self._lost_listeners = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._liveness, name="staleness-liveness", daemon=True)
        self._monitor.start()
        self._ids = itertools.count(1)

    # -- key-value store ---------------------------------------------------------------
    def key(self, name: str) -> str:
        return f"{PREFIX}/{name}"

    def set(self, name: str, value: str, overwrite: bool = False) -> None:
        self.client.key_value_set(self.key(name), value, allow_overwrite=overwrite)

    def get(self, name: str, timeout_ms: int = POLL_MS) -> str | None:
        """The value of `name`, or None if it is not set within `timeout_ms`."""
        try:
            return self.client.blocking_key_value_get(self.key(name), int(timeout_ms))
        except Exception as e:  # noqa: BLE001 - jaxlib raises a plain runtime error
            if _is_deadline(e):
                return None
            raise

    def try_get(self, name: str) -> str | None:
        """The value of `name`, or None if it is not set (never waits)."""
        try:
            return self.client.key_value_try_get(self.key(name))
        except Exception as e:  # noqa: BLE001
            if "NOT_FOUND" in str(e):
                return None
            raise

    def delete(self, name: str) -> None:
        self.client.key_value_delete(self.key(name))

    def barrier(self, name: str, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until every process reached `name`."""
        self.client.wait_at_barrier(self.key(name), int(timeout * 1000))

    def address(self, process: int, incarnation: int, timeout: float) -> str:
        value = self.get(f"addr/{process}.{incarnation}", int(timeout * 1000))
        if value is None:
            raise TimeoutError(f"process {process} did not publish its transfer address within {timeout:g} s")
        return value

    def new_id(self) -> int:
        """A fresh transfer id (unique on this process's transfer server)."""
        return next(self._ids)

    # -- rejoining -----------------------------------------------------------------------------
    @property
    def rejoining(self) -> bool:
        """True in a restarted process (it joins a running job instead of starting one)."""
        return self.incarnation > 1

    def announce_join(self, timeout: float = 30.0) -> None:
        """Tell the server that this restarted process is ready for its workers' releases."""
        self._seen_self.wait(timeout)  # our JAX incarnation id, so the server can tell us from our predecessor
        self.set(f"join/{self.process_id}", f"{self.incarnation} {self.live.get(self.process_id)}", overwrite=True)

    # -- liveness ----------------------------------------------------------------------------
    def on_lost(self, callback) -> None:
        """Call `callback(process, reason, jax_incarnation)` when a process leaves the live set
        (jax_incarnation: the id of the incarnation that left, None if unknown)."""
        self._lost_listeners.append(callback)

    def is_live(self, process: int) -> bool:
        return process in self.live

    def _notify(self, gone, reason_of) -> None:
        for p, inc in gone:
            for cb in self._lost_listeners:
                cb(p, reason_of(p), inc)

    def _liveness(self) -> None:
        me = self.process_id
        everyone = list(range(self.num_processes))
        while not self._stop.is_set():
            try:
                now_live = dict(self.client.get_live_nodes(everyone))
            except Exception as e:  # noqa: BLE001 - the service is gone (or refuses us): everyone else is lost
                with self._lock:
                    gone = [(p, inc) for p, inc in self.live.items() if p != me]
                    self.live = {me: self.live.get(me)}
                self._notify(gone, lambda p: f"coordination service unreachable ({_first_line(e, 120)})")
                return
            if me not in now_live:  # the service declared this process dead (it missed heartbeats)
                self.declared_dead = True
                with self._lock:
                    gone = [(p, inc) for p, inc in self.live.items() if p != me]
                    self.live = {me: None}
                self._notify(gone, lambda p: "this process was declared dead by the coordination service "
                             "(it missed heartbeats, e.g. it was paused longer than the heartbeat timeout)")
                return
            with self._lock:
                gone = [(p, inc) for p, inc in self.live.items()
                        if p not in now_live or (inc is not None and now_live[p] != inc)]
                self.live = now_live
            self._seen_self.set()
            self._notify(gone, lambda p: "process restarted" if p in now_live else
                         "process left the job (died or shut down; heartbeat timeout or disconnect)")
            self._stop.wait(LIVENESS_SECONDS)

    def wait_others_left(self, timeout: float) -> bool:
        """Wait until this is the only live process (others shut down); False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if set(self.live) <= {self.process_id}:
                return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        """Leave the job: stop the liveness monitor, disconnect, and (process 0) stop the service."""
        self._stop.set()
        self._monitor.join(timeout=5.0)
        try:
            jax.distributed.shutdown()
        finally:
            if self.service is not None:
                self.service.stop()


def _avals(tree, device):
    sharding = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


class DistributedServerLink(ServerLink):
    """The server's end on process 0: per process the incarnation it serves and whether
    that one is alive, a receiving thread per served incarnation, and a watcher
    thread that lets restarted processes back in.

    Args:
      coord: this process's Coordination.
      worker_process: [λ] the process of each worker.
      device: the server's device (pushes are pulled onto it).
      push_shape: what a worker pushes beside its loss (`Numerics.push_shape`).
    """

    def __init__(self, coord: Coordination, worker_process: list[int], device, push_shape):
        self.coord = coord
        self.worker_process = list(worker_process)
        self.processes = sorted(set(worker_process))
        self._payload = (_avals(jax.ShapeDtypeStruct((), jnp.float32), device), _avals(push_shape, device))
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._inc = {p: 1 for p in self.processes}          # incarnation served
        self._jax_id = {p: None for p in self.processes}    # its JAX incarnation id, when known
        self._alive = {p: True for p in self.processes}
        self._seq = {p: 0 for p in self.processes}          # next release message on its channel
        self._stopped = threading.Event()
        self._conns = {}
        coord.on_lost(self._lost)
        for p in self.processes:
            self._start_receiver(p, 1)
        threading.Thread(target=self._watch_joins, name="staleness-joins", daemon=True).start()

    def _workers_of(self, process: int) -> list[int]:
        return [w for w, p in enumerate(self.worker_process) if p == process]

    def _serving(self, process: int, incarnation: int) -> bool:
        return self._alive[process] and self._inc[process] == incarnation

    def _lose_process(self, process: int, incarnation: int | None, reason: str, jax_id=None) -> None:
        """Mark `process` lost (if `incarnation` is still the one served) and report its workers."""
        with self._lock:
            if process not in self._alive or not self._alive[process]:
                return
            if incarnation is not None and incarnation != self._inc[process]:
                return
            if jax_id is not None and self._jax_id[process] not in (None, jax_id):
                return  # the loss of an incarnation older than the one served
            self._alive[process] = False
        for w in self._workers_of(process):
            self._events.put(WorkerLost(w, reason))

    def _lost(self, process: int, reason: str, jax_id=None) -> None:
        self._lose_process(process, None, f"process {process}: {reason}", jax_id)

    def _start_receiver(self, process: int, incarnation: int) -> None:
        threading.Thread(target=self._receive, args=(process, incarnation), daemon=True,
                         name=f"staleness-recv-{process}.{incarnation}").start()

    def _connection(self, process: int, incarnation: int):
        key = (process, incarnation)
        if key not in self._conns:
            self._conns[key] = self.coord.transfer.connect(self.coord.address(process, incarnation, 30.0))
        return self._conns[key]

    def _receive(self, process: int, incarnation: int) -> None:
        seq = 0
        while not self._stopped.is_set() and self._serving(process, incarnation):
            try:
                text = self.coord.get(_msg_key("push", process, incarnation, seq))
            except Exception:  # noqa: BLE001 - service gone; liveness reports it
                return
            if text is None:
                continue
            _consumed(self.coord, "push", process, incarnation, seq)
            seq += 1
            msg = Push.from_json(text)
            if msg.error is not None:
                self._events.put(WorkerFailed(msg.worker, msg.error))
                continue
            try:
                loss, grad = self._connection(process, incarnation).pull(msg.handle, self._payload)
                # The pull returned before the data arrived: wait for it here, off the
                # server's loop, so that a peer dying mid-transfer is seen now (as a lost
                # process) and never later, by whoever reads the arrays.
                jax.block_until_ready((loss, grad))
                loss = float(loss)
            except Exception as e:  # noqa: BLE001 - the peer died mid-transfer
                self._lose_process(process, incarnation, f"process {process}: pull failed ({_first_line(e)})")
                return
            if not self._serving(process, incarnation):
                return  # lost meanwhile: its gradient is not wanted
            self._events.put(Arrival(msg, loss, grad))

    def _watch_joins(self) -> None:
        """Let a restarted process back in: it announced `join/{p}` with a newer incarnation."""
        while not self._stopped.wait(JOIN_POLL_SECONDS):
            for p in self.processes:
                if self._alive[p]:
                    continue  # a restart is let in only once its predecessor was seen lost
                try:
                    text = self.coord.try_get(f"join/{p}")
                except Exception:  # noqa: BLE001 - service gone
                    return
                if text is None:
                    continue
                inc_text, _, id_text = text.partition(" ")
                inc = int(inc_text)
                with self._lock:
                    if self._alive[p] or inc <= self._inc[p] or self._stopped.is_set():
                        continue
                    self._inc[p], self._seq[p], self._alive[p] = inc, 0, True
                    self._jax_id[p] = int(id_text) if id_text.isdigit() else None
                self._start_receiver(p, inc)
                for w in self._workers_of(p):
                    self._events.put(WorkerJoined(w, f"process {p} restarted (incarnation {inc})"))

    def _next_message(self, p: int) -> tuple[int, int] | None:
        """(incarnation, sequence number) of the next message to process `p`; None if it is lost."""
        with self._lock:
            if not self._alive[p]:
                return None
            inc, k = self._inc[p], self._seq[p]
            self._seq[p] = k + 1
            return inc, k

    def release(self, msg: Release, params) -> None:
        p = self.worker_process[msg.worker]
        channel = self._next_message(p)
        if channel is None:
            return
        handle = self.coord.new_id()
        self.coord.transfer.await_pull(handle, params)
        rel = Release(msg.worker, msg.iteration, msg.version, msg.epoch, handle)
        self.coord.set(_msg_key("rel", p, *channel), rel.to_json())

    def publish(self, version: int, params, to: list[int]) -> None:
        """Offer `version` to each actor in `to` on its channel (one offer each: an actor takes
        every version offered to it, in order, by its next rollout if not this one; offers
        still queued when the run stops are held until the process exits)."""
        for w in to:
            p = self.worker_process[w]
            channel = self._next_message(p)
            if channel is None:
                continue
            handle = self.coord.new_id()
            self.coord.transfer.await_pull(handle, params)
            self.coord.set(_msg_key("rel", p, *channel), Published(w, version, handle).to_json())

    def poll(self, timeout: float):
        try:
            return self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        try:  # the run is over: a worker process that sees process 0 leave from now on exits normally
            self.coord.set("done", "1", overwrite=True)
        except Exception:  # noqa: BLE001
            pass
        for p in self.processes:
            channel = self._next_message(p)
            try:
                if channel is None:   # a restarted process still waiting to be let in is stopped too
                    text = self.coord.try_get(f"join/{p}")
                    if text is None or int(text.split()[0]) <= self._inc[p]:
                        continue
                    channel = (int(text.split()[0]), 0)
                self.coord.set(_msg_key("rel", p, *channel), Release(STOP, 0, 0, 0).to_json())
            except Exception:  # noqa: BLE001 - best effort: a dead process needs no stop
                pass


class DistributedWorkerLink(WorkerLink):
    """The end shared by the worker threads of one process.

    Args:
      coord: this process's Coordination.
      worker_devices: {worker: device} of the workers hosted here.
      params_shape: a params-shaped pytree (arrays or ShapeDtypeStructs).
      server_process: the process hosting the server (0; it never restarts).
    """

    def __init__(self, coord: Coordination, worker_devices: dict, params_shape, server_process: int = 0):
        self.coord = coord
        self.devices = dict(worker_devices)
        self.server_process = server_process
        self.incarnation = coord.incarnation
        self.stopped = threading.Event()
        self.server_lost: str | None = None
        self._avals = {w: _avals(params_shape, d) for w, d in self.devices.items()}
        self._queues = {w: queue.SimpleQueue() for w in self.devices}
        self._published = {w: queue.SimpleQueue() for w in self.devices}   # (version, handle) offered mid-rollout
        self._push_lock = threading.Lock()
        self._push_seq = 0
        self._local = threading.local()
        coord.on_lost(self._lost)
        self._dispatcher = threading.Thread(target=self._dispatch, name="staleness-dispatch", daemon=True)
        self._dispatcher.start()

    def _lost(self, process: int, reason: str, jax_id=None) -> None:
        if process == self.server_process:
            # A server that ended the run and left is a normal end, unless this process
            # was itself declared dead (its workers were lost: that is this process's failure).
            if self.coord.declared_dead or not self.server_done():
                self.server_lost = reason
            self.stopped.set()

    def server_done(self) -> bool:
        """True once the server has ended the run (it may not have sent us a stop: we
        were a restarted process not yet let in)."""
        try:
            return self.coord.try_get("done") is not None
        except Exception:  # noqa: BLE001 - the service is gone: we cannot know
            return False

    def _dispatch(self) -> None:
        me = self.coord.process_id
        seq = 0
        while not self.stopped.is_set():
            try:
                text = self.coord.get(_msg_key("rel", me, self.incarnation, seq))
            except Exception as e:  # noqa: BLE001 - the service is gone
                self.server_lost = f"coordination service unreachable ({_first_line(e, 120)})"
                self.stopped.set()
                return
            if text is None:
                continue
            _consumed(self.coord, "rel", me, self.incarnation, seq)
            seq += 1
            msg = from_server(text)
            if isinstance(msg, Published):
                self._published[msg.worker].put((msg.version, msg.handle))
                continue
            if msg.worker == STOP:
                self.stopped.set()
                return
            self._queues[msg.worker].put(msg)

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.coord.transfer.connect(self.coord.address(self.server_process, 1, 30.0))
        return conn

    def wait_release(self, worker: int, timeout: float):
        try:
            msg = self._queues[worker].get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        return msg, msg.handle

    def newer(self, worker: int, version: int, timeout: float):
        """The next version offered to `worker` (in order: every offer is taken), skipping
        (and taking) any not newer than `version`: offers made for an earlier rollout, after
        it ended, are taken here by the next one (a few may stay unpulled when the run stops)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                v, handle = self._published[worker].get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                return None
            if v > version:
                return v, handle
            jax.block_until_ready(self.fetch(worker, handle))

    def fetch(self, worker: int, offer):
        return self._connection().pull(offer, self._avals[worker])

    def _send(self, msg: Push) -> None:
        with self._push_lock:
            k = self._push_seq
            self._push_seq = k + 1
            self.coord.set(_msg_key("push", self.coord.process_id, self.incarnation, k), msg.to_json())

    def push(self, msg: Push, loss, grad) -> None:
        handle = self.coord.new_id()
        self.coord.transfer.await_pull(handle, (loss, grad))
        self._send(dataclasses.replace(msg, handle=handle))

    def fail(self, worker: int, message: str, exception: BaseException | None = None) -> None:
        self._send(Push(worker, 0, 0, 0, error=message[-8000:]))
