"""Synchronization policies: when a worker may start, when the server updates, what a worker computes.

A policy is one immutable value (`Policy`) of three parts, each a declared
protocol (in the spirit of optax's transformations: any value with the
methods will do, and the layers ask it rather than test its type):

- a **gate** (`Gate`, `gates`) decides when a worker may start its next
  iteration: `Free` (ASP, softsync), `ClockBound(s)` (SSP; BSP's barrier at
  s = 0), `DynamicBound(s_low, r_max, cap)` (DSSP), `RoundBound()` (backup workers);
- an **aggregation** (`Aggregation`, `aggregations`) decides which gradients
  the server keeps and when it applies an update: `EachGradient` (ASP, SSP,
  DSSP), `AllLive` (BSP), `Count(n)` (Rudra n-softsync), `FirstOfRound(b)`
  (backup workers);
- a **work** (`Work`, `work`) says what a worker computes between a pull and a
  push: `Gradient()`, `LocalSteps(H)` (Local SGD, DiLoCo), `Streaming(...)`
  (Streaming DiLoCo), `Rollout(learner, inflight, refill)` (asynchronous RL's actors), and
  answers every question the simulator, the engine, the network model, the runtime and the
  CLI ask about it (its bytes through `payload`'s shape arithmetic; the engine's step it
  runs by name, `Work.numerics`).

    ssp(3)          == Policy(ClockBound(3), EachGradient(), "ssp:3")
    bsp()           == Policy(ClockBound(0), AllLive(), "bsp")

The driver protocol (`Policy.init/push/fail/join`, module `policy`) is the
same for the simulator and the runtime. Your own policy is one file: a
factory returning a `Policy`, named on every command as
'package.module:factory[:ARGS]' or registered with `register(name, factory)`
(module `registry`; `parse` turns spec strings into policies).
"""

from staleness.policies import payload
from staleness.policies.aggregations import (AllLive, Aggregation, Count, EachGradient, FirstOfRound, Fresh,
                                             Minibatches, Quorum, Window)
from staleness.policies.factories import (RL_MODES, asp, async_diloco, backup_workers, bsp, decoupled_diloco, diloco,
                                          dssp, local_sgd,
                                          rl_async, rl_inflight, rl_one_step_off, rl_partial, rl_sync, softsync, ssp, streaming_diloco)
from staleness.policies.gates import Capacity, ClockBound, DynamicBound, Free, Gate, RoundBound, RoundLag, dssp_controller
from staleness.policies.policy import Policy, Unknown
from staleness.policies import registry
from staleness.policies.registry import factory, names, parse, recorded, register, resolve, spec_help
from staleness.policies.state import ClockTable, PushOutcome, SyncState
from staleness.policies.work import Gradient, LocalSteps, Rollout, Streaming, Work

__all__ = [
    "Policy", "PushOutcome", "SyncState", "ClockTable", "Gate", "Aggregation", "Work", "Unknown",
    "Free", "ClockBound", "DynamicBound", "RoundBound", "RoundLag", "Capacity",
    "EachGradient", "Window", "Quorum", "AllLive", "Count", "FirstOfRound", "Fresh", "Minibatches", "Gradient", "LocalSteps", "Streaming", "Rollout",
    "bsp", "asp", "ssp", "dssp", "softsync", "backup_workers", "local_sgd", "diloco", "async_diloco",
    "streaming_diloco", "decoupled_diloco", "rl_sync", "rl_one_step_off", "rl_async", "rl_inflight", "rl_partial", "RL_MODES",
    "dssp_controller", "parse", "resolve", "register", "names", "factory", "registry", "spec_help", "recorded", "payload",
]


def __dir__():
    return sorted(__all__)
