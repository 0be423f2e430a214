"""A Ctrl-C swallowed by a callback still stops the run (staleness.infra.interrupts).

Observed under load: SIGINT to `staleness compare` arrived while JAX's
garbage-collection callback ran; Python printed "Exception ignored in
_xla_gc_callback ... KeyboardInterrupt" and the command went on to exit 0. Here the
handler runs inside a weakref finalizer (whose exceptions Python also ignores),
which swallows its KeyboardInterrupt the same way."""

import gc
import signal
import sys
import weakref

import pytest

import staleness as st
from staleness.infra import interrupts
from staleness.results.compare import compare
from staleness.engine import chunks
from staleness.engine import run as engine_run

# the finalizer's ignored KeyboardInterrupt is reported by pytest as an unraisable exception
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class _Obj:
    pass


def _swallowed_ctrl_c():
    """Run the SIGINT handler where Python ignores its exception (a finalizer)."""
    obj = _Obj()
    weakref.finalize(obj, interrupts.handler, signal.SIGINT, None)
    del obj
    gc.collect()


@pytest.fixture
def installed():
    old, old_hook = signal.getsignal(signal.SIGINT), sys.unraisablehook
    interrupts.install()
    yield
    interrupts.clear()
    signal.signal(signal.SIGINT, old)
    sys.unraisablehook = old_hook


def test_the_finalizer_really_swallows_the_interrupt(installed):
    _swallowed_ctrl_c()   # no KeyboardInterrupt here: that is the problem being fixed
    with pytest.raises(KeyboardInterrupt):
        interrupts.check()


def test_the_chunk_loop_stops_at_the_next_chunk(installed):
    done = []

    def step(carry, xs):
        done.append(xs)
        if xs == 1:
            _swallowed_ctrl_c()
        return carry, {}

    _, status, _ = chunks.run(step, 0, num_chunks=5, inputs=lambda k: k, record=lambda *a: True)
    assert status == "stopped" and done == [0, 1]


def test_compare_stops_after_a_swallowed_ctrl_c(installed, tmp_path, monkeypatch):
    real, count = engine_run.core.run_chunk, []

    def chunk(*args, **kwargs):
        count.append(1)
        if len(count) == 2:   # the first run's second chunk
            _swallowed_ctrl_c()
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_run.core, "run_chunk", chunk)
    cmp = compare(st.tasks.get("quadratic", num_workers=4), ["asp"], st.cluster.parse("1,1,2,2"), seeds=[0, 1, 2],
                  num_updates=12, lr=0.05, num_evals=4, out=tmp_path / "cmp")
    assert cmp.interrupted and [r.status for r in cmp.results] == ["stopped"]


def test_the_swallowed_interrupt_is_not_printed(installed, capsys):
    """The CLI's Ctrl-C is one line: the swallowed KeyboardInterrupt's report is dropped
    (other unraisable exceptions still reach the previous hook)."""
    seen = []
    sys.unraisablehook = interrupts._quiet_hook(seen.append)
    _swallowed_ctrl_c()
    obj = _Obj()
    weakref.finalize(obj, lambda: 1 / 0)
    del obj
    gc.collect()
    assert [type(u.exc_value) for u in seen] == [ZeroDivisionError]
    assert "KeyboardInterrupt" not in capsys.readouterr().err


def test_without_install_nothing_is_recorded():
    interrupts.clear()
    interrupts.check()   # the Python API: no handler installed, nothing pending


def test_a_real_run_stops_after_a_ctrl_c_swallowed_before_it_served(installed):
    """`staleness run` interrupted while it started (imports, compiling) ran to the end
    and exited 0 when a callback swallowed the interrupt; the serve loop now stops at
    its next step and keeps what it recorded."""
    _swallowed_ctrl_c()
    res = st.runtime.run(st.tasks.get("quadratic", num_workers=2), "asp", None, num_updates=5000, lr=0.05,
                         devices=1, progress=False)
    assert res.status == "stopped" and res.schedule.num_updates < 5000


def test_the_console_script_exits_at_once_after_a_failure(tmp_path):
    """A failed or interrupted command exits with os._exit after flushing (JAX threads
    may still run; finalizing under them crashed it): its status and last line survive."""
    import subprocess

    code = ("import sys, threading, time\n"
            "from staleness import cli\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()   # a non-daemon thread that would hang exit\n"
            "sys.argv = ['staleness', 'simulate', '--updates', '-3']\n"
            "cli.entry()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("staleness: error: --updates = -3"), out.stderr


@pytest.mark.parametrize("under", ["handler", "default"])
def test_ctrl_c_during_a_results_orbax_save_waits_for_its_commit(installed, tmp_path, monkeypatch, caplog, under):
    """Seen by hand: Ctrl-C while a Result's orbax checkpoint was committing (on orbax's
    thread) raised at once; the atomic write's cleanup then removed the directory under the
    commit, which failed with absl's "Failed to run ... Commit operations" traceback. The
    save now runs to its end and the interrupt follows it: nothing half-written stays behind."""
    import os

    import orbax.checkpoint as ocp

    if under == "default":
        signal.signal(signal.SIGINT, signal.default_int_handler)
    real = ocp.StandardCheckpointer.save
    finished = []

    def save(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C as the save starts
        out = real(self, *args, **kwargs)
        self.wait_until_finished()
        finished.append(True)
        return out

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", save)
    r = st.simulate(st.tasks.get("quadratic", num_workers=2), "asp", "1,1", num_updates=4, lr=0.05)
    with pytest.raises(KeyboardInterrupt):
        r.save(tmp_path / "res")
    assert finished == [True], "the interrupt did not wait for the save"
    assert list(tmp_path.iterdir()) == []     # the atomic write left nothing behind
    assert "Failed to run" not in caplog.text
    assert (interrupts._pending.is_set()) == (under == "handler")
    assert signal.getsignal(signal.SIGINT) is (interrupts.handler if under == "handler" else signal.default_int_handler)
