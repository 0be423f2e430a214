"""Work: what a worker does between a pull and a push, as one value every layer asks.

A work value answers each question a layer has about it, so that no layer
tests its type (a new kind of work is one new class here):

=====================  ==========================================================
asked by               method or attribute
=====================  ==========================================================
policy, runtime, CLI   `local`: the push is a delta after local steps (an inner
                       optimizer runs on the worker; the server's is an outer one)
runtime                `collective_round`: every worker's iteration can be one
                       collective step (a `pmean` of the workers' results)
sim                    `steps_per_worker(mean_seconds)`, `timing(one_step, steps,
                       num_workers)`: the compute time of an iteration
sim (network model)    `payload_bytes(shapes)`: bytes pulled and pushed
engine, runtime        `numerics` and `numerics_options(shapes)`: which of the engine's
                       per-worker steps it runs ("gradient", "local", "learner") and
                       that step's options, plain values (`engine.local.configure`)
CLI tables             `iterations_per_sync`: iterations between two synchronizations
                       of the same parameters (H = steps per iteration times it)
sweeps, CLI            `replay_settings()`: the settings compiled into the replay
                       (a sweep needs one value of them), `compiled_what` names them
=====================  ==========================================================

Every method is plain Python over plain values: a work declares what the engine runs
(`numerics`) and never imports the engine; the shape and byte arithmetic is
`policies.payload`'s, so `staleness.policies` itself imports no JAX.

- `Gradient`: one minibatch gradient per iteration (the seeds' parameter-server family);
- `LocalSteps(steps, dynamic)`: H inner steps, then a delta (Local SGD, DiLoCo, async DiLoCo);
- `Streaming(...)`: Streaming DiLoCo's fragments, overlap and quantized outer gradients;
- `Rollout(learner, inflight, refill)`: asynchronous RL's actors: generate rollouts with
  the pulled version (and, in flight, newer ones), which a learner trains on at its current
  version (data staleness).

A work may also have `learner_seconds(sizes, mean_seconds, num_workers)` (an optional
member of `Work`, default None): the seconds a learner trains one update whose rows had
these sizes (`Rollout`); the simulator then completes each update that long after it is
decided (`Policy.complete`), one at a time. Works without it complete updates at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from staleness.infra import checks
from staleness.policies import payload

__all__ = ["Work", "Gradient", "LocalSteps", "Streaming", "Rollout", "ComputeTime"]

#: compute_time(worker, iteration, start seconds) -> seconds, as `cluster.Sampler.compute_time`.
ComputeTime = Callable[[int, int, float], float]


@runtime_checkable
class Work(Protocol):
    """What a worker computes per iteration (see the module docstring for who asks what)."""

    local: bool
    collective_round: bool
    compiled_what: str
    iterations_per_sync: int

    def steps_per_worker(self, mean_seconds: Sequence[float]) -> tuple[int, ...] | None: ...
    def timing(self, one_step: ComputeTime, steps: tuple[int, ...] | None,
               num_workers: int) -> tuple[ComputeTime, Callable[[int], None] | None]: ...
    numerics: str

    def payload_bytes(self, shapes) -> tuple[int, int]: ...
    def numerics_options(self, shapes) -> dict[str, Any]: ...
    def replay_settings(self) -> tuple: ...
    def describe(self) -> str: ...

    # optional (the value `Policy` uses where a work leaves it out): the module docstring
    learner_seconds: Callable[[Sequence[float], float, int], float] | None = None


@dataclasses.dataclass(frozen=True)
class Gradient:
    """One minibatch gradient per iteration (the papers' parameter-server family)."""

    local: ClassVar[bool] = False
    collective_round: ClassVar[bool] = True
    compiled_what: ClassVar[str] = "nothing"
    numerics: ClassVar[str] = "gradient"
    iterations_per_sync: ClassVar[int] = 1

    def steps_per_worker(self, mean_seconds) -> tuple[int, ...] | None:
        """None: an iteration is one step of the cluster's compute time."""
        return None

    def timing(self, one_step, steps, num_workers):
        """(compute_time, forget): an iteration takes the cluster's time for one step."""
        return one_step, None

    def payload_bytes(self, shapes) -> tuple[int, int]:
        """(pull, push) bytes: the parameters, then a gradient of the same pytree."""
        n = payload.tree_bytes(shapes)
        return n, n

    def numerics_options(self, shapes) -> dict:
        """The engine's gradient step takes no options."""
        return {}

    def replay_settings(self) -> tuple:
        return ()

    def describe(self) -> str:
        return ""


@dataclasses.dataclass(frozen=True)
class LocalSteps:
    """`steps` inner optimizer steps per iteration on the worker's own copy of the
    parameters (started from the version it pulled), then a push of the delta
    Δ = θ_pulled − θ_after, which the server treats as a gradient (an outer step).
    The worker's inner-optimizer state is kept across its iterations.

    dynamic: Dynamic Local Updates (Liu et al. 2024): a worker slower than the
    fastest takes proportionally fewer steps, round(steps · t_fastest / t_worker)
    (at least 1), so that all workers finish a round in about the same time.
    weighted: an update's deltas are weighted by their workers' inner steps (the tokens
    they processed; Decoupled DiLoCo's token-weighted merge) instead of equally.
    topk, qbits, error_feedback: compressed pushes (SparseLoCo): each tensor of the delta is
    sent as its top `topk` fraction of values by magnitude, quantized to `qbits` bits
    (`engine.local.quantize`); with error feedback a worker adds what compression left out of
    its last delta to its next one (1.0, 32, False: the dense delta).
    """

    steps: int = 1
    dynamic: bool = False
    weighted: bool = dataclasses.field(default=False, kw_only=True)
    topk: float = dataclasses.field(default=1.0, kw_only=True)
    qbits: int = dataclasses.field(default=32, kw_only=True)
    error_feedback: bool = dataclasses.field(default=False, kw_only=True)

    local: ClassVar[bool] = True
    collective_round: ClassVar[bool] = False
    compiled_what: ClassVar[str] = "token weights"
    numerics: ClassVar[str] = "local"
    iterations_per_sync: ClassVar[int] = 1

    def __post_init__(self):
        checks.integer("local steps", "steps", self.steps, low=1)
        for name in ("dynamic", "weighted", "error_feedback"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"local steps: {name} = {getattr(self, name)!r} must be True or False")
        if isinstance(self.topk, bool) or not isinstance(self.topk, (int, float)) or not 0.0 < self.topk <= 1.0:
            raise ValueError(f"local steps: topk = {self.topk!r} must be in (0, 1] (the fraction of values sent)")
        if self.qbits not in (2, 3, 4, 8, 32):
            raise ValueError(f"local steps: bits = {self.qbits!r} must be one of 2, 3, 4, 8 or 32")
        if self.error_feedback and not self.compressed:
            raise ValueError("local steps: error_feedback needs a compression (topk < 1 or bits < 32)")

    @property
    def compressed(self) -> bool:
        return self.topk < 1.0 or self.qbits < 32

    def steps_per_worker(self, mean_seconds) -> tuple[int, ...]:
        """[λ] inner steps per iteration of each worker, from its mean seconds per step."""
        if not self.dynamic:
            return tuple(self.steps for _ in mean_seconds)
        fastest = min(mean_seconds)
        return tuple(max(1, round(self.steps * fastest / t)) for t in mean_seconds)

    def timing(self, one_step, steps, num_workers):
        """(compute_time, forget): an iteration is steps[w] inner steps, each the cluster's step time."""
        def compute_time(w, it, start, _one=one_step, _steps=steps):
            return _steps[w] * _one(w, it, start)
        return compute_time, None

    def payload_bytes(self, shapes) -> tuple[int, int]:
        """(pull, push) bytes: the parameters, then a delta of the same pytree (compressed:
        its top-k values with their indices, quantized; `payload.sparse_bytes`)."""
        return payload.tree_bytes(shapes), payload.sparse_bytes(shapes, self.topk, self.qbits)

    def numerics_options(self, shapes) -> dict:
        """The engine's local steps (`engine.local.Local`: H_max inner steps of the inner
        optimizer, masked when workers take different numbers), token-weighted or not."""
        out = {"weighted": True} if self.weighted else {}
        if self.compressed:
            out.update(topk=float(self.topk), qbits=int(self.qbits), ef=self.error_feedback)
        return out

    def replay_settings(self) -> tuple:
        # H is data of the replay (steps per worker), not compiled into it
        return (self.weighted, self.topk, self.qbits, self.error_feedback)

    def describe(self) -> str:
        return (f"local:{self.steps}" + (":dynamic" if self.dynamic else "") + (":weighted" if self.weighted else "")
                + (f":topk={self.topk:g}" if self.topk < 1 else "") + (f":bits={self.qbits}" if self.qbits < 32 else "")
                + (":error_feedback" if self.error_feedback else ""))


@dataclasses.dataclass(frozen=True)
class Streaming(LocalSteps):
    """Streaming DiLoCo (Douillard et al. 2025): the parameters are split into
    `fragments` P groups of modules (strided: top-level module j is in fragment
    j mod P), and one fragment is synchronized every H/P inner steps, round robin,
    so each is synchronized every H steps. An iteration is these H/P steps
    (`steps` per iteration = H/P). The workers keep their own parameters across
    iterations; the outer update of fragment p is merged into a worker's copy
    `overlap` (τ) inner steps later, θ_p ← α·θ_p(local) + (1−α)·θ_p(global); the
    outer gradients are sent quantized to `bits` bits (32: not quantized; fewer:
    a sign and a (bits−1)-bit exponent per value, an E(bits−1)M0 float, scaled by
    the tensor's largest magnitude) and averaged in float32.

    anchored: the fragments are merged by a quorum of free-running learners (Decoupled
    DiLoCo's fragments): a learner's outer gradient of fragment p is taken from the global
    fragment it last merged, not from the one it pulled (`engine.local.streaming_delta`); with
    `weighted` the merge weighs each learner's delta by its tokens (as `LocalSteps`).
    """

    fragments: int = 1
    overlap: int = 0
    alpha: float = 0.0
    bits: int = 32
    anchored: bool = dataclasses.field(default=False, kw_only=True)

    compiled_what: ClassVar[str] = "H and the fragment settings"

    @property
    def iterations_per_sync(self) -> int:
        """P: one fragment is synchronized per iteration, each every P iterations."""
        return self.fragments

    def __post_init__(self):
        super().__post_init__()
        if self.compressed or self.error_feedback or self.dynamic:
            raise ValueError("streaming_diloco: quantize with its own bits=; topk, error feedback and dynamic "
                             "local updates are not implemented for fragments")
        if not isinstance(self.anchored, bool):
            raise ValueError(f"streaming_diloco: anchored = {self.anchored!r} must be True or False")
        checks.integer("streaming_diloco", "fragments", self.fragments, low=1)
        checks.integer("streaming_diloco", "overlap", self.overlap, low=0)
        if self.overlap >= max(1, self.steps):
            raise ValueError(f"streaming_diloco: overlap = {self.overlap} must be < the {self.steps} inner steps "
                             "between two synchronizations (H / fragments)")
        if not (isinstance(self.alpha, (int, float)) and 0.0 <= self.alpha <= 1.0):
            raise ValueError(f"streaming_diloco: alpha = {self.alpha!r} must be in [0, 1] (the local weight)")
        if self.bits not in (2, 3, 4, 8, 32):
            raise ValueError(f"streaming_diloco: bits = {self.bits!r} must be one of 2, 3, 4, 8 or 32")

    def timing(self, one_step, steps, num_workers):
        """(compute_time, forget) with an overlap of τ inner steps.

        A worker does not stop at a synchronization: it runs on for τ inner steps
        while its fragment is in flight and merges the outer update after them.
        So the τ steps after iteration k's end overlap whatever comes before
        iteration k+1's parameters arrive (the push, the aggregation, the wait for
        the round's other workers, the pull). Iteration k+1, whose parameters
        arrive at `start`, ends at max(start + (H/P − τ)·t, end_k + (H/P)·t) for a
        step time t: the communication is hidden up to τ steps and the steps
        themselves still take their time. The first iteration, and the first after
        a worker (re)joins, has nothing to overlap. `forget(w)` is called when
        worker w fails.
        """
        if self.overlap == 0:
            return super().timing(one_step, steps, num_workers)
        tau = self.overlap
        last: list = [None] * num_workers   # [λ] (iteration, end seconds) of each worker's last computation

        def compute_time(w, it, start):
            t = one_step(w, it, start)
            full = steps[w] * t
            prev = last[w]
            if prev is not None and prev[0] == it - 1 and start > prev[1]:
                full = max(full - tau * t, prev[1] + full - start)
            last[w] = (it, start + full)
            return full

        def forget(w):
            last[w] = None
        return compute_time, forget

    def payload_bytes(self, shapes) -> tuple[int, int]:
        """(pull, push) bytes of one synchronization: one fragment (the mean over
        fragments, rounded up), pushed quantized to `bits`."""
        frags = payload.fragment_keys(shapes, self.fragments)
        full = sum(payload.tree_bytes({k: shapes[k] for k in keys}) for keys in frags)
        sent = sum(payload.quantized_bytes({k: shapes[k] for k in keys}, self.bits) for keys in frags)
        p = len(frags)
        return -(-full // p), -(-sent // p)

    def numerics_options(self, shapes) -> dict:
        """The engine's local steps with fragments of the parameter pytree `shapes`, the
        overlap, the mixing factor and the bits, compiled into the replay (unmasked)."""
        out = {"masked": False, "fragments": self.fragments, "overlap": self.overlap, "alpha": self.alpha,
               "bits": self.bits, "fragment_keys": payload.fragment_keys(shapes, self.fragments)}
        out.update({k: True for k in ("weighted", "anchored") if getattr(self, k)})
        return out

    def replay_settings(self) -> tuple:
        return (self.steps, self.fragments, self.overlap, self.alpha, self.bits, self.weighted, self.anchored)

    def describe(self) -> str:
        return (f"streaming:{self.steps}:fragments={self.fragments}:overlap={self.overlap}:"
                f"alpha={self.alpha:g}:bits={self.bits}" + (":weighted" if self.weighted else "")
                + (":anchored" if self.anchored else ""))


@dataclasses.dataclass(frozen=True)
class Rollout:
    """An actor of asynchronous RL: it pulls version v, generates a rollout (G
    completions of each of its B prompts, sampled from π_v) and pushes it; the
    learner computes the objective's gradient at its *current* version u on
    rollouts generated at v <= u (data staleness u − v, in the `Schedule`'s
    columns: `pull_version` is the behavior version).

    Time: a rollout takes the cluster's step time per decoded token times its size
    (the tokens its batch decodes, prefill included: `RLTask.rollout_sizes`), so
    the cluster's step time is an actor's seconds per token. The learner trains an
    update of rollouts with sizes s_r for `learner` × t̄ × Σ s_r / λ seconds (t̄ the
    cluster's mean step time, λ actors): with learner = 1 training a batch of λ
    rollouts takes as long as an average actor generating one.

    The pull moves the parameters' bytes (the weight sync); rollouts (tokens,
    log-probabilities, rewards) are small next to them and move no modelled bytes.

    inflight: in-flight weight updates (PipelineRL): every version the learner completes
    is sent to the actors at once and taken between two tokens of the rollouts they are
    decoding (the transfer, the pull's time, overlaps the decode: the timing is that of
    `inflight=False`), so one rollout's tokens come from several versions; the schedule
    records each segment's version (`Schedule.meta['segments']`) and the replay samples
    each token with its segment's version. Its `pull_version` (and the staleness the
    policy bounds) is that of its oldest tokens.

    refill: partial rollouts (AReaL's interruptible generation; needs `inflight`): a version
    that reaches an actor mid-rollout interrupts the decode instead of overlapping it. The
    token in progress finishes, then the actor pauses for the weight load (the pull's
    transfer time again: latency + the parameters' bytes / bandwidth) and for re-prefilling
    the prompt and the tokens generated so far with the new weights, `refill` token-times
    (the actor's seconds per token; a constant per interruption, whatever the tokens so
    far: a prefill is one parallel forward pass), then decodes on with the new version. So
    an interrupted rollout ends (and pushes) (transfer + refill × token time) later per
    interruption. A version that arrives during a pause interrupts again right after it,
    before the same token (its segment replaces the previous one, as in `inflight`).
    None: no interruption (the transfer overlaps the decode).

    minibatches: the learner trains each version in M optimizer steps, one on each of M
    minibatches of its batch (every rollout's prompts split in M parts; AReaL's
    `ppo_n_minibatches`), with π_prox the log-probs at the version's parameters before its
    first step (`engine.rollout.learner_update`). The version is what actors pull: staleness
    is counted in versions, not steps. The learner's time is unchanged (the same tokens
    pass forward and backward once, in M parts).
    """

    learner: float = 0.5
    inflight: bool = False
    refill: float | None = None
    minibatches: int = 1

    local: ClassVar[bool] = False
    collective_round: ClassVar[bool] = False
    compiled_what: ClassVar[str] = "nothing"
    numerics: ClassVar[str] = "learner"
    iterations_per_sync: ClassVar[int] = 1

    def __post_init__(self):
        if isinstance(self.learner, bool) or not isinstance(self.learner, (int, float)) or not (
                self.learner >= 0 and self.learner < float("inf")):
            raise ValueError(f"rollout: learner = {self.learner!r} must be a finite number >= 0 (the learner's "
                             "seconds per update, in units of an actor generating one average rollout)")
        if not isinstance(self.inflight, bool):
            raise ValueError(f"rollout: inflight = {self.inflight!r} must be True or False")
        checks.integer("rollout", "minibatches", self.minibatches, low=1)
        if self.refill is not None:
            checks.finite("rollout", "refill", self.refill, low=0.0)
            if not self.inflight:
                raise ValueError(f"rollout: refill = {self.refill!r} (partial rollouts) needs inflight=True: an "
                                 "interrupted rollout's tokens come from several versions")

    def steps_per_worker(self, mean_seconds) -> None:
        return None

    def timing(self, one_step, steps, num_workers):
        """(compute_time, forget): the cluster's time per token, already scaled by each
        rollout's size by the simulator."""
        return one_step, None

    def learner_seconds(self, sizes: Sequence[float], mean_seconds: float, num_workers: int) -> float:
        """Seconds the learner trains one update of rollouts of these sizes (tokens)."""
        return float(self.learner) * float(mean_seconds) * float(sum(sizes)) / num_workers

    def payload_bytes(self, shapes) -> tuple[int, int]:
        """(pull, push) bytes: the parameters (the weight sync), then nothing modelled."""
        return payload.tree_bytes(shapes), 0

    def numerics_options(self, shapes) -> dict:
        """The engine's learner step (`engine.rollout.Learner`: generate at the pulled
        version, the objective's gradient at the current one)."""
        return {"inflight": self.inflight, "minibatches": self.minibatches, "reprefill": self.refill is not None}

    def replay_settings(self) -> tuple:
        return ()

    def describe(self) -> str:
        return (f"rollout:learner={self.learner:g}" + (":inflight" if self.inflight else "")
                + ("" if self.refill is None else f":refill={self.refill:g}")
                + ("" if self.minibatches == 1 else f":minibatches={self.minibatches}"))
