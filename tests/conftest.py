"""Test configuration: strict JAX settings and hypothesis profiles.

Virtual CPU devices are set before any JAX op so multi-device tests can run
in-process; tests that need a different device count start a subprocess.
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
