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
