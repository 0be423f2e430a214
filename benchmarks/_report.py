"""Shared helpers of the reproduction scripts (run as `python benchmarks/<script>.py`,
so this directory is on sys.path)."""

import os
import platform

import numpy as np


def versions() -> dict:
    """Versions and machine facts recorded in every results file."""
    import flax
    import jax
    import optax

    import staleness as st

    return {"python": platform.python_version(), "platform": platform.platform(), "jax": jax.__version__,
            "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else "", "flax": flax.__version__,
            "optax": optax.__version__, "numpy": np.__version__, "staleness": st.__version__,
            "backend": jax.default_backend(), "cpus": os.cpu_count()}
