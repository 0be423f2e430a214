"""Test configuration: strict JAX settings and hypothesis profiles.

Virtual CPU devices are set before any JAX op so multi-device tests can run
in-process; tests that need a different device count start a subprocess.

The README runs the suite on two pytest-xdist workers with `--dist loadfile`: each
test file runs on one worker (its module fixtures are built once), and the files whose
tests start jobs of several JAX processes form one unit, so at most one such job runs
at a time (on a loaded 2-core machine two at once starve each other's heartbeats).
"""

import os

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
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

    return Scheduling(config, log)


def scheduling_unit(nodeid: str) -> str:
    """The unit of tests one xdist worker runs together: the test's file, or
    'multiprocess' for every file of MULTIPROCESS_FILES."""
    file = nodeid.split("::", 1)[0]
    return "multiprocess" if file.rsplit("/", 1)[-1] in MULTIPROCESS_FILES else file
