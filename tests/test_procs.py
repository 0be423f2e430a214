"""`staleness.procs.kill_groups`: SIGKILL to each process group, after an optional grace."""

import signal
import subprocess
import sys
import time

from staleness.procs import kill_groups


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
