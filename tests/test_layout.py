"""The layer folders (sim/, results/, infra/) keep every public name working (`st.X`,
`from staleness import X`); the modules' old dotted paths (`staleness.compare`) are gone
with the import hook that served them (issue 37): importing staleness changes no
interpreter-wide state."""

import importlib
import subprocess
import sys

import pytest

import staleness as st

PUBLIC = {"compare": "results.compare", "stats": "results.stats", "metrics": "tasks.metrics",
          "plots": "results.plots", "explorer": "results.explorer", "tracking": "infra.tracking",
          "rollouts": "results.rollouts", "files": "infra.files", "specs": "infra.specs", "checks": "infra.checks"}


def test_public_names_are_the_layer_modules():
    for name, where in PUBLIC.items():
        assert getattr(st, name) is importlib.import_module(f"staleness.{where}"), name


def test_no_import_hook_and_the_old_dotted_paths_are_gone():
    code = ("import sys\nimport staleness as st\nfrom staleness import plots, stats\n"
            "ours = [f for f in sys.meta_path if getattr(f, '__module__', '').split('.')[0] == 'staleness']\n"
            "assert not ours, ours\n"
            "assert plots is st.plots and stats is st.stats and st.results.Result is st.Result\n"
            "assert st.sim.simulate_schedule is st.simulate_schedule\n"
            "try:\n    import staleness.compare\nexcept ModuleNotFoundError:\n    pass\n"
            "else:\n    raise AssertionError('staleness.compare still imports')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("staleness.sim_pool")


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
