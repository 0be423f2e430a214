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


class _Node:
    """A stand-in for xdist's WorkerController: records the tests it is sent."""

    def __init__(self, name):
        self.name, self.shutting_down, self.sent = name, False, []

    def send_runtest_some(self, indexes):
        self.sent.append(list(indexes))

    def shutdown(self):
        self.shutting_down = True


def test_a_crashed_worker_hands_on_only_its_unfinished_tests():
    """Regression: xdist re-queued the crashed worker's finished files too; the next worker
    was sent an empty batch and the run waited forever (a CI run ended at its 90-minute limit)."""
    from collections import OrderedDict

    sched = conftest.scheduler_class().__new__(conftest.scheduler_class())
    sched.log = lambda *a, **k: None
    collection = ["tests/test_a.py::t1", "tests/test_a.py::t2", "tests/test_b.py::t1", "tests/test_b.py::t2",
                  "tests/test_b.py::t3", "tests/test_c.py::t1"]
    crashed, alive = _Node("gw0"), _Node("gw1")
    sched.collection = collection
    sched.registered_collections = {crashed: collection, alive: collection}
    sched.workqueue = OrderedDict()
    sched.assigned_work = {
        crashed: {"tests/test_a.py": {"tests/test_a.py::t1": True, "tests/test_a.py::t2": True},
                  "tests/test_b.py": {"tests/test_b.py::t1": True, "tests/test_b.py::t2": False,
                                      "tests/test_b.py::t3": False}},
        alive: {"tests/test_c.py": {"tests/test_c.py::t1": True}},
    }
    assert sched.remove_node(crashed) == "tests/test_b.py::t2"
    assert alive.sent == [[3, 4]]           # test_b's two unfinished tests, not test_a's none
    assert not sched.workqueue
