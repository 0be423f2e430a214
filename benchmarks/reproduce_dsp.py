"""Reproduce the DSP findings (Xu, Huo, Huang, CVPR 2020) in the pipeline simulator.

A residual MLP split into K = 4 stages (one residual block per stage, the
input layer on stage 0 and the classifier on stage 3) trains on digits (and
MNIST-1D in the full run) along five schedules of `staleness.pipeline`:
backprop (reference), GPipe with 4 micro-batches, DDG, DSP(1,1,1,0) (lags
m = 6,4,2,0) and DSP(2,2,2,0) (m = 12,8,4,0), plus DSP(1,1,1,0) with
PipeDream-style weight stashing as an ablation of the recomputation. Every
schedule gets the same number of batches, seeds and learning-rate grid
(momentum SGD 0.9); the numbers of a run do not depend on the cluster, so
each (schedule, lr, seed) is trained once and its time axis comes from
`simulate_timing` on three per-stage cluster models: constant speeds, stage 2
twice as slow, and random transient stragglers. Simulated time is charged
with the DSP recomputation as a full forward (`recompute_cost=1`, the
library's default) and fully overlapped (`recompute_cost=0`, the paper's
claim); both are reported.

Prints the tables and a verdict, computed from these results, for each DSP
claim of PAPERS.md section 3; writes `<out>/reproduce_dsp.md`,
`<out>/reproduce_dsp_<task>.png` and `<out>/reproduce_dsp_throughput.png`;
ends with one JSON line.

    python benchmarks/reproduce_dsp.py            # full: digits + MNIST-1D, 5 seeds, ~6 min on 2 cores
    python benchmarks/reproduce_dsp.py --quick    # smoke run (< 1 min), writes runs/reproduce_dsp_quick/
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from _report import versions
import staleness.pipeline as pp
from staleness import cluster as C
from staleness.results import DivergenceError

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_dsp"
K = 4

SCHEDULES = ["backprop", "gpipe:4", "ddg", "dsp:1,1,1,0", "dsp:2,2,2,0", "dsp:1,1,1,0+stash"]
TIMING_ONLY = ["gpipe:8"]  # numerically GPipe(4) (same synchronous gradient); fewer bubbles
DSP, GPIPE, DDG, BACKPROP = "dsp:1,1,1,0", "gpipe:4", "ddg", "backprop"
RECOMPUTE = (1.0, 0.0)

# Per-stage cluster models (stage k = worker k; 1 s per forward + backward of a batch).
STRAGGLERS = dict(prob=0.05, slowdown=4.0, duration=3.0)  # per-tick episode probability, x, simulated s
CLUSTERS = {
    "constant": C.constant(K),
    "slow stage": C.heterogeneous([1.0, 1.0, 2.0, 1.0]),
    "stragglers": C.constant(K).stragglers(**STRAGGLERS),
}
CLUSTER_TEXT = {
    "constant": "every stage 1 s",
    "slow stage": "stage 2 takes 2 s, the others 1 s",
    "stragglers": (f"every stage 1 s; each tick starts a {STRAGGLERS['duration']:g}-s episode of "
                   f"{STRAGGLERS['slowdown']:g}x slowdown with probability {STRAGGLERS['prob']:g}, per stage"),
}

# Per task: batches per run, learning-rate grid, seeds, target accuracy of the
# time-to-target columns, evaluation spacing (batches). The grid brackets every
# schedule's best lr; COMMON_LR is the largest lr at which DSP trains stably on
# digits (momentum 0.9), used for the equal-lr comparison.
COMMON_LR = 0.005
TASKS = {
    "digits-resmlp": dict(batches=1000, lrs=[0.0025, 0.005, 0.01, 0.02], seeds=5, target=0.93, eval_every=40),
    "mnist1d-resmlp": dict(batches=2000, lrs=[0.0025, 0.005, 0.01, 0.02], seeds=5, target=0.55, eval_every=80),
}
QUICK = {"digits-resmlp": dict(batches=300, lrs=[0.0025, 0.005], seeds=3, target=0.85, eval_every=30)}
BATCH_SIZE = 32

# Thresholds of the verdicts (stated in the report).
SIGNIFICANT = 1.2   # "significant speed-up": throughput (or time-to-target) ratio at least this
ACC_TOL = 0.01      # "no accuracy loss": DSP's median final accuracy at most 1 point below the reference


# -- running -----------------------------------------------------------------------
def train_all(task: str, cfg: dict, bar) -> dict:
    """{(schedule, lr, seed): run dict} of every accuracy run of `task`."""
    ptask = pp.tasks.get(task, num_stages=K, batch_size=BATCH_SIZE)
    out = {}
    for spec in SCHEDULES:
        for lr in cfg["lrs"]:
            for seed in range(cfg["seeds"]):
                bar.set_postfix_str(f"{task} {spec} lr={lr:g} seed={seed}")
                try:
                    r, status = pp.simulate(ptask, spec, cfg["batches"], lr=lr, seed=seed,
                                            eval_every=cfg["eval_every"]), "complete"
                except DivergenceError as e:
                    r, status = e.result, "diverged"
                h = r.history
                out[(spec, lr, seed)] = {
                    "status": status,
                    "update": h["update"].to_numpy(np.int64),
                    "accuracy": h["accuracy"].to_numpy(np.float64),
                    # a diverged run counts as accuracy 0 in medians (it is also counted separately)
                    "final": float(h["accuracy"].iloc[-1]) if status == "complete" else 0.0,
                    "lags": tuple(r.config["lags"]),
                }
                bar.update(1)
    return out


def timelines(task: str, cfg: dict, specs: list[str]) -> dict:
    """{(schedule, cluster, recompute_cost, seed): Timeline} for `task`'s number of batches.

    Deterministic clusters are simulated once (seed 0) and shared by every seed."""
    out = {}
    n = cfg["batches"]
    for spec in specs:
        plan = pp.make_plan(pp.parse(spec), K, n)
        recomputes = plan.schedule.backward == "recompute" and any(m > 0 for m in plan.lags)
        for cname, cluster in CLUSTERS.items():
            random = cname == "stragglers"
            for rc in RECOMPUTE:
                for seed in range(cfg["seeds"]):
                    if (not random and seed > 0) or (not recomputes and rc != RECOMPUTE[0]):
                        out[(spec, cname, rc, seed)] = out[(spec, cname, RECOMPUTE[0] if not recomputes else rc,
                                                            seed if random else 0)]
                        continue
                    out[(spec, cname, rc, seed)] = pp.simulate_timing(plan, cluster, seed, recompute_cost=rc)
    return out


def memory_and_invariants(task: str) -> dict:
    """Per schedule: lags m_k, the plan's forward/backward gap and queue length per
    stage, and the bytes each stage stores between a forward and its backward."""
    import jax.numpy as jnp

    from staleness.engine import core
    from staleness.engine.optim import get as get_optimizer
    from staleness.pipeline import sim
    from staleness.pipeline import stage as S

    ptask = pp.tasks.get(task, num_stages=K, batch_size=BATCH_SIZE)
    params = ptask.init_stage_params(core.keys(0)[0])
    ctx = S.Context(ptask, core.keys(0)[1], jnp.float32(0.1))
    out = {}
    for spec in SCHEDULES + ["dsp:0,0,0,0"]:
        plan = pp.make_plan(pp.parse(spec), K, 50)
        _, carry = sim.init(ptask, plan, get_optimizer("momentum:0.9"), params, ctx)
        out[spec] = {"lags": list(plan.lags), "gaps": [int(g) for g in plan.gaps()],
                     "queue_max": [int(q) for q in plan.in_flight().max(0)],
                     "stored_bytes": sim.stored_bytes(carry), "backward": plan.schedule.backward,
                     "fwd": plan.fwd, "bwd": plan.bwd}
    return out


# -- statistics ----------------------------------------------------------------------
def acc_cell(runs: dict, spec: str, lr: float, seeds: int) -> dict:
    finals = np.array([runs[(spec, lr, s)]["final"] for s in range(seeds)])
    return {"median": float(np.median(finals)), "min": float(finals.min()), "max": float(finals.max()),
            "diverged": int(sum(runs[(spec, lr, s)]["status"] == "diverged" for s in range(seeds)))}


def best_lr(acc: dict, spec: str, lrs: list[float]) -> float:
    """The lr of the grid with the highest median final accuracy (ties: the smaller lr)."""
    return max(lrs, key=lambda lr: (acc[(spec, lr)]["median"], -lr))


def batches_to(run: dict, target: float) -> int | None:
    """First evaluated batch count at which the run's accuracy reached `target` (None: never)."""
    hit = np.flatnonzero(run["accuracy"] >= target)
    return int(run["update"][hit[0]]) if len(hit) else None


def time_to(run: dict, tl, target: float) -> float:
    n = batches_to(run, target)
    if n is None:
        return math.inf
    return 0.0 if n == 0 else float(tl.batch_done_time()[n - 1])


def task_stats(task: str, cfg: dict, runs: dict, tls: dict) -> dict:
    lrs, seeds = cfg["lrs"], cfg["seeds"]
    acc = {(spec, lr): acc_cell(runs, spec, lr, seeds) for spec in SCHEDULES for lr in lrs}
    best = {spec: best_lr(acc, spec, lrs) for spec in SCHEDULES}
    ttt = {}
    for spec in SCHEDULES:
        for cname in CLUSTERS:
            for rc in RECOMPUTE:
                times = np.array([time_to(runs[(spec, best[spec], s)], tls[(spec, cname, rc, s)], cfg["target"])
                                  for s in range(seeds)])
                ttt[(spec, cname, rc)] = {"median": float(np.median(times)),
                                          "reached": int(np.isfinite(times).sum())}
    return {"acc": acc, "best": best, "ttt": ttt}


def throughput(tls: dict, specs: list[str], seeds: int) -> dict:
    """{(schedule, cluster, rc): mean batches per simulated second over seeds}."""
    return {(spec, cname, rc): float(np.mean([tls[(spec, cname, rc, s)].throughput for s in range(seeds)]))
            for spec in specs for cname in CLUSTERS for rc in RECOMPUTE}


# -- claims --------------------------------------------------------------------------
def verdict(ok: int, n: int) -> str:
    if n == 0:
        return "not tested"
    if ok == n:
        return "HOLDS"
    if ok == 0:
        return "DOES NOT HOLD"
    return f"PARTLY ({ok}/{n})"


def fmt_ratio(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.2f}"


def ratio(a: float, b: float) -> float:
    """b / a for times (speed-up of a over b; inf = never reached): NaN when neither reached."""
    if math.isinf(a) and math.isinf(b):
        return math.nan
    if math.isinf(a):
        return 0.0
    if math.isinf(b):
        return math.inf
    return b / a if a > 0 else math.nan


def claims(tp: dict, stats: dict, settings: dict, mem: dict) -> list[dict]:
    out = []
    rc_name = {1.0: "recompute charged (rc=1)", 0.0: "recompute overlapped (rc=0)"}

    def speedup(base: str, label: str):
        rows, ok, n, ok_rc = [], 0, 0, {rc: 0 for rc in RECOMPUTE}
        for rc in RECOMPUTE:
            for cname in CLUSTERS:
                r = tp[(DSP, cname, rc)] / tp[(base, cname, rc)]
                good = r >= SIGNIFICANT
                ok += good
                ok_rc[rc] += good
                n += 1
                rows.append(f"{cname}, {rc_name[rc]}: DSP {tp[(DSP, cname, rc)]:.3f} vs {label} "
                            f"{tp[(base, cname, rc)]:.3f} batches/s -> {r:.2f}x")
        return {"test": f"simulated throughput DSP(1,1,1,0) / {label} >= {SIGNIFICANT} per (cluster, recompute cost)",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows,
                "note": "; ".join(f"{rc_name[rc]}: {ok_rc[rc]}/{len(CLUSTERS)} clusters" for rc in RECOMPUTE)}

    def end_to_end(base: str, label: str):
        rows, ok, n, ok_rc = [], 0, 0, {rc: 0 for rc in RECOMPUTE}
        for t, s in stats.items():
            for rc in RECOMPUTE:
                parts = []
                for cname in CLUSTERS:
                    a, b = s["ttt"][(DSP, cname, rc)]["median"], s["ttt"][(base, cname, rc)]["median"]
                    r = ratio(a, b)
                    good = math.isfinite(r) and r >= SIGNIFICANT or (math.isinf(r) and r > 0)
                    ok += good
                    ok_rc[rc] += good
                    n += 1
                    parts.append(f"{cname} " + ("DSP never reached it" if r == 0.0 else
                                                f"{label} never reached it" if math.isinf(r) else f"{fmt_ratio(r)}x"))
                rows.append(f"{t}, {rc_name[rc]}: DSP (lr {s['best'][DSP]:g}) vs {label} (lr {s['best'][base]:g}): "
                            + ", ".join(parts))
        return {"test": f"median simulated time to the target accuracy, {label} / DSP(1,1,1,0) >= {SIGNIFICANT}, each "
                        "at its best lr of the grid, per (task, cluster, recompute cost)",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows,
                "note": "; ".join(f"{rc_name[rc]}: {ok_rc[rc]}/{n // len(RECOMPUTE)}" for rc in RECOMPUTE)
                        + "; this combines throughput with how many batches each schedule needs at the lr it "
                          "tolerates"}

    c = speedup(GPIPE, "GPipe(4)")
    g8 = [f"{cname} {tp[(DSP, cname, rc)] / tp[('gpipe:8', cname, rc)]:.2f}x" for rc in RECOMPUTE for cname in CLUSTERS]
    c["details"].append("against GPipe with 8 micro-batches (rc=1 then rc=0): " + ", ".join(g8))
    out.append({"claim": "Significant speed-up over GPipe (throughput)", **c})
    out.append({"claim": "Significant speed-up over GPipe (time to accuracy)", **end_to_end(GPIPE, "GPipe(4)")})
    c = speedup(DDG, "DDG")
    c["details"].append("our DDG has no iteration barrier (stages wait only for data), which favours its "
                        "throughput; its forward still crosses all stages within a tick; with rc=0 DSP and DDG "
                        "both run every stage back to back at constant speeds")
    out.append({"claim": "Significant speed-up over DDG (throughput)", **c})
    out.append({"claim": "Significant speed-up over DDG (time to accuracy)", **end_to_end(DDG, "DDG")})

    # no accuracy loss: DSP vs backprop (and GPipe) after the same batches
    rows, ok, n = [], 0, 0
    for t, s in stats.items():
        acc, best = s["acc"], s["best"]
        for ref in (BACKPROP, GPIPE):
            for mode in ("common", "best"):
                lr_d, lr_r = (COMMON_LR, COMMON_LR) if mode == "common" else (best[DSP], best[ref])
                if (DSP, lr_d) not in acc or (ref, lr_r) not in acc:
                    continue
                d, r = acc[(DSP, lr_d)]["median"], acc[(ref, lr_r)]["median"]
                good = d >= r - ACC_TOL
                ok += good
                n += 1
                rows.append(f"{t}, {'equal lr ' + format(COMMON_LR, 'g') if mode == 'common' else 'each at its best lr'}: "
                            f"DSP {d:.3f} (lr {lr_d:g}) vs {ref} {r:.3f} (lr {lr_r:g}): {d - r:+.3f}")
        for lr in settings[t]["lrs"]:
            rows.append(f"{t}, lr {lr:g}: median final accuracy " + ", ".join(
                f"{spec} {acc[(spec, lr)]['median']:.3f}" + (f" ({acc[(spec, lr)]['diverged']} diverged)"
                                                             if acc[(spec, lr)]['diverged'] else "")
                for spec in SCHEDULES))
    out.append({"claim": "No accuracy loss (DSP vs backpropagation after the same number of batches)",
                "test": f"median final held-out accuracy of DSP(1,1,1,0) >= reference - {ACC_TOL} "
                        f"(reference: backprop and GPipe(4); at lr {COMMON_LR:g} and at each schedule's best lr)",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows})

    # robustness to stragglers: the fraction of its constant-speed throughput each schedule keeps
    rows, ok, n = [], 0, 0
    for rc in RECOMPUTE:
        for cname in ("stragglers", "slow stage"):
            kept = {spec: tp[(spec, cname, rc)] / tp[(spec, "constant", rc)] for spec in (DSP, GPIPE, DDG)}
            good = kept[DSP] > max(kept[GPIPE], kept[DDG])
            if cname == "stragglers":
                ok += good
                n += 1
            rows.append(f"{cname}, {rc_name[rc]}: throughput kept vs constant speeds: DSP {kept[DSP]:.2f}, "
                        f"GPipe(4) {kept[GPIPE]:.2f}, DDG {kept[DDG]:.2f}"
                        + ("" if cname == "stragglers" else " (not part of the test)"))
        d2 = tp[("dsp:2,2,2,0", "stragglers", rc)] / tp[("dsp:2,2,2,0", "constant", rc)]
        rows.append(f"stragglers, {rc_name[rc]}: DSP(2,2,2,0) keeps {d2:.2f} (larger delays = more slack)")
    out.append({"claim": "Stronger robustness to random stragglers",
                "test": "fraction of its constant-speed throughput DSP(1,1,1,0) keeps under random stragglers "
                        f"(prob {STRAGGLERS['prob']}, {STRAGGLERS['slowdown']:g}x, {STRAGGLERS['duration']:g} s) "
                        "> that of GPipe(4) and of DDG, per recompute cost",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows})

    # memory: m_k stored inputs per stage, not whole graphs
    rows, ok, n = [], 0, 0
    m = mem[DSP]
    for k in range(K):
        if m["lags"][k] == 0:
            continue
        d, g = m["stored_bytes"][k], mem[DDG]["stored_bytes"][k]
        per_input = d / m["lags"][k]
        rows.append(f"stage {k}: DSP stores {m['lags'][k]} inputs = {d / 1024:.1f} KiB ({per_input / 1024:.1f} KiB "
                    f"each); DDG (lag {mem[DDG]['lags'][k]}) stores {g / 1024:.1f} KiB of graphs; "
                    f"DSP+stash {mem['dsp:1,1,1,0+stash']['stored_bytes'][k] / 1024:.1f} KiB")
    per_item_d = [mem[DSP]["stored_bytes"][k] / mem[DSP]["lags"][k] for k in range(K) if mem[DSP]["lags"][k]]
    per_item_g = [mem[DDG]["stored_bytes"][k] / mem[DDG]["lags"][k] for k in range(K) if mem[DDG]["lags"][k]]
    ok = int(max(per_item_d) < min(per_item_g))
    n = 1
    out.append({"claim": "Memory: m_k stored inputs per block rather than whole activation graphs",
                "test": "bytes stored per in-flight batch, DSP (largest stage) < DDG (smallest stage) "
                        f"on {list(stats)[0]}, batch {BATCH_SIZE}",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows,
                "note": "in total DSP stores more here, because its lags m_k (6,4,2) exceed DDG's (3,2,1)"})

    # invariants of PAPERS.md
    rows, ok, n = [], 0, 0
    for spec in (DSP, "dsp:2,2,2,0"):
        v = mem[spec]
        good = v["gaps"] == v["lags"] and v["queue_max"] == v["lags"]
        ok += good
        n += 1
        rows.append(f"{spec}: m_k {v['lags']}, forward/backward gap {v['gaps']}, max queue {v['queue_max']}")
    z, b = mem["dsp:0,0,0,0"], mem[BACKPROP]
    same = (np.array_equal(z["fwd"], b["fwd"]) and np.array_equal(z["bwd"], b["bwd"]) and z["lags"] == b["lags"]
            and z["backward"] == b["backward"])
    ok += same
    n += 1
    rows.append(f"dsp:0,0,0,0 has the tick tables of backprop: {same}")
    out.append({"claim": "(PAPERS.md invariants) stage k's forward/backward gap = m_k, its queue holds m_k "
                         "inputs; all s_k = 0 is backpropagation",
                "test": "from the plans' tick tables", "verdict": verdict(ok, n), "ok": ok, "n": n,
                "details": rows})

    rows = []
    for t, s in stats.items():
        stable = {}
        for spec in SCHEDULES:
            best_acc = max(s["acc"][(spec, lr)]["median"] for lr in settings[t]["lrs"])
            good = [lr for lr in settings[t]["lrs"]
                    if s["acc"][(spec, lr)]["diverged"] == 0 and s["acc"][(spec, lr)]["median"] >= best_acc - 0.02]
            stable[spec] = max(good) if good else math.nan
        rows.append(f"{t}: largest lr of the grid within 0.02 of the schedule's best accuracy, no divergence: "
                    + ", ".join(f"{spec} {v:g}" for spec, v in stable.items()))
    out.append({"claim": "Theory: convergence to critical points with a step size bounded by the largest staleness",
                "test": "a proof, not a measurement; shown: the largest well-behaved lr per schedule",
                "verdict": "not tested", "ok": 0, "n": 0, "details": rows})
    return out


# -- reporting -------------------------------------------------------------------------
def throughput_table(tp: dict, specs: list[str], md: bool) -> str:
    cols = [(c, rc) for rc in RECOMPUTE for c in CLUSTERS]
    heads = [f"{c} rc={rc:g}" for c, rc in cols]
    if md:
        lines = ["| schedule | " + " | ".join(heads) + " |", "|---" * (len(cols) + 1) + "|"]
        for spec in specs:
            lines.append(f"| {spec} | " + " | ".join(f"{tp[(spec, c, rc)]:.3f}" for c, rc in cols) + " |")
        return "\n".join(lines) + "\n"
    lines = [f"{'schedule':<20}" + "".join(f"{h:>24}" for h in heads)]
    for spec in specs:
        lines.append(f"{spec:<20}" + "".join(f"{tp[(spec, c, rc)]:>24.3f}" for c, rc in cols))
    return "\n".join(lines)


def staleness_label(spec: str, lags) -> str:
    """Per-stage staleness of the gradients, in batches (GPipe's lags are ticks within a flush)."""
    return "0 (sync)" if spec.startswith("gpipe") else ",".join(map(str, lags))


def accuracy_table(s: dict, cfg: dict, md: bool) -> str:
    lrs = cfg["lrs"]

    def cell(spec, lr):
        a = s["acc"][(spec, lr)]
        mark = "*" if lr == s["best"][spec] else ""
        div = f" ({a['diverged']} div.)" if a["diverged"] else ""
        return f"{a['median']:.3f}{mark} [{a['min']:.3f}–{a['max']:.3f}]{div}"

    if md:
        lines = ["| schedule | m_k | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |", "|---" * (len(lrs) + 2) + "|"]
        for spec in SCHEDULES:
            lines.append(f"| {spec} | {staleness_label(spec, s['lags'][spec])} | "
                         + " | ".join(cell(spec, lr) for lr in lrs) + " |")
        return "\n".join(lines) + "\n"
    lines = [f"{'schedule':<20}{'m_k':<10}" + "".join(f"{'lr ' + format(lr, 'g'):>30}" for lr in lrs)]
    for spec in SCHEDULES:
        lines.append(f"{spec:<20}{staleness_label(spec, s['lags'][spec]):<10}"
                     + "".join(f"{cell(spec, lr):>30}" for lr in lrs))
    return "\n".join(lines)


def ttt_table(s: dict, cfg: dict, md: bool) -> str:
    cols = [(c, rc) for rc in RECOMPUTE for c in CLUSTERS]

    def cell(spec, c, rc):
        v = s["ttt"][(spec, c, rc)]
        t = "never" if math.isinf(v["median"]) else f"{v['median']:.0f}"
        return f"{t} ({v['reached']}/{cfg['seeds']})"

    heads = [f"{c} rc={rc:g}" for c, rc in cols]
    if md:
        lines = ["| schedule | best lr | " + " | ".join(heads) + " |", "|---" * (len(cols) + 2) + "|"]
        for spec in SCHEDULES:
            lines.append(f"| {spec} | {s['best'][spec]:g} | " + " | ".join(cell(spec, c, rc) for c, rc in cols) + " |")
        return "\n".join(lines) + "\n"
    lines = [f"{'schedule':<20}{'best lr':>8}" + "".join(f"{h:>22}" for h in heads)]
    for spec in SCHEDULES:
        lines.append(f"{spec:<20}{s['best'][spec]:>8g}" + "".join(f"{cell(spec, c, rc):>22}" for c, rc in cols))
    return "\n".join(lines)


def _curve_band(runs: dict, spec: str, lr: float, seeds: int, x_of=None):
    """(x, median, min, max) of accuracy over seeds on the common evaluation points."""
    ups = runs[(spec, lr, 0)]["update"]
    ys = np.full((seeds, len(ups)), np.nan)
    for s in range(seeds):
        a = runs[(spec, lr, s)]["accuracy"]
        ys[s, : len(a)] = a if runs[(spec, lr, s)]["status"] == "complete" else np.where(np.isfinite(a), a, 0.0)
    ys = ys[:, : min(len(runs[(spec, lr, s)]["accuracy"]) for s in range(seeds))]
    x = ups[: ys.shape[1]] if x_of is None else x_of(ups[: ys.shape[1]])
    return x, np.nanmedian(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)


def plot_task(task: str, cfg: dict, runs: dict, s: dict, tls: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from staleness import plots

    colors = {spec: f"C{i}" for i, spec in enumerate(SCHEDULES)}
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), layout="constrained")
    for ax, mode in zip(axes[0, :2], ("common", "best")):
        for spec in SCHEDULES:
            lr = COMMON_LR if mode == "common" else s["best"][spec]
            if (spec, lr, 0) not in runs:
                continue
            x, mid, lo, hi = _curve_band(runs, spec, lr, cfg["seeds"])
            ax.fill_between(x, lo, hi, color=colors[spec], alpha=0.15, linewidth=0)
            ax.plot(x, mid, color=colors[spec], label=f"{spec} (lr {lr:g})")
        ax.set_xlabel("batches")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"lr {COMMON_LR:g} for all" if mode == "common" else "each at its best lr of the grid",
                     fontsize="medium")
        ax.legend(fontsize="x-small")
    ax = axes[0, 2]
    for i, spec in enumerate(SCHEDULES):
        lrs = cfg["lrs"]
        med = [s["acc"][(spec, lr)]["median"] for lr in lrs]
        lo = [s["acc"][(spec, lr)]["min"] for lr in lrs]
        hi = [s["acc"][(spec, lr)]["max"] for lr in lrs]
        x = np.array(lrs) * (1 + 0.04 * (i - len(SCHEDULES) / 2))
        ax.errorbar(x, med, yerr=[np.subtract(med, lo), np.subtract(hi, med)], color=colors[spec], marker="o",
                    markersize=4, capsize=2, label=spec)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (momentum 0.9)")
    ax.set_ylabel(f"accuracy after {cfg['batches']} batches")
    ax.set_title("final accuracy vs lr (median, min–max; diverged = 0)", fontsize="medium")
    ax.legend(fontsize="x-small")
    for ax, cname in zip(axes[1], CLUSTERS):
        for spec in SCHEDULES:
            lr = s["best"][spec]
            tl = tls[(spec, cname, 1.0, 0)]
            done = tl.batch_done_time()
            x, mid, lo, hi = _curve_band(runs, spec, lr, cfg["seeds"],
                                         x_of=lambda u, done=done: np.where(u > 0, done[np.maximum(u, 1) - 1], 0.0))
            ax.fill_between(x, lo, hi, color=colors[spec], alpha=0.15, linewidth=0)
            ax.plot(x, mid, color=colors[spec], label=spec)
        ax.axhline(cfg["target"], color="0.3", linestyle=":", linewidth=1.0)
        ax.set_xlim(0, tls[(DSP, cname, 1.0, 0)].end_time)  # backprop's 4x longer run would squeeze the rest
        ax.set_xlabel("simulated time (s; seed 0's timeline, recompute charged)")
        ax.set_ylabel("held-out accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"{cname}: {CLUSTERS[cname].describe()}", fontsize="medium")
        ax.legend(fontsize="x-small")
    fig.suptitle(f"{task}, K = {K} stages, batch {BATCH_SIZE}: accuracy vs batches and vs simulated time "
                 f"(median and min–max over {cfg['seeds']} seeds; dotted: target {cfg['target']:g})")
    plots.save(fig, path)
    plt.close(fig)
    return path


def plot_throughput(tp: dict, specs: list[str], n: int, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from staleness import plots

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), layout="constrained", sharey=True)
    width = 0.8 / len(CLUSTERS)
    for ax, rc in zip(axes, RECOMPUTE):
        for j, cname in enumerate(CLUSTERS):
            vals = [tp[(spec, cname, rc)] for spec in specs]
            ax.bar(np.arange(len(specs)) - 0.4 + width * (j + 0.5), vals, width, label=cname)
        ax.set_xticks(np.arange(len(specs)), specs, rotation=25, fontsize="small")
        ax.set_title(f"recompute_cost = {rc:g} ({'charged as a full forward' if rc else 'fully overlapped'})",
                     fontsize="medium")
        ax.set_ylabel("batches per simulated second")
        ax.legend(fontsize="small")
    fig.suptitle(f"Simulated throughput over {n} batches, K = {K} stages at 1 s per batch per stage")
    plots.save(fig, path)
    plt.close(fig)
    return path


def write_markdown(path: Path, *, command: str, wall: float, cpu: float, vers: dict, settings: dict, tp: dict,
                   tp_specs: list[str], tp_batches: int, stats: dict, verdicts: list[dict], mem: dict,
                   pngs: list[Path], quick: bool) -> None:
    lines = [f"# Reproducing DSP (Xu, Huo, Huang, CVPR 2020){' — QUICK smoke run' if quick else ''}", "",
             "Produced by `benchmarks/reproduce_dsp.py`; every number below is computed by the script "
             "from this run's results.", "",
             f"- command: `{command}`",
             f"- wall time: {wall:.0f} s ({wall / 60:.1f} min); process CPU time {cpu:.0f} s",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
             "", "## Setup", "",
             f"- model: residual MLP (`staleness.pipeline.tasks`, width 64), K = {K} stages: stage 0 = input "
             "layer + residual block, stages 1–2 = one residual block each, stage 3 = residual block + classifier; "
             f"batch {BATCH_SIZE}; momentum SGD 0.9 per stage",
             "- schedules (per-stage staleness m_k in batches): "
             + ", ".join(f"{spec} (m = {staleness_label(spec, mem[spec]['lags'])})" for spec in SCHEDULES)
             + "; GPipe(8) in the throughput table only (its numbers equal GPipe(4)'s: the same synchronous "
             "gradient)",
             "- clusters (stage k = worker k, 1 s per forward + backward of a whole batch; a backward costs 2 "
             "forwards): " + "; ".join(f"{k}: {CLUSTER_TEXT[k]} (`{c.describe()}`)" for k, c in CLUSTERS.items()),
             "- recompute_cost: DSP and GPipe recompute the forward of a stale backward from the stored input; "
             "rc = 1 charges it as a full forward (the library's default), rc = 0 assumes it fully overlaps the "
             "forward (the paper's claim). DDG, backprop and weight stashing never recompute.",
             "- a run's numbers do not depend on the cluster (the tick order is fixed), so each "
             "(schedule, lr, seed) is trained once and its time axis comes from `simulate_timing` per cluster; "
             "seed s uses cluster seed s (random stragglers differ per seed)",
             "- throughput: batches / simulated time of the whole run (fill and drain included), mean over seeds; "
             "time to target: first evaluation at or above the target accuracy, median over seeds, at each "
             "schedule's best lr (highest median final accuracy of the grid)",
             "- diverged runs (a non-finite loss) count as accuracy 0 in medians and are counted",
             ""]
    for t, cfg in settings.items():
        lines.append(f"- {t}: {cfg['batches']} batches per run, lrs {cfg['lrs']}, seeds {list(range(cfg['seeds']))}, "
                     f"target accuracy {cfg['target']:g}, evaluation every {cfg['eval_every']} batches")
    lines += ["", "## Verdicts", "", "| claim (PAPERS.md section 3) | verdict here |", "|---|---|"]
    lines += [f"| {v['claim']} | {v['verdict']} |" for v in verdicts]
    lines += ["", "Caveats that apply to every verdict: a residual MLP on digits / MNIST-1D with K = 4 stages on a "
              "simulated time axis, not the paper's ResNets on CIFAR / ImageNet on GPUs; accuracy is compared after a "
              "fixed number of batches, not at convergence; throughput comes from the cost model of "
              "`staleness.pipeline.timing` (no per-micro-batch overhead, so GPipe gains from more micro-batches; "
              "no iteration barrier for DDG, which favours it; DSP's recomputation charged by `recompute_cost`).",
              "", "## Claims", ""]
    for v in verdicts:
        lines.append(f"### {v['claim']}")
        lines.append(f"**{v['verdict']}** — test: {v['test']}.")
        if v.get("note"):
            lines.append(f"({v['note']}.)")
        lines.append("")
        for d in v["details"]:
            lines.append(f"- {d}")
        lines.append("")
    lines += ["## Tables", "", f"### Simulated throughput (batches per simulated second, {tp_batches} batches)", "",
              throughput_table(tp, tp_specs, md=True)]
    for t, cfg in settings.items():
        lines += [f"### {t}: held-out accuracy after {cfg['batches']} batches", "",
                  "Median [min–max] over seeds; * marks the schedule's best lr.", "",
                  accuracy_table(stats[t], cfg, md=True),
                  f"### {t}: simulated seconds to accuracy {cfg['target']:g} (median; seeds that reached it)", "",
                  ttt_table(stats[t], cfg, md=True)]
    lines += ["### Memory: bytes each stage stores between a forward and its backward", "",
              "| schedule | forward→backward lag per stage (ticks) | KiB per stage |", "|---|---|---|"]
    for spec in SCHEDULES:
        lines.append(f"| {spec} | {','.join(map(str, mem[spec]['lags']))} (ticks) | "
                     + ", ".join(f"{b / 1024:.1f}" for b in mem[spec]["stored_bytes"]) + " |")
    lines += ["", "## Plots", ""]
    for p in pngs:
        lines.append(f"![{p.stem}]({p.name})")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (< 1 min): digits, 300 batches, 2 lrs, 3 seeds")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per task (default 5; quick 3)")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of " + ",".join(TASKS))
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/results; quick: runs/reproduce_dsp_quick)")
    args = ap.parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", "benchmarks/reproduce_dsp.py", *argv])

    tasks = list(QUICK) if args.quick else list(TASKS)
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",")]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        ap.error(f"--tasks: unknown {bad}; valid: {', '.join(TASKS)}")
    if args.seeds is not None and args.seeds < 1:
        ap.error(f"--seeds {args.seeds} must be >= 1")
    settings = {t: {**TASKS[t], **(QUICK.get(t, {}) if args.quick else {})} for t in tasks}
    for cfg in settings.values():
        if args.seeds is not None:
            cfg["seeds"] = args.seeds
        if COMMON_LR not in cfg["lrs"]:
            cfg["lrs"] = sorted({*cfg["lrs"], COMMON_LR})
    out = Path(args.out) if args.out else (ROOT / "runs" / f"{NAME}_quick" if args.quick else ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)

    from tqdm.auto import tqdm

    tp_specs = SCHEDULES + TIMING_ONLY
    runs, tls, stats = {}, {}, {}
    total = sum(len(SCHEDULES) * len(c["lrs"]) * c["seeds"] for c in settings.values())
    with tqdm(total=total, desc=NAME, unit="run") as bar:
        for t, cfg in settings.items():
            runs[t] = train_all(t, cfg, bar)
            tls[t] = timelines(t, cfg, tp_specs)
            stats[t] = task_stats(t, cfg, runs[t], tls[t])
            stats[t]["lags"] = {spec: runs[t][(spec, cfg["lrs"][0], 0)]["lags"] for spec in SCHEDULES}
    t_tp = tasks[0]
    tp = throughput(tls[t_tp], tp_specs, settings[t_tp]["seeds"])
    mem = memory_and_invariants(t_tp)
    verdicts = claims(tp, stats, settings, mem)

    print(f"Simulated throughput (batches per simulated second, {settings[t_tp]['batches']} batches, "
          f"mean over {settings[t_tp]['seeds']} seeds):")
    print(throughput_table(tp, tp_specs, md=False))
    for t, cfg in settings.items():
        print(f"\n{t}: held-out accuracy after {cfg['batches']} batches, median [min–max] over {cfg['seeds']} "
              "seeds (* = best lr)")
        print(accuracy_table(stats[t], cfg, md=False))
        print(f"\n{t}: simulated seconds to accuracy {cfg['target']:g} at each schedule's best lr "
              "(median; seeds that reached it)")
        print(ttt_table(stats[t], cfg, md=False))
    print("\nClaims of the DSP paper (PAPERS.md section 3):")
    for v in verdicts:
        print(f"- {v['claim']}: {v['verdict']}  [{v['test']}]")
        if v.get("note"):
            print(f"    ({v['note']})")
        for d in v["details"]:
            print(f"    {d}")

    pngs = [plot_task(t, settings[t], runs[t], stats[t], tls[t], out / f"{NAME}_{t}.png") for t in tasks]
    pngs.append(plot_throughput(tp, tp_specs, settings[t_tp]["batches"], out / f"{NAME}_throughput.png"))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    write_markdown(out / f"{NAME}.md", command=command, wall=wall, cpu=cpu, vers=versions(), settings=settings,
                   tp=tp, tp_specs=tp_specs, tp_batches=settings[t_tp]["batches"], stats=stats, verdicts=verdicts,
                   mem=mem, pngs=pngs, quick=args.quick)
    print(f"wrote {out / f'{NAME}.md'} and {', '.join(p.name for p in pngs)}; wall {wall:.0f} s, CPU {cpu:.0f} s")

    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x

    summary = {
        "benchmark": NAME, "quick": args.quick, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "seeds": {t: c["seeds"] for t, c in settings.items()},
        "verdicts": {v["claim"]: v["verdict"] for v in verdicts},
        "throughput": {f"{spec}|{c}|rc{rc:g}": round(v, 4) for (spec, c, rc), v in tp.items()},
        "accuracy": {f"{t}|{spec}|{lr:g}": clean(a["median"]) for t, s in stats.items()
                     for (spec, lr), a in s["acc"].items()},
        "best_lr": {f"{t}|{spec}": lr for t, s in stats.items() for spec, lr in s["best"].items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
