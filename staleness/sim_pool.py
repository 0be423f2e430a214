"""Many schedules at once, on every core: the schedules of a sweep.

`simulate_schedules(jobs)` returns `[simulate_schedule(**job) for job in jobs]`, the very
same schedules (the simulator is deterministic), computed by worker processes when that
pays: at least two cores and two jobs, and an estimated `MIN_SECONDS` of simulation or
more (a worker process costs about 0.3 s to start and import the control plane). The
workers are fresh interpreters that import only the control plane (no JAX), started with
`subprocess` (`python -m staleness.sim_pool`): jobs go in and schedules come back pickled
through their pipes, so a user's script is never imported again (as multiprocessing's
spawn would) and nothing is forked from a process that runs JAX's threads.

What cannot go to another process falls back to this one, with one warning: a job that
does not pickle (a policy or cluster defined in `__main__` or a notebook, an RL task's
rollout sizes, which hold device arrays) or a worker that failed.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import warnings

from staleness.sim import simulate_schedule

__all__ = ["simulate_schedules", "MIN_SECONDS", "ROWS_PER_S", "estimate_seconds", "serve"]

MIN_SECONDS = 2.0
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
    threads = [threading.Thread(target=_work, args=(p, max(TIMEOUT_FLOOR, 20 * load[k]), out, errors), daemon=True)
               for k, p in enumerate(payloads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors or len(out) != len(jobs):
        return _here(jobs, errors[0] if errors else "a worker process returned too few schedules")
    return [out[i] for i in range(len(jobs))]


def _here(jobs: list[dict], why: str) -> list:
    warnings.warn(f"simulating {len(jobs)} schedules in this process, one after another: {why}", stacklevel=3)
    return [simulate_schedule(**job) for job in jobs]


def _work(payload: bytes, timeout: float, out: dict, errors: list) -> None:
    """One worker process: send it `payload`, collect its schedules into `out`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        done = subprocess.run([sys.executable, "-m", "staleness.sim_pool"], input=payload, capture_output=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        errors.append(f"a worker process took more than {timeout:.0f} s")
        return
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()
        errors.append(f"a worker process failed ({tail[-1] if tail else f'exit {done.returncode}'})")
        return
    try:
        out.update(pickle.loads(done.stdout))
    except Exception as e:  # noqa: BLE001
        errors.append(f"a worker process sent back no schedules ({type(e).__name__})")


def serve(stdin=None, stdout=None) -> None:
    """A worker process's body: pickled [(index, job)] in, pickled {index: Schedule} out."""
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    work = pickle.loads(stdin.read())
    stdout.write(pickle.dumps({i: simulate_schedule(**job) for i, job in work}))
    stdout.flush()


if __name__ == "__main__":
    serve()
