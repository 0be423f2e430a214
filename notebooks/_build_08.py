"""Generate notebook 08 (low-communication training: DiLoCo, Streaming DiLoCo, async
DiLoCo, bytes on the wire) from the cell sources below.

    python notebooks/_build_08.py          # rewrite notebooks/08-*.ipynb
    python notebooks/_build_08.py --check  # exit 1 if the committed notebook differs from what this writes

Same format as `notebooks/_build.py` (whose writer it uses). Edit the sources
here, not the .ipynb file.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUP = '''import os
import subprocess
import sys

import jax
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

import staleness as st

# Small settings by default (CI runs this notebook top to bottom in about a minute on
# two CPU cores); set the environment variable STALENESS_FULL=1 for the full size.
FULL = os.environ.get("STALENESS_FULL", "0") == "1"
SEEDS = [0, 1, 2] if FULL else [0]
STEPS = 600 if FULL else 120          # inner steps per worker: the same for every method
pd.set_option("display.precision", 3)

task = st.tasks.get("digits-mlp", batch_size=8, num_workers=4)
params = task.init_params(jax.random.key(0))
param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))   # bytes of one full exchange
print(f"digits-mlp: {param_bytes} bytes of float32 parameters in modules {list(params)}")'''

NB08 = [
    ("md", """# 08 · Low-communication training: DiLoCo, Streaming DiLoCo, async and Decoupled DiLoCo

The parameter-server policies of notebooks 01-05 exchange a gradient and the parameters
for **every** minibatch. The local-update methods let each worker take H inner steps on
its own copy of the parameters and exchange only the delta θ_pulled − θ_after:

| spec | method |
| --- | --- |
| `local_sgd:H` | H inner steps, then the server averages the parameters |
| `diloco:H` | inner AdamW per worker (its state kept across rounds), outer Nesterov SGD (0.7, 0.9) on the mean delta |
| `streaming_diloco:H:fragments=P:overlap=T:alpha=A:bits=B` | one fragment of the modules synchronized every H/P steps, merged T steps later, outer gradients quantized to B bits |
| `async_diloco:H[:bound=S][:dynamic]` | each delta applied on arrival; `delayed_nesterov:N` outer optimizer; Dynamic Local Updates |

They are policies like the others: the same simulator, the same Schedule columns (a row is
one round of H inner steps; its staleness is counted in outer versions), the same replay
and the same real runtime. This notebook:

1. DiLoCo vs data-parallel at equal inner steps, and the bytes each sends,
2. Streaming DiLoCo's fragments in the schedule and in the parameters,
3. asynchronous DiLoCo on heterogeneous workers: naive vs Delayed Nesterov vs Dynamic Local Updates,
4. compute utilization vs bandwidth from the simulator's network model,
5. the same from the command line."""),
    ("code", SETUP),
    ("md", """## 1 · DiLoCo vs data-parallel at equal inner steps

Data-parallel training is `bsp` with the workers' optimizer on the server: one update per
inner step, a gradient pushed and the parameters pulled by every worker every step.
`diloco:H` takes `STEPS / H` rounds of H inner AdamW steps. Both do `STEPS` inner steps per
worker; the x axis below counts them."""),
    ("code", '''cluster = st.cluster.constant(4)          # 4 identical workers, 1 s per inner step
opt = "adamw:lr=3e-3"
runs = {"data-parallel (bsp)": st.sweep(task, ["bsp"], cluster, seeds=SEEDS, num_updates=STEPS, optimizer=opt,
                                       num_evals=6)}
for h in (10,):
    runs[f"diloco:{h}"] = st.sweep(task, [f"diloco:{h}"], cluster, seeds=SEEDS, num_updates=STEPS // h,
                                   inner_optimizer=opt, num_evals=3)

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, rs in runs.items():
    steps_per_update = 1 if name.startswith("data") else int(name.split(":")[1])
    h = rs[0].history
    ax.plot(h["update"] * steps_per_update, np.median([r.history["loss"] for r in rs], axis=0), marker="o",
            label=name)
ax.set_xlabel("inner steps per worker"); ax.set_ylabel("held-out loss"); ax.legend()
plt.show()
pd.DataFrame({name: {"final loss": np.median([r.final["loss"] for r in rs]),
                     "final accuracy": np.median([r.final["accuracy"] for r in rs])} for name, rs in runs.items()}).T'''),
    ("md", """### Bytes on the wire

The simulator's network model times every transfer as latency + bytes / bandwidth, with
the bytes of the real parameter pytree (`payload_bytes`; a compressed or quantized push
passes `push_bytes`). The schedule records each pull's and push's bytes; `summary()` adds
them up. Same number of inner steps, H times fewer exchanges (and Streaming DiLoCo's
pushes, section 2, are one fragment at 4 bits per value):"""),
    ("code", '''from staleness.engine.local import fragment_keys

net = "1*4+net=100mbps:5ms"            # 4 workers, 100 Mbit/s links, 5 ms latency
frag_bytes = [sum(x.size * x.dtype.itemsize for k in keys for x in jax.tree.leaves(params[k]))
              for keys in fragment_keys(params, 2)]    # Streaming DiLoCo's 2 fragments (section 2)
rows = {}
for spec, updates in [("bsp", STEPS), ("diloco:10", STEPS // 10), ("diloco:40", STEPS // 40),
                      ("streaming_diloco:10:fragments=2:overlap=1:alpha=0.5:bits=4", 2 * STEPS // 10)]:
    # Streaming DiLoCo pushes one fragment's outer gradient at 4 bits per value (float32: 32 bits);
    # the simulator takes one push size per run: the fragments' mean
    push = int(np.mean(frag_bytes)) * 4 // 32 if spec.startswith("streaming") else None
    s = st.simulate_schedule(spec, net, num_updates=updates, seed=0, payload_bytes=param_bytes, push_bytes=push)
    summ = s.summary()
    rows[spec] = {"updates": summ["updates"], "MB sent": summ["bytes_sent"] / 1e6,
                  "simulated s": summ["sim_time_s"], "wait fraction": summ["wait_fraction_mean"]}
pd.DataFrame(rows).T'''),
    ("md", """## 2 · Streaming DiLoCo: fragments synchronized at staggered times

`streaming_diloco:H:fragments=P` splits the model's top-level modules into P strided
fragments (module j in fragment j mod P) and synchronizes one fragment every H/P inner
steps, so each fragment is still synchronized every H steps but a synchronization moves
1/P of the model. `overlap=T` merges the outer update T inner steps after it was sent (the
communication hides behind those steps), `alpha` is the local weight of the merge and
`bits=4` quantizes the outer gradients. digits-mlp has two modules, so P = 2 here: each
update of the replay changes one fragment of the global parameters."""),
    ("code", '''spec = "streaming_diloco:10:fragments=2:overlap=1:alpha=0.5:bits=4"
print("fragments:", fragment_keys(params, 2))
sched = st.simulate_schedule(spec, cluster, num_updates=3, seed=0)
before = None
for u in range(1, 4):   # replay the first u updates and see which modules moved
    part = st.Schedule(columns={k: v[sched.columns["apply_version"] < u] for k, v in sched.columns.items()},
                       update_time=sched.update_time[:u], num_workers=4, policy=sched.policy, meta=sched.meta)
    p = st.engine.replay(part, task, inner_optimizer="adamw:lr=3e-3", num_evals=1).params
    if before is not None:
        moved = [k for k in p if any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p[k]),
                                                                                 jax.tree.leaves(before[k])))]
        print(f"update {u}: changed {moved}")
    before = p'''),
    ("code", '''spec = "streaming_diloco:10:fragments=2:overlap=1:alpha=0.5:bits=4"
rs = st.sweep(task, [spec], cluster, seeds=SEEDS, num_updates=2 * STEPS // 10, inner_optimizer="adamw:lr=3e-3",
              num_evals=3)
pd.DataFrame({"diloco:10": {"final loss": np.median([r.final["loss"] for r in runs["diloco:10"]])},
              spec: {"final loss": np.median([r.final["loss"] for r in rs])}}).T'''),
    ("md", """## 3 · Asynchronous DiLoCo on heterogeneous workers

Four workers at 0.58, 0.75, 1.51 and 3.33 s per inner step (the asynchronous Local-SGD
paper's toy setting). `async_diloco:H` applies each delta when it arrives, so the fast
workers' deltas are applied many times between two of the slow worker's, and the slow
worker's delta is stale. Liu et al.'s two fixes:

- **Delayed Nesterov** (`delayed_nesterov:N` as the outer optimizer): each arrival is applied
  as a plain step, the momentum only every N arrivals;
- **Dynamic Local Updates** (`:dynamic`): a worker takes H · t_fastest / t_worker steps, so
  every round takes about as long."""),
    ("code", '''het = st.cluster.heterogeneous([0.58, 0.75, 1.51, 3.33])
T = 400.0 if FULL else 120.0
print("Dynamic Local Updates, steps per worker:",
      st.simulate_schedule("async_diloco:20:dynamic", het, num_updates=8, seed=0).meta["local_steps"])
variants = {"naive async": ("async_diloco:20", "nesterov:0.9,lr=0.7"),
            "Delayed Nesterov": ("async_diloco:20", "delayed_nesterov:4,lr=0.7"),
            "DN + Dynamic Local Updates": ("async_diloco:20:dynamic", "delayed_nesterov:4,lr=0.7")}
fig, ax = plt.subplots(figsize=(6, 3.5))
table = {}
for name, (spec, outer) in variants.items():
    rs = st.sweep(task, [spec], het, seeds=SEEDS, max_time=T, optimizer=outer, inner_optimizer="adamw:lr=3e-3",
                  num_evals=6)
    h = rs[0].history
    ax.plot(h["time"], np.median([r.history["loss"] for r in rs], axis=0), marker="o", label=name)
    table[name] = {"final loss": np.median([r.final["loss"] for r in rs]),
                   "mean staleness": np.mean([r.schedule.summary()["staleness_mean"] for r in rs]),
                   "time to loss 0.5 (s)": np.median([r.time_to(0.5, "loss") for r in rs])}
ax.set_xlabel("simulated time (s)"); ax.set_ylabel("held-out loss"); ax.legend()
plt.show()
pd.DataFrame(table).T'''),
    ("md", """## 4 · Compute utilization vs bandwidth

With a ring all-reduce (`.allreduce("ring", bandwidth, latency)`: 2(λ−1)/λ · B / b +
2(λ−1) · L per round), a synchronous round waits for the reduction. Utilization is the
fraction of wall time spent computing: data-parallel reduces every step, DiLoCo every H
steps. Only the schedule is simulated here (no numerics), so this is fast. The scenario:
a 100 MB model, 1 s per inner step, 5 ms latency, 8 workers."""),
    ("code", '''model_bytes, lam = 100_000_000, 8
gbps = np.logspace(-1, 2, 7)
util = {}
for spec, updates in [("bsp", 40), ("diloco:10", 4), ("diloco:100", 2)]:
    util[spec] = []
    for g in gbps:
        cl = st.cluster.constant(lam, 1.0).allreduce("ring", g * 1e9 / 8, 5e-3)
        s = st.simulate_schedule(spec, cl, num_updates=updates, seed=0, payload_bytes=model_bytes)
        f = s.columns
        util[spec].append(float(np.sum(f["end"] - f["start"]) / (lam * s.update_time[-1])))
fig, ax = plt.subplots(figsize=(6, 3.5))
for spec, u in util.items():
    ax.plot(gbps, u, marker="o", label=spec)
ax.set_xscale("log"); ax.set_xlabel("bandwidth (Gbit/s)"); ax.set_ylabel("compute utilization")
ax.set_ylim(0, 1.02); ax.legend()
plt.show()'''),
    ("md", """`benchmarks/reproduce_diloco.py` does all of this at a larger scale, with 5 seeds and
verdicts per claim of the papers (results in `benchmarks/results/reproduce_diloco.md`).

## 5 · Decoupled DiLoCo under chaos

`decoupled_diloco:H:quorum=K:grace=G` (Douillard et al. 2026): learners run on their own
clocks; once K of them have pushed, the synchronizer waits G seconds for more and merges every
arrival into one update, each delta weighted by the tokens its learner processed. Chips fail:
`+chaos=MTBF:REPAIR:CHIPS` makes each worker a learner of CHIPS chips that each fail every
MTBF seconds on average, and a failure takes the learner down for REPAIR seconds. Goodput
(`summary()['goodput']`) is the compute of what was applied over the chips' time.

The same 8,000 chips as one data-parallel job (`bsp`: any chip's failure stalls it), as 8
synchronous DiLoCo learners (a round waits for the live ones) and as 8 decoupled learners,
merging every arrival alone (K = 1), once 2 have arrived, waiting 5 s for more, or with the
paper's adaptive window (`grace=adaptive`: γ·(τ·step − time to the quorum − a sync), at most
one step here). Move the
slider (the chips' mean time between failures): the left plot is goodput from schedules
alone, the right one the loss of digits-mlp trained along the chosen rate's schedules (4
learners of 2,000 chips there, to keep it small). Decoupled DiLoCo's outer step is clocked
(`clocked_nesterov`, its default): a merge moves the model by its share of a round's tokens,
and the momentum folds once per round's worth of merged tokens. A full Nesterov step per merge
(`optimizer="nesterov:0.9,lr=0.7"`) diverges as soon as merges hold fewer than every learner,
as asynchronous DiLoCo did in section 3. The quorum and its window merge several deltas per
step, at some cost in goodput (the paper's trade-off between K, the grace window and quality).
With `fragments=P` a learner pushes one fragment every H/P steps (as in Streaming DiLoCo) and
each fragment is merged by its own quorum and window (the last row on the left: K = 2, P = 4)."""),
    ("code", '''import io

import ipywidgets as widgets
from IPython.display import Image, display

MTBFS = [3e5, 1e6, 3e6, 1e7, 3e7]      # seconds between one chip's failures (3e7: about a year)
HORIZON = 2000.0 if FULL else 600.0    # simulated seconds
LEARNERS = "1*8+jitter=0.05+chaos={m:g}:30:1000"
SETTINGS = {"data parallel (bsp)": ("bsp", "1+chaos={m:g}:30:8000"), "DiLoCo, 8 learners": ("diloco:24", LEARNERS),
            "decoupled, K=1": ("decoupled_diloco:24", LEARNERS),
            "decoupled, K=2, 5 s": ("decoupled_diloco:24:quorum=2:grace=5", LEARNERS),
            "decoupled, K=1, adaptive": ("decoupled_diloco:24:grace=adaptive", LEARNERS),
            "decoupled, K=2, 4 fragments": ("decoupled_diloco:24:quorum=2:fragments=4", LEARNERS)}
goodput = {name: [st.simulate_schedule(p, c.format(m=m), max_time=HORIZON, seed=0).goodput() for m in MTBFS]
           for name, (p, c) in SETTINGS.items()}
losses = {}
OUTER = {"diloco:24": None, "decoupled_diloco:24": None,   # each method's own outer step
         "decoupled_diloco:24:quorum=2:grace=5": None, "decoupled_diloco:24:grace=adaptive": None}
COLOR = {"diloco:24": "C1", "decoupled_diloco:24": "C2", "decoupled_diloco:24:quorum=2:grace=5": "C3",
         "decoupled_diloco:24:grace=adaptive": "C4"}   # as on the left


def loss_runs(mtbf):
    if mtbf not in losses:
        cl = f"1*4+jitter=0.05+chaos={mtbf:g}:30:2000"
        losses[mtbf] = {p: st.simulate(task, p, cl, max_time=HORIZON / 4, seed=0, inner_optimizer="adamw:lr=3e-3",
                                       optimizer=outer, num_evals=4) for p, outer in OUTER.items()}
    return losses[mtbf]


def png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return Image(buf.getvalue())


def chaos_figure(mtbf):
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    for name, g in goodput.items():
        a.plot(MTBFS, g, marker="o", label=name)
    a.axvline(mtbf, color="grey", ls=":")
    a.set_xscale("log"); a.set_xlabel("chip MTBF (s)"); a.set_ylabel("goodput"); a.set_ylim(0, 1.02)
    a.legend(fontsize=8)
    for p, r in loss_runs(mtbf).items():
        b.plot(r.history["time"], r.history["loss"], marker="o", color=COLOR[p],
               label=f"{p} (goodput {r.schedule.goodput():.2f})")
    b.set_xlabel("simulated seconds"); b.set_ylabel("held-out loss"); b.set_title(f"chip MTBF {mtbf:g} s")
    b.legend(fontsize=7, loc="upper right")
    return png(fig)


rate = widgets.SelectionSlider(options=MTBFS, value=1e6, description="chip MTBF (s)", continuous_update=False,
                               style={"description_width": "100px"})
chaos_state = {"renders": 0}
plot = display(chaos_figure(rate.value), display_id=True)   # display handles, no Output widget (see notebook 09)
chaos_state["renders"] = 1


def on_rate(change):
    plot.update(chaos_figure(change["new"]))
    chaos_state["renders"] += 1


rate.observe(on_rate, names="value")
display(rate)
pd.DataFrame(goodput, index=[f"{m:g}" for m in MTBFS]).rename_axis("chip MTBF (s)")'''),
    ("code", '''rate.value = 3e5   # moves the slider the way a user does: the figure above follows
assert chaos_state["renders"] == 2 and 3e5 in losses, chaos_state
assert goodput["decoupled, K=1"][0] > goodput["data parallel (bsp)"][0]'''),
    ("md", """`benchmarks/reproduce_decoupled_diloco.py` runs the paper's setting (150k to 2.4M chips,
one year per chip) with verdicts per claim (`benchmarks/results/reproduce_decoupled_diloco.md`).

## 6 · From the command line

The same specs work in `staleness simulate`, `compare` and `run`; `--inner-optimizer` is
the workers' optimizer and `--optimizer` the outer one."""),
    ("code", '''proc = subprocess.run([sys.executable, "-m", "staleness", "simulate", "--task", "digits-mlp",
                       "--policy", "diloco:10", "--cluster", "1,1,2.6,2.6", "--updates", "6",
                       "--inner-optimizer", "adamw:lr=3e-3", "--no-progress"],
                      capture_output=True, text=True)
print(proc.stdout[-800:] or proc.stderr[-800:])'''),
]

NOTEBOOKS = {"08-low-communication.ipynb": NB08}


def main(argv=None) -> int:
    """Write (or with --check, compare) notebook 08 with `_build.py`'s writer."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_build", HERE / "_build.py")
    build_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_module)
    return build_module.main(argv, NOTEBOOKS, "notebooks/_build_08.py")


if __name__ == "__main__":
    sys.exit(main())
