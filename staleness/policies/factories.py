"""The built-in policies: the seeds' parameter-server family and the local-update methods.

    ssp(3)            == Policy(ClockBound(3), EachGradient(), "ssp:3")
    bsp()             == Policy(ClockBound(0), AllLive(), "bsp")
    dssp(3, 12)       == Policy(DynamicBound(3, 12), EachGradient(), "dssp:3:12")
    softsync(4)       == Policy(Free(), Count(4), "softsync:4")
    backup_workers(1) == Policy(RoundBound(), FirstOfRound(1), "backup:1")
    diloco(50)        == Policy(ClockBound(0), AllLive(), "diloco:50", LocalSteps(50), "nesterov:0.9,lr=0.7")

Each factory checks its arguments (a ValueError naming the argument) and
returns a `Policy` whose spec parses back to it (`staleness.policies.parse`).
"""

from __future__ import annotations

from staleness.infra import checks
from staleness.policies.aggregations import (AllLive, Count, EachGradient, FirstOfRound, Fresh, Minibatches, Quorum,
                                             Window)
from staleness.policies.gates import Capacity, ClockBound, DynamicBound, Free, RoundBound, RoundLag
from staleness.policies.policy import Policy
from staleness.policies.work import LocalSteps, Rollout, Streaming

__all__ = ["bsp", "asp", "ssp", "dssp", "softsync", "backup_workers", "local_sgd", "diloco", "async_diloco",
           "streaming_diloco", "decoupled_diloco", "rl_sync", "rl_one_step_off", "rl_async", "rl_inflight", "rl_partial", "RL_MODES"]


def bsp() -> Policy:
    """Bulk synchronous parallel (hardsync): staleness 0, every live worker's gradient per update."""
    return Policy(ClockBound(0), AllLive(), "bsp")


def asp() -> Policy:
    """Asynchronous parallel: apply on arrival, never block."""
    return Policy(Free(), EachGradient(), "asp")


def ssp(staleness: int = 3) -> Policy:
    """Stale synchronous parallel with a fixed threshold `staleness` (clocks)."""
    checks.integer("ssp", "staleness", staleness, low=0)
    return Policy(ClockBound(staleness), EachGradient(), f"ssp:{staleness}")


def dssp(s_low: int = 3, r_max: int = 12, cap: bool = True) -> Policy:
    """Dynamic SSP with threshold in [s_low, s_low + r_max] (see `DynamicBound`)."""
    checks.integer("dssp", "s_low", s_low, low=0)
    checks.integer("dssp", "r_max", r_max, low=0)
    if not isinstance(cap, bool):
        raise ValueError(f"dssp: cap = {cap!r} must be True or False")
    return Policy(DynamicBound(s_low, r_max, cap), EachGradient(), f"dssp:{s_low}:{r_max}" + ("" if cap else ":nocap"))


def softsync(n: int = 1) -> Policy:
    """Rudra n-softsync: one update per floor(λ/n) gradients."""
    checks.integer("softsync", "n", n, low=1)
    return Policy(Free(), Count(n), f"softsync:{n}")


def backup_workers(b: int = 1) -> Policy:
    """Synchronous SGD that drops the last `b` gradients of each round."""
    checks.integer("backup_workers", "b", b, low=0)
    return Policy(RoundBound(), FirstOfRound(b), f"backup:{b}")


def local_sgd(steps: int = 10) -> Policy:
    """Local SGD: every worker takes `steps` inner steps from the last global
    parameters, then the server averages the workers' parameters (synchronous: the
    outer step is plain SGD with learning rate 1 on the mean delta)."""
    return Policy(ClockBound(0), AllLive(), f"local_sgd:{steps}", LocalSteps(steps), "sgd:lr=1")


def diloco(steps: int = 50, topk: float = 1.0, bits: int = 32, error_feedback: bool = False) -> Policy:
    """DiLoCo (Douillard et al. 2023): Local SGD with an inner optimizer per worker
    (state kept across rounds) and an outer optimizer on the mean delta, by default
    Nesterov SGD with learning rate 0.7 and momentum 0.9. topk, bits, error_feedback:
    SparseLoCo's compressed deltas (e.g. topk=0.02, bits=2, error_feedback; see `LocalSteps`)."""
    work, suffix = _compressed(steps, topk, bits, error_feedback)
    return Policy(ClockBound(0), AllLive(), f"diloco:{steps}{suffix}", work, "nesterov:0.9,lr=0.7")


def _compressed(steps: int, topk: float, bits: int, error_feedback: bool, **more) -> tuple[LocalSteps, str]:
    """(LocalSteps with SparseLoCo's compression, the spec suffix naming what differs from dense)."""
    work = LocalSteps(steps, topk=float(topk), qbits=bits, error_feedback=error_feedback, **more)
    return work, ((f":topk={float(topk):g}" if topk < 1 else "") + (f":bits={bits}" if bits < 32 else "")
                  + (":error_feedback" if error_feedback else ""))


def async_diloco(steps: int = 50, bound: int | None = None, dynamic: bool = False, grace: float = 0.0) -> Policy:
    """Asynchronous Local-SGD / DiLoCo (Liu et al. 2024): the server applies each
    worker's delta on arrival; `bound` (clocks) blocks a worker that runs too far
    ahead, as SSP does (None: never); `dynamic`: Dynamic Local Updates (fewer steps
    for slower workers); `grace` (seconds): an arrival opens a window in
    which every other worker that arrives is synchronized too, and all of them restart at
    the window's last synchronization (`Window`: the asyncdiloco notebook's
    `max_wait_time`; 0: none). The outer optimizer defaults to DiLoCo's; the paper's
    Delayed Nesterov is `staleness.tasks.optim.delayed_nesterov` (spec
    `delayed_nesterov:N`)."""
    if bound is not None:
        checks.integer("async_diloco", "bound", bound, low=0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not 0.0 <= grace < float("inf"):
        raise ValueError(f"async_diloco: grace = {grace!r} must be a finite number of seconds >= 0 (0: no window)")
    spec = (f"async_diloco:{steps}" + ("" if bound is None else f":bound={bound}") + (":dynamic" if dynamic else "")
            + (f":grace={float(grace):g}" if grace else ""))
    gate = Free() if bound is None else ClockBound(bound)
    aggregation = Window(float(grace)) if grace else EachGradient()
    return Policy(gate, aggregation, spec, LocalSteps(steps, dynamic), "nesterov:0.9,lr=0.7")


def streaming_diloco(steps: int = 50, fragments: int = 2, overlap: int = 0, alpha: float = 0.0,
                     bits: int = 32) -> Policy:
    """Streaming DiLoCo: DiLoCo whose parameters are synchronized one fragment at a time
    (see `Streaming`): an update every H/P inner steps, of one fragment; `overlap` τ
    inner steps pass before a worker merges it with mixing factor `alpha`; outer
    gradients quantized to `bits`. The workers stay in lockstep (a synchronization
    round every H/P steps, as in the paper); the overlap is in the numerics (the merge
    comes τ steps late) and in the simulated time: the τ steps run while the fragment
    is in flight, hiding up to τ steps of communication (see `staleness.sim.scheduler`), and a
    sync moves one fragment's bytes (`staleness.engine.payload`)."""
    checks.integer("streaming_diloco", "steps", steps, low=1)
    checks.integer("streaming_diloco", "fragments", fragments, low=1)
    if steps % fragments:
        raise ValueError(f"streaming_diloco: steps = {steps} must be a multiple of fragments = {fragments} "
                         "(one fragment is synchronized every steps / fragments inner steps)")
    work = Streaming(steps // fragments, False, fragments, overlap, float(alpha), bits)
    # the spec names only what differs from the defaults: a short label for tables, legends and directories
    spec = f"streaming_diloco:{steps}" + "".join(
        f":{k}={v:g}" if isinstance(v, float) else f":{k}={v}"
        for k, v, default in (("fragments", fragments, 2), ("overlap", overlap, 0), ("alpha", float(alpha), 0.0),
                              ("bits", bits, 32)) if v != default)
    return Policy(ClockBound(0), AllLive(), spec, work, "nesterov:0.9,lr=0.7")


def decoupled_diloco(steps: int = 50, quorum: int = 1, grace: float | str = 0.0, dynamic: bool = False,
                     tokens: bool = True, topk: float = 1.0, bits: int = 32, error_feedback: bool = False,
                     gamma: float = 0.5, tau: int = 2, fragments: int = 1, overlap: int = 0) -> Policy:
    """Decoupled DiLoCo (Douillard et al. 2026): independent learners take `steps` inner
    steps on their own clocks and push their deltas to a synchronizer, which merges once
    `quorum` learners have arrived, after waiting `grace` seconds for more (`Quorum`); the
    merged learners restart on the merged version, the others are merged in a later window.
    grace: seconds, or "adaptive": the paper's adaptive window, γ·max(0, τ·ξ_step − ξ_quorum −
      ξ_sync) from the quorum's learner (`Quorum.window_seconds`; gamma, tau).
    tokens: each delta is weighted by the tokens its learner processed, tokens × tokens per
      step (the paper's "quantity × quality"): with one minibatch size for every learner,
      proportional to its inner steps (they differ with `dynamic`, Dynamic Local Updates).
      False: the plain mean.
    quorum = 1 and grace = 0 is `async_diloco(steps)`'s schedule; quorum = λ and grace = 0 is
    `diloco(steps)`'s round. topk, bits, error_feedback: compressed deltas, as for `diloco`.
    fragments, overlap: the parameters synchronized one fragment at a time, as in
      `streaming_diloco` (an iteration is steps / fragments inner steps, then a push of fragment
      iteration mod P, merged τ = overlap steps into the next, replacing the learner's own), each
      fragment by its own quorum and window: the windows of several fragments may be open at
      once, and a merge takes one fragment's pushes (their tokens, its own outer step and clock:
      `engine.local.fragmented`). A learner's outer gradient of a fragment is taken from the
      fragment as it last merged it (`Streaming.anchored`). quorum = λ and grace = 0 is
      `streaming_diloco(steps, fragments, overlap, bits=bits)` (with tokens: its weights are equal).
      bits quantizes the sent fragments as streaming_diloco's do; topk, error_feedback and
      dynamic are not implemented with fragments.
    The outer optimizer defaults to `clocked_nesterov:0.9,lr=0.7` (`tasks.optim`): DiLoCo's
    Nesterov step once per round's worth of merged tokens, each merge applied at once by its
    share of a round. Its merges of every learner are DiLoCo's steps bitwise; merges of one
    learner of λ are `async_diloco` with `delayed_nesterov:λ`. A full Nesterov step per merge
    (`optimizer="nesterov:0.9,lr=0.7"`) diverges once merges hold fewer than λ learners
    (benchmarks/reproduce_decoupled_diloco.py)."""
    checks.integer("decoupled_diloco", "steps", steps, low=1)
    checks.integer("decoupled_diloco", "quorum", quorum, low=1)
    adaptive = grace == "adaptive"
    if adaptive:
        grace = 0.0
        gamma = checks.number("decoupled_diloco", "gamma", gamma)
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"decoupled_diloco: gamma = {gamma!r} must be a number in (0, 1) (the safety margin "
                             "on the slack)")
        checks.integer("decoupled_diloco", "tau", tau, low=1)
    elif isinstance(grace, str):
        raise ValueError(f"decoupled_diloco: grace = {grace!r} must be a number of seconds >= 0 or 'adaptive'")
    else:
        grace = checks.finite("decoupled_diloco", "grace", grace, low=0.0)
        if (gamma, tau) != (0.5, 2):
            raise ValueError("decoupled_diloco: gamma and tau are the adaptive window's (grace='adaptive')")
    for name, value in (("dynamic", dynamic), ("tokens", tokens)):
        if not isinstance(value, bool):
            raise ValueError(f"decoupled_diloco: {name} = {value!r} must be True or False")
    checks.integer("decoupled_diloco", "fragments", fragments, low=1)
    if fragments > 1:
        if steps % fragments:
            raise ValueError(f"decoupled_diloco: steps = {steps} must be a multiple of fragments = {fragments} "
                             "(a fragment is pushed every steps / fragments inner steps)")
        if dynamic or topk < 1 or error_feedback:
            raise ValueError("decoupled_diloco: dynamic, topk and error_feedback are not implemented with "
                             f"fragments = {fragments} (bits quantizes the fragments)")
        work = Streaming(steps // fragments, False, fragments, overlap, 0.0, bits, weighted=tokens, anchored=True)
        suffix = "".join(f":{k}={v}" for k, v, default in (("fragments", fragments, 1), ("overlap", overlap, 0),
                                                           ("bits", bits, 32)) if v != default)
    elif overlap:
        raise ValueError(f"decoupled_diloco: overlap = {overlap!r} is the fragments' (fragments > 1)")
    else:
        work, suffix = _compressed(steps, topk, bits, error_feedback, dynamic=dynamic, weighted=tokens)
    window = ((":grace=adaptive" + (f":gamma={gamma:g}" if gamma != 0.5 else "") + (f":tau={tau}" if tau != 2 else ""))
              if adaptive else (f":grace={grace:g}" if grace else ""))
    spec = (f"decoupled_diloco:{steps}" + ("" if quorum == 1 else f":quorum={quorum}") + window
            + (":dynamic" if dynamic else "") + ("" if tokens else ":notokens") + suffix)
    return Policy(Free(), Quorum(quorum, grace, adaptive, float(gamma), tau), spec, work,
                  "clocked_nesterov:0.9,lr=0.7")


# -- asynchronous RL (data staleness): actors generate rollouts, a learner trains on them -----------
RL_MODES = ("pace", "drop", "requeue")
"""What `rl_async` does about staleness: 'pace' holds actors back (AReaL's rule) and drops
the rollouts that still arrive too stale; 'drop' lets actors run free and drops every
rollout staler than η when it arrives; 'requeue' lets them run free and has a rollout
staler than η generated again, on the newest version, by the same actor."""


def _learner_suffix(learner: float, minibatches: int = 1) -> str:
    return (("" if learner == 0.5 else f":learner={learner:g}")
            + ("" if minibatches == 1 else f":minibatches={minibatches}"))


def _rounds(name: str, eta: int, learner: float, minibatches: int, split: int) -> Policy:
    checks.integer(name, "minibatches", minibatches, low=1)
    checks.integer(name, "split", split, low=1)
    spec = name + _learner_suffix(learner, minibatches) + ("" if split == 1 else f":split={split}")
    aggregation = AllLive() if split == 1 else Minibatches(split)
    return Policy(RoundLag(eta, split), aggregation, spec, Rollout(learner, minibatches=minibatches))


def rl_sync(learner: float = 0.5, minibatches: int = 1, split: int = 1) -> Policy:
    """Synchronous on-policy RL: every actor generates one rollout on version k, the
    learner trains update k on all of them, then every actor pulls version k + 1
    (staleness 0). `learner`: the learner's time per update (see `Rollout`).
    minibatches: M > 1 trains each version in M optimizer steps on M minibatches of its
    batch, π_prox computed once before the first (AReaL's `ppo_n_minibatches`; staleness is
    counted in versions: every rollout is still 0 versions stale; see `Rollout`).
    split: s > 1 counts staleness as verl does instead: each round's rollouts make s learner
    updates of their own, the j-th j versions stale, though every rollout was generated on
    the round's version (the staleness "on-policy" PPO epochs add when every optimizer step
    is a version)."""
    return _rounds("rl_sync", 0, learner, minibatches, split)


def rl_one_step_off(learner: float = 0.5, minibatches: int = 1, split: int = 1) -> Policy:
    """One-step off-policy RL (verl's recipe): round k + 1 is generated while the learner
    trains on round k, on the version before that update, so every consumed rollout after
    the first round is exactly one version stale (also at learner = 0: the actors are
    released with the decision of update k, before it is complete, as in the real
    runtime, where the server releases them before it computes the update).
    minibatches, split: as for `rl_sync`."""
    return _rounds("rl_one_step_off", 1, learner, minibatches, split)


def rl_async(eta: int | None = None, mode: str = "pace", learner: float = 0.5, batch: int | None = None,
             minibatches: int = 1) -> Policy:
    """Asynchronous RL bounded by η (AReaL's `max_head_offpolicyness`): actors generate
    continuously on the newest completed version; the learner updates from every λ
    rollouts in arrival order; no consumed rollout is more than η versions stale.

    mode: 'pace' (AReaL's rule): an actor may not start a rollout that would be consumed
      more than η versions after the version it pulls (`Capacity`); one that still arrives
      too stale (it finished out of order: with long-tailed lengths a sizeable share) is
      dropped. 'drop': actors never wait; every
      rollout staler than η on arrival is dropped (which biases what is consumed toward
      short generations). 'requeue': actors never wait; a rollout staler than η is thrown
      away and its prompts generated again next by the same actor on the newest version
      (nothing is lost, at the cost of the generation).
    eta: None is fully asynchronous (no bound, nothing dropped); η = 0 is `rl_sync`.
    batch: rollouts per learner update (None: one per actor, λ); fewer make the learner
      update more often than each actor generates, so rollouts grow staler.
    minibatches: M optimizer steps per version (see `rl_sync`).
    """
    return _bounded("rl_async", eta, mode, learner, batch, False, minibatches=minibatches)


def rl_inflight(eta: int | None = None, mode: str = "pace", learner: float = 0.5, batch: int | None = None,
                minibatches: int = 1) -> Policy:
    """Asynchronous RL with in-flight weight updates (PipelineRL): `rl_async`, except that
    every version the learner completes reaches the actors while they decode and is taken
    between two tokens, so a rollout's later tokens come from newer versions than its first
    (the schedule records each segment's version; see `Rollout(inflight=True)`). The
    timing is `rl_async`'s (the weight transfer overlaps the decode); the bound η, the
    modes, `batch` and `minibatches` apply to a rollout's oldest tokens, its pulled version, as there."""
    return _bounded("rl_inflight", eta, mode, learner, batch, True, minibatches=minibatches)


def rl_partial(eta: int | None = None, mode: str = "pace", learner: float = 0.5, batch: int | None = None,
               refill: float = 1.0, minibatches: int = 1) -> Policy:
    """Asynchronous RL with partial rollouts (AReaL's interruptible generation): `rl_inflight`
    (segments, η, the modes and `batch` as there), except that a version reaching an actor
    mid-rollout interrupts its decode: after the token in progress the actor loads the
    weights (the pull's transfer time again) and re-prefills the prompt and the tokens so far
    (`refill` token-times per interruption, whatever their number), then decodes on with the
    new version; the rollout ends (transfer + refill × token time) later per interruption
    (see `Rollout`). refill = 0 on a network without latency or bytes is `rl_inflight`.
    """
    return _bounded("rl_partial", eta, mode, learner, batch, True, refill, minibatches)


def _bounded(name: str, eta, mode: str, learner: float, batch, inflight: bool, refill=None,
             minibatches: int = 1) -> Policy:
    checks.integer(name, "minibatches", minibatches, low=1)
    if eta is not None:
        checks.integer(name, "eta", eta, low=0)
    if batch is not None:
        checks.integer(name, "batch", batch, low=1)
    if refill is not None:
        refill = checks.finite(name, "refill", refill, low=0.0)
    if mode not in RL_MODES:
        raise ValueError(f"{name}: mode = {mode!r} must be one of {', '.join(RL_MODES)}")
    if mode != "pace" and eta is None:   # without a bound nothing is too stale: the mode would do nothing
        raise ValueError(f"{name}: mode = {mode!r} needs a staleness bound η ({name}:ETA:mode={mode}); without one "
                         "no rollout is ever too stale to drop or requeue")
    gate = Capacity(eta, batch) if eta is not None and mode == "pace" else Free()
    spec = (name + ("" if eta is None else f":{eta}") + (f":mode={mode}" if mode != "pace" and eta is not None else "")
            + ("" if batch is None else f":batch={batch}"))
    spec += _learner_suffix(learner, minibatches) + ("" if refill is None or refill == 1.0 else f":refill={refill:g}")
    return Policy(gate, Fresh(eta, batch, mode == "requeue" and eta is not None), spec,
                  Rollout(learner, inflight, refill, minibatches))
