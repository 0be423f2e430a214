"""Hypothesis strategies shared by the asynchronous-RL schedule tests."""

from hypothesis import strategies as hst

from staleness import cluster as C
from staleness import policies as P


def actors(draw, max_workers: int = 4):
    """1..max_workers actors of random speeds (0.2-3 s per token), jittered half of the time."""
    n = draw(hst.integers(1, max_workers))
    cluster = C.heterogeneous(draw(hst.lists(hst.floats(0.2, 3.0), min_size=n, max_size=n)))
    if draw(hst.booleans()):
        cluster = cluster.jitter(draw(hst.floats(0.0, 0.6)))
    return cluster


def bounded_policy(draw) -> tuple:
    """(eta, mode, learner, batch) of rl_async / rl_inflight / rl_partial (a mode other than
    pacing needs a bound η)."""
    eta = draw(hst.sampled_from([None, 0, 1, 3]))
    mode = "pace" if eta is None else draw(hst.sampled_from(P.RL_MODES))
    return (eta, mode, draw(hst.sampled_from([0.0, 0.5, 2.0])), draw(hst.sampled_from([None, 1, 3])))
