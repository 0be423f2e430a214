"""Test configuration: strict JAX settings and hypothesis profiles.

Virtual CPU devices are set before any JAX op so multi-device tests can run
in-process; tests that need a different device count start a subprocess.

The README runs the suite on two pytest-xdist workers with `--dist loadfile`: each
test file runs on one worker (its module fixtures are built once), and the files whose
tests start jobs of several JAX processes form one unit, so at most one such job runs
at a time (on a loaded 2-core machine two at once starve each other's heartbeats).
"""

import gc
import os
import sys

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import hypothesis

hypothesis.settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, print_blob=True
)
hypothesis.settings.register_profile("dev", max_examples=100, deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

try:
    import jax

    jax.config.update("jax_threefry_partitionable", True)
except ImportError:  # pragma: no cover
    pass


# Test files whose tests start multi-process jobs (launchers, `jax.distributed`, soak scenarios).
MULTIPROCESS_FILES = frozenset({"test_runtime_multiprocess.py", "test_pipeline_multiprocess.py", "test_soak.py",
                                "test_sweep.py", "test_rl_multiprocess.py"})


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the multi-process files as one unit (one worker, one at a
    time). xdist's own `loadgroup` cannot be used: it renames node ids, which pytest >= 9.2
    no longer lets it do, so its groups are silently ignored."""
    if config.getvalue("dist") != "loadfile":
        return None
    return scheduler_class()(config, log)


def scheduler_class():
    """xdist's LoadFileScheduling with our units, and a crashed worker's finished units kept
    out of the queue: xdist 3.8 re-queues every unit the crashed worker was given, finished
    ones too, and a worker then handed a finished unit is sent no test, so nothing ever asks
    the scheduler for more work and the run waits forever (CI's 90 minutes)."""
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

        def remove_node(self, node):
            workload = self.assigned_work.get(node, {})
            for scope in [s for s, unit in workload.items() if all(unit.values())]:
                del workload[scope]
            return super().remove_node(node)

    return Scheduling


def scheduling_unit(nodeid: str) -> str:
    """The unit of tests one xdist worker runs together: the test's file, or
    'multiprocess' for every file of MULTIPROCESS_FILES."""
    file = nodeid.split("::", 1)[0]
    return "multiprocess" if file.rsplit("/", 1)[-1] in MULTIPROCESS_FILES else file


# XLA:CPU maps each compiled program's code and data into the process with mmap, and jit
# caches keep every program alive: one xdist worker that runs half the suite collected
# ~30,000 mappings and, past the kernel's vm.max_map_count (65,530), XLA aborted in the
# middle of a compilation ("Fatal Python error: Aborted", the worker lost). After each test
# file, a worker holding more than MAPPINGS_LIMIT mappings drops its compiled programs.
MAPPINGS_LIMIT = 16_000


def mapping_count() -> int:
    """How many memory mappings this process holds (0 where /proc is not there)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:  # pragma: no cover (not Linux)
        return 0


def release_compiled_programs(limit: int = MAPPINGS_LIMIT) -> bool:
    """Clear JAX's caches (and collect) when this process holds more than `limit` mappings;
    returns whether it did."""
    if "jax" not in sys.modules or mapping_count() <= limit:
        return False
    sys.modules["jax"].clear_caches()
    gc.collect()
    return True


@pytest.fixture(autouse=True, scope="module")
def _bounded_compiled_programs(request):
    yield
    before = mapping_count()
    released = release_compiled_programs()
    log = os.environ.get("STALENESS_MAPPINGS_LOG")
    if log:
        with open(f"{log}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a") as f:
            f.write(f"{request.module.__name__} {before} {mapping_count()} {released}\n")
