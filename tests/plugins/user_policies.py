"""A policy written in a user's own file, outside the package: bounded-delay ASP.

Every gradient is applied on arrival (ASP's gate and aggregation), except that
the server drops a gradient staler than `tau` versions (the "bounded delay"
rule of Hogwild-style and bounded-asynchrony analyses). Named on every command
as 'user_policies:bounded_asp[:TAU]' with this directory on the Python path,
or registered with `st.policies.register("bounded_asp", bounded_asp)`.

It uses only the public protocol of `staleness.policies`: an aggregation is any
value with `accepts`, `due`, `size`, `validate` and `all_live`.
"""

import dataclasses

from staleness import policies


@dataclasses.dataclass(frozen=True)
class DropStale:
    """Apply each gradient on arrival; drop one computed more than `tau` versions ago."""

    tau: int
    all_live = False   # updates never wait for every live worker

    def accepts(self, state, worker, pull_version):
        return state.version - pull_version <= self.tau

    def due(self, state):
        return state.buffered >= 1

    def size(self, num_live, num_workers):
        return 1

    def validate(self, num_workers):
        pass


def bounded_asp(tau: int = 2) -> policies.Policy:
    """ASP that drops gradients staler than `tau` versions (tau >= 0)."""
    if tau < 0:
        raise ValueError(f"bounded_asp: tau = {tau} must be >= 0 (versions)")
    return policies.Policy(policies.Free(), DropStale(tau), f"bounded_asp:{tau}")
