"""The suite's own scheduling on xdist workers (tests/conftest.py)."""

from pathlib import Path

import conftest


def test_multiprocess_files_exist_and_share_one_scheduling_unit():
    here = Path(__file__).parent
    for name in conftest.MULTIPROCESS_FILES:   # a renamed file would silently leave the unit
        assert (here / name).is_file(), name
    units = {conftest.scheduling_unit(f"tests/{name}::test_x[1]") for name in conftest.MULTIPROCESS_FILES}
    assert units == {"multiprocess"}


def test_other_files_are_their_own_units():
    assert conftest.scheduling_unit("tests/test_specs.py::test_a") == "tests/test_specs.py"
    assert conftest.scheduling_unit("notebooks/01-quickstart.ipynb::01-quickstart.ipynb") == \
        "notebooks/01-quickstart.ipynb"


def test_compiled_programs_are_released_past_the_mapping_limit():
    """XLA:CPU's compiled programs hold memory mappings until their caches are cleared; a
    worker past the kernel's limit aborts, so conftest clears them past MAPPINGS_LIMIT."""
    import jax
    import jax.numpy as jnp

    assert conftest.MAPPINGS_LIMIT < 65_530 // 2
    for i in range(60):
        jax.jit(lambda x, i=i: jnp.tanh(x @ x.T * i).cumsum(0))(jnp.ones((8, 8))).block_until_ready()
    held = conftest.mapping_count()
    assert held > 0
    assert not conftest.release_compiled_programs(limit=10 ** 9)
    assert conftest.release_compiled_programs(limit=0)
    assert conftest.mapping_count() < held
