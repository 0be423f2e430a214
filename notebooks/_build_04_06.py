"""Generate notebooks 04 (pipeline staleness, DSP) and 06 (real devices) from the cell sources below.

    python notebooks/_build_04_06.py          # rewrite notebooks/04-*.ipynb and 06-*.ipynb
    python notebooks/_build_04_06.py --check  # exit 1 if a committed notebook differs from what this writes

Same format as `notebooks/_build.py` (no outputs, deterministic cell ids, the
`python3` kernel, byte-identical rebuilds); kept separate so the two files
can be edited independently. Edit the sources here, not the .ipynb files.
Each notebook starts a fresh kernel whose first code cell sets the number of
virtual CPU devices before any JAX operation.
"""

from __future__ import annotations

import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------------
NB04 = [
    ("md", """# 04 · Layer-wise staleness in pipelines (DSP)

Backpropagation is **locked** three ways: a layer cannot run its forward before the
layers below it have (forward locking), cannot compute its gradient before the layers
above it have (backward locking), and cannot start the next batch before its update
(update locking). Split a network into K stages, one per device, and plain backprop keeps
all but one device idle at any moment.

Three ways around it, all in `staleness.pipeline`, all run by one tick engine:

- **GPipe**: split each batch into M micro-batches and pipeline them through the stages,
  accumulate their gradients and apply one synchronous update per batch. No staleness,
  but the pipeline fills and drains around every update (the *bubble*).
- **DDG** (decoupled delayed gradients): the forward of a batch still crosses every stage
  in one go; the backward is decoupled, one tick per link, so stage k uses a gradient
  K−1−k batches stale, computed on the stored autodiff graph of its own forward.
- **DSP** (diversely stale parameters; Xu, Huo, Huang, CVPR 2020): links in *both*
  directions carry a delay s_k, so no stage waits for another within a tick. Stage k
  backpropagates a batch m_k = 2·Σ_{i≥k} s_i ticks after it forwarded it, *recomputing*
  the stage's forward from the stored input with its current weights (one weight copy,
  m_k stored inputs). Lower stages are staler; the last stage is not stale.

This notebook splits a residual MLP into K = 4 stages, shows the lags m_k and the tick
plan, trains backprop, GPipe, DDG and DSP on the same batches, compares their simulated
throughput with a slow stage and with random stragglers, and finally runs DSP with each
stage on its own (virtual CPU) device. `benchmarks/reproduce_dsp.py` does the full
comparison with seeds and a learning-rate grid; its report is
`benchmarks/results/reproduce_dsp.md`."""),
    ("code", '''# Four virtual CPU devices, one per pipeline stage. This must run before any JAX
# operation (each notebook starts a fresh kernel).
import jax

jax.config.update("jax_num_cpu_devices", 4)

import os
import time

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

import staleness as st
import staleness.pipeline as pp
from staleness import plots

# Small settings by default (CI runs every notebook top to bottom in a few
# minutes); set the environment variable STALENESS_FULL=1 for the full size.
FULL = os.environ.get("STALENESS_FULL", "0") == "1"
pd.set_option("display.precision", 3)

K = 4                                   # pipeline stages
BATCHES = 1500 if FULL else 500         # batches of 32 per run
SEEDS = [0, 1, 2] if FULL else [0, 1]
LR = 0.005                              # momentum SGD (0.9) per stage, the same for every schedule
print(jax.devices())'''),
    ("md", """## A residual MLP in K stages

`pp.tasks.get("digits-resmlp", num_stages=K)` builds a residual MLP for scikit-learn's
8×8 digits and splits it with `pp.split`: an input layer (flatten, dense, ReLU), K
residual blocks `x + W₂·relu(W₁·x)` and a classifier, grouped into K contiguous stages
(the input layer joins stage 0, the classifier the last stage). Stage k is an ordinary
flax module applied to stage k−1's output; `ptask.apply(k, params[k], x)` runs it alone.
Any list of blocks splits the same way (`pp.split(blocks, K, first=..., last=...)`)."""),
    ("code", '''ptask = pp.tasks.get("digits-resmlp", num_stages=K, batch_size=32)
params = ptask.init_stage_params(jax.random.key(0))
x = ptask.minibatch(jax.random.key(1), 0)["x"]
rows = []
for k, stage in enumerate(ptask.model.stages):
    y = ptask.apply(k, params[k], x)
    rows.append({"stage": k, "layers": " → ".join(type(layer).__name__ for layer in stage.layers),
                 "parameters": sum(p.size for p in jax.tree.leaves(params[k])),
                 "input": tuple(x.shape), "output": tuple(y.shape)})
    x = y
pd.DataFrame(rows).set_index("stage")'''),
    ("md", """## How stale is each stage? m_k per schedule

A schedule is a set of per-link delays in ticks. Link k joins stage k to stage k+1; the
last entry is the link to the loss (0 in the paper's examples). `lags` are the m_k: the
ticks, equal to batches, between stage k's forward of a batch and its backward of it, so
the gradient stage k applies was computed on a batch it forwarded m_k updates ago. For
DSP(s) both directions carry s, so m_k = 2·Σ_{i≥k} s_i: (1, 1, 0) on three stages gives
(4, 2, 0). This formula is our reading of the paper (PAPERS.md marks the exact box as not
available). `offsets` say how many ticks after stage 0 a batch reaches stage k.

GPipe's lags count ticks *within* a flush (micro-batches in flight); its gradients are
not stale. DSP with all delays 0 is ordinary backpropagation."""),
    ("code", '''rows = []
for sched in [pp.dsp((1, 1, 0)), pp.dsp((1, 1, 1, 0)), pp.dsp((2, 2, 2, 0)), pp.dsp((0, 0, 0, 0)),
              pp.gpipe(4), pp.ddg(), pp.backprop()]:
    r = sched.resolve(sched.num_stages or K)
    rows.append({"schedule": r.describe(), "stages": r.num_stages, "forward delays": r.forward_delays,
                 "backward delays": r.backward_delays, "m_k (lags)": r.lags, "offsets F_k": r.offsets})
pd.DataFrame(rows).set_index("schedule")'''),
    ("md", """## The tick plan

`pp.make_plan(schedule, K, num_batches)` turns a schedule into tick tables, computed on
the host: for every tick and stage, the batch it forwards (`F n`) and the batch it
backpropagates (`B n`), in that order. Both numeric engines (one device, K devices) and
the timing model follow these tables; nothing else decides the order. For DSP(1,1,1,0)
batch n enters stage 0 at tick n, reaches stage k at tick n + k, and stage k
backpropagates it m_k ticks after its forward: stage 0 runs the forward of batch t and
the backward of batch t − 6 in the same tick."""),
    ("code", '''plan = pp.make_plan(pp.dsp((1, 1, 1, 0)), K, 10)


def entry(f, b):
    parts = ([f"F{f}"] if f >= 0 else []) + ([f"B{b}"] if b >= 0 else [])
    return " ".join(parts) or "·"


table = pd.DataFrame([[entry(plan.fwd[t, k], plan.bwd[t, k]) for k in range(K)] for t in range(plan.num_ticks)],
                     columns=[f"stage {k}" for k in range(K)])
table.index.name = "tick"
print(plan.describe(), "| forward/backward gap per stage:", plan.gaps(),
      "| most inputs stored per stage:", plan.in_flight().max(0))
table'''),
    ("md", """The same tables as heatmaps (colour = batch; white = idle) for DSP, GPipe with 4
micro-batches and DDG over the first 40 ticks. DSP and DDG keep every stage busy in
every tick once the pipeline is full; GPipe fills and drains around every batch: 10 ticks
per batch here (4 micro-batches plus 6 ticks for the last one to come back down)."""),
    ("code", '''def show_plan(plan, axes, title):
    for ax, grid, what in zip(axes, (plan.fwd, plan.bwd), ("forwards", "backpropagates")):
        batch = np.where(grid >= 0, grid // plan.microbatches, np.nan).T
        im = ax.imshow(batch, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_yticks(range(plan.num_stages))
        ax.set_ylabel("stage")
        ax.set_title(f"{title}: the batch each stage {what}", fontsize="medium", loc="left")
    return im


fig, axes = plt.subplots(6, 1, figsize=(10, 9), layout="constrained", sharex=True)
for i, spec in enumerate(["dsp:1,1,1,0", "gpipe:4", "ddg"]):
    im = show_plan(pp.make_plan(pp.parse(spec), K, 4 if spec.startswith("gpipe") else 40),
                   axes[2 * i: 2 * i + 2], spec)
axes[-1].set_xlim(-0.5, 39.5)
axes[-1].set_xlabel("tick")
fig.colorbar(im, ax=axes, label="batch", shrink=0.6)
plt.show()'''),
    ("md", """## Accuracy after the same batches

`pp.simulate` trains along a plan with all K stages in one compiled `lax.scan` over ticks
(one device); every stage applies every batch's gradient exactly once, so all schedules
see the same data in the same order. Momentum SGD (0.9) at lr 0.005 for everyone: DSP
needs a small step size here (the paper's convergence result bounds it by the largest
staleness; see the learning-rate table below). GPipe computes the same synchronous
gradient as backprop (up to floating-point reassociation of the micro-batch mean)."""),
    ("code", '''SCHEDULES = ["backprop", "gpipe:4", "ddg", "dsp:1,1,1,0"]
results = [pp.simulate(ptask, spec, BATCHES, lr=LR, seed=seed, num_evals=15)
           for spec in SCHEDULES for seed in SEEDS]
summary = pd.DataFrame([{"schedule": r.config["schedule"], "seed": r.config["seed"],
                         "m_k": tuple(r.config["lags"]), "final accuracy": r.final["accuracy"],
                         "batches / simulated s": r.config["sim_throughput"]} for r in results])
summary.groupby("schedule", sort=False)[["final accuracy", "batches / simulated s"]].median()'''),
    ("md", """Left: accuracy against batches (what staleness costs per batch). Right: the same runs
against simulated time on K stages at 1 s per forward + backward of a batch each
(what the pipeline gains per second). DSP is the most stale (m = 6, 4, 2, 0) and needs
the most batches. Per simulated second DDG processes about four times as many batches
as backprop, DSP three times (its recomputed forward is charged in full here, see
below) and GPipe about twice. On this small problem DSP's extra batches outweigh its
throughput: it reaches a given accuracy later in simulated time than GPipe and DDG."""),
    ("code", '''fig, axes = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
plots.metric_vs_updates(results, "accuracy", ax=axes[0])
axes[0].set_xlabel("batches")
plots.metric_vs_time(results, "accuracy", ax=axes[1])
plt.show()'''),
    ("md", """### Step size and staleness

Final accuracy (seed 0) over a small learning-rate grid: backprop is happy at every lr
here, while the stale schedules degrade or diverge (NaN) as lr grows. This is why the
comparison above uses lr 0.005, and why `benchmarks/reproduce_dsp.py` reports each
schedule both at a common lr and at its own best lr."""),
    ("code", '''rows = []
for spec in ["backprop", "ddg", "dsp:1,1,1,0"]:
    for lr in [0.0025, 0.005, 0.01, 0.02]:
        try:
            acc = pp.simulate(ptask, spec, BATCHES, lr=lr, seed=0, num_evals=15).final["accuracy"]
        except st.results.DivergenceError:
            acc = np.nan   # a non-finite loss
        rows.append({"schedule": spec, "lr": f"{lr:g}", "final accuracy": acc})
pd.DataFrame(rows).pivot(index="schedule", columns="lr", values="final accuracy")'''),
    ("md", """## Throughput with a slow stage and with stragglers

A pipeline's time comes from `pp.simulate_timing(plan, cluster)`: stage k is worker k of
a `staleness.cluster` model, whose iteration time is one forward + backward of a batch
on that stage (a backward costs two forwards). An operation starts when its stage is
free and its input has arrived. Three clusters: constant speeds, stage 2 twice as slow,
and random transient stragglers (each tick starts a 3-second 4× slowdown with
probability 0.05).

DSP's recomputed forward is charged as one more forward by default (`recompute_cost=1`);
the paper overlaps it with the forward (`recompute_cost=0`). Both are shown: with the
recomputation charged, DDG (which stores the graph instead) is faster than DSP; with it
overlapped they tie at constant speeds and DSP pulls ahead with stragglers. Our DDG has
no iteration barrier, which favours it."""),
    ("code", '''clusters = {
    "constant": st.cluster.constant(K),
    "stage 2 twice as slow": st.cluster.heterogeneous([1.0, 1.0, 2.0, 1.0]),
    "random stragglers": st.cluster.constant(K).stragglers(prob=0.05, slowdown=4.0, duration=3.0),
}
rows = []
for spec in SCHEDULES:
    plan = pp.make_plan(pp.parse(spec), K, 500)
    for name, cluster in clusters.items():
        for rc in (1.0, 0.0):
            tl = pp.simulate_timing(plan, cluster, seed=0, recompute_cost=rc)
            rows.append({"schedule": spec, "cluster": name, "recompute_cost": rc, "batches / s": tl.throughput})
throughput = pd.DataFrame(rows).pivot_table(index="schedule", columns=["recompute_cost", "cluster"],
                                            values="batches / s", sort=False)
throughput[[(rc, name) for rc in (1.0, 0.0) for name in clusters]]'''),
    ("md", """What the stages do over the first 30 simulated seconds with stage 2 twice as slow,
drawn from the `Timeline` (start and end of every forward and backward). Every schedule
ends up at the slow stage's pace, so the other stages idle part of the time; GPipe in
addition fills and drains the pipeline around every batch, so even the slow stage
idles. (`Timeline.to_schedule()` also turns a timeline into the `Schedule` the policies
produce, one row per stage backward, for the usual plots and summaries.)"""),
    ("code", '''def gantt(tl, ax, max_time):
    for k in range(tl.plan.num_stages):
        for start, end, color, label in ((tl.fwd_start, tl.fwd_end, "tab:green", "forward"),
                                         (tl.bwd_start, tl.bwd_end, "tab:blue", "backward (+ recompute)")):
            ok = np.isfinite(start[:, k]) & (start[:, k] < max_time)
            ax.broken_barh(np.stack([start[ok, k], end[ok, k] - start[ok, k]], 1), (k - 0.4, 0.8),
                           facecolors=color, edgecolor="white", linewidth=0.5, label=label if k == 0 else None)
    ax.set_xlim(0, max_time)
    ax.set_ylim(tl.plan.num_stages - 0.5, -0.5)
    ax.set_yticks(range(tl.plan.num_stages))
    ax.set_ylabel("stage")


slow = clusters["stage 2 twice as slow"]
fig, axes = plt.subplots(2, 1, figsize=(10, 4.5), layout="constrained", sharex=True)
for ax, spec in zip(axes, ["gpipe:4", "dsp:1,1,1,0"]):
    tl = pp.simulate_timing(pp.make_plan(pp.parse(spec), K, 40), slow, seed=0)
    gantt(tl, ax, max_time=30)
    busy = tl.busy / tl.end_time
    ax.set_title(f"{spec}: {tl.throughput:.2f} batches / s; stages busy "
                 + ", ".join(f"{b:.0%}" for b in busy), fontsize="medium", loc="left")
axes[0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize="small", frameon=False)
axes[-1].set_xlabel("simulated time (s)")
plt.show()'''),
    ("md", """The numbers of a run do not depend on the cluster (the tick order is fixed), so the
same training under random stragglers differs only in its time axis. Seed s draws the
stragglers of cluster seed s."""),
    ("code", '''strag = clusters["random stragglers"]
results_strag = [pp.simulate(ptask, spec, BATCHES, lr=LR, seed=seed, num_evals=15, cluster=strag)
                 for spec in SCHEDULES for seed in SEEDS]
fig = plots.metric_vs_time(results_strag, "accuracy")
fig.axes[0].set_title(f"accuracy vs simulated time, {strag.describe()}", fontsize="medium")
fig'''),
    ("md", """## On K devices

`pp.run_devices` runs the same plan with stage k on device k: one SPMD program
(`shard_map` over a 1-D mesh), each device running its own stage's code, activations and
gradients moving between neighbours with `ppermute`. Here the devices are four virtual
CPU devices sharing this machine's cores, so wall-clock speed says nothing about a real
pipeline; the point is that the numbers are those of the one-device simulation (the same
per-stage code in the same order; on CPU they usually agree bit for bit)."""),
    ("code", '''t0 = time.perf_counter()
dev = pp.run_devices(ptask, "dsp:1,1,1,0", BATCHES, lr=LR, seed=0, num_evals=15)
sim = next(r for r in results if r.config["schedule"] == "dsp:1,1,1,0" and r.config["seed"] == 0)
diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
           for a, b in zip(jax.tree.leaves(dev.params), jax.tree.leaves(sim.params)))
print("stages on devices:", dev.config["devices"])
print(f"final accuracy on devices {dev.final['accuracy']:.4f}, simulated {sim.final['accuracy']:.4f}; "
      f"largest |parameter difference| {diff:.1e}")
print(f"{dev.config['ticks_per_s']:.0f} ticks per wall second on shared CPU cores "
      f"(compile {dev.config['compile_s']:.1f} s, cell {time.perf_counter() - t0:.1f} s)")'''),
    ("md", """## What to take away

- m_k grows towards the input: DSP(1,1,1,0) trains stage 0 with gradients 6 batches
  stale. It pays for that in batches and in the step size it tolerates.
- Per simulated second DSP removes GPipe's bubbles, and keeps more of its throughput
  under random stragglers than GPipe or DDG. Whether it beats DDG depends on whether the
  recomputation really overlaps the forward (`recompute_cost`).
- `benchmarks/reproduce_dsp.py` checks each claim of the paper with seeds and a
  learning-rate grid, on digits and MNIST-1D; `staleness pipeline --schedule dsp
  --delays 1,1,1,0 --stages 4` does one run from the command line."""),
]

# ---------------------------------------------------------------------------------
NB06 = [
    ("md", """# 06 · Real devices: the same policies for real, and the replay of their trace

Notebooks 01–03 *simulate* a cluster. `staleness.runtime` runs the same policy objects
for real: each worker, bound to its own device, runs the engine's jitted
per-gradient function on a minibatch (a thread per worker sleeps a cluster's injected
delays; without a cluster the server's loop dispatches every worker's step itself); a server loop owns the parameters, applies
gradients with the optimizer and asks the policy, on every push, whether the worker
may start its next iteration. Time is `time.monotonic()`, not a simulated clock.

Heterogeneity on homogeneous hardware comes from the cluster models: a worker's
iteration lasts at least `compute_time × time_scale` real seconds, where
`compute_time` is drawn from the same cluster model the simulator uses. Every run
**records its trace**: for each gradient, the worker, the parameter version it was
computed on, the version it was applied at and the real times. The engine can replay
that trace, and on CPU it reproduces the real run's final parameters bit for bit:
what the simulator replays is exactly what a real run does, given the same order of
events.

Here: eight virtual CPU devices, four fast and four slow (2.6×) workers with 20 %
jitter, under SSP(3) and DSSP(3, 12)."""),
    ("code", '''# Eight virtual CPU devices, one per worker. This must run before any JAX operation
# (each notebook starts a fresh kernel).
import jax

jax.config.update("jax_num_cpu_devices", 8)

import os
import time

import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

import staleness as st
from staleness import plots

# Small settings by default (CI runs every notebook top to bottom in a few
# minutes); set the environment variable STALENESS_FULL=1 for the full size.
FULL = os.environ.get("STALENESS_FULL", "0") == "1"
pd.set_option("display.precision", 3)

UPDATES = 3000 if FULL else 800    # server updates per run
TIME_SCALE = 0.02                  # real seconds per simulated second: fast 20 ms, slow 52 ms per iteration
print(len(jax.local_devices()), "devices:", jax.local_devices())'''),
    ("md", """## A real run

The cluster spec `1*4,2.6*4+jitter=0.2` is four workers at 1 simulated second per
iteration and four at 2.6 s (the GTX 1080 Ti : GTX 1060 ratio of the DSSP paper), each
iteration scaled by a lognormal factor (σ = 0.2). With `TIME_SCALE` = 0.02 a fast
worker's iteration lasts 20 ms of real time, long enough that the injected delay, not
this machine's compute, sets the pace. The task is `digits-mlp`, μ = 16 per worker,
plain SGD at lr 0.05 on the server."""),
    ("code", '''cluster = st.cluster.parse("1*4,2.6*4+jitter=0.2")
task = st.tasks.get("digits-mlp", num_workers=8, batch_size=16)
POLICIES = ["ssp:3", "dssp:3:12"]

real = {}
for p in POLICIES:
    t0 = time.perf_counter()
    real[p] = st.runtime.run(task, p, cluster, num_updates=UPDATES, time_scale=TIME_SCALE, lr=0.05, seed=0,
                             num_evals=15)
    print(f"{p:>10}: {real[p].status}, {real[p].schedule.num_updates} updates in "
          f"{real[p].schedule.end_time:.2f} s of training (the call took {time.perf_counter() - t0:.1f} s, "
          f"compilation included)")'''),
    ("md", """`Result.summary` is the simulator's; here `sim_time_s` is the run's *wall-clock*
seconds and `updates_per_s` real updates per second."""),
    ("code", '''pd.DataFrame({p: r.summary(target=0.9) for p, r in real.items()}).T'''),
    ("md", """The recorded trace is an ordinary `Schedule`, one row per gradient, with real times
in seconds since the start of the run:"""),
    ("code", '''real["dssp:3:12"].schedule.to_frame().head(8)'''),
    ("md", """## The live run, plotted

The worker timeline of each recorded trace over its first second: blue is compute (the
injected delay included), orange is waiting at the gate. Workers 0–3 are the fast ones;
under SSP(3) they run ahead until they are 3 clocks ahead of the slowest worker, then
wait. DSSP lets the fastest worker run up to `r*` extra iterations beyond `s_L` = 3,
chosen by its controller from the real push timestamps. With constant speed ratios every
bounded policy ends at the slow workers' pace (notebook 02), so DSSP's fast workers wait
about as much in total, in fewer and longer stretches."""),
    ("code", '''fig, axes = plt.subplots(2, 1, figsize=(10, 7), layout="constrained")
for ax, p in zip(axes, POLICIES):
    plots.worker_timeline(real[p], ax=ax, max_time=1.0)
    ax.set_xlabel("wall-clock time (s)")
plt.show()'''),
    ("code", '''fig, axes = plt.subplots(1, 3, figsize=(15, 4), layout="constrained")
plots.staleness_histogram(list(real.values()), ax=axes[0])
plots.wait_fraction(list(real.values()), ax=axes[1])
plots.metric_vs_time(list(real.values()), "accuracy", ax=axes[2])
axes[2].set_xlabel("wall-clock time (s)")
plt.show()'''),
    ("md", """## Replaying the trace in the engine

`st.runtime.replay_trace(result)` feeds the recorded trace to `st.engine.replay`
(with `slot_mode="map"`, the per-gradient function the workers ran), with the run's own
task, learning rate, optimizer and seed. The replay computes every gradient on the
parameter version the trace says it was computed on and applies it at the version it
was applied at, in one compiled `lax.scan`. On CPU the final parameters are **bitwise
equal** to the real run's (on GPUs, compare with a tolerance: kernels may differ between
the standalone and the scanned program)."""),
    ("code", '''rows = []
for p, r in real.items():
    t0 = time.perf_counter()
    rep, cmp = st.runtime.replay_trace(r)
    rows.append({"policy": p, "bitwise equal": cmp.bitwise, "max |difference|": cmp.max_abs_diff,
                 "real final accuracy": r.final["accuracy"], "replay final accuracy": rep.final["accuracy"],
                 "replay seconds": time.perf_counter() - t0})
pd.DataFrame(rows).set_index("policy")'''),
    ("md", """## Real vs simulated

The simulator predicts the schedule from the same cluster model: run
`simulate_schedule` for the same policy, cluster, seed and number of updates, and
compare. Real updates per second × `TIME_SCALE` is updates per simulated second. The
real run is somewhat slower than predicted: its iterations last the injected delay
*plus* a little real work and thread scheduling on this shared machine, and the server
itself takes time per update. Staleness and waiting are close but not identical: the
order of near-simultaneous pushes depends on real timing."""),
    ("code", '''rows, sims = [], {}
for p, r in real.items():
    s_real = r.schedule.summary()
    sims[p] = st.simulate_schedule(p, cluster, num_updates=UPDATES, seed=0)
    s_sim = sims[p].summary()
    rows.append({"policy": p,
                 "real updates / s": s_real["updates_per_s"],
                 "real updates / simulated s": s_real["updates_per_s"] * TIME_SCALE,
                 "simulated updates / simulated s": s_sim["updates_per_s"],
                 "real / simulated": s_real["updates_per_s"] * TIME_SCALE / s_sim["updates_per_s"],
                 "τ mean (real)": s_real["staleness_mean"], "τ mean (simulated)": s_sim["staleness_mean"],
                 "wait fraction (real)": s_real["wait_fraction_mean"],
                 "wait fraction (simulated)": s_sim["wait_fraction_mean"]})
pd.DataFrame(rows).set_index("policy").T'''),
    ("code", '''p = "dssp:3:12"
plots.staleness_histogram([real[p].schedule, sims[p]],
                          label_fn=lambda s: f"{p} ({'real' if s.meta.get('recorded') == 'runtime' else 'simulated'})")'''),
    ("md", """## From the command line

```bash
staleness run --policy dssp:3:12 --cluster "1*4,2.6*4+jitter=0.2" --cpu-devices 8 --updates 800 \\
    --time-scale 0.02 --out runs/real
staleness replay runs/real --check                        # bitwise on CPU
staleness launch --local 4 --policy ssp:3 --updates 300 --out runs/mp   # 4 processes via jax.distributed
```

Across processes or hosts the same policies run with `jax.distributed` (see the README);
the trace, and its replay, are the same."""),
]

NOTEBOOKS = {
    "04-pipeline-staleness.ipynb": NB04,
    "06-real-devices.ipynb": NB06,
}


def main(argv=None) -> int:
    """Write (or with --check, compare) notebooks 04 and 06 with `_build.py`'s writer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_build", HERE / "_build.py")
    build_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_module)
    return build_module.main(argv, NOTEBOOKS, "notebooks/_build_04_06.py")


if __name__ == "__main__":
    sys.exit(main())
