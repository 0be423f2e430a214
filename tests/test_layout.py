"""The layer folders (sim/, results/, infra/) keep every public name working: `st.X`,
`from staleness import X`, and the modules' old import paths (the same module objects)."""

import importlib
import subprocess
import sys

import staleness as st

MOVED = {"compare": "results.compare", "stats": "results.stats", "metrics": "results.metrics",
         "plots": "results.plots", "explorer": "results.explorer", "tracking": "results.tracking",
         "rollouts": "results.rollouts", "files": "infra.files", "specs": "infra.specs", "checks": "infra.checks",
         "checkpoint": "infra.checkpoint", "procs": "infra.procs", "interrupts": "infra.interrupts",
         "sim_pool": "sim.pool", "inflight": "sim.inflight"}


def test_old_module_paths_import_the_moved_modules():
    for old, new in MOVED.items():
        module = importlib.import_module(f"staleness.{new}")
        assert importlib.import_module(f"staleness.{old}") is module, old
        assert module.__spec__.name == f"staleness.{new}" and module.__name__ == f"staleness.{new}"


def test_a_fresh_process_imports_by_the_old_paths():
    code = ("from staleness.compare import Comparison\nimport staleness.plots\nfrom staleness import stats\n"
            "import staleness as st\nassert st.plots is staleness.plots and st.stats is stats\n"
            "assert Comparison is st.compare.Comparison and st.results.Result is st.Result\n"
            "assert st.sim.simulate_schedule is st.simulate_schedule\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_public_names_listed_and_no_import_leaks():
    names = dir(st)
    for name in ("compare", "plots", "stats", "explorer", "files", "checks", "sim", "results", "simulate"):
        assert name in names and getattr(st, name) is not None
    assert "sys" not in vars(st) and "_sys" not in names


def test_the_command_line_and_the_control_plane_import_no_jax():
    """`staleness schedule` starts fast: the CLI (run's flags come from `runtime.spec`) and
    the control plane load without JAX (the runtime's names load on first use)."""
    code = ("import sys\nimport staleness.cli, staleness.runtime.spec, staleness.sim.pool\n"
            "assert not [m for m in sys.modules if m == 'jax' or m.startswith('jax.')], 'jax imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
