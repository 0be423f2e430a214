"""Sweeps over processes and hosts: every process of a `jax.distributed` job
replays its share of the grid on its local devices; process 0 gathers the Results.

    results = sweep_process(lambda: prepare(...), coordinator="10.0.0.1:8476", num_processes=2, process_id=i)

Every process prepares the same grid (schedules are deterministic from their seeds, so
the padding agrees without a message), replays its contiguous share of the grid's blocks
(`share`) and sends its Results to process 0 through the job's key-value store; every
block is computed by the same compiled program, so the gathered Results are bitwise those
of a one-device sweep. A process that dies stops the job: JAX's coordination service fails
the others (after `heartbeat_timeout` seconds); process 0 also gives up waiting after
`gather_timeout` seconds, naming the processes it is missing.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

__all__ = ["share", "sweep_process", "GatherError"]

KEY = "staleness/sweep/results/{}"


class GatherError(RuntimeError):
    """Process 0 did not receive every process's Results in time."""


def share(num_configs: int, num_processes: int, process_id: int, block: int = 1) -> list[int]:
    """Configuration indices of process `process_id`: contiguous whole blocks of `block`
    configurations (the grid's blocks, so each is computed exactly as on one process)."""
    nb = -(-num_configs // block)
    mine = np.array_split(np.arange(nb), num_processes)[process_id]
    return [i for b in mine for i in range(int(b) * block, min((int(b) + 1) * block, num_configs))]


def _check(coordinator, num_processes, process_id) -> None:
    if not isinstance(coordinator, str) or ":" not in coordinator:
        raise ValueError(f"coordinator = {coordinator!r} must be HOST:PORT, e.g. 10.0.0.1:8476")
    port = coordinator.rsplit(":", 1)[1]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"coordinator = {coordinator!r}: the port must be an integer in 1..65535")
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes = {num_processes!r} must be an integer >= 1")
    if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id = {process_id!r} must be an integer in 0..{num_processes - 1}")


def _pack(results) -> bytes:
    # Within one job of this same program: the Results minus their schedules (process 0 has them).
    return pickle.dumps([(r.history, r.params, r.config, r.train_loss, r.status) for r in results])


def sweep_process(make_grid, *, coordinator: str, num_processes: int, process_id: int, devices=None,
                  block: int | None = None, progress: bool = False, init_timeout: float = 120.0, heartbeat_timeout: int = 60,
                  gather_timeout: float = 3600.0):
    """Run one process of a multi-process sweep (call before any other JAX operation).

    Args:
      make_grid: zero-argument callable returning the `sweeps.Grid` (called after
        `jax.distributed` is initialized: no JAX operation may run before).
      coordinator: HOST:PORT of process 0; num_processes, process_id: the job.
      devices, block: this process's local devices and configurations per device per call
        (`sweeps.replay_grid`; block the same on every process: default min(8, ⌈grid size /
        num_processes⌉), whatever each process's devices or cores).
      init_timeout: seconds for every process to join; heartbeat_timeout: seconds without a
        heartbeat after which JAX fails the job; gather_timeout: seconds process 0 waits for
        the other processes' Results (after its own share is done).
    Returns: all Results (in grid order) on process 0, None on the others.
    """
    _check(coordinator, num_processes, process_id)
    import jax

    from staleness.engine import sweeps
    from staleness.engine.result import Result

    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=int(init_timeout),
                               heartbeat_timeout_seconds=int(heartbeat_timeout))
    try:
        from jax._src import distributed   # the key-value store has no public accessor

        client = distributed.global_state.client
        grid = make_grid()
        # the same block on every process whatever its devices or cores (the shares are its blocks)
        block = block if block is not None else max(1, min(sweeps.DEFAULT_BLOCK, -(-len(grid) // num_processes)))
        block = sweeps.grid_block(grid, block)
        mine = share(len(grid), num_processes, process_id, block)
        t0 = time.perf_counter()
        results = sweeps.replay_grid(grid, mine, devices=devices, progress=progress, block=block)
        for r in results:
            r.config.update(processes=num_processes, process=process_id)
        if process_id != 0:
            client.key_value_set_bytes(KEY.format(process_id), _pack(results))
            return None
        out = list(results)
        deadline = time.monotonic() + gather_timeout
        for p in range(1, num_processes):
            left_ms = int(max(1.0, deadline - time.monotonic()) * 1000)
            try:
                blob = client.blocking_key_value_get_bytes(KEY.format(p), left_ms)
            except Exception as e:   # XlaRuntimeError: DEADLINE_EXCEEDED or a failed job
                raise GatherError(f"sweep: process 0 has no Results from process {p} after "
                                  f"{time.perf_counter() - t0:.0f} s ({str(e).splitlines()[0][:200]}); is it "
                                  "running, with the same arguments?") from None
            idx = share(len(grid), num_processes, p, block)
            for i, (history, params, config, train_loss, status) in zip(idx, pickle.loads(blob)):
                pol, seed, _, _ = grid.configs[i]
                out.append(Result(history, grid.schedules[(pol, seed)], params, config, train_loss, status))
        return out
    finally:
        jax.distributed.shutdown()   # a barrier: the others leave once process 0 has read their Results
