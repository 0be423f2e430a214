"""Reproduce the DSSP paper's findings (Zhao et al., ICDCS 2019) in the simulator.

Scenarios: three clusters built from the GTX 1060 / GTX 1080 Ti presets
(4+4 and 2+6 heterogeneous, 8 x 1080 Ti homogeneous; a 1080 Ti takes 1 s per
iteration, a 1060 2.6 s), each (a) at constant speeds, (b) with lognormal
jitter and (c) with random transient stragglers. Constant speed ratios alone
make every bounded-staleness policy settle at the slow workers' pace, which is
why (b) and (c) are there.

Policies: BSP, ASP, SSP(3), SSP(15), DSSP(3, 12) with the cap and without it.
Tasks: digits-cnn and mnist1d-mlp (plus cifar10-resnet20 with --cifar-dir).
Every policy of a scenario gets the same simulated-time budget, learning rate
and seeds. Seeds of the asynchronous policies (one gradient per update) are
replayed together in one `st.sweep`, BSP's (eight gradients per update) in
another, so padding wastes little.

Prints one table per task (simulated time to a target accuracy, final accuracy,
staleness, waiting) and a verdict, computed from these results, for each claim
of the paper listed in PAPERS.md; writes `<out>/reproduce_dssp.md` and
`<out>/reproduce_dssp_<task>.png`; ends with one JSON line.

    python benchmarks/reproduce_dssp.py            # full: 5 seeds, about 6 min on 2 cores
    python benchmarks/reproduce_dssp.py --quick    # smoke run (< 1 min), writes runs/reproduce_dssp_quick/
    python benchmarks/reproduce_dssp.py --cifar-dir ~/data/cifar-10-batches-py   # adds CIFAR-10 (slow on CPU)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np

import staleness as st
from _report import versions

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_dssp"

POLICIES = ["bsp", "asp", "ssp:3", "ssp:15", "dssp:3:12", "dssp:3:12:nocap"]
ASYNC = POLICIES[1:]  # one gradient per update: replayed in one sweep
DSSP, DSSP_NOCAP = "dssp:3:12", "dssp:3:12:nocap"
BOUNDED = ["ssp:3", "ssp:15", DSSP]

# Scenario modifiers (simulated seconds; a GTX 1080 Ti iteration takes 1 s).
JITTER_SIGMA = 0.3
STRAGGLERS = dict(prob=0.02, slowdown=4.0, duration=10.0)  # per-iteration episode probability, x, s
CLUSTERS = {
    "4+4": ["gtx1080ti"] * 4 + ["gtx1060"] * 4,
    "2+6": ["gtx1080ti"] * 2 + ["gtx1060"] * 6,
    "8x1080ti": ["gtx1080ti"] * 8,
}
VARIANTS = ("constant", "jitter", "stragglers")
HETEROGENEOUS = ("4+4", "2+6")

# Per task: minibatch μ per worker, server optimizer and learning rate, simulated
# seconds per run, target accuracy of the time-to-target column, evaluation spacing
# (updates). Chosen once, not tuned per policy: the learning rate trains every
# policy stably, the target is reached by ASP/SSP/DSSP well inside the budget, and
# the budgets keep the full run near 10 minutes on 2 CPU cores.
TASKS = {
    "digits-cnn": dict(batch_size=8, lr=0.1, optimizer="sgd", max_time=180.0, target=0.90,
                       eval_async=50, eval_bsp=6),
    "mnist1d-mlp": dict(batch_size=32, lr=0.2, optimizer="sgd", max_time=400.0, target=0.55,
                        eval_async=50, eval_bsp=5),
    "cifar10-resnet20": dict(batch_size=32, lr=0.05, optimizer="momentum:0.9", max_time=1800.0, target=0.50,
                             eval_async=200, eval_bsp=25),
}
QUICK = {"mnist1d-mlp": dict(max_time=150.0, target=0.40, eval_async=50, eval_bsp=5)}

# Thresholds of the verdicts (stated in the report).
MUCH_EARLIER = 0.75   # "much earlier/faster": median time-to-target ratio at most this
CLOSE = 1.25          # "close to ASP in speed": DSSP / ASP time ratio at most this
SETTLE_TOL = 0.10     # "settles at the slow workers' pace": steady gradient rate within 10 % of BSP's


def cluster_for(name: str, variant: str) -> st.cluster.Cluster:
    c = st.cluster.gpus(CLUSTERS[name])
    if variant == "jitter":
        c = c.jitter(JITTER_SIGMA)
    elif variant == "stragglers":
        c = c.stragglers(**STRAGGLERS)
    return c


# -- statistics of one (task, scenario, policy) cell -------------------------------
def steady_rate(sched, t_end: float) -> float:
    """Gradients pushed per simulated second over the second half of the run."""
    push = sched.columns["push_time"]
    ok = np.isfinite(push) & (push >= t_end / 2) & (push <= t_end)
    return float(ok.sum() / (t_end / 2))


def fluctuation(result) -> float:
    """Mean |change| of accuracy between consecutive evaluations over the last
    half of the run: how unsteady the accuracy curve is late in training."""
    acc = result.history["accuracy"].to_numpy()
    tail = acc[len(acc) // 2:]
    return float(np.mean(np.abs(np.diff(tail)))) if len(tail) > 1 else math.nan


def max_clock_gap(sched) -> int:
    """Largest (fastest - slowest) clock, in pushes, over the run: what SSP's s and DSSP's
    s_U bound (a worker may start while at most s ahead, so a push can make it s + 1)."""
    c = sched.columns
    order = np.argsort(c["push_time"], kind="stable")
    order = order[np.isfinite(c["push_time"][order])]
    onehot = np.zeros((len(order), sched.num_workers), np.int32)
    onehot[np.arange(len(order)), c["worker"][order]] = 1
    clocks = np.cumsum(onehot, axis=0)
    return int((clocks.max(axis=1) - clocks.min(axis=1)).max(initial=0))


def schedule_key(sched) -> str:
    """A hash of which gradient was computed on which version and applied when: equal
    keys mean two policies produced the same schedule (e.g. nobody ever blocked)."""
    h = hashlib.sha256()
    for k in ("worker", "iteration", "pull_version", "apply_version"):
        h.update(np.ascontiguousarray(sched.columns[k]).tobytes())
    return h.hexdigest()[:16]


def cell(results, target: float, t_end: float) -> dict:
    times = np.array([r.time_to(target) for r in results])
    reached = np.isfinite(times)
    finals = np.array([r.final.get("accuracy", math.nan) for r in results])
    sums = [r.schedule.summary() for r in results]
    rstar = [x[2] for r in results for x in r.schedule.rstar]
    return {
        "seeds": len(results),
        "reached": int(reached.sum()),
        # median over seeds, a run that never reached the target counting as +inf
        "t_median": float(np.median(np.where(reached, times, np.inf))),
        "t_min": float(times[reached].min()) if reached.any() else math.nan,
        "t_max": float(times[reached].max()) if reached.any() else math.nan,
        "final_median": float(np.median(finals)),
        "final_min": float(finals.min()),
        "final_max": float(finals.max()),
        "final_std": float(finals.std()),
        "fluctuation": float(np.mean([fluctuation(r) for r in results])),
        "staleness_mean": float(np.mean([s["staleness_mean"] for s in sums])),
        "staleness_max": int(max(s["staleness_max"] for s in sums)),
        "wait_fraction": float(np.mean([s["wait_fraction_mean"] for s in sums])),
        "updates": int(np.median([s["updates"] for s in sums])),
        "grad_rate": float(np.mean([steady_rate(r.schedule, t_end) for r in results])),
        "rstar_mean": float(np.mean(rstar)) if rstar else math.nan,
        "clock_gap_max": int(max(max_clock_gap(r.schedule) for r in results)),
        "diverged": int(sum(r.status == "diverged" for r in results)),
        "sched_key": tuple(schedule_key(r.schedule) for r in results),
    }


# -- running -----------------------------------------------------------------------
def run_task(task_name: str, cfg: dict, scenarios, seeds, data_dir, bar) -> dict:
    """{(cluster, variant): {policy: [Result per seed]}}"""
    kw = {"data_dir": data_dir} if data_dir else {}
    task = st.tasks.get(task_name, batch_size=cfg["batch_size"], num_workers=8, **kw)
    out = {}
    for cname, variant in scenarios:
        cluster = cluster_for(cname, variant)
        bar.set_postfix_str(f"{task_name} {cname} {variant}")
        by_policy = {}
        for group, every in ((["bsp"], cfg["eval_bsp"]), (ASYNC, cfg["eval_async"])):
            results = st.sweep(task, group, cluster, seeds=seeds, lrs=[cfg["lr"]], optimizer=cfg["optimizer"],
                               max_time=cfg["max_time"], eval_every=every)
            for r in results:
                by_policy.setdefault(r.config["policy"], []).append(r)
        out[(cname, variant)] = by_policy
        bar.update(1)
    return out


# -- claims ------------------------------------------------------------------------
def ratio(a: float, b: float) -> float:
    """a / b for median times (inf = never reached): NaN when neither reached."""
    if math.isinf(a) and math.isinf(b):
        return math.nan
    if math.isinf(b):
        return 0.0
    return a / b


def fmt_ratio(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.2f}"


def verdict(ok: int, n: int) -> str:
    if n == 0:
        return "not tested"
    if ok == n:
        return "HOLDS"
    if ok == 0:
        return "DOES NOT HOLD"
    return f"PARTLY ({ok}/{n})"


def claims(cells: dict, tasks: list[str], settings: dict) -> list[dict]:
    """Each claim of PAPERS.md section 1 with its verdict and the numbers behind it."""
    out = []

    def scen(kind):
        return [(t, s) for t in tasks for s in cells[t] if (s[0] in HETEROGENEOUS) == (kind == "hetero")]

    hetero, homo = scen("hetero"), scen("homo")

    def name(t, s):
        return f"{t} {s[0]} {s[1]}"

    def versus(dssp: str, label: str, claim: str):
        """DSSP (`dssp` spec) earlier than BSP, SSP(3) and SSP(15) on the heterogeneous scenarios."""
        rows, strict, weak = [], 0, 0
        per_base = {p: [] for p in ("bsp", "ssp:3", "ssp:15")}
        for t, s in hetero:
            c = cells[t][s]
            rs = {p: ratio(c[dssp]["t_median"], c[p]["t_median"]) for p in per_base}
            for p, v in rs.items():
                per_base[p].append(v)
            strict += all(math.isfinite(v) and v <= MUCH_EARLIER for v in rs.values())
            weak += all(math.isfinite(v) and v < 1 for v in rs.values())
            rows.append(f"{name(t, s)}: {label}/BSP {fmt_ratio(rs['bsp'])}, {label}/SSP(3) {fmt_ratio(rs['ssp:3'])}, "
                        f"{label}/SSP(15) {fmt_ratio(rs['ssp:15'])}")
        for p, vs in per_base.items():
            f = [v for v in vs if math.isfinite(v)]
            rows.append(f"overall vs {p}: earlier (ratio < 1) in {sum(v < 1 for v in f)}/{len(vs)}, much earlier "
                        f"(<= {MUCH_EARLIER}) in {sum(v <= MUCH_EARLIER for v in f)}/{len(vs)}, median ratio "
                        f"{fmt_ratio(float(np.median(f)) if f else math.nan)} (0 = the baseline never reached the target)")
        return {"claim": claim,
                "test": f"median time-to-target ratio {label} / X <= {MUCH_EARLIER} for every X in BSP, SSP(3), SSP(15), "
                        "per scenario",
                "verdict": verdict(strict, len(hetero)), "ok": strict, "n": len(hetero), "details": rows,
                "note": f"weaker reading (earlier, ratio < 1, than all three): {weak}/{len(hetero)} scenarios"}

    # 1. heterogeneous: DSSP reaches the target much earlier than SSP and BSP (cap on, then off)
    out.append(versus(DSSP, "DSSP", "Heterogeneous cluster: DSSP reaches the target accuracy much earlier than SSP and BSP"))
    out.append(versus(DSSP_NOCAP, "nocap", "(same claim, DSSP without the cap)"))

    # 2. DSSP close to ASP in speed
    rows, ok, ok_nocap = [], 0, 0
    for t, s in hetero:
        c = cells[t][s]
        r_cap = ratio(c[DSSP]["t_median"], c["asp"]["t_median"])
        r_nocap = ratio(c[DSSP_NOCAP]["t_median"], c["asp"]["t_median"])
        ok += math.isfinite(r_cap) and r_cap <= CLOSE
        ok_nocap += math.isfinite(r_nocap) and r_nocap <= CLOSE
        rows.append(f"{name(t, s)}: DSSP/ASP {fmt_ratio(r_cap)} (nocap/ASP {fmt_ratio(r_nocap)})")
    out.append({"claim": "Heterogeneous cluster: DSSP is close to ASP in speed",
                "test": f"median time-to-target ratio DSSP(3,12, cap) / ASP <= {CLOSE}",
                "verdict": verdict(ok, len(hetero)), "ok": ok, "n": len(hetero), "details": rows,
                "note": f"without the cap: {ok_nocap}/{len(hetero)} scenarios"})

    # 3. ASP converges to lower accuracy
    rows, ok = [], 0
    for t, s in hetero:
        c = cells[t][s]
        d = c[DSSP]["final_median"] - c["asp"]["final_median"]
        ok += d > 0
        rows.append(f"{name(t, s)}: final accuracy ASP {c['asp']['final_median']:.3f} vs DSSP "
                    f"{c[DSSP]['final_median']:.3f} (DSSP − ASP = {d:+.3f}; SSP(3) {c['ssp:3']['final_median']:.3f}, "
                    f"SSP(15) {c['ssp:15']['final_median']:.3f})")
    out.append({"claim": "Heterogeneous cluster: ASP converges to a lower accuracy (than DSSP)",
                "test": "median final accuracy (same simulated time) of ASP < that of DSSP(3,12, cap)",
                "verdict": verdict(ok, len(hetero)), "ok": ok, "n": len(hetero), "details": rows})

    # 4. the reported pair: 0.68 in 3046 s (DSSP) vs 7256 s (SSP s=15): ratio 0.42
    rows, ok, vals = [], 0, []
    for t, s in hetero:
        c = cells[t][s]
        r = ratio(c[DSSP]["t_median"], c["ssp:15"]["t_median"])
        vals.append(r)
        ok += math.isfinite(r) and r <= 0.6
        rows.append(f"{name(t, s)}: DSSP/SSP(15) time to {settings[t]['target']:g} = {fmt_ratio(r)}")
    out.append({"claim": "Reported pair: accuracy 0.68 in 3046 s with DSSP vs 7256 s with SSP(15) (ratio 0.42)",
                "test": "our DSSP/SSP(15) median time-to-target ratio <= 0.6 (the paper's 0.42, with slack)",
                "verdict": verdict(ok, len(hetero)), "ok": ok, "n": len(hetero), "details": rows})

    # 5. homogeneous: more stable and slightly better than SSP and ASP, much faster than BSP.
    # Where DSSP's schedules equal a baseline's (no worker ever blocks), there is nothing to compare.
    others = ("asp", "ssp:3", "ssp:15")
    stab, better, identical, fast, rows_fast = [0, 0], [0, 0], [], 0, []
    rows = []
    for t, s in homo:
        c = cells[t][s]
        parts = []
        for p in others:
            if c[DSSP]["sched_key"] == c[p]["sched_key"]:
                identical.append(f"{name(t, s)} vs {p}")
                continue
            st_ok = c[DSSP]["fluctuation"] <= c[p]["fluctuation"]
            be_ok = c[DSSP]["final_median"] >= c[p]["final_median"]
            stab[0] += st_ok
            stab[1] += 1
            better[0] += be_ok
            better[1] += 1
            parts.append(f"vs {p}: fluctuation {c[DSSP]['fluctuation']:.4f} vs {c[p]['fluctuation']:.4f}, final "
                         f"{c[DSSP]['final_median']:.3f} vs {c[p]['final_median']:.3f}")
        rows.append(f"{name(t, s)}: " + ("; ".join(parts) if parts else "DSSP's schedules equal every baseline's"))
        rb = ratio(c[DSSP]["t_median"], c["bsp"]["t_median"])
        fast += math.isfinite(rb) and rb <= MUCH_EARLIER
        rows_fast.append(f"{name(t, s)}: DSSP/BSP time to {settings[t]['target']:g} = {fmt_ratio(rb)}")
    note = (f"excluded, identical schedules (no worker ever blocks, so the policies coincide): {', '.join(identical)}"
            if identical else "")
    out.append({"claim": "Homogeneous cluster: DSSP is more stable than SSP and ASP",
                "test": "mean |Δ accuracy| between consecutive evaluations over the last half of the run, DSSP <= X, "
                        "per (scenario, X in ASP, SSP(3), SSP(15)) with different schedules",
                "verdict": verdict(*stab), "ok": stab[0], "n": stab[1], "details": rows, "note": note})
    out.append({"claim": "Homogeneous cluster: DSSP is slightly better than SSP and ASP",
                "test": "median final accuracy DSSP >= X, per (scenario, X) pair as above",
                "verdict": verdict(*better), "ok": better[0], "n": better[1], "details": [], "note": note})
    out.append({"claim": "Homogeneous cluster: DSSP is much faster than BSP",
                "test": f"median time-to-target ratio DSSP / BSP <= {MUCH_EARLIER}",
                "verdict": verdict(fast, len(homo)), "ok": fast, "n": len(homo), "details": rows_fast})

    # 6. PAPERS.md's note: constant ratios make bounded policies run at the slow pace
    rows, ok, n = [], 0, 0
    for t in tasks:
        for s in cells[t]:
            if s[1] != "constant" or s[0] not in HETEROGENEOUS:
                continue
            c = cells[t][s]
            base = c["bsp"]["grad_rate"]
            rel = {p: c[p]["grad_rate"] / base for p in BOUNDED + ["asp", DSSP_NOCAP]}
            good = all(abs(rel[p] - 1) <= SETTLE_TOL for p in BOUNDED)
            ok += good
            n += 1
            rows.append(f"{name(t, s)}: steady gradients/s relative to BSP: "
                        + ", ".join(f"{p} {v:.2f}" for p, v in rel.items()))
    out.append({"claim": "(PAPERS.md note) At constant speed ratios every bounded policy (SSP, capped DSSP) "
                         "settles at the slow workers' pace, like BSP",
                "test": f"gradients/s over the second half within {SETTLE_TOL:.0%} of BSP's for SSP(3), SSP(15), DSSP(cap)",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows})

    # 7. PAPERS.md's invariant: the bounds hold (and the uncapped loop may drift past s_U)
    bounds = {"ssp:3": 3 + 1, "ssp:15": 15 + 1, DSSP: 15 + 1}
    rows, ok, n = [], 0, 0
    drift = []
    for t in tasks:
        for s in cells[t]:
            c = cells[t][s]
            for p, b in bounds.items():
                ok += c[p]["clock_gap_max"] <= b
                n += 1
            if c[DSSP_NOCAP]["clock_gap_max"] > 16:
                drift.append(f"{name(t, s)} ({c[DSSP_NOCAP]['clock_gap_max']})")
            rows.append(f"{name(t, s)}: max clock gap " + ", ".join(f"{p} {c[p]['clock_gap_max']}" for p in
                                                                 ["ssp:3", "ssp:15", DSSP, DSSP_NOCAP, "asp"]))
    out.append({"claim": "(PAPERS.md invariant) SSP(s) keeps the clock gap within s, capped DSSP within s_U = 15",
                "test": "max (fastest − slowest) clock after any push <= s + 1 for SSP(3), SSP(15) and <= s_U + 1 "
                        "for DSSP(3,12, cap), over every run",
                "verdict": verdict(ok, n), "ok": ok, "n": n, "details": rows,
                "note": ("uncapped DSSP drifted past s_U + 1 in " + (", ".join(drift) if drift else "no scenario"))})

    out.append({"claim": "Theory: DSSP inherits SSP's regret bound with s = s_U",
                "test": "a proof, not a measurement", "verdict": "not tested", "ok": 0, "n": 0, "details": []})
    return out


def observations(cells: dict) -> str:
    """Per scenario, the policy with the smallest median time to target; counted."""
    wins: dict = {}
    lines = []
    for t, by_s in cells.items():
        for s, c in by_s.items():
            best = min(POLICIES, key=lambda p: c[p]["t_median"])
            tmin = c[best]["t_median"]
            tied = [p for p in POLICIES if c[p]["t_median"] == tmin]
            if math.isinf(tmin):
                tied = ["none reached the target"]
            for p in tied:
                wins[p] = wins.get(p, 0) + 1
            lines.append(f"- {t} {s[0]} {s[1]}: {', '.join(tied)}"
                         + ("" if math.isinf(tmin) else f" ({tmin:.0f} s)"))
    total = sum(len(v) for v in cells.values())
    head = "Fastest to the target (median over seeds; ties listed together), in " + f"{total} scenarios: " + \
        ", ".join(f"{p} {k}" for p, k in sorted(wins.items(), key=lambda kv: -kv[1])) + "."
    return head + "\n\n" + "\n".join(lines)


# -- reporting ---------------------------------------------------------------------
def fmt_time(c: dict) -> str:
    if c["reached"] == 0:
        return f"never (0/{c['seeds']})"
    med = "never" if math.isinf(c["t_median"]) else f"{c['t_median']:.0f}"
    return f"{med} [{c['t_min']:.0f}–{c['t_max']:.0f}] ({c['reached']}/{c['seeds']})"


def table_md(task: str, cells_t: dict, cfg: dict) -> str:
    head = (f"| scenario | policy | time to {cfg['target']:g} (s): median [min–max] (reached) | final accuracy: "
            "median [min–max] | staleness mean / max | max clock gap | wait fraction | gradients/s | r* mean |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for (cname, variant), cs in cells_t.items():
        for p in POLICIES:
            c = cs[p]
            div = f" ({c['diverged']} diverged)" if c["diverged"] else ""
            lines.append(
                f"| {cname} {variant} | {p} | {fmt_time(c)} | {c['final_median']:.3f} "
                f"[{c['final_min']:.3f}–{c['final_max']:.3f}]{div} | {c['staleness_mean']:.2f} / "
                f"{c['staleness_max']} | {c['clock_gap_max']} | {c['wait_fraction']:.2f} | {c['grad_rate']:.2f} | "
                f"{'' if math.isnan(c['rstar_mean']) else format(c['rstar_mean'], '.2f')} |")
    return head + "\n".join(lines) + "\n"


def table_text(task: str, cells_t: dict, cfg: dict) -> str:
    out = [f"{task}: time to accuracy {cfg['target']:g} (simulated s), final accuracy at {cfg['max_time']:g} s"]
    out.append(f"{'scenario':<22}{'policy':<17}{'t_med':>7}{'t_min':>7}{'t_max':>7}{'reach':>6}"
               f"{'final':>7}{'min':>7}{'max':>7}{'τ mean':>8}{'τ max':>6}{'gap':>5}{'wait':>6}{'grad/s':>7}")
    for (cname, variant), cs in cells_t.items():
        for p in POLICIES:
            c = cs[p]
            out.append(f"{cname + ' ' + variant:<22}{p:<17}{c['t_median']:>7.0f}{c['t_min']:>7.0f}{c['t_max']:>7.0f}"
                       f"{c['reached']:>4}/{c['seeds']}{c['final_median']:>7.3f}{c['final_min']:>7.3f}"
                       f"{c['final_max']:>7.3f}{c['staleness_mean']:>8.2f}{c['staleness_max']:>6}{c['clock_gap_max']:>5}"
                       f"{c['wait_fraction']:>6.2f}{c['grad_rate']:>7.2f}")
    return "\n".join(out)


def plot_task(task: str, results: dict, cfg: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from staleness import plots

    names = list(dict.fromkeys(s[0] for s in results))
    variants = list(dict.fromkeys(s[1] for s in results))
    fig, axes = plt.subplots(len(names), len(variants), figsize=(4.4 * len(variants), 3.2 * len(names)),
                             squeeze=False, layout="constrained", sharey=True)
    for i, cname in enumerate(names):
        for j, variant in enumerate(variants):
            ax = axes[i, j]
            runs = [r for p in POLICIES for r in results[(cname, variant)][p]]
            plots.metric_vs_time(runs, "accuracy", ax=ax, label_fn=lambda r: r.config["policy"])
            ax.axhline(cfg["target"], color="0.3", linestyle=":", linewidth=1.0)
            keys = {tuple(schedule_key(r.schedule) for r in results[(cname, variant)][p]) for p in ASYNC}
            same = "\n(no worker ever blocks: the asynchronous policies coincide)" if len(keys) == 1 else ""
            ax.set_title(f"{cname}, {variant}{same}", fontsize="medium")
            if (i, j) != (0, 0):
                ax.get_legend().remove()
            else:
                ax.legend(fontsize="x-small")
    fig.suptitle(f"{task}: held-out accuracy vs simulated time (median and min–max over seeds; dotted: target)")
    plots.save(fig, path)
    plt.close(fig)
    return path


def write_markdown(path: Path, *, command: str, wall: float, cpu: float, vers: dict, settings: dict, seeds,
                   cells: dict, verdicts: list[dict], pngs: list[Path], quick: bool) -> None:
    lines = [f"# Reproducing DSSP (Zhao et al., ICDCS 2019){' — QUICK smoke run' if quick else ''}", "",
             "Produced by `benchmarks/reproduce_dssp.py`; every number below is computed by the script "
             "from this run's results.", "",
             f"- command: `{command}`",
             f"- wall time: {wall:.0f} s ({wall / 60:.1f} min); process CPU time {cpu:.0f} s",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
             f"- seeds: {list(seeds)}",
             "", "## Setup", "",
             "- clusters (`st.cluster.gpus`, a GTX 1080 Ti iteration = 1 s, a GTX 1060 = 2.6 s): "
             + "; ".join(f"{k} = " + " + ".join(f"{v.count(g)} x {label}" for g, label in
                                                (("gtx1080ti", "1080 Ti"), ("gtx1060", "1060")) if v.count(g))
                         for k, v in CLUSTERS.items() if k in {s[0] for c in cells.values() for s in c}),
             f"- variants: constant speeds; lognormal jitter (sigma = {JITTER_SIGMA}); transient stragglers "
             f"(per-iteration probability {STRAGGLERS['prob']}, {STRAGGLERS['slowdown']:g}x slower for "
             f"{STRAGGLERS['duration']:g} s)",
             "- policies: " + ", ".join(POLICIES) + " (`nocap`: DSSP's literal server loop, whose repeated "
             "grants may drift past s_U = 15)",
             "- staleness is in server updates (versions), as everywhere in `staleness`; wait fraction = "
             "time blocked at the gate / elapsed time, mean over workers; gradients/s over the second half "
             "of the run; r* = DSSP controller outputs; max clock gap = largest (fastest − slowest) number of "
             "pushes; time ratios < 1 mean DSSP reached the target earlier"]
    for t, cfg in settings.items():
        lines.append(f"- {t}: μ = {cfg['batch_size']} per worker, {cfg['optimizer']} at lr {cfg['lr']:g}, "
                     f"{cfg['max_time']:g} simulated s per run, target accuracy {cfg['target']:g}, "
                     f"evaluation every {cfg['eval_async']} updates (BSP: {cfg['eval_bsp']})")
    lines += ["", "## Summary", "", "| claim (PAPERS.md section 1) | verdict here |", "|---|---|"]
    lines += [f"| {v['claim']} | {v['verdict']} |" for v in verdicts]
    lines += ["", "## Claims", ""]
    for v in verdicts:
        lines.append(f"### {v['claim']}")
        lines.append(f"**{v['verdict']}** — test: {v['test']}.")
        if v.get("note"):
            lines.append(f"({v['note']}.)")
        lines.append("")
        for d in v["details"]:
            lines.append(f"- {d}")
        lines.append("")
    lines += ["## Which policy reached the target first", "", observations(cells), "", "## Tables", ""]
    for t, cfg in settings.items():
        lines += [f"### {t}", "", table_md(t, cells[t], cfg)]
    lines += ["## Plots", ""]
    for p in pngs:
        lines.append(f"![{p.stem}]({p.name})")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (< 1 min): mnist1d-mlp, the 4+4 cluster, 2 seeds")
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5; quick: 2)")
    ap.add_argument("--cifar-dir", default=None, help="CIFAR-10 python-pickle directory: adds cifar10-resnet20")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of " + ",".join(TASKS))
    ap.add_argument("--clusters", default=None, help="comma-separated subset of " + ",".join(CLUSTERS))
    ap.add_argument("--max-time", type=float, default=None, help="override every task's simulated seconds per run")
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/results; quick: runs/reproduce_dssp_quick)")
    args = ap.parse_args(argv)
    t0, c0 = time.perf_counter(), time.process_time()
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", "benchmarks/reproduce_dssp.py", *argv])

    seeds = list(range(args.seeds if args.seeds is not None else (2 if args.quick else 5)))
    if len(seeds) < 1:
        ap.error(f"--seeds {args.seeds} must be >= 1")
    tasks = ["mnist1d-mlp"] if args.quick else ["digits-cnn", "mnist1d-mlp"]
    if args.cifar_dir:
        tasks.append("cifar10-resnet20")
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",")]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        ap.error(f"--tasks: unknown {bad}; valid: {', '.join(TASKS)}")
    if "cifar10-resnet20" in tasks and not args.cifar_dir:
        ap.error("--tasks cifar10-resnet20 needs --cifar-dir")
    clusters = ["4+4"] if args.quick else list(CLUSTERS)
    if args.clusters:
        clusters = [c.strip() for c in args.clusters.split(",")]
    bad = [c for c in clusters if c not in CLUSTERS]
    if bad:
        ap.error(f"--clusters: unknown {bad}; valid: {', '.join(CLUSTERS)}")
    out = Path(args.out) if args.out else (ROOT / "runs" / f"{NAME}_quick" if args.quick else ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)

    settings = {t: {**TASKS[t], **(QUICK.get(t, {}) if args.quick else {})} for t in tasks}
    if args.max_time is not None:
        if not (math.isfinite(args.max_time) and args.max_time > 0):
            ap.error(f"--max-time {args.max_time} must be a number of simulated seconds > 0")
        for cfg in settings.values():
            cfg["max_time"] = args.max_time
    scenarios = [(c, v) for c in clusters for v in VARIANTS]

    from tqdm.auto import tqdm

    results, cells = {}, {}
    with tqdm(total=len(tasks) * len(scenarios), desc=NAME, unit="scenario") as bar:
        for t in tasks:
            results[t] = run_task(t, settings[t], scenarios, seeds, args.cifar_dir, bar)
            cells[t] = {s: {p: cell(rs, settings[t]["target"], settings[t]["max_time"]) for p, rs in by.items()}
                        for s, by in results[t].items()}
    verdicts = claims(cells, tasks, settings)

    for t in tasks:
        print(table_text(t, cells[t], settings[t]))
        print()
    print(observations(cells))
    print()
    print("Claims of the DSSP paper (PAPERS.md section 1):")
    for v in verdicts:
        print(f"- {v['claim']}: {v['verdict']}  [{v['test']}]")
        if v.get("note"):
            print(f"    ({v['note']})")
        for d in v["details"]:
            print(f"    {d}")

    pngs = [plot_task(t, results[t], settings[t], out / f"{NAME}_{t}.png") for t in tasks]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    vers = versions()
    write_markdown(out / f"{NAME}.md", command=command, wall=wall, cpu=cpu, vers=vers, settings=settings,
                   seeds=seeds, cells=cells, verdicts=verdicts, pngs=pngs, quick=args.quick)
    print(f"wrote {out / f'{NAME}.md'} and {', '.join(p.name for p in pngs)}; wall {wall:.0f} s, CPU {cpu:.0f} s")

    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x

    summary = {
        "benchmark": NAME, "quick": args.quick, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "seeds": len(seeds),
        "verdicts": {v["claim"]: v["verdict"] for v in verdicts},
        "cells": {f"{t}|{s[0]}|{s[1]}|{p}": {k: clean(c[k]) for k in ("t_median", "final_median", "staleness_mean",
                                                                      "staleness_max", "wait_fraction")}
                  for t in tasks for s, cs in cells[t].items() for p, c in cs.items()},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
