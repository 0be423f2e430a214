"""The simulator: the discrete-event scheduler and what it shares with the runtime.

- `scheduler`: (policy, cluster, budget, seed) -> `Schedule` (`simulate_schedule`,
  and `stream_schedule`, which yields it update by update);
- `pool`: worker processes that simulate a sweep's schedules on every core;
- `inflight`: which token an arriving version reaches (`Decode`), one rule for the
  simulated and the real actors of asynchronous RL.

The control plane: nothing here imports JAX.
"""

from staleness.sim.scheduler import ScheduleStream, simulate_schedule, stream_schedule

__all__ = ["simulate_schedule", "stream_schedule", "ScheduleStream"]


def __dir__():
    return sorted(__all__)   # the public names only, not the imports
