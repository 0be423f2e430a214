"""`staleness.infra.procs.kill_groups`: SIGKILL to each process group, after an optional grace."""

import signal
import subprocess
import sys
import time

from staleness.infra.procs import kill_groups


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_kills_the_running_and_reaps_the_finished():
    hung, done = _start("import time; time.sleep(60)"), _start("pass")
    done.wait(timeout=30)
    kill_groups([hung, done])
    assert hung.returncode == -signal.SIGKILL
    assert done.returncode == 0


def test_grace_lets_a_process_end_on_its_own():
    p = _start("import time; time.sleep(0.3)")
    t0 = time.monotonic()
    kill_groups([p], grace=30)
    assert p.returncode == 0
    assert time.monotonic() - t0 < 25   # returned when it ended, not at the end of the grace


# -- the launcher (`staleness launch --local N`), with stand-in processes -----------------------
FAKE = r"""#!/bin/sh
# a stand-in for `python -m staleness run ... --process-id I`: its behaviour by process id
id=$(echo "$@" | sed 's/.*--process-id \([0-9]*\).*/\1/')
case "$MODE:$id" in
  killed:0) sleep 1; exit 0 ;;              # process 0 completes (on_worker_failure=continue)
  killed:*) kill -9 $$ ;;                   # a worker process is killed
  interrupt:0) trap 'exit 130' INT; touch "$READY.0"; while :; do sleep 0.1; done ;;
  interrupt:*) trap '' INT; touch "$READY.$id"; sleep 120 ;;    # still starting up: never ends on its own
esac
"""


def _fake(tmp_path):
    path = tmp_path / "fake-python"
    path.write_text(FAKE)
    path.chmod(0o755)
    return str(path)


def _launcher(tmp_path, mode: str) -> subprocess.Popen:
    code = ("import sys\nfrom staleness.runtime import multiprocess as m\nm.INTERRUPT_GRACE = 1.0\n"
            f"sys.exit(m.launch_local(2, [], python={_fake(tmp_path)!r}, timeout=100))\n")
    env = {**__import__("os").environ, "MODE": mode, "READY": str(tmp_path / "ready")}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)


def test_the_launcher_exits_with_process_0s_status_and_names_a_lost_process(tmp_path):
    """A job that lost a worker process and completed (on_worker_failure=continue) exits
    0, not with the killed process's raw status; the lost process is named on stderr."""
    p = _launcher(tmp_path, "killed")
    try:
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()   # a launcher that hangs is a failure, not a leftover (it kills its children at its timeout)
    assert p.returncode == 0, err
    assert err.strip().splitlines() == ["staleness: process 1 exited with signal 9"]


def test_ctrl_c_on_the_launcher_kills_processes_that_outlive_process_0(tmp_path):
    """Ctrl-C while the job starts up: process 0 stops; a process waiting for the gone
    coordination service would hang for minutes, and is killed after the grace."""
    p = _launcher(tmp_path, "interrupt")
    deadline = time.monotonic() + 120   # both stand-ins started (the launcher waits on them), on a loaded box too
    while not all((tmp_path / f"ready.{i}").exists() for i in range(2)):
        assert p.poll() is None and time.monotonic() < deadline, "the launcher did not start both processes"
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and time.monotonic() - t0 < 30, err
    assert "killed the processes still running 1 s after process 0 stopped" in err
