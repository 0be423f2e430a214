"""Many schedules at once, on every core: the schedules of a sweep.

`simulate_schedules(jobs)` returns `[simulate_schedule(**job) for job in jobs]`, the very
same schedules (the simulator is deterministic), computed by worker processes when that
pays: at least two cores and two jobs, and an estimated `MIN_SECONDS` of simulation or
more. The workers are fresh interpreters that import only the control plane (no JAX),
started with `subprocess` (`python -m staleness.sim.pool`) on first use and kept for later
calls (starting one costs about 0.15 s): jobs go in and schedules come back pickled through
their pipes, so a user's script is never imported again (as multiprocessing's spawn would)
and nothing is forked from a process that runs JAX's threads. A worker exits when this
process closes its stdin (at exit, or when it dies).

What cannot go to another process falls back to this one, with one warning: a job that
does not pickle (a policy or cluster defined in `__main__` or a notebook, an RL task's
rollout sizes, which hold device arrays) or a worker that failed.
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from staleness.sim.scheduler import simulate_schedule

__all__ = ["simulate_schedules", "MIN_SECONDS", "ROWS_PER_S", "estimate_seconds", "serve"]

MIN_SECONDS = 0.3
"""Below this estimated simulation time the schedules are simulated here, one after another."""
ROWS_PER_S = 150_000.0
"""The simulator's speed used for the estimate (measured 120,000-160,000 rows/s on a 2-core CPU)."""
TIMEOUT_FLOOR = 120.0   # seconds a worker process may take at least (its deadline grows with its estimate)


def estimate_seconds(job: dict) -> float:
    """Rough seconds `simulate_schedule(**job)` takes: its gradients (num_updates × the
    policy's gradients per update, or max_time × the cluster's gradient rate) / ROWS_PER_S."""
    from staleness import cluster as _cluster
    from staleness import policies as _policies

    policy, cluster = job["policy"], job["cluster"]
    policy = _policies.parse(policy) if isinstance(policy, str) else policy
    cluster = _cluster.parse(cluster) if isinstance(cluster, str) else cluster
    n = cluster.num_workers
    rows = []
    if job.get("num_updates") is not None:
        rows.append(float(job["num_updates"]) * max(1, policy.gradients_per_update(n, n)))
    if job.get("max_time") is not None:
        rows.append(float(job["max_time"]) * sum(1.0 / t for t in cluster.mean_seconds if t > 0))
    return (min(rows) if rows else 0.0) / ROWS_PER_S


def simulate_schedules(jobs: list[dict], processes: int | None = None, min_seconds: float | None = None) -> list:
    """[simulate_schedule(**job) for job in jobs], on up to `processes` worker processes
    (default: the machine's cores) when the estimated total is at least `min_seconds`
    (default `MIN_SECONDS`)."""
    jobs = list(jobs)
    min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
    n = min(len(jobs), processes if processes is not None else (os.cpu_count() or 1))
    if n < 2 or any(job.get("sizes") is not None for job in jobs):
        return [simulate_schedule(**job) for job in jobs]
    cost = [estimate_seconds(job) for job in jobs]
    if sum(cost) < min_seconds:
        return [simulate_schedule(**job) for job in jobs]
    bins: list[list[int]] = [[] for _ in range(n)]   # longest first, each to the least loaded worker
    load = [0.0] * n
    for i in sorted(range(len(jobs)), key=lambda i: -cost[i]):
        k = load.index(min(load))
        bins[k].append(i)
        load[k] += cost[i]
    try:
        payloads = [pickle.dumps([(i, jobs[i]) for i in b]) for b in bins]
    except Exception as e:  # noqa: BLE001 - whatever does not pickle is simulated here
        return _here(jobs, f"a job does not pickle ({type(e).__name__}: {e})")
    out: dict = {}
    errors: list[str] = []
    with _LOCK:
        workers = _workers(n)
        threads = [threading.Thread(target=w.run, args=(p, out, errors), daemon=True)
                   for w, p in zip(workers, payloads)]
        for t in threads:
            t.start()
        limit = max(TIMEOUT_FLOOR, 20 * max(load))
        end = time.monotonic() + limit   # one deadline for all of them
        try:
            for w, t in zip(workers, threads):
                t.join(max(0.0, end - time.monotonic()))
                if t.is_alive():   # past the deadline: killed (its read then ends), started afresh next time
                    w.kill()
                    t.join(5.0)
                    errors.append(f"a worker process took more than {limit:.0f} s")
        except BaseException:   # Ctrl-C: a reader may still wait on its pipe; those workers are not reused
            for w in workers:
                w.kill()
            raise
    if errors or len(out) != len(jobs):
        return _here(jobs, errors[0] if errors else "a worker process returned too few schedules")
    return [out[i] for i in range(len(jobs))]


def _here(jobs: list[dict], why: str) -> list:
    warnings.warn(f"simulating {len(jobs)} schedules in this process, one after another: {why}", stacklevel=3)
    return [simulate_schedule(**job) for job in jobs]


_LOCK = threading.Lock()
_POOL: list = []   # the worker processes kept for later calls (started on first use)


class _Worker:
    """A worker process kept between calls (its start-up, about 0.15 s, is paid once):
    length-prefixed pickles both ways through its pipes. It exits when its stdin closes, so
    it never outlives this process; its stderr goes to a temporary file (read on failure)."""

    def __init__(self):
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "staleness.sim.pool"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=env)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()

    def close(self) -> None:
        """Release its pipes and files (it has exited or is killed here)."""
        self.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            try:
                f.close()
            except OSError:
                pass

    def run(self, payload: bytes, out: dict, errors: list) -> None:
        """Send `payload` ([(index, job)]), collect its schedules into `out` (or a message into `errors`)."""
        try:
            _send(self.proc.stdin, payload)
            ok, value = pickle.loads(_receive(self.proc.stdout))
        except Exception as e:  # noqa: BLE001 - a dead or killed worker: read what it said
            self.kill()
            self.err.seek(0)
            tail = self.err.read().decode(errors="replace").strip().splitlines()
            errors.append(f"a worker process failed ({tail[-1] if tail else type(e).__name__})")
            return
        if ok:
            out.update(value)
        else:
            errors.append(value)


def _workers(n: int) -> list:
    """n live worker processes (dead ones replaced)."""
    for w in _POOL:
        if not w.alive():
            w.close()
    _POOL[:] = [w for w in _POOL if w.alive()]
    while len(_POOL) < n:
        _POOL.append(_Worker())
    return _POOL[:n]


@atexit.register
def _close() -> None:
    """At exit: close every worker's stdin (it then exits), wait for it a moment, release its files."""
    for w in _POOL:
        try:
            w.proc.stdin.close()
        except OSError:
            pass
    for w in _POOL:
        try:
            w.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
        w.close()
    _POOL.clear()


def _send(stream, data: bytes) -> None:
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream) -> bytes:
    head = stream.read(8)
    if len(head) != 8:
        raise EOFError("the other end closed")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the other end closed mid-message")
    return data


def serve(stdin=None, stdout=None) -> None:
    """A worker process's body: requests of pickled [(index, job)] until stdin closes, each
    answered with (True, {index: Schedule}) or (False, what went wrong), pickled."""
    stdin = stdin or sys.stdin.buffer
    if stdout is None:   # the protocol keeps fd 1; anything a user's module prints goes to stderr
        stdout = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    while True:
        try:
            request = _receive(stdin)
        except EOFError:
            return
        try:
            answer = (True, {i: simulate_schedule(**job) for i, job in pickle.loads(request)})
        except Exception as e:  # noqa: BLE001 - reported to the caller, which simulates these itself
            answer = (False, f"a worker process failed ({type(e).__name__}: {e})")
        _send(stdout, pickle.dumps(answer))


if __name__ == "__main__":
    serve()
