"""Pipeline schedules: GPipe, DSP, DDG and plain backpropagation as one kind of value.

Every schedule is described by the same few numbers, and one tick engine
(`staleness.pipeline.sim`, `staleness.pipeline.devices`) runs all of them:

- per link delays, in ticks. Link k joins stage k to stage k+1 (k < K-1); link
  K-1 joins the last stage to the loss. `forward_delays[k]` ticks pass between
  stage k's forward of a batch and stage k+1's forward of it;
  `backward_delays[k]` ticks between stage k+1's backward of a batch and stage
  k's backward of it (for k = K-1: between the loss and the last stage's
  backward). A delay of 0 means "in the same tick, after the sender".
- the lag of stage k, m_k = Σ_{i≥k} (forward_delays[i] + backward_delays[i]):
  the number of ticks (= batches) between stage k's forward of a batch and its
  backward of it. DSP(s) has forward = backward = s, so m_k = 2·Σ_{i≥k} s_i.
- `backward`: what the backward of a stale batch is computed from:
  "recompute" (DSP, GPipe's re-materialisation): the stored stage input,
  re-run through the stage with the *current* weights (one weight copy);
  "stash" (PipeDream weight stashing): the stored input with the weights the
  forward used (m_k weight copies);
  "graph" (DDG): the stored residuals of the forward's own autodiff graph
  (numerically equal to "stash").
- `microbatches` and `flush`: GPipe splits each batch into M micro-batches,
  pipelines them, accumulates their gradients and applies one synchronous
  update per batch (a flush); the next batch enters when the previous one has
  left stage 0.

Per tick each stage does at most one forward and then at most one backward
(with its update). All delays zero is ordinary backpropagation.

What is our reading (PAPERS.md marks the DSP box as not available; these are
the rules implemented, each in one place so it is easy to change):
- The K-th delay is the link to the loss (0 in the paper's examples, so the
  last stage has m = 0); a nonzero last entry delays the loss gradient too
  (`plan.make_plan`, `stage.forward`).
- Within a tick a stage runs its forward, then the backward of the
  micro-batch m_k ticks older, then its update (`stage.py`); the loss and
  dL/dlogits are computed at the last stage's forward, with its logits.
- The paper overlaps the recomputation with the forward; `simulate_timing`
  charges it as one more forward by default (`recompute_cost=1`; 0 models a
  full overlap).
- DDG: forward links of delay 0, backward links of delay 1, so stage k is
  K-1-k batches stale, on the forward's stored autodiff residuals. Huo et
  al.'s iteration barrier (forward through all modules, then every delayed
  backward, then the next batch) is the default (`ddg()`); only the timing
  model reads it, the tick tables and numbers are the same without it.
- GPipe: link delays 1 like DSP(1,...,1,0), micro-batches pipelined with each
  stage's backward interleaved after its forwards (one flush has the tick
  tables of DSP(1,...,1,0) over its M micro-batches), one update per batch
  with the mean micro-batch gradient, re-materialisation on every stage but
  the last (closed forms of its time in `timing.py`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["BACKWARD_MODES", "NAMES", "PipelineSchedule", "backprop", "ddg", "dsp", "gpipe", "parse"]

BACKWARD_MODES = ("recompute", "stash", "graph")
NAMES = ("backprop", "gpipe", "dsp", "ddg")


def _delays(arg: str, value, num_stages: int | None = None) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"{arg} = {value!r} must be comma-separated integers >= 0, e.g. 1,1,0") from None
    try:
        items = list(value)
    except TypeError:
        raise ValueError(f"{arg} = {value!r} must be a sequence of integers >= 0, one per stage") from None
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{arg} = {tuple(items)!r}: every delay must be an integer >= 0 (ticks); got {v!r}")
        if int(v) < 0:
            raise ValueError(f"{arg} = {tuple(items)!r}: delays must be >= 0 (ticks); got {int(v)}")
        out.append(int(v))
    if not out:
        raise ValueError(f"{arg} is empty; give one delay per stage, e.g. 1,1,0 for 3 stages")
    if num_stages is not None and len(out) != num_stages:
        raise ValueError(
            f"{arg} = {tuple(out)} has {len(out)} entries but the model has {num_stages} stages; give one "
            f"delay per stage (entry k is the link after stage k; the last one is the link to the loss, "
            f"usually 0), e.g. {','.join(['1'] * (num_stages - 1) + ['0'])}")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule (immutable; see the module docstring).

    name: "backprop", "gpipe", "dsp" or "ddg".
    forward_delays, backward_delays: per-link delays in ticks (length K), or
      None for schedules whose delays follow from K (gpipe, ddg, backprop);
      `resolve(K)` fills them in.
    microbatches: micro-batches per batch (GPipe); 1 otherwise.
    backward: one of BACKWARD_MODES.
    flush: apply one synchronous update per batch after all its micro-batches
      (GPipe); else every backward applies its own update.
    barrier: DDG's per-iteration barrier (timing only; see `ddg`).
    """

    name: str
    forward_delays: tuple[int, ...] | None = None
    backward_delays: tuple[int, ...] | None = None
    microbatches: int = 1
    backward: str = "recompute"
    flush: bool = False
    barrier: bool = False

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"schedule name = {self.name!r} is not known; valid: {', '.join(NAMES)}")
        if self.backward not in BACKWARD_MODES:
            raise ValueError(f"backward = {self.backward!r} is not known; valid: {', '.join(BACKWARD_MODES)}")
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"microbatches = {m!r} must be an integer >= 1")
        if m > 1 and not self.flush:
            raise ValueError(f"microbatches = {m} needs flush=True (micro-batches are accumulated into one "
                             f"synchronous update, as in GPipe)")
        if not isinstance(self.barrier, bool):
            raise ValueError(f"barrier = {self.barrier!r} must be True or False")
        if self.barrier and self.name != "ddg":
            raise ValueError(f"barrier = True applies to ddg only (its per-iteration barrier); schedule "
                             f"{self.name!r} has none, use ddg() or barrier=False")
        if (self.forward_delays is None) != (self.backward_delays is None):
            raise ValueError("give both forward_delays and backward_delays, or neither")
        if self.forward_delays is not None:
            object.__setattr__(self, "forward_delays", _delays("forward_delays", self.forward_delays))
            object.__setattr__(self, "backward_delays", _delays("backward_delays", self.backward_delays,
                                                                len(self.forward_delays)))

    # -- derived --------------------------------------------------------------
    @property
    def resolved(self) -> bool:
        return self.forward_delays is not None

    @property
    def num_stages(self) -> int | None:
        return len(self.forward_delays) if self.resolved else None

    def resolve(self, num_stages: int) -> PipelineSchedule:
        """This schedule with concrete delays for `num_stages` stages.

        Raises ValueError if its delays were given for a different number of stages."""
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages = {num_stages!r} must be an integer >= 1")
        if self.resolved:
            arg = "delays" if self.name == "dsp" else "forward_delays"
            _delays(arg, self.forward_delays, num_stages)
            return self
        k = num_stages
        inter = [1] * (k - 1) + [0]
        f, b = {"gpipe": (inter, inter), "ddg": ([0] * k, inter)}.get(self.name, ([0] * k, [0] * k))   # else backprop
        return dataclasses.replace(self, forward_delays=tuple(f), backward_delays=tuple(b))

    @property
    def lags(self) -> tuple[int, ...]:
        """m_k per stage: ticks (= batches) between stage k's forward and backward of a batch."""
        self._need_resolved("lags")
        f, b = self.forward_delays, self.backward_delays
        return tuple(sum(f[i] + b[i] for i in range(k, len(f))) for k in range(len(f)))

    @property
    def offsets(self) -> tuple[int, ...]:
        """F_k per stage: ticks between stage 0's and stage k's forward of a batch."""
        self._need_resolved("offsets")
        f = self.forward_delays
        return tuple(sum(f[:k]) for k in range(len(f)))

    def _need_resolved(self, what: str) -> None:
        if not self.resolved:
            raise ValueError(f"{self.describe()}: {what} depend on the number of stages; call resolve(K) first")

    def describe(self) -> str:
        """A spec string `parse` reads back, e.g. 'dsp:1,1,0', 'gpipe:4', 'ddg', 'ddg:nobarrier'."""
        if self.name == "gpipe":
            return f"gpipe:{self.microbatches}"
        if self.name == "dsp":
            return "dsp:" + ",".join(map(str, self.forward_delays)) + ("+stash" if self.backward == "stash" else "")
        if self.name == "ddg":
            return "ddg" if self.barrier else "ddg:nobarrier"
        return self.name

    def __str__(self) -> str:
        return self.describe()


def dsp(delays: Sequence[int], *, stash: bool = False) -> PipelineSchedule:
    """DSP(s_0, ..., s_{K-1}) (Xu, Huo, Huang, CVPR 2020): layer-wise staleness.

    Args:
      delays: s_k >= 0 per stage, the delay (ticks) of the link after stage k
        in both directions; the last entry is the link to the loss (0 in the
        paper's examples, so the last stage is not stale). Stage k then uses
        gradients m_k = 2·Σ_{i≥k} s_i batches stale, e.g. (1,1,0) -> (4,2,0).
      stash: PipeDream-style weight stashing: the backward uses the weights its
        forward used (m_k copies) instead of recomputing with the current ones.
    """
    d = _delays("delays", delays)
    return PipelineSchedule("dsp", d, d, 1, "stash" if stash else "recompute", False)


def gpipe(microbatches: int = 4) -> PipelineSchedule:
    """GPipe: each batch split into `microbatches` micro-batches, pipelined
    (one tick per link), gradients accumulated, one synchronous update per batch
    (fill and drain; no staleness). Micro-batch size = batch size / microbatches."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches = {microbatches!r} must be an integer >= 1")
    return PipelineSchedule("gpipe", microbatches=microbatches, backward="recompute", flush=True)


def ddg(*, barrier: bool = True) -> PipelineSchedule:
    """DDG (Huo et al. 2018, decoupled parallel backpropagation with delayed
    gradients): the forward is sequential within a tick (forward-locked); the
    backward is decoupled, one tick per link, so stage k uses a gradient
    K-1-k batches stale, computed on the stored graph of its forward.

    Args:
      barrier: the per-iteration barrier of Huo et al.'s Algorithm 1 (default):
        each batch's forward pass crosses every stage, then every stage runs
        its (delayed) backward, then the next batch starts. False: stages wait
        only for their inputs, so forwards of consecutive batches pipeline (an
        optimistic DDG). Changes the simulated time only, never the numbers.
    """
    if not isinstance(barrier, bool):
        raise ValueError(f"barrier = {barrier!r} must be True or False")
    return PipelineSchedule("ddg", backward="graph", barrier=barrier)


def backprop() -> PipelineSchedule:
    """Ordinary backpropagation: forward through all stages, backward through all, update."""
    return PipelineSchedule("backprop")


_SPEC = re.compile(r"^\s*(\w+)\s*(?::\s*([^+]*?))?\s*(\+\s*stash)?\s*$")


def parse(spec: str, *, delays=None, microbatches: int | None = None, stash: bool = False) -> PipelineSchedule:
    """A schedule from a spec string: 'backprop', 'gpipe[:M]', 'dsp:1,1,0[+stash]', 'ddg[:nobarrier]'.

    `delays`, `microbatches` and `stash` (the CLI's --delays, --microbatches,
    --stash) fill in what the spec leaves out."""
    if isinstance(spec, PipelineSchedule):
        return spec
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if not m or m.group(1).lower() not in NAMES:
        raise ValueError(f"schedule = {spec!r} is not known; valid: backprop, gpipe[:M], dsp:S0,S1,..., "
                         f"ddg[:nobarrier]")
    name, arg, plus = m.group(1).lower(), m.group(2), m.group(3)
    stash = stash or bool(plus)
    if stash and name != "dsp":
        raise ValueError(f"schedule = {spec!r}: weight stashing (+stash) applies to dsp only")
    if name == "dsp":
        if arg and delays is not None:
            raise ValueError(f"schedule = {spec!r} already gives delays; do not also pass delays = {delays!r}")
        d = arg if arg else delays
        if d is None:
            raise ValueError("dsp needs delays, one per stage: e.g. --delays 1,1,0 or --schedule dsp:1,1,0")
        return dsp(_delays("delays", d), stash=stash)
    if delays is not None:
        raise ValueError(f"delays = {delays!r} apply to dsp only; schedule {name!r} fixes its own delays")
    if name == "gpipe":
        if arg and microbatches is not None:
            raise ValueError(f"schedule = {spec!r} already gives microbatches; do not also pass {microbatches}")
        if arg:
            try:
                microbatches = int(arg)
            except ValueError:
                raise ValueError(f"schedule = {spec!r}: microbatches {arg!r} is not an integer") from None
        return gpipe(4 if microbatches is None else microbatches)
    if microbatches not in (None, 1):
        raise ValueError(f"microbatches = {microbatches} applies to gpipe only")
    if name == "ddg":
        if arg and arg.strip().lower() not in ("barrier", "nobarrier"):
            raise ValueError(f"schedule = {spec!r}: ddg takes 'barrier' (the default) or 'nobarrier', "
                             f"e.g. ddg:nobarrier; got {arg!r}")
        return ddg(barrier=not (arg and arg.strip().lower() == "nobarrier"))
    if arg:
        raise ValueError(f"schedule = {spec!r}: {name} takes no argument")
    return backprop()
