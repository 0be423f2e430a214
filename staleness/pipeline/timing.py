"""Simulated time of a pipeline plan: per-stage compute times from `staleness.cluster`.

Cost model. Stage k is cluster worker k. Each tick in which stage k has work
is one of its "iterations": `sampler.compute_time(k, i, start)` gives the
seconds c of one forward + backward of a whole batch on that stage (jitter,
stragglers and periodic slowdowns included), and the tick's operations take
their share of it, divided by M for a micro-batch:

    forward   f = c / (1 + r)                         (r = `backward_ratio`, default 2)
    backward  b = c · r / (1 + r), plus ρ = `recompute_cost` · f when the stage
              recomputes its forward in the backward (`recomputes`)

Messages between stages take `sampler.push_delay(sender, i)` seconds.

An operation starts when its stage is free and its input has arrived: stage
k's forward of tick t needs stage k-1's forward of tick t - f_{k-1}; its
backward needs stage k+1's backward of tick t - b_k (the last stage: its own
forward of tick t - m_{K-1}). With `schedule.barrier` (DDG's iteration
barrier) a tick's backwards also wait until its forward pass has crossed
every stage, and its operations until every operation and message of the
previous tick has finished. Stages never reorder their operations (the
plan's order), so the numbers of a run do not depend on the times: the same
plan trained on one device or on K gives the same parameters, and the times
here say how long K real stages at these speeds would have taken. Pure NumPy.

Closed forms on K equal stages (c = 1 s, f + b = 1, no delays or messages;
`tests/test_pipeline_timing.py` checks each against the simulation):

- backprop: N·K·(f + b) (nothing overlaps).
- DSP(1,...,1,0) over N batches, and GPipe(M) per batch (one flush has the
  tick tables of DSP(1,...,1,0) over its M micro-batches, each costing 1/M):
  with n items of cost f, b, ρ (DSP: n = N; GPipe: n = M and f, b, ρ / M),

      T(n) = max( (n+K-1)(f+b) + (K-1)ρ,                  fill, all n at the last stage, drain
                  (n+K-2)(f+b+ρ),                         the same through stage K-2 only
                  (K + max(0, n-3))·f + b + (n+K-2)(b+ρ) )  item 0's round trip, then stage K-2

  With ρ = 0 this is GPipe's fill/drain (M+K-1)(f+b)/M per batch exactly;
  with ρ > 0 the re-materialisation of stages 0..K-2 (the last stage has
  lag 0 and recomputes nothing) adds the rest. DSP's throughput N / T tends
  to 1 / (f + b + ρ): every stage but the last forwards, recomputes and
  backpropagates one batch per tick.
- DDG with its barrier: each tick lasts the forward pass plus the slowest
  backward, T = N·(K·f + b) + (K-1)·b (the last K-1 ticks only drain
  backwards); throughput → 1 / (K·f + b).
- DDG without the barrier: T = (N+K-1)(f+b), like DSP with ρ = 0.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from staleness.infra import checks
from staleness.cluster import Cluster
from staleness.pipeline.plan import IDLE, TickPlan
from staleness.schedule import Schedule

__all__ = ["Timeline", "closed_form_time", "recomputes", "simulate_timing"]


@dataclasses.dataclass(frozen=True, eq=False)
class Timeline:
    """Simulated start/end seconds of every operation of a plan ([T, K], NaN where idle)."""

    plan: TickPlan
    fwd_start: np.ndarray
    fwd_end: np.ndarray
    bwd_start: np.ndarray
    bwd_end: np.ndarray
    idle: np.ndarray      # [T, K] seconds stage k waited (for inputs) before its work in tick t
    cluster: str
    seed: int

    @property
    def end_time(self) -> float:
        return float(np.nanmax(self.bwd_end))

    @property
    def busy(self) -> np.ndarray:
        """[K] seconds each stage computed."""
        return np.nansum(self.fwd_end - self.fwd_start, 0) + np.nansum(self.bwd_end - self.bwd_start, 0)

    @property
    def throughput(self) -> float:
        """Batches per simulated second over the whole run (fill and drain included)."""
        return self.plan.num_batches / self.end_time

    def tick_end(self) -> np.ndarray:
        """[T] time at which every operation of ticks <= t has finished."""
        end = np.fmax(np.nan_to_num(self.fwd_end, nan=0.0), np.nan_to_num(self.bwd_end, nan=0.0)).max(1)
        return np.maximum.accumulate(end)

    def batch_done_time(self) -> np.ndarray:
        """[N] time at which batch n's update has been applied at every stage."""
        p = self.plan
        out = np.zeros(p.num_batches)
        t, k = np.nonzero(p.update)
        np.maximum.at(out, p.bwd[t, k] // p.microbatches, self.bwd_end[t, k])
        return out

    def to_schedule(self) -> Schedule:
        """The run as a `Schedule`: one row per (stage, micro-batch) backward.

        worker = stage; iteration = micro-batch id; pull_version = the stage's
        update count when it forwarded the micro-batch; apply_version = the update
        of that stage which applied its gradient (so staleness is the number of
        updates the stage made in between: min(m_k, ...) for DSP/DDG, 0 for GPipe);
        pull_time = forward start, start/end = backward start/end, push_time = end,
        wait = seconds the stage sat idle since its previous row. update_time[u] =
        when every stage had applied its u-th update (one per batch)."""
        p = self.plan
        upd_before = np.concatenate([np.zeros((1, p.num_stages), np.int64), np.cumsum(p.update, 0)])  # [T+1, K]
        rows = {c: [] for c in ("worker", "iteration", "pull_version", "apply_version", "pull_time", "start",
                                "end", "push_time", "wait")}
        fwd_tick = np.full((p.num_batches * p.microbatches, p.num_stages), -1, np.int64)
        tf, kf = np.nonzero(p.fwd != IDLE)
        fwd_tick[p.fwd[tf, kf], kf] = tf
        upd_tick = np.full((p.num_batches, p.num_stages), -1, np.int64)
        tu, ku = np.nonzero(p.update)
        upd_tick[p.bwd[tu, ku] // p.microbatches, ku] = tu
        waited = np.zeros(p.num_stages)
        for t in range(p.num_ticks):
            waited += np.nan_to_num(self.idle[t])
            for k in range(p.num_stages):
                i = p.bwd[t, k]
                if i == IDLE:
                    continue
                ft = fwd_tick[i, k]
                row = (k, i, upd_before[ft, k], upd_before[upd_tick[i // p.microbatches, k], k], self.fwd_start[ft, k],
                       self.bwd_start[t, k], self.bwd_end[t, k], self.bwd_end[t, k], waited[k])
                for column, v in zip(rows.values(), row, strict=True):   # in the order of `rows`
                    column.append(v)
                waited[k] = 0.0
        order = np.lexsort((rows["worker"], rows["end"]))
        dtypes = {"worker": np.int32, "iteration": np.int64, "pull_version": np.int64, "apply_version": np.int64}
        cols = {c: np.asarray(v, dtypes.get(c, np.float64))[order] for c, v in rows.items()}
        cols["dropped"] = np.zeros(len(order), bool)
        cols["lost"] = np.zeros(len(order), bool)
        sched = p.schedule
        meta = {"kind": "pipeline", "schedule": sched.describe(), "stages": p.num_stages,
                "microbatches": p.microbatches, "lags": list(sched.lags),
                "forward_delays": list(sched.forward_delays), "backward_delays": list(sched.backward_delays),
                "backward": sched.backward, "recomputes": list(recomputes(sched)), "barrier": sched.barrier,
                "ticks": p.num_ticks, "batches": p.num_batches,
                "busy_s": [float(b) for b in self.busy]}
        return Schedule(columns=cols, update_time=self.batch_done_time(), num_workers=p.num_stages,
                        policy=sched.describe(), cluster=self.cluster, seed=self.seed, end_time=self.end_time,
                        meta=meta)


def recomputes(schedule) -> tuple[bool, ...]:
    """[K] whether stage k recomputes its forward in the backward (charged `recompute_cost`).

    `schedule`: a resolved `PipelineSchedule` or a `TickPlan`. True where the lag
    m_k > 0 and the backward mode is "recompute" (DSP, GPipe) or "stash"
    (weight stashing re-runs the forward with the stashed weights, `stage.py`); "graph"
    (DDG) and lag-0 stages replay the forward's own autodiff residuals."""
    sched = schedule.schedule if isinstance(schedule, TickPlan) else schedule
    if not getattr(sched, "resolved", False):
        raise ValueError(f"schedule = {schedule!r} must be a resolved PipelineSchedule (call resolve(K)) or a TickPlan")
    return tuple(sched.backward in ("recompute", "stash") and m > 0 for m in sched.lags)


def _pipeline_time(n: int, k: int, f: float, b: float, rho: float) -> float:
    """T(n) of the module docstring: DSP(1,...,1,0) over n items of cost f, b, rho on k equal stages."""
    if k == 1:
        return n * (f + b)
    return max((n + k - 1) * (f + b) + (k - 1) * rho, (n + k - 2) * (f + b + rho),
               (k + max(0, n - 3)) * f + b + (n + k - 2) * (b + rho))


def closed_form_time(schedule, num_stages: int, num_batches: int, *, backward_ratio: float = 2.0,
                     recompute_cost: float = 1.0) -> float:
    """Seconds `simulate_timing` takes for `schedule` on `num_stages` equal stages at 1 s per
    forward + backward of a batch, without delays or messages, by the closed forms of the
    module docstring (backprop, GPipe(M), DSP(1,...,1,0) with or without stashing, DDG with
    and without its barrier). Also GPipe's textbook fill/drain for comparison:
    `closed_form_time(gpipe(M), ..., recompute_cost=0)` = N (M+K-1)/M.

    Raises ValueError for schedules without a closed form here (other DSP delays)."""
    from staleness.pipeline.schedules import PipelineSchedule, parse

    sched = parse(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(sched, PipelineSchedule):
        raise ValueError(f"schedule = {schedule!r} must be a PipelineSchedule or a spec like 'gpipe:4'")
    k, n = int(num_stages), int(num_batches)
    sched = sched.resolve(k)
    f = 1.0 / (1.0 + backward_ratio)
    b = backward_ratio * f
    rho = recompute_cost * f
    if sched.name == "backprop":
        return n * k * (f + b)
    if sched.name == "gpipe":
        m = sched.microbatches
        return n * _pipeline_time(m, k, f / m, b / m, rho / m)
    if sched.name == "ddg":
        return n * (k * f + b) + (k - 1) * b if sched.barrier else (n + k - 1) * (f + b)
    if sched.forward_delays == tuple([1] * (k - 1) + [0]):
        return _pipeline_time(n, k, f, b, rho)
    raise ValueError(f"no closed form for {sched.describe()} here; closed forms cover backprop, gpipe:M, ddg, "
                     f"ddg:nobarrier and dsp:1,...,1,0[+stash]")


def simulate_timing(plan: TickPlan, cluster: Cluster, seed: int = 0, *, backward_ratio: float = 2.0,
                    recompute_cost: float = 1.0) -> Timeline:
    """Simulated start and end of every operation of `plan` on `cluster` (one worker per stage).

    Args:
      plan: the tick tables (its schedule's `barrier` adds DDG's iteration barrier).
      cluster: K workers; worker k's iteration time (seconds) is one forward + backward
        of a batch on stage k.
      seed: the cluster sampler's seed.
      backward_ratio: backward cost / forward cost (> 0).
      recompute_cost: cost of the forward a stage recomputes in its backward (`recomputes`),
        in forwards (>= 0; 0 models a recomputation fully overlapped with the forward).
    Returns:
      A `Timeline` (seconds; see the module docstring for the cost model and closed forms).
    """
    k_all = plan.num_stages
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster = {cluster!r} must be a staleness.cluster.Cluster (one worker per stage)")
    if cluster.num_workers != k_all:
        raise ValueError(f"cluster has {cluster.num_workers} workers but the pipeline has {k_all} stages; "
                         f"give one worker per stage (e.g. '1*{k_all}' or 1,1,2,1 for a 2x slower stage 2)")
    checks.number_at_least("backward_ratio", backward_ratio, 0, strict=True)
    checks.number_at_least("recompute_cost", recompute_cost, 0)
    sampler = cluster.sampler(seed)
    if sampler.membership_events():
        raise ValueError(f"cluster = {cluster.describe()!r}: worker failures are not modelled for pipelines "
                         f"(a stage that fails stops the pipeline); remove the fail= modifier")
    ct, push = sampler.compute_time, sampler.push_delay
    m = plan.microbatches
    f_del, b_del, lags = plan.forward_delays, plan.backward_delays, plan.lags
    recompute = recomputes(plan)
    barrier = plan.schedule.barrier
    f_frac = 1.0 / (1.0 + backward_ratio) / m
    b_frac = [(backward_ratio + (recompute_cost if recompute[k] else 0.0)) / (1.0 + backward_ratio) / m
              for k in range(k_all)]
    shape = (plan.num_ticks, k_all)
    fs, fe, bs, be = (np.full(shape, np.nan) for _ in range(4))
    idle = np.zeros(shape)
    fsend = np.full(shape, np.nan)  # arrival time of stage k's tick-t activation at stage k+1
    bsend = np.full(shape, np.nan)  # arrival time of stage k's tick-t gradient at stage k-1
    free = np.zeros(k_all)
    iters = np.zeros(k_all, np.int64)
    dur = np.zeros(k_all)  # this tick's iteration seconds per stage (NaN until drawn)
    fwd, bwd = plan.fwd, plan.bwd
    tick_start = 0.0  # barrier: when every operation and message of the previous tick had finished
    for t in range(plan.num_ticks):
        dur[:] = np.nan
        for k in range(k_all):
            if fwd[t, k] == IDLE:
                continue
            ready = max(free[k], tick_start) if barrier else free[k]
            if k > 0:
                ready = max(ready, fsend[t - f_del[k - 1], k - 1])
            idle[t, k] += ready - free[k]
            dur[k] = ct(k, int(iters[k]), ready)
            iters[k] += 1
            fs[t, k], fe[t, k] = ready, ready + dur[k] * f_frac
            free[k] = fe[t, k]
            if k < k_all - 1:
                fsend[t, k] = fe[t, k] + push(k, int(iters[k]) - 1)
        # barrier: the backward pass starts when the forward pass (and the loss) has crossed every stage
        bwd_start = max(tick_start, float(np.nanmax(fe[t], initial=0.0))) if barrier else 0.0
        for k in reversed(range(k_all)):
            if bwd[t, k] == IDLE:
                continue
            arrive = fe[t - lags[k], k] if k == k_all - 1 else bsend[t - b_del[k], k + 1]
            ready = max(free[k], arrive, bwd_start)
            idle[t, k] += ready - free[k]
            if math.isnan(dur[k]):
                dur[k] = ct(k, int(iters[k]), ready)
                iters[k] += 1
            bs[t, k], be[t, k] = ready, ready + dur[k] * b_frac[k]
            free[k] = be[t, k]
            if k > 0:
                bsend[t, k] = be[t, k] + push(k, int(iters[k]) - 1)
        if barrier:
            tick_start = max(bwd_start, float(np.nanmax(be[t], initial=0.0)), float(np.nanmax(bsend[t], initial=0.0)))
    return Timeline(plan, fs, fe, bs, be, idle, cluster.describe(), int(seed))
