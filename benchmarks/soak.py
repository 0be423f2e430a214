"""Soak: randomized fault scenarios against the multi-process runtime.

Each scenario starts a job of 3 or 4 local processes on 127.0.0.1 (its own free
port): `staleness run --coordinator ... --process-id I` per process, or
`staleness launch --local N` for the Ctrl-C scenario, on the quadratic or the
digits-mlp task, under one of bsp, asp, ssp:3, dssp:3:12, softsync:2, backup:1,
with --on-worker-failure continue or stop, and injects one fault at a random
moment (a random number of updates into the run, read from process 0's
progress lines; for `raise_worker`, a random iteration):

  kill_worker     SIGKILL a worker process (not 0)
  pause_worker    SIGSTOP a worker process longer than the heartbeat timeout, then SIGCONT
  raise_worker    a worker raises in its gradient call (this script is then the processes' main)
  ctrl_c          SIGINT to the launcher
  kill_server     SIGKILL process 0 (the server)
  restart_worker  SIGKILL a worker process and start it again with the same id (it rejoins)

Checks, per scenario: every process ends within FAULT_DEADLINE seconds of the
fault (else: a hang; all are SIGKILLed); every exit status is the expected one
(table in `expected`); process 0's Result is on disk, loads and has the
expected status, and the engine's replay of its trace (slot_mode='map')
reproduces its parameters bitwise; when process 0 is killed there is no
Result, the others print exactly one `staleness: error: ...` line and exit 1,
and the coordination service's process is gone soon after.

Prints the seed, one line per scenario and the counts; ends with one JSON line
(scenarios, hangs, crashes_without_result, replay_mismatches, ... wall_seconds, agree).
Exit status 1 when a scenario fails a check; the replay vs the real run is held to 0 ulp
(bitwise: README, "Trace replays are bitwise on CPU"; these runs are CPU processes with
--cluster, so the server sync, and the default optimizer, no global-norm clipping), and
beyond it one line on stderr names the two paths, the largest distance and the tolerance
(`_report.finish`).

    python benchmarks/soak.py [--scenarios 36] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _report import BITWISE, Agreement, finish  # noqa: E402
from staleness.infra.procs import descendants  # noqa: E402

POLICIES = ("bsp", "asp", "ssp:3", "dssp:3:12", "softsync:2", "backup:1")
KINDS = ("kill_worker", "pause_worker", "raise_worker", "ctrl_c", "kill_server", "restart_worker")
TASKS = ("quadratic", "digits-mlp")
WORKER_TIMEOUT = 4      # seconds (--worker-timeout); the heartbeat timeout is half of it: 2 s
HEARTBEAT = 2
TIME_SCALE = 0.02       # real seconds per simulated second: an iteration takes 20-30 ms
START_DEADLINE = 150.0  # seconds from the start until the fault's moment (compilation included)
FAULT_DEADLINE = 90.0   # seconds from the fault until every process has exited
SERVICE_DEADLINE = 15.0  # seconds after the job until the coordination service's process is gone
# updates of a run, per policy (so that a run lasts several seconds on two busy cores)
UPDATES = {"bsp": 150, "backup:1": 150, "softsync:2": 400, "asp": 1000, "ssp:3": 1000, "dssp:3:12": 1000}
SERVER_LOST = ("lost the server (process 0): process left the job "
               "(died or shut down; heartbeat timeout or disconnect)")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One fault scenario (all random choices made up front, from the seed)."""

    index: int
    kind: str
    policy: str
    processes: int
    task: str
    on_failure: str      # 'continue' or 'stop'
    updates: int
    fault_at: int        # updates shown by process 0 when the fault is injected
    victim: int          # the process hit (kill/pause/restart/kill_server), or the raising worker
    raise_iteration: int  # raise_worker: the iteration at which the worker raises
    pause: float         # pause_worker: seconds between SIGSTOP and SIGCONT

    @property
    def workers(self) -> int:
        return 2 * self.processes

    def describe(self) -> str:
        what = {"raise_worker": f"worker {self.victim} raises at iteration {self.raise_iteration}",
                "pause_worker": f"process {self.victim} paused {self.pause:.1f} s at update {self.fault_at}",
                "ctrl_c": f"Ctrl-C at update {self.fault_at}"}.get(
            self.kind, f"process {self.victim} at update {self.fault_at}")
        return (f"#{self.index:02d} {self.kind:<14} {self.policy:<10} {self.processes}p {self.task:<10} "
                f"{self.on_failure:<8} {what}")


def make_scenarios(count: int, seed: int, kinds=KINDS) -> list[Scenario]:
    """`count` scenarios: the kinds in turn, everything else drawn from `seed`."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        policy = POLICIES[(i // len(kinds) + i) % len(POLICIES)] if len(kinds) > 1 else rng.choice(POLICIES)
        n = rng.choice((3, 4))
        task = TASKS[1] if rng.random() < 0.4 else TASKS[0]
        updates = UPDATES[policy] * (3 if kind == "restart_worker" else 1)
        lo, hi = (0.1, 0.3) if kind == "restart_worker" else (0.1, 0.5)
        fault_at = max(3, int(updates * rng.uniform(lo, hi)))
        victim = rng.randrange(1, n) if kind not in ("kill_server", "raise_worker") else 0
        if kind == "raise_worker":
            victim = rng.randrange(2 * n)
        on_failure = rng.choice(("continue", "stop"))
        if kind == "restart_worker":
            on_failure = "continue"  # a rejoin needs a run that goes on without the process meanwhile
        out.append(Scenario(index=i, kind=kind, policy=policy, processes=n, task=task,
                            on_failure=on_failure, updates=updates, fault_at=fault_at,
                            victim=victim, raise_iteration=rng.randint(2, 12),
                            pause=round(rng.uniform(HEARTBEAT + 2.0, HEARTBEAT + 6.0), 1)))
    return out


def expected(sc: Scenario) -> dict:
    """Expected exit statuses (per process, or the launcher's) and Result status (None: no Result)."""
    n, v = sc.processes, sc.victim
    codes = [0] * n
    if sc.kind == "ctrl_c":
        return {"codes": [130], "status": "stopped"}
    if sc.kind == "kill_server":
        return {"codes": [-signal.SIGKILL] + [1] * (n - 1), "status": None}
    if sc.kind == "raise_worker":
        codes[0] = 1
        return {"codes": codes, "status": "stopped"}
    stop = sc.on_failure == "stop"
    codes[0] = 1 if stop else 0
    if sc.kind in ("kill_worker", "restart_worker"):
        codes[v] = -signal.SIGKILL
    if sc.kind == "pause_worker":
        codes[v] = 1  # declared dead while paused: it exits with one line when continued
    if sc.kind == "restart_worker":
        codes.append(0)  # the restarted process: let in then stopped, or the run was over when it started
    return {"codes": codes, "status": "stopped" if stop else "complete"}


@dataclasses.dataclass
class Outcome:
    scenario: Scenario
    codes: list = dataclasses.field(default_factory=list)
    hang: bool = False
    fault_missed: bool = False          # the run ended before the fault's moment
    crash_without_result: bool = False
    replay_mismatch: bool = False
    replay_ulp: int | None = None       # largest difference of the replay, in float32 units in the last place
    wrong_codes: bool = False
    wrong_status: bool = False
    bad_message: bool = False
    service_leftover: bool = False
    rejoined: bool | None = None        # restart_worker: its workers pushed again
    end_after_fault_s: float | None = None   # fault -> every process exited
    detection_s: float | None = None    # lost row's time minus the worker's last push before it (upper bound)
    status: str | None = None
    updates_done: int | None = None
    wall_s: float = 0.0
    notes: list = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.hang or self.crash_without_result or self.replay_mismatch or self.wrong_codes
                    or self.wrong_status or self.bad_message or self.service_leftover)

    def line(self) -> str:
        flags = [k for k in ("hang", "fault_missed", "crash_without_result", "replay_mismatch", "wrong_codes",
                             "wrong_status", "bad_message", "service_leftover") if getattr(self, k)]
        extra = []
        if self.end_after_fault_s is not None:
            extra.append(f"ended {self.end_after_fault_s:.1f} s after the fault")
        if self.detection_s is not None:
            extra.append(f"detected <= {self.detection_s:.2f} s")
        if self.rejoined is not None:
            extra.append("rejoined" if self.rejoined else "NOT rejoined")
        return (f"{'ok  ' if self.ok else 'FAIL'} {self.scenario.describe()} | codes {self.codes} "
                f"status {self.status} updates {self.updates_done} | {', '.join(extra)} | {self.wall_s:.0f} s"
                + (f" | {' '.join(flags)}" if flags else "") + (f" | {'; '.join(self.notes)}" if self.notes else ""))


# -- processes --------------------------------------------------------------------------------
def _env() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


class Job:
    """The processes of one scenario, each in its own session, output collected
    (stdout and stderr apart: the one-line error is checked on stderr)."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []
        self.stdout: list[list[str]] = []
        self.stderr: list[list[str]] = []
        self.extra_pids: set[int] = set()   # descendants seen (the coordination service, launched processes)

    def spawn(self, argv) -> subprocess.Popen:
        p = subprocess.Popen(argv, cwd=ROOT, env=_env(), start_new_session=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out, err = [], []
        for stream, lines in ((p.stdout, out), (p.stderr, err)):
            threading.Thread(target=lambda s=stream, ls=lines: ls.extend(iter(s.readline, "")), daemon=True).start()
        self.procs.append(p)
        self.stdout.append(out)
        self.stderr.append(err)
        return p

    def note_descendants(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                self.extra_pids.update(descendants(p.pid))

    def progress(self, i: int) -> int:
        """The largest update count in process i's progress lines so far."""
        best = -1
        for line in list(self.stderr[i]):
            head = line.split("/", 1)[0].strip()
            if head.isdigit() and "upd" in line:
                best = max(best, int(head))
        return best

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def kill(self) -> None:
        pids = set(self.extra_pids)
        for p in self.procs:
            pids.update(descendants(p.pid))
            pids.add(p.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def text(self, i: int, stream: str = "stderr") -> str:
        return "".join(getattr(self, stream)[i])


def _run_args(sc: Scenario, out: Path | None) -> list[str]:
    n = sc.processes
    args = ["--task", sc.task, "--policy", sc.policy, "--cluster", f"1*{n},1.5*{n}", "--time-scale",
            str(TIME_SCALE), "--updates", str(sc.updates), "--worker-timeout", str(WORKER_TIMEOUT),
            "--on-worker-failure", sc.on_failure, "--seed", str(sc.index)]
    if sc.task == "quadratic":
        args += ["--lr-rule", "per_gradient"]  # α0/τ keeps ASP on the quadratic stable at the default lr
    if out is not None:
        args += ["--out", str(out)]
    return args


def _process_argv(sc: Scenario, port: int, i: int, out: Path) -> list[str]:
    job = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(sc.processes), "--process-id", str(i)]
    args = _run_args(sc, out if i == 0 else None) + ([] if i == 0 else ["--no-progress"])
    if sc.kind == "raise_worker":
        return [sys.executable, str(Path(__file__).resolve()), "--child-raise",
                f"{sc.victim}:{sc.raise_iteration}", "--", *job, *args]
    return [sys.executable, "-m", "staleness", "run", *job, *args]


# -- one scenario -----------------------------------------------------------------------------
def run_scenario(sc: Scenario, workdir: Path, start_deadline: float = START_DEADLINE,
                 fault_deadline: float = FAULT_DEADLINE) -> Outcome:
    """Run `sc` in `workdir` (its Result goes to workdir/sNN) and check it.

    start_deadline: seconds from the start to the fault's moment; fault_deadline:
    seconds from the fault until every process has exited (else a hang: all are
    SIGKILLed). Returns the Outcome (`.ok`, `.line()`).
    """
    from staleness.runtime.multiprocess import free_port

    t_start = time.monotonic()
    res = Outcome(sc)
    out = workdir / f"s{sc.index:02d}"
    job = Job()
    port = free_port()
    if sc.kind == "ctrl_c":
        job.spawn([sys.executable, "-m", "staleness", "launch", "--local", str(sc.processes), "--timeout",
                   str(start_deadline + fault_deadline), *_run_args(sc, out)])
    else:
        for i in range(sc.processes):
            job.spawn(_process_argv(sc, port, i, out))
    try:
        t_fault = _inject(sc, job, res, port, out, start_deadline)
        _wait_end(sc, job, res, t_fault, fault_deadline)
        _check(sc, job, res, out)
    finally:
        job.kill()
        res.wall_s = time.monotonic() - t_start
    return res


def _inject(sc: Scenario, job: Job, res: Outcome, port: int, out: Path, start_deadline: float) -> float:
    """Wait for the fault's moment, inject it; returns its time (monotonic)."""
    deadline = time.monotonic() + start_deadline
    if sc.kind == "raise_worker":  # the fault fires by itself: it is 'now' once the run makes progress
        while job.progress(0) < 1 and job.procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        job.note_descendants()
        return time.monotonic()
    while job.progress(0) < sc.fault_at:
        if job.procs[0].poll() is not None:
            res.fault_missed = True
            res.notes.append("the run ended before the fault's moment")
            return time.monotonic()
        if time.monotonic() > deadline:
            res.hang = True
            res.notes.append(f"no progress to update {sc.fault_at} within {start_deadline:g} s")
            return time.monotonic()
        time.sleep(0.05)
    job.note_descendants()
    victim = job.procs[0] if sc.kind == "ctrl_c" else job.procs[sc.victim]
    if sc.kind == "ctrl_c":
        victim.send_signal(signal.SIGINT)
    elif sc.kind in ("kill_worker", "kill_server", "restart_worker"):
        os.killpg(victim.pid, signal.SIGKILL)
    elif sc.kind == "pause_worker":
        os.killpg(victim.pid, signal.SIGSTOP)
    t_fault = time.monotonic()
    if sc.kind == "restart_worker":
        victim.wait(timeout=10)
        job.spawn(_process_argv(sc, port, sc.victim, out))
    return t_fault


def _wait_end(sc: Scenario, job: Job, res: Outcome, t_fault: float, fault_deadline: float) -> None:
    if res.hang:
        return
    deadline = t_fault + fault_deadline
    continued = sc.kind != "pause_worker"
    while job.running():
        now = time.monotonic()
        if not continued and now >= t_fault + sc.pause:
            os.killpg(job.procs[sc.victim].pid, signal.SIGCONT)
            continued = True
        if now > deadline:
            res.hang = True
            still = [i for i, p in enumerate(job.procs) if p.poll() is None]
            res.notes.append(f"processes {still} still running {fault_deadline:g} s after the fault")
            job.kill()
            break
        job.note_descendants()
        time.sleep(0.05)
    if not continued:
        os.killpg(job.procs[sc.victim].pid, signal.SIGCONT)
    res.end_after_fault_s = time.monotonic() - t_fault
    time.sleep(0.2)  # let the reader threads drain the pipes
    res.codes = [p.returncode for p in job.procs]
    # the coordination service (a child of process 0) leaves once the job is over
    gone_by = time.monotonic() + SERVICE_DEADLINE
    while any(_alive(pid) for pid in job.extra_pids) and time.monotonic() < gone_by:
        time.sleep(0.1)
    left = [pid for pid in job.extra_pids if _alive(pid)]
    if left and not res.hang:
        res.service_leftover = True
        res.notes.append(f"processes {left} outlived the job by {SERVICE_DEADLINE:g} s")


def _check(sc: Scenario, job: Job, res: Outcome, out: Path) -> None:
    if res.hang:
        return
    exp = expected(sc)
    if res.fault_missed:  # no fault happened: a plain run
        exp = {"codes": [0] * len(res.codes), "status": "complete"}
    if res.codes != exp["codes"]:
        res.wrong_codes = True
        res.notes.append(f"expected codes {exp['codes']}")
    code0 = res.codes[0] if res.codes else None
    if sc.kind == "kill_server" and not res.fault_missed:
        for i in range(1, sc.processes):
            errors = [line.strip() for line in job.text(i).splitlines() if line.startswith("staleness: error:")]
            want = f"staleness: error: process {i}: {SERVER_LOST}"
            if errors != [want] or "Check failure" in job.text(i):
                res.bad_message = True
                res.notes.append(f"process {i} printed {errors or job.text(i)[-300:]!r}")
        if out.exists():
            res.notes.append("a Result was written although process 0 was killed")
        return
    if sc.kind == "pause_worker" and not res.fault_missed:
        errors = [line for line in job.text(sc.victim).splitlines() if line.startswith("staleness: error:")]
        if len(errors) != 1 or "Check failure" in job.text(sc.victim):
            res.bad_message = True
            res.notes.append(f"paused process printed {errors or job.text(sc.victim)[-300:]!r}")
    if sc.kind == "raise_worker":
        errors = [line for line in job.text(0).splitlines() if line.startswith("staleness: error:")]
        if not (len(errors) == 1 and f"worker {sc.victim} failed" in errors[0] and "boom" in errors[0]):
            res.bad_message = True
            res.notes.append(f"process 0 printed {errors or job.text(0)[-300:]!r}")
    try:
        import staleness as st

        result = st.Result.load(out)
    except Exception as e:  # noqa: BLE001 - any failure to load counts
        res.crash_without_result = True
        res.notes.append(f"no Result ({type(e).__name__}: {str(e)[:120]}); process 0 exited {code0}: "
                         f"{job.text(0)[-400:]!r}")
        return
    res.status = result.status
    res.updates_done = result.schedule.num_updates
    if result.status != exp["status"]:
        res.wrong_status = True
        res.notes.append(f"expected status {exp['status']}")
    if result.status == "complete" and result.schedule.num_updates != sc.updates:
        res.wrong_status = True
        res.notes.append(f"complete after {result.schedule.num_updates} of {sc.updates} updates")
    _measure(sc, result, res)
    res.replay_ulp = replay_distance(result, sc.workers)
    if res.replay_ulp:
        res.replay_mismatch = True
        res.notes.append(f"replay differs by {res.replay_ulp} ulp")


def _measure(sc: Scenario, result, res: Outcome) -> None:
    import numpy as np

    f = result.schedule.columns
    victims = ([w for w in range(sc.workers) if w % sc.processes == sc.victim]
               if sc.kind in ("kill_worker", "pause_worker", "restart_worker") else [])
    times = []
    for w in victims:
        lost = f["lost"] & (f["worker"] == w)
        if not lost.any():
            continue
        t_lost = float(f["end"][lost][0])
        before = (f["worker"] == w) & ~f["lost"] & (f["push_time"] <= t_lost)
        if before.any():
            times.append(t_lost - float(np.max(f["push_time"][before])))
        if sc.kind == "restart_worker":
            back = (f["worker"] == w) & ~f["lost"] & (f["push_time"] > t_lost)
            res.rejoined = bool(back.any()) if res.rejoined is None else (res.rejoined and bool(back.any()))
    if times:
        res.detection_s = max(times)


def replay_distance(result, workers: int) -> int:
    """Largest distance in units in the last place (float32) between the Result's
    parameters and the engine's replay of its trace (slot_mode='map'); 0: bitwise."""
    import jax
    import numpy as np

    import staleness as st

    cfg = result.config
    task = st.tasks.get(cfg["task"], num_workers=workers, batch_size=cfg["batch_size"])
    rep = st.engine.replay(result.schedule, task, slot_mode="map", lr=cfg["lr"], seed=cfg["seed"],
                           lr_rule=cfg["lr_rule"], optimizer=cfg["optimizer"])
    worst = 0
    for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(rep.params)):
        a, b = np.asarray(a), np.asarray(b)
        if np.array_equal(a, b):
            continue
        if a.dtype != np.float32:
            return 2**31
        ia, ib = (np.where(x.view(np.int32) < 0, np.int64(-2**31) - x.view(np.int32), x.view(np.int32))
                  .astype(np.int64) for x in (a, b))
        worst = max(worst, int(np.max(np.abs(ia - ib))))
    return worst


# -- summary ----------------------------------------------------------------------------------
def summarize(outcomes: list[Outcome], wall: float, seed: int) -> dict:
    def count(flag):
        return sum(bool(getattr(o, flag)) for o in outcomes)

    det = sorted(o.detection_s for o in outcomes if o.detection_s is not None)
    server_exit = sorted(o.end_after_fault_s for o in outcomes
                         if o.scenario.kind == "kill_server" and o.end_after_fault_s is not None and not o.hang)
    return {
        "scenarios": len(outcomes), "seed": seed, "ok": sum(o.ok for o in outcomes),
        "hangs": count("hang"), "crashes_without_result": count("crash_without_result"),
        "replay_mismatches": count("replay_mismatch"),
        "replay_mismatches_over_4_ulp": sum((o.replay_ulp or 0) > 4 for o in outcomes),
        "wrong_exit_codes": count("wrong_codes"),
        "wrong_status": count("wrong_status"), "bad_messages": count("bad_message"),
        "service_leftovers": count("service_leftover"), "faults_missed": count("fault_missed"),
        "rejoined": sum(o.rejoined is True for o in outcomes),
        "restarts": sum(o.scenario.kind == "restart_worker" for o in outcomes),
        "detection_s_median": det[len(det) // 2] if det else None, "detection_s_max": det[-1] if det else None,
        "others_exit_after_server_kill_s_max": server_exit[-1] if server_exit else None,
        "by_kind": {k: sum(o.scenario.kind == k and o.ok for o in outcomes) for k in KINDS},
        "wall_seconds": round(wall, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=36)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    ap.add_argument("--only", default=None, help="comma-separated scenario indices to run (of the seed's list)")
    ap.add_argument("--keep", default=None, help="directory for the scenarios' Results (default: a temp dir)")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--kinds must be a subset of {','.join(KINDS)}")
    scenarios = make_scenarios(args.scenarios, seed, kinds)
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        scenarios = [s for s in scenarios if s.index in keep]
    workdir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="staleness-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"soak: seed {seed}, {len(scenarios)} scenarios, Results in {workdir}", flush=True)
    t0 = time.monotonic()
    outcomes = []
    try:
        for sc in scenarios:
            o = run_scenario(sc, workdir)
            outcomes.append(o)
            print(o.line(), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = summarize(outcomes, time.monotonic() - t0, seed)
    print(f"soak: {summary['ok']}/{summary['scenarios']} ok; hangs {summary['hangs']}, crashes without a "
          f"Result {summary['crashes_without_result']}, replay mismatches {summary['replay_mismatches']}, "
          f"wrong exit codes {summary['wrong_exit_codes']}, wrong status {summary['wrong_status']}, bad messages "
          f"{summary['bad_messages']}, service leftovers {summary['service_leftovers']}; rejoined "
          f"{summary['rejoined']}/{summary['restarts']}")
    ulps = [o.replay_ulp for o in outcomes if o.replay_ulp is not None]
    worst = max(ulps, default=0)
    check = Agreement("the engine's replay (slot_mode='map')", "the real multi-process run", float(worst), BITWISE,
                      what=f"largest distance of final parameters (float32 ulp) over {len(ulps)} replays",
                      why="bitwise on CPU",
                      detail=", ".join(f"#{o.scenario.index:02d}: {o.replay_ulp} ulp" for o in outcomes
                                       if o.replay_ulp))
    finish(summary, [check])   # exits 1 beyond the tolerance
    return 0 if summary["ok"] == summary["scenarios"] else 1


# -- the raising worker's process ----------------------------------------------------------------
def _child_raise(spec: str, argv: list[str]) -> int:
    """`staleness run ARGV` where worker W raises at iteration I (spec 'W:I'), from
    its gradient call in the worker's thread, as a model's error would surface
    there. (The numerics are untouched, so the trace still replays bitwise.)"""
    sys.path.insert(0, str(ROOT))
    from staleness.cli import main as cli_main
    from staleness.runtime import numerics

    worker, iteration = (int(x) for x in spec.split(":"))
    gradient = numerics.Numerics.gradient

    def failing_gradient(self, params, w, i, device):
        if int(w) == worker and int(i) >= iteration:
            raise ValueError(f"boom in worker {int(w)} at iteration {int(i)}")
        return gradient(self, params, w, i, device)

    numerics.Numerics.gradient = failing_gradient
    return cli_main(["run", *argv])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child-raise":
        rest = sys.argv[3:]
        sys.exit(_child_raise(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest))
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
