"""A quick soak: three fault scenarios of `benchmarks/soak.py` (the full soak
runs 36 randomized ones), each a real 3-process job on 127.0.0.1 with its own
free port, under hard deadlines (every process is SIGKILLed when one passes).

  - a worker process is SIGKILLed mid-run (ASP, --on-worker-failure continue):
    the run completes without it and its trace replays bitwise;
  - process 0 is SIGKILLed (SSP): the others exit 1 with one `staleness: error:`
    line each, and the coordination service's process goes away;
  - a worker raises in its gradient call (DSSP): process 0 exits 1 naming it,
    with a 'stopped' Result that replays bitwise.

Nothing asserts on speed: the deadlines are there to catch hangs, with margins
for two busy cores.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import soak  # noqa: E402

SCENARIOS = [
    soak.Scenario(index=0, kind="kill_worker", policy="asp", processes=3, task="quadratic", on_failure="continue",
                  updates=600, fault_at=60, victim=2, raise_iteration=0, pause=0.0),
    soak.Scenario(index=1, kind="kill_server", policy="ssp:3", processes=3, task="quadratic", on_failure="continue",
                  updates=100_000, fault_at=40, victim=0, raise_iteration=0, pause=0.0),
    soak.Scenario(index=2, kind="raise_worker", policy="dssp:3:12", processes=3, task="quadratic",
                  on_failure="stop", updates=1000, fault_at=0, victim=4, raise_iteration=5, pause=0.0),
]


@pytest.mark.timeout(110)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s.kind}-{s.policy}")
def test_quick_soak(scenario, tmp_path):
    outcome = soak.run_scenario(scenario, tmp_path, start_deadline=60.0, fault_deadline=40.0)
    print(outcome.line())
    assert outcome.ok, outcome.line()
    assert not outcome.fault_missed, outcome.line()
    if scenario.kind == "kill_server":
        assert outcome.codes == [-9, 1, 1]
    else:
        assert outcome.status == soak.expected(scenario)["status"] and outcome.replay_ulp == 0
