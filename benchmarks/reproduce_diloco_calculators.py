"""Reproduce two public DiLoCo bandwidth calculators with the project's network model:
diloco-measured's analytic compute utilization (Adnan082/diloco-measured) and Douillard's
"DiLoCo Bandwidth Simulator" (arthurdouillard.com/diloco), to the printed digit; then the
measured/analytic gap that diloco-measured reports, and what the simulator says about it.

Parts (every number is computed here, from this run; sources in the report):

1. `measured`: for each shaped DiLoCo run of diloco-measured (16 points H x bandwidth, first
   pass r0; full mode also the repeats r1, r2) the analytic inputs derived from the repo's raw
   step telemetry and its aggregation script (benchmarks/data/diloco_measured_runs.json:
   H, t_compute = mean post-warmup compute seconds per step, the iperf3-verified bandwidth,
   bytes_synced = n_params x 4). Each analytic CU is reproduced by `st.simulate_schedule`
   (diloco:H on 4 workers of constant step time, per-worker links of the measured bandwidth,
   no latency, pull 0 bytes, push bytes_synced) and must agree to 1e-9 relative and to the
   printed digits. Then the gap measured/analytic (1.08-1.92x) is taken apart with the
   simulator: the ring all-reduce's 2(P-1)/P bytes (`+allreduce=ring`), a latency per ring
   step, the measured compute jitter, and the measurement window's accounting; what is left
   is reported per point. Overlap is shown as what it would recover (the runs block).
2. `douillard`: the calculator's table "bandwidth (Gbps) needed for each CU threshold" at its
   defaults (Data Parallel; DiLoCo H=30; Streaming DiLoCo H=100, P=16, tau=1; N=10B, bf16,
   T=1 s, M=2) and three other settings, from closed forms of its timeline simulation with the
   transfer time C from `staleness.cluster.network.allreduce_parts` (ring, n = M) and its own
   bisection and display rounding; every printed cell must equal the page's. A line-by-line
   port of the page's JS timeline is run as a second path (its raw bisection values must
   equal the page's bit for bit). The project's simulator gives its own numbers for the
   same scenario (DiLoCo and data-parallel on a ring all-reduce, with and without overlap),
   printed beside them with the convention that makes them differ.

    python benchmarks/reproduce_diloco_calculators.py            # full: 48 runs, every port check
    python benchmarks/reproduce_diloco_calculators.py --quick    # r0 runs, port checks on the defaults
    python benchmarks/reproduce_diloco_calculators.py --derive   # rebuild the data file from the mirror

Exits with status 1 when a reproduction disagrees beyond its stated tolerance (`_report.finish`).
"""

from __future__ import annotations

import argparse
import decimal
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import staleness as st
from _report import Agreement, finish
from staleness.cluster.network import allreduce_parts, parse_bandwidth

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_diloco_calculators"
DATA = ROOT / "benchmarks" / "data" / "diloco_measured_runs.json"
MIRROR = Path("/work/.mirror/Adnan082+diloco-measured/repo")

REL_TOL = 1e-9          # simulator vs closed form: both are exact arithmetic, float rounding only
WORKERS = 4             # diloco-measured: 4 x g6e.2xlarge, one L40S each
LEVELS = ("50m", "200m", "1g", "5g")
HS = (1, 8, 32, 128)

# =============================================================================================
# Part 1: diloco-measured
# =============================================================================================
# The README's measured table (printed, percent with 2 decimals), quoted from
# Adnan082/diloco-measured README.md @ 07b7885 ("median of 3 repeats" per the README; these
# are the r0 values, see the report).
README_MEASURED = {1: ("0.07%", "0.32%", "1.74%", "7.76%"), 8: ("0.55%", "2.48%", "12.35%", "40.24%"),
                   32: ("2.41%", "10.01%", "36.01%", "68.10%"), 128: ("11.55%", "36.09%", "71.52%", "87.00%")}
README_RANGE = ("1.08", "1.92")   # "discrepancy_link ... 1.08x-1.92x"


def derive(mirror: Path) -> dict:
    """Read the 48 shaped DiLoCo runs from the mirrored repo (git objects, no work tree) and
    derive each run's analytic inputs exactly as experiments/01_cu_grid/aggregate_shaped_grid.py
    does (`aggregate_one`), plus what the gap analysis needs (per-sync blocked seconds, jitter)."""
    def show(path):
        return subprocess.run(["git", "-C", str(mirror), "show", f"HEAD:{path}"], check=True,
                              capture_output=True, text=True).stdout

    commit = subprocess.run(["git", "-C", str(mirror), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    runs = []
    for r in (0, 1, 2):
        for h in HS:
            for lvl in LEVELS:
                rid = f"cu_grid-diloco-30m-h{h}-bw{lvl}-r{r}"
                tel_path = f"experiments/01_cu_grid/raw_step_telemetry_shaped/{rid}.json"
                res_path = f"results/raw/{rid}.json"
                raw, res = json.loads(show(tel_path)), json.loads(show(res_path))
                w = raw["warmup_steps"]
                kept = raw["step_records"][w:]
                # aggregate_shaped_grid.py::aggregate_one, verbatim arithmetic
                total_compute_s = sum(x["compute_time_ms"] for x in kept) / 1000
                total_sync_s = sum(x["sync_blocked_ms"] for x in kept) / 1000
                total_opt_s = sum(x["optimizer_time_ms"] for x in kept) / 1000
                total_loader_s = sum(x["loader_stall_ms"] for x in kept) / 1000
                total_wall_s = sum(x["wall_time_ms"] for x in kept) / 1000
                logs = [math.log(x["compute_time_ms"]) for x in kept]
                runs.append({
                    "run_id": rid, "H": raw["H"], "repeat": r, "level": lvl,
                    "requested_bps": res["shaping"]["requested_bps"],
                    "measured_bps": res["shaping"]["measured_bps"],
                    "n_params": raw["n_params"], "bytes_synced": raw["n_params"] * 4,
                    "world_size": raw["world_size"], "steps": raw["steps"], "warmup_steps": w,
                    "kept_steps": len(kept),
                    "t_compute_s": total_compute_s / len(kept),
                    "compute_s": total_compute_s, "sync_blocked_s": total_sync_s, "optimizer_s": total_opt_s,
                    "loader_stall_s": total_loader_s, "wall_s": total_wall_s,
                    "sync_steps": [x["step"] for x in kept if x["did_outer_step"]],
                    "sync_blocked_per_sync_s": [x["sync_blocked_ms"] / 1000 for x in kept if x["did_outer_step"]],
                    "sigma_log_compute_per_step": statistics.pstdev(logs),
                    "reported": {"cu_analytic_link": res["cu"]["cu_analytic_link"],
                                 "cu_measured": res["cu"]["cu_measured"],
                                 "discrepancy_link": res["cu"]["discrepancy_link"]},
                    "sources": {"telemetry": tel_path, "record": res_path},
                })
    return {"source": {"repo": "github.com/Adnan082/diloco-measured", "commit": commit,
                       "derivation": "experiments/01_cu_grid/aggregate_shaped_grid.py::aggregate_one (t_compute = "
                                     "sum(compute_time_ms of the steps after warmup)/1000/len, bytes_synced = "
                                     "n_params*4, bandwidth = int(shaping.measured_bps)); "
                                     "src/diloco_measured/analysis/cu.py::analytic and ::measured"},
            "fields": {"measured_bps": "iperf3-verified rate of the shaped link, bits/s (results/raw shaping block)",
                       "t_compute_s": "mean compute seconds per step over the kept (post-warmup) steps",
                       "sync_blocked_per_sync_s": "rank 0's blocked seconds on each outer-sync step in the window",
                       "sigma_log_compute_per_step": "std of log(compute_time_ms) over the kept steps",
                       "reported": "the values stored in results/raw/<run_id>.json"},
            "runs": runs}


def analytic_cu(h: int, t_compute_s: float, bytes_synced: int, bandwidth_bps: int) -> float:
    """diloco-measured's src/diloco_measured/analysis/cu.py::analytic, verbatim arithmetic."""
    compute_budget_s = h * t_compute_s
    sync_time_s = (bytes_synced * 8) / bandwidth_bps
    return compute_budget_s / (compute_budget_s + sync_time_s)


def measured_cu(run: dict) -> float:
    """cu.py::measured = sum(compute_time_ms) / sum(wall_time_ms) over the kept steps."""
    return run["compute_s"] / run["wall_s"]


def sim_links(run: dict, rounds: int = 4) -> st.Schedule:
    """The analytic model as a simulation: diloco:H on 4 workers of constant step time t, each
    on its own link of the measured bandwidth (bytes/s = bits/s / 8) and no latency; a sync is
    one push of bytes_synced over that link (pull 0 bytes)."""
    bw = int(run["measured_bps"]) / 8
    cl = st.cluster.constant(WORKERS, run["t_compute_s"]).links(bw, 0.0)
    return st.simulate_schedule(f"diloco:{run['H']}", cl, num_updates=rounds, seed=0, payload_bytes=0,
                                push_bytes=run["bytes_synced"])


def ring_cluster(run: dict, latency: float = 0.0, sigma: float = 0.0):
    cl = st.cluster.constant(WORKERS, run["t_compute_s"])
    if sigma > 0:
        cl = cl.jitter(sigma)
    return cl.allreduce("ring", int(run["measured_bps"]) / 8, latency)


def sim_ring(run: dict, latency: float = 0.0, sigma: float = 0.0, rounds: int = 8, seed: int = 0,
             overlap: bool = False) -> st.Schedule:
    return st.simulate_schedule(f"diloco:{run['H']}", ring_cluster(run, latency, sigma), num_updates=rounds, seed=seed,
                                payload_bytes=0, push_bytes=run["bytes_synced"], overlap=overlap)


def window_cu(sched: st.Schedule, run: dict) -> float:
    """CU over the measured window, as cu.py::measured counts it (rank 0's compute / wall from
    the start of step `warmup` to the end of step `steps - 1`, its sync included when it is a
    sync step), read off the simulated schedule of worker 0. Step i is inner step i % H of
    round i // H; a round's steps share its compute evenly."""
    c = sched.columns
    mine = np.flatnonzero(c["worker"] == 0)
    mine = mine[np.argsort(c["iteration"][mine])]
    s, e, p = c["start"][mine], c["end"][mine], c["push_time"][mine]
    h, w, n = run["H"], run["warmup_steps"], run["steps"]
    if len(mine) * h < n:
        raise ValueError(f"window_cu: {run['run_id']}: {len(mine)} rounds < {n} steps / H")
    d = (e - s) / h

    def begin(i):
        r, j = divmod(i, h)
        return s[r] + j * d[r]

    def fin(i):
        r, j = divmod(i, h)
        return p[r] if j == h - 1 else s[r] + (j + 1) * d[r]

    compute = sum(d[i // h] for i in range(w, n))
    return float(compute / (fin(n - 1) - begin(w)))


def fit_latency(runs: list[dict]) -> dict:
    """The latency per ring step L that the simulator's all-reduce (2(P-1)/P B/b + 2(P-1) L)
    needs to match the measured steady-state sync time at 1 and 5 Gbit/s: the median over
    those runs' syncs (the run's first collective, at step H-1, excluded: see `first_sync`) of
    (blocked seconds - ring bandwidth part) / (2(P-1))."""
    per_level = {}
    for lvl in ("1g", "5g"):
        ex = []
        for r in runs:
            if r["level"] != lvl:
                continue
            bw_part, _ = allreduce_parts("ring", r["bytes_synced"], WORKERS, int(r["measured_bps"]) / 8)
            ex += [(b - bw_part) / (2 * (WORKERS - 1)) for stp, b in zip(r["sync_steps"], r["sync_blocked_per_sync_s"])
                   if stp != r["H"] - 1]
        per_level[lvl] = statistics.median(ex)
    allx = []
    for r in runs:
        if r["level"] in ("1g", "5g"):
            bw_part, _ = allreduce_parts("ring", r["bytes_synced"], WORKERS, int(r["measured_bps"]) / 8)
            allx += [(b - bw_part) / (2 * (WORKERS - 1)) for stp, b in zip(r["sync_steps"], r["sync_blocked_per_sync_s"])
                     if stp != r["H"] - 1]
    return {"latency_s": statistics.median(allx), "per_level_s": per_level, "syncs": len(allx)}


def steady_syncs(run: dict) -> list[float]:
    """Blocked seconds of the run's outer syncs in the window, its first collective (step H-1) excluded."""
    return [b for stp, b in zip(run["sync_steps"], run["sync_blocked_per_sync_s"]) if stp != run["H"] - 1]


def first_sync(run: dict, steady: float) -> float | None:
    """Extra blocked seconds of the run's first collective (step H-1) over the measured steady-state
    sync time `steady` (seconds), when that step is inside the window; None otherwise."""
    for stp, b in zip(run["sync_steps"], run["sync_blocked_per_sync_s"]):
        if stp == run["H"] - 1:
            return b - steady
    return None


def part_measured(data: dict, repeats: tuple[int, ...], seeds: int, log) -> tuple[dict, list]:
    runs = [r for r in data["runs"] if r["repeat"] in repeats]
    checks = []
    rows = []
    worst_rel, worst_id, digit_bad = 0.0, "", []
    worst_src, src_id = 0.0, ""
    # (1) the derivation reproduces the stored records; the simulator reproduces the analytic CU
    for r in runs:
        an = analytic_cu(r["H"], r["t_compute_s"], r["bytes_synced"], int(r["measured_bps"]))
        me = measured_cu(r)
        for mine, theirs in ((an, r["reported"]["cu_analytic_link"]), (me, r["reported"]["cu_measured"])):
            d = abs(mine - theirs) / abs(theirs)
            if d > worst_src:
                worst_src, src_id = d, r["run_id"]
        sched = sim_links(r)
        sim = sched.summary()["goodput"]
        rel = abs(sim - an) / an
        if rel > worst_rel:
            worst_rel, worst_id = rel, r["run_id"]
        for fmt in ("{:.4f}", "{:.2%}", "{:.6g}"):
            if fmt.format(sim) != fmt.format(an):
                digit_bad.append(f"{r['run_id']}: {fmt.format(sim)} vs {fmt.format(an)}")
        rows.append({"run_id": r["run_id"], "H": r["H"], "level": r["level"], "repeat": r["repeat"],
                     "t_compute_ms": r["t_compute_s"] * 1e3, "bandwidth_bps": int(r["measured_bps"]),
                     "analytic": an, "sim_links": sim, "measured": me, "cluster": sched.cluster})
    checks.append(Agreement("derived analytic/measured CU (raw telemetry + aggregate_shaped_grid.py)",
                            "diloco-measured results/raw records", worst_src, 1e-12, "max relative difference",
                            "same arithmetic on the same numbers", src_id))
    checks.append(Agreement("simulate_schedule goodput (diloco:H, links, push bytes_synced)",
                            "diloco-measured analytic CU", worst_rel, REL_TOL, "max relative difference",
                            "both exact: float rounding only", worst_id))
    checks.append(Agreement("simulated CU printed (.4f, .2%, .6g)", "analytic CU printed", float(len(digit_bad)), 0.0,
                            "cells that differ", "printed digits must match", "; ".join(digit_bad[:3])))
    log(f"[measured] {len(runs)} runs: simulator vs analytic max rel {worst_rel:.2e}; printed digits differ in "
        f"{len(digit_bad)}")
    # the README's table and range (r0)
    r0 = {(r["H"], r["level"]): r for r in rows if r["repeat"] == 0}
    bad = [f"H={h} {lvl}: {r0[(h, lvl)]['measured']:.2%} vs README {README_MEASURED[h][i]}"
           for h in HS for i, lvl in enumerate(LEVELS) if f"{r0[(h, lvl)]['measured']:.2%}" != README_MEASURED[h][i]]
    disc = [r["analytic"] / r["measured"] for r in r0.values()]
    rng = (f"{min(disc):.2f}", f"{max(disc):.2f}")
    checks.append(Agreement("measured CU of the r0 records (printed .2%) and their discrepancy range",
                            "README table and '1.08x-1.92x'", float(len(bad) + (rng != README_RANGE)), 0.0,
                            "cells that differ", "printed digits", "; ".join(bad[:3]) + (f" range {rng}" if rng != README_RANGE else "")))

    # (2) the gap: a ladder of simulator settings, each added to the previous one
    fit = fit_latency([r for r in runs if r["repeat"] == 0])
    lat = fit["latency_s"]
    log(f"[measured] fitted latency per ring step {lat * 1e3:.3f} ms (1g {fit['per_level_s']['1g'] * 1e3:.3f}, "
        f"5g {fit['per_level_s']['5g'] * 1e3:.3f}) from {fit['syncs']} steady-state syncs")
    by_id = {r["run_id"]: r for r in runs}
    # measured steady-state sync seconds per (level, repeat): median over that level's runs' syncs,
    # each run's first collective excluded (the reference for the first collective's extra)
    steady_at = {}
    for r in runs:
        steady_at.setdefault((r["level"], r["repeat"]), []).extend(steady_syncs(r))
    steady_at = {k: statistics.median(v) for k, v in steady_at.items()}
    gap = []
    for row in rows:
        r = by_id[row["run_id"]]
        n_rounds = -(-r["steps"] // r["H"])
        ring = sim_ring(r).summary()["goodput"]
        ring_lat = sim_ring(r, lat).summary()["goodput"]
        sig = r["sigma_log_compute_per_step"] / math.sqrt(r["H"])
        jit = float(np.mean([sim_ring(r, lat, sig, rounds=64, seed=k).summary()["goodput"] for k in range(seeds)]))
        jit_corr = float(np.mean([sim_ring(r, lat, r["sigma_log_compute_per_step"], rounds=64, seed=k).summary()["goodput"]
                                  for k in range(seeds)]))
        win = float(np.mean([window_cu(sim_ring(r, lat, sig, rounds=n_rounds, seed=k), r) for k in range(seeds)]))
        over = sim_ring(r, lat, overlap=True).summary()["goodput"]
        # time accounting in the window: measured wall vs simulated wall at the same compute
        sim_wall = r["compute_s"] / win
        bw_part, lat_part = allreduce_parts("ring", r["bytes_synced"], WORKERS, int(r["measured_bps"]) / 8, lat)
        steady = bw_part + lat_part
        fs = first_sync(r, steady_at[(r["level"], r["repeat"])])
        other = r["optimizer_s"] + r["loader_stall_s"]
        # + the first collective's measured extra (not a network effect: added to the simulated window's wall)
        first = r["compute_s"] / (sim_wall + (fs or 0.0))
        own = steady_syncs(r)
        gap.append({**row, "ring": ring, "ring_latency": ring_lat, "jitter": jit, "jitter_correlated": jit_corr,
                    "window": win, "first_collective": first, "overlap": over, "sigma_round": sig,
                    "syncs_in_window": len(r["sync_steps"]), "kept_steps": r["kept_steps"],
                    "sync_sim_s": steady, "sync_measured_median_s": statistics.median(r["sync_blocked_per_sync_s"]),
                    "first_sync_extra_s": fs, "other_s": other,
                    "residual_wall_s": r["wall_s"] - sim_wall - (fs or 0.0),
                    "bandwidth_efficiency": bw_part / (statistics.median(own) - lat_part) if own else None})
    # the ring factor in the simulator is exactly 2(P-1)/P = 1.5 on the sync time
    worst_ring = 0.0
    for g in gap:
        r = by_id[g["run_id"]]
        ht = r["H"] * r["t_compute_s"]
        t_sync = r["bytes_synced"] * 8 / int(r["measured_bps"])
        want = ht / (ht + 1.5 * t_sync)
        worst_ring = max(worst_ring, abs(g["ring"] - want) / want)
    checks.append(Agreement("simulate_schedule goodput (diloco:H, +allreduce=ring, no latency)",
                            "H t / (H t + 1.5 bytes_synced 8 / bps)", worst_ring, REL_TOL, "max relative difference",
                            "ring factor 2(P-1)/P = 1.5 at P = 4"))
    log(f"[measured] ring factor check max rel {worst_ring:.2e}")
    return {"rows": gap, "latency_fit": fit, "repeats": list(repeats), "jitter_seeds": seeds}, checks


# =============================================================================================
# Part 2: Douillard's DiLoCo Bandwidth Simulator
# =============================================================================================
N_STEPS, K_BUCKETS = 2000, 128
THRESHOLDS = (50, 75, 90, 95, 99)
MIN_BW, MAX_BW, TOL_PP, MAX_ITER = 0.1, 100000.0, 0.5, 50
# (name, N billions, T s/step, M, diloco H, streaming H, P, tau); bf16 (2 bytes) everywhere
SETTINGS = [("defaults", 10.0, 1.0, 2.0, 30, 100, 16, 1), ("N=100B", 100.0, 1.0, 2.0, 30, 100, 16, 1),
            ("N=1B", 1.0, 1.0, 2.0, 30, 100, 16, 1), ("M=4, DiLoCo H=100", 10.0, 1.0, 4.0, 100, 100, 16, 1)]
# The page's table: printed text and raw bisection value of every cell, from the page's own JS
# (arthurdouillard.github.io diloco/index.html @ 9049612, functions calculateCore ..
# findBandwidthForUtilization, formatBandwidth extracted verbatim and run in node 20 with the
# inputs set; printed values also in the research notes, section 1.6).
PAGE = {
    "defaults": {
        "Data Parallel": [("96", 96.23027496337892), ("162", 161.84300231933594), ("208", 207.61932373046875),
                          ("223", 222.8780975341797), ("244", 244.240380859375)],
        "DiLoCo": [("5.2", 5.249836158752442), ("15", 14.59583511352539), ("40", 39.77281188964844),
                   ("73", 73.3421142578125), ("195", 195.4123046875)],
        "Streaming DiLoCo": [("1.2", 1.2444080352783202), ("2.7", 2.6749180793762206), ("4.3", 4.296162796020507),
                             ("5.1", 5.059101486206055), ("5.8", 5.822040176391601)]},
    "N=100B": {
        "Data Parallel": [("952", 952.2474853515624), ("1611", 1611.426513671875), ("2075", 2075.2932373046874),
                          ("2246", 2246.19150390625), ("2442", 2441.50380859375)],
        "DiLoCo": [("52", 51.97983093261719), ("147", 146.584228515625), ("391", 390.724609375),
                   ("684", 683.69306640625), ("1563", 1562.5984375)],
        "Streaming DiLoCo": [("13", 12.688488388061524), ("27", 26.802854156494142), ("43", 42.82456665039062),
                             ("50", 50.45395355224609), ("58", 58.08334045410156)]},
    "N=1B": {
        "Data Parallel": [("9.6", 9.636733627319336), ("16", 16.121712493896485), ("21", 20.699344635009766),
                          ("22", 22.415956687927245), ("25", 24.5140380859375)],
        "DiLoCo": [("0.52", 0.517232096195221), ("1.5", 1.4828263759613036), ("3.9", 3.914693450927734),
                   ("7.0", 6.966448211669922), ("18", 18.410528564453124)],
        "Streaming DiLoCo": [("0.13", 0.12682206332683563), ("0.27", 0.2668928384780884), ("0.42", 0.4218647599220276),
                             ("0.51", 0.5053111791610718), ("0.58", 0.5768366813659668)]},
    "M=4, DiLoCo H=100": {
        "Data Parallel": [("144", 143.5324737548828), ("241", 241.18862609863282), ("311", 311.37898559570306),
                          ("336", 335.79302368164065), ("366", 366.3105712890625)],
        "DiLoCo": [("2.4", 2.388816070556641), ("7.0", 6.966448211669922), ("21", 21.462283325195312),
                   ("43", 42.82456665039062), ("195", 195.4123046875)],
        "Streaming DiLoCo": [("1.9", 1.911979389190674), ("4.0", 4.010060787200928), ("6.4", 6.394244194030762),
                             ("7.5", 7.538652229309082), ("8.7", 8.683060264587404)]},
}
# The page's calculateCore(...).utilization (percent) at a few bandwidths, defaults, same node run.
PAGE_CU_DEFAULTS = {0.1: (0.06248677851366214, 1.8594905054124236, 5.975798018026966),
                    1.0: (0.6236803638135441, 15.979107317182791, 42.84184219921461),
                    5.0: (3.0922853921727436, 49.16005438331021, 94.86166007905102),
                    10.0: (6.120497290404665, 66.39348513927075, 100.0),
                    100.0: (51.5851692640727, 96.99585645824392, 100.0),
                    1000.0: (99.87515605492898, 99.99587517014915, 100.0)}


def methods_of(setting) -> list[tuple[str, int, int, int]]:
    """(label, H, S = tau, P) as updateBandwidthTable builds them."""
    _, _, _, _, dh, sh, p, tau = setting
    return [("Data Parallel", 1, 0, 1), ("DiLoCo", dh, 0, 1), ("Streaming DiLoCo", sh, tau, p)]


def fragment_sends(h: int, p: int) -> int:
    """Fragments sent in the page's 2000 steps: a slot change of floor((step % H) / (H / P)), or step 0."""
    fi = h / p
    return sum(1 for step in range(N_STEPS)
               if step == 0 or math.floor((step % h) / fi) != math.floor(((step - 1 + h) % h) / fi))


def transfer_seconds(n_params: float, bytes_per_param: float, m: float, bw_gbps: float) -> float:
    """C: one full synchronization of the model across M datacenters, from the project's
    all-reduce cost: allreduce_parts('ring', bytes, n=M, bandwidth) with the bandwidth in
    bytes/s = Gbit/s x 1e9 / 8 and no latency (the page's alpha = 0)."""
    bw_part, lat_part = allreduce_parts("ring", n_params * bytes_per_param, int(m), bw_gbps * 1e9 / 8, 0.0)
    return bw_part + lat_part


def closed_cu(h, bpp, s, p, bw_gbps, n_b, t_step, m) -> float:
    """The page's utilization (percent) from closed forms of its timeline simulation:
    K = 128 buckets released through the backward pass (T_bwd = 2T/3, bucket k at
    T/3 + (k+1)/K T_bwd) into one FIFO link; a step stalls by how late its last bucket
    finishes, stall(C) = max(C/K, C - (K-1)/K T_bwd); DiLoCo syncs on the floor(2000/H) steps
    with (step+1) % H == 0; a Streaming fragment (C/P, deadline (tau+1) T) stalls by
    max(0, max(T + C/(P K), T/3 + T_bwd/K + C/P) - (tau+1) T), once per fragment sent."""
    c = transfer_seconds(n_b * 1e9, bpp, m, bw_gbps)
    t_fwd, t_bwd = t_step / 3, t_step * 2 / 3
    compute = N_STEPS * t_step
    if c == 0.0:
        return 100.0
    if h == 1:
        stall = N_STEPS * max(c / K_BUCKETS, c - (K_BUCKETS - 1) / K_BUCKETS * t_bwd)
    elif s > 0 or p > 1:
        if h / p < s + 1:
            raise ValueError("closed_cu: fragments overlap in flight (H/P < tau+1); the closed form does not hold")
        one = max(t_step + c / (p * K_BUCKETS), t_fwd + t_bwd / K_BUCKETS + c / p) - (s + 1) * t_step
        stall = fragment_sends(h, p) * max(0.0, one)
    else:
        stall = (N_STEPS // h) * max(c / K_BUCKETS, c - (K_BUCKETS - 1) / K_BUCKETS * t_bwd)
    return 100.0 * compute / (compute + stall)


def js_cu(h, bpp, s, p, bw_gbps, n_b, t_step, m) -> float:
    """A line-by-line port of the page's calculateCore + simulateDP / simulateDiLoCo /
    simulateStreamingDiLoCo (same operations in the same order: JS numbers are IEEE doubles,
    as Python floats, so the result is the page's bit for bit)."""
    n = n_b * 1e9
    t_fwd, t_bwd = t_step / 3, t_step * 2 / 3
    k_b = K_BUCKETS
    s_total = n * bpp * 8
    b_bps = bw_gbps * 1e9
    factor = 2 * (1 - 1 / m) if m > 1 else 0
    offs = [t_fwd + ((k + 1) / k_b) * t_bwd for k in range(k_b)]
    net_free = 0.0
    t = 0.0
    stall_total = 0.0
    compute = 0.0
    if h == 1:
        size = (s_total / k_b) * factor
        dur = 0 + size / b_bps
        jobs_per_step = size > 0
    elif s > 0 or p > 1:
        frag = s_total / p
        fi = h / p
        size = (frag * factor) / k_b
        dur = 0 + size / b_bps
    else:
        size = (s_total * factor) / k_b
        dur = 0 + size / b_bps
    for step in range(N_STEPS):
        step_start = t
        send, deadline = False, 0.0
        if h == 1:
            send, deadline = jobs_per_step, step_start + t_step
        elif s > 0 or p > 1:
            cur = math.floor((step % h) / fi)
            prev = math.floor(((step - 1 + h) % h) / fi)
            if (step == 0 or cur != prev) and frag * factor > 0:
                send, deadline = True, step_start + (s + 1) * t_step
        elif (step + 1) % h == 0 and s_total * factor > 0:
            send, deadline = True, step_start + t_step
        if send:
            max_stall = 0.0
            for off in offs:
                start = max(step_start + off, net_free)
                fin = start + dur
                net_free = fin
                st_ = max(0, fin - deadline)
                max_stall = max(max_stall, st_)
            t += max_stall
            stall_total += max_stall
        t += t_step
        compute += t_step
    return (compute / (compute + stall_total)) * 100


def bisect_bandwidth(cu_of, target: float) -> tuple[float | None, int]:
    """The page's findBandwidthForUtilization: bisection on [0.1, 100000] Gbps that stops at the
    first midpoint whose CU is within 0.5 percentage points of the target (not the root);
    (bandwidth or None, evaluations)."""
    low, high, best = MIN_BW, MAX_BW, None
    for it in range(MAX_ITER):
        mid = (low + high) / 2
        u = cu_of(mid)
        if abs(u - target) < TOL_PP:
            return mid, it + 1
        if u < target:
            low = mid
        else:
            high = mid
            best = mid
    return best, MAX_ITER


def js_to_fixed(x: float, digits: int) -> str:
    """Number.prototype.toFixed: the exact decimal value of the double, rounded half up."""
    q = decimal.Decimal(1).scaleb(-digits)
    return str(decimal.Decimal(x).quantize(q, rounding=decimal.ROUND_HALF_UP))


def format_bandwidth(bw: float | None) -> str:
    """The page's formatBandwidth: null '> 1000'; < 1: toFixed(2); < 10: toFixed(1); else Math.round."""
    if bw is None:
        return "> 1000"
    if bw < 1:
        return js_to_fixed(bw, 2)
    if bw < 10:
        return js_to_fixed(bw, 1)
    return str(math.floor(bw + 0.5))


def sim_douillard(policy: str, m: float, t_step: float, nbytes: int, bw_gbps: float, overlap: bool, rounds: int) -> float:
    """The project's simulator on the calculator's scenario: M workers (one per datacenter) of
    constant step time on a ring all-reduce at B Gbit/s, no latency; goodput in percent."""
    cl = st.cluster.constant(int(m), t_step).allreduce("ring", bw_gbps * 1e9 / 8, 0.0)
    s = st.simulate_schedule(policy, cl, num_updates=rounds, seed=0, payload_bytes=nbytes, overlap=overlap)
    return 100.0 * s.summary()["goodput"]


def part_douillard(quick: bool, log) -> tuple[dict, list]:
    checks = []
    tables, sims = {}, {}
    printed_bad, raw_bad, port_bad, c_rel = [], [], [], 0.0
    js_evals = 0
    for setting in SETTINGS:
        name, n_b, t_step, m = setting[:4]
        tables[name] = {}
        for label, h, s, p in methods_of(setting):
            cells = []
            for i, th in enumerate(THRESHOLDS):
                bw, it = bisect_bandwidth(lambda g: closed_cu(h, 2.0, s, p, g, n_b, t_step, m), th)
                text = format_bandwidth(bw)
                want_text, want_raw = PAGE[name][label][i]
                if text != want_text:
                    printed_bad.append(f"{name} {label} {th}%: {text} vs page {want_text}")
                if bw != want_raw:
                    raw_bad.append(f"{name} {label} {th}%: {bw!r} vs page {want_raw!r}")
                cell = {"threshold": th, "printed": text, "raw": bw, "iterations": it, "page_printed": want_text,
                        "page_raw": want_raw, "cu_at_raw": closed_cu(h, 2.0, s, p, bw, n_b, t_step, m)}
                # second path: the JS port's own bisection (DP costs 256k queue jobs per evaluation:
                # quick mode runs it on the defaults only)
                if not quick or name == "defaults" or h != 1:
                    jbw, jit = bisect_bandwidth(lambda g: js_cu(h, 2.0, s, p, g, n_b, t_step, m), th)
                    js_evals += jit
                    cell["js_port_raw"] = jbw
                    if jbw != want_raw:
                        port_bad.append(f"{name} {label} {th}%: {jbw!r} vs page {want_raw!r}")
                cells.append(cell)
            tables[name][label] = cells
        # C from the project's all-reduce vs the page's bits x 2(1-1/M) / (B 1e9)
        for g in (0.1, 1.0, 10.0, 100.0):
            mine = transfer_seconds(n_b * 1e9, 2.0, m, g)
            page = (n_b * 1e9 * 2 * 8 * (2 * (1 - 1 / m))) / (g * 1e9)
            c_rel = max(c_rel, abs(mine - page) / page)
    # CU curves at the defaults: closed form and JS port vs the page's values
    cu_bad = 0.0
    d = SETTINGS[0]
    for g, vals in PAGE_CU_DEFAULTS.items():
        for (label, h, s, p), want in zip(methods_of(d), vals):
            for fn in (closed_cu, js_cu):
                cu_bad = max(cu_bad, abs(fn(h, 2.0, s, p, g, *d[1:4]) - want))
    n_cells = sum(len(c) for t in tables.values() for c in t.values())
    checks.append(Agreement("Douillard table from closed forms + allreduce_parts (printed)", "the page's printed table",
                            float(len(printed_bad)), 0.0, f"cells that differ (of {n_cells})", "printed digits",
                            "; ".join(printed_bad[:3])))
    checks.append(Agreement("Douillard table from closed forms + allreduce_parts (raw bisection value)",
                            "the page's raw bisection value", float(len(raw_bad)), 0.0, f"cells that differ (of {n_cells})",
                            "same bisection decisions give the same midpoint bit for bit", "; ".join(raw_bad[:3])))
    checks.append(Agreement("line-by-line JS port of the page's timeline (bisection)", "the page's raw bisection value",
                            float(len(port_bad)), 0.0, "cells that differ", "IEEE doubles on both sides",
                            "; ".join(port_bad[:3])))
    checks.append(Agreement("transfer time C from allreduce_parts('ring', n=M)", "page: bits x 2(1-1/M) / (B x 1e9)",
                            c_rel, 1e-12, "max relative difference", "same quantity, different rounding"))
    checks.append(Agreement("CU (percent) at 0.1-1000 Gbps, defaults: closed form and JS port",
                            "the page's calculateCore", cu_bad, 1e-9, "max |difference| in percentage points",
                            "closed form vs the queue differ by float rounding only"))
    log(f"[douillard] {n_cells} cells: printed differ {len(printed_bad)}, raw differ {len(raw_bad)}, JS port differs "
        f"{len(port_bad)} ({js_evals} timeline evaluations); C rel {c_rel:.1e}; CU max diff {cu_bad:.1e} pp")

    # the project's simulator on the same scenario: what it gives and why it differs
    for setting in SETTINGS:
        name, n_b, t_step, m, dh = setting[:5]
        nbytes = int(round(n_b * 1e9 * 2))
        rows = {}
        for label, pol, rounds in (("Data Parallel", "bsp", 20), ("DiLoCo", f"diloco:{dh}", 8)):
            row = {}
            for overlap in (False, True):
                fn = lambda g, pol=pol, ov=overlap, r=rounds: sim_douillard(pol, m, t_step, nbytes, g, ov, r)
                need = [bisect_bandwidth(fn, th)[0] for th in THRESHOLDS]
                row["overlap" if overlap else "no_overlap"] = {"printed": [format_bandwidth(x) for x in need],
                                                               "raw": need}
            # at the page's bandwidths: the page's CU vs the simulator's
            page_bw = [c["page_raw"] for c in tables[name][label]]
            row["at_page_bandwidth"] = [{"gbps": g, "page_cu": c["cu_at_raw"],
                                         "sim_no_overlap": sim_douillard(pol, m, t_step, nbytes, g, False, rounds),
                                         "sim_overlap": sim_douillard(pol, m, t_step, nbytes, g, True, rounds)}
                                        for g, c in zip(page_bw, tables[name][label])]
            rows[label] = row
        sims[name] = rows
    # the simulator without overlap is H T / (H T + C) (DiLoCo) and T / (T + C) (DP): checked
    sim_rel = 0.0
    for setting in SETTINGS:
        name, n_b, t_step, m, dh = setting[:5]
        for g in (0.5, 5.0, 50.0, 500.0):
            c = transfer_seconds(n_b * 1e9, 2.0, m, g)
            for pol, h in (("bsp", 1), (f"diloco:{dh}", dh)):
                want = 100 * h * t_step / (h * t_step + c)
                got = sim_douillard(pol, m, t_step, int(round(n_b * 2e9)), g, False, 8)
                sim_rel = max(sim_rel, abs(got - want) / want)
    checks.append(Agreement("simulate_schedule on the calculator's scenario (no overlap)", "H T / (H T + C)",
                            sim_rel, REL_TOL, "max relative difference", "exact arithmetic, float rounding only"))
    return {"tables": tables, "simulator": sims,
            "fragment_sends": {f"H={s[5]} P={s[6]}": fragment_sends(s[5], s[6]) for s in SETTINGS[:1]},
            "diloco_syncs": {s[0]: N_STEPS // s[4] for s in SETTINGS}}, checks


# =============================================================================================
# report
# =============================================================================================
def pct(x: float, d: int = 2) -> str:
    return f"{100 * x:.{d}f}%"


def plot(res: dict, out: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:   # noqa: BLE001 -- the report is written without the figure
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    rows = [r for r in res["measured"]["rows"] if r["repeat"] == 0]
    labels = [f"H{r['H']}\n{r['level']}" for r in rows]
    x = np.arange(len(rows))
    for key, name, mk in (("analytic", "analytic (diloco-measured) = simulator, links", "o"),
                          ("ring", "+ ring all-reduce (1.5x bytes)", "s"),
                          ("ring_latency", "+ latency per ring step (fitted)", "^"),
                          ("jitter", "+ compute jitter", "v"),
                          ("window", "+ the measurement window's accounting", "D"),
                          ("first_collective", "+ the first collective's measured extra", "x")):
        ax.plot(x, [r[key] / r["measured"] for r in rows], mk + "-", ms=4, lw=1, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("CU model / CU measured")
    ax.set_title("diloco-measured (r0): the gap, step by step in the simulator", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1]
    setting = SETTINGS[0]
    gs = np.logspace(-1, 3, 81)
    n_b, t_step, m = setting[1:4]
    for (label, h, s, p), col in zip(methods_of(setting), ("C0", "C3", "C1")):
        ax.plot(gs, [closed_cu(h, 2.0, s, p, g, n_b, t_step, m) for g in gs], color=col, label=f"page: {label}")
    nbytes = int(n_b * 2e9)
    for label, pol, col in (("Data Parallel", "bsp", "C0"), ("DiLoCo", f"diloco:{setting[4]}", "C3")):
        ax.plot(gs, [sim_douillard(pol, m, t_step, nbytes, g, False, 4) for g in gs], "--", color=col,
                label=f"simulator, no overlap: {label}")
        ax.plot(gs, [sim_douillard(pol, m, t_step, nbytes, g, True, 4) for g in gs], ":", color=col,
                label=f"simulator, overlap=True: {label}")
    ax.set_xscale("log")
    ax.set_xlabel("inter-datacenter bandwidth (Gbit/s)")
    ax.set_ylabel("compute utilization (%)")
    ax.set_title("Douillard's calculator (defaults) vs the project's simulator", fontsize=10)
    ax.legend(fontsize=6.5)
    fig.tight_layout()
    path = out / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


CONVENTIONS_MEASURED = [
    "CU = H t / (H t + bytes_synced x 8 / B) (src/diloco_measured/analysis/cu.py::analytic); in the simulator: "
    "`diloco:H` on 4 workers of constant step time t (`st.cluster.constant(4, t)`), so an iteration is H inner "
    "steps of t, and goodput = compute / (4 x end time) is the CU of equal workers",
    "t = mean compute seconds per step over the kept steps (the warmup steps, 2-20 of them, discarded), from the raw "
    "telemetry: sum(compute_time_ms)/1000/len (aggregate_shaped_grid.py)",
    "B = int(shaping.measured_bps): the iperf3-verified rate of the shaped link (e.g. 992,606,801 bit/s at '1g'), "
    "not the nominal rate; decimal bits/s; the simulator's bandwidth is in bytes/s = B / 8 "
    "(`parse_bandwidth('1gbps')` = 1.25e8 B/s: 'gbps' is 1e9 bits/s)",
    "bytes_synced = n_params x 4 = 123,386,880 B (fp32 pseudo-gradient, 30,846,720 parameters)",
    "one transfer of bytes_synced per sync, no ring factor: in the simulator a push of bytes_synced over each "
    "worker's own link (`links(B/8, 0)`), pull 0 bytes, no latency, no overlap (the sync blocks)",
    "measured CU = sum(compute_time_ms) / sum(wall_time_ms) over the kept steps of rank 0 (cu.py::measured): a "
    "window of K steps holding the syncs that fall in it (e.g. H=32: 140 steps, 4 syncs, not 140/32 = 4.375)",
]


def write_markdown(path: Path, res: dict, meta: dict, png: str | None) -> None:
    m, d = res["measured"], res["douillard"]
    L = [f"# Reproducing the DiLoCo bandwidth calculators with the project's network model", "",
         f"Produced by `benchmarks/{NAME}.py`; every number below is computed by the script from this run "
         f"(`{NAME}.json`).", "",
         f"- command: `{meta['command']}`", f"- wall time: {meta['wall']:.1f} s",
         f"- versions: python {sys.version.split()[0]}, numpy {np.__version__}, staleness {st.__version__}",
         f"- verdict: **{'ALL REPRODUCED' if meta['agree'] else 'DISAGREEMENT (see the checks)'}**", "",
         "## Sources", "",
         f"- diloco-measured: `{res['source']['repo']}` @ `{res['source']['commit'][:7]}`: raw step telemetry "
         "`experiments/01_cu_grid/raw_step_telemetry_shaped/<run>.json`, records `results/raw/<run>.json` (shaping "
         "block, stored `cu`), `experiments/01_cu_grid/aggregate_shaped_grid.py`, `src/diloco_measured/analysis/cu.py`, "
         "README.md; derived inputs of every run (with the source paths) in `benchmarks/data/diloco_measured_runs.json`.",
         "- Douillard's DiLoCo Bandwidth Simulator: `github.com/arthurdouillard/arthurdouillard.github.io`, "
         "`diloco/index.html` @ `9049612` (2026-02-19), served at arthurdouillard.com/diloco; the page's printed "
         "table and raw values in the script (`PAGE`) come from its own JS functions (calculateCore .. "
         "findBandwidthForUtilization, formatBandwidth, extracted verbatim) run in node 20, not from a browser.",
         "- background: /work/notes/diloco_calculators_research.md.", "",
         "## Checks", "", "| first | second | measured | tolerance | agree |", "|---|---|---|---|---|"]
    for c in meta["checks"]:
        L.append(f"| {c['first']} | {c['second']} | {c['what'].replace('|', '&#124;')}: {c['measured']:.3g} | {c['tolerance']:g} | "
                 f"{'yes' if c['agree'] else '**NO**'} |")
    # ---- part 1
    rows0 = [r for r in m["rows"] if r["repeat"] == 0]
    L += ["", "## 1. diloco-measured: the analytic CU in the simulator", "",
          "Conventions matched (each one needed for the digits):", ""]
    L += [f"- {c}" for c in CONVENTIONS_MEASURED]
    L += ["", f"Runs: the 16 first-pass (r0) points{'' if m['repeats'] == [0] else ' (table) and the repeats r1, r2 (checks, JSON)'}. "
          "`analytic` is diloco-measured's `cu_analytic_link` recomputed from the derived inputs (equal to the stored "
          "value), `simulator` the goodput of `simulate_schedule` on the cluster shown, `measured` its `cu_measured`.", "",
          "| H | level | t (ms) | B (bit/s) | analytic | simulator | measured | analytic / measured | cluster |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows0:
        L.append(f"| {r['H']} | {r['level']} | {r['t_compute_ms']:.3f} | {r['bandwidth_bps']:,} | {r['analytic']:.6f} | "
                 f"{r['sim_links']:.6f} | {r['measured']:.6f} | {r['analytic'] / r['measured']:.3f} | `{r['cluster']}` |")
    r0 = [r for r in m["rows"] if r["repeat"] == 0]
    disc = [r["analytic"] / r["measured"] for r in r0]
    L += ["", f"The README's measured table (\"median of 3 repeats\") equals these r0 values to its printed digit "
          f"(checked), and the r0 discrepancies span {min(disc):.3f}-{max(disc):.3f}, its '1.08x-1.92x'"
          + ("" if m["repeats"] == [0] else
             f"; over all {len(m['rows'])} runs {min(r['analytic'] / r['measured'] for r in m['rows']):.3f}-"
             f"{max(r['analytic'] / r['measured'] for r in m['rows']):.3f}") + "."]
    fit = m["latency_fit"]
    L += ["", "## 1b. The measured/analytic gap, and what the simulator says", "",
          "Each column adds one thing to the previous one and gives the simulator's CU over the measured CU "
          "(1.000 = the gap is explained):", "",
          "- `analytic`: diloco-measured's model (= the simulator with per-worker links, above);",
          f"- `+ring`: the sync is a ring all-reduce (`+allreduce=ring:B:0`): each worker sends and receives "
          f"2(P-1)/P = 1.5 x bytes_synced (P = 4) — methods/wire_model.md §2 of the repo states this byte count, the "
          "analytic model leaves it out on purpose;",
          f"- `+latency`: a latency per ring step, {fit['latency_s'] * 1e3:.2f} ms (2(P-1) = 6 steps: "
          f"{6 * fit['latency_s'] * 1e3:.1f} ms per sync), **fitted** here: the median over the "
          f"{fit['syncs']} steady-state syncs at 1 and 5 Gbit/s (r0; each run's first collective excluded) of "
          f"(blocked time − ring bandwidth part) / 6 (1g alone {fit['per_level_s']['1g'] * 1e3:.2f} ms, 5g alone "
          f"{fit['per_level_s']['5g'] * 1e3:.2f} ms). The trainer all-reduces each of the model's tensors "
          "separately (`for g in pseudo_grads: dist.all_reduce(g)`), so this is many small collectives' fixed costs "
          "lumped into one;",
          "- `+jitter`: lognormal compute jitter from rank 0's telemetry, σ = std(log step compute time) per step; the "
          "simulator draws one factor per iteration (H steps), so σ/√H (independent steps) is used; the round waits "
          "for the slowest of the 4 workers; mean of the seeds;",
          "- `+window`: the CU counted as diloco-measured counts it, over the kept steps only (rank 0, from the "
          "simulated schedule): K steps and the syncs that fall in them;",
          "- `overlap`: what-if, not an explanation (the runs block on the sync): the simulator with `overlap=True` "
          "(the all-reduce's data phase starts with the round's compute, so up to H t of it is hidden).", "",
          "| H | level | analytic | +ring | +latency | +jitter | +window | +first collective | measured CU | "
          "overlap (what-if) CU | effective rate / B | first collective extra (s) | unexplained wall (s) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows0:
        fs = "—" if r["first_sync_extra_s"] is None else f"{r['first_sync_extra_s']:+.3f}"
        eff = "—" if r["bandwidth_efficiency"] is None else f"{r['bandwidth_efficiency']:.3f}"
        L.append(f"| {r['H']} | {r['level']} | {r['analytic'] / r['measured']:.3f} | {r['ring'] / r['measured']:.3f} | "
                 f"{r['ring_latency'] / r['measured']:.3f} | {r['jitter'] / r['measured']:.3f} | "
                 f"{r['window'] / r['measured']:.3f} | {r['first_collective'] / r['measured']:.3f} | "
                 f"{pct(r['measured'])} | {pct(r['overlap'])} | {eff} | {fs} | {r['residual_wall_s']:.3f} |")
    L += ["", "`+first collective`: the measured extra blocked time of the run's first collective (step H−1; inside "
          "the window only at H = 32 and 128; the extra over the median steady-state sync of the same bandwidth level "
          "and repeat) added to the simulated window's wall time — measured, not simulated (the simulator has no "
          "one-time set-up cost). `effective rate / B`: the ring bandwidth part over (the run's median steady-state "
          "sync time − the fitted latency part): the share of the iperf3-verified rate the all-reduce got (— : no "
          "steady-state sync in the window). `unexplained wall`: the window's measured wall time − the simulator's "
          "(`+window`) − the first collective's extra, at the same compute.", ""]
    L += summary_gap(m)
    if png:
        L += ["", f"![gap and calculator curves]({png})"]
    # ---- part 2
    L += ["", "## 2. Douillard's DiLoCo Bandwidth Simulator", "",
          "Conventions matched (each one needed for the digits):", "",
          "- the transfer time of one full synchronization, C = 2(M−1)/M x N x 2 bytes / (B x 1e9 / 8) s: "
          "`allreduce_parts('ring', N x 2, n=M, B x 1e9/8, 0)` (the page: bits x 2(1−1/M) / (B x 1e9); checked equal "
          "to 1e-12); decimal Gbit/s; no latency (the page's alpha = 0 since commit cb0921d); M = 1 sends nothing;",
          "- N = billions x 1e9 parameters, bf16 = 2 bytes per value for all three methods; step time T = 1 s, "
          "forward T/3, backward T_bwd = 2T/3;",
          "- 128 buckets of C/128 released through the backward pass (bucket k at T/3 + (k+1)/128 x T_bwd) into one "
          "FIFO link whose state persists; a step stalls by how late its last bucket finishes: "
          "stall(C) = max(C/128, C − 127/128 x T_bwd);",
          "- Data Parallel syncs every step (deadline the end of the step); DiLoCo on the steps with "
          f"(step+1) % H = 0 of 2000 simulated steps: floor(2000/H) syncs ({d['diloco_syncs']['defaults']} at H=30, "
          "not 2000/30 = 66.7), the outer sync also overlapped with that step's backward pass;",
          "- Streaming DiLoCo: one fragment of C/P every H/P = 6.25 steps (a slot change of floor((step % H)/(H/P)), "
          f"{d['fragment_sends']['H=100 P=16']} fragments in 2000 steps at H=100, P=16), deadline (τ+1) T after the "
          "step it leaves: stall_f = max(0, max(T + C/(128P), T/3 + T_bwd/128 + C/P) − (τ+1) T);",
          "- CU = 2000 T / (2000 T + total stall) in percent; the table's cell is the page's bisection on "
          "[0.1, 100000] Gbit/s that **stops at the first midpoint within ±0.5 percentage points** of the threshold "
          "(not the root; at most 50 halvings; null → '> 1000');",
          "- display: < 1 → toFixed(2), < 10 → toFixed(1), else Math.round (both round half up, emulated exactly).", ""]
    for name, tab in d["tables"].items():
        L += [f"**{name}** — printed (raw bisection value); page: the page's printed value", "",
              "| method | " + " | ".join(f"{t}%" for t in THRESHOLDS) + " |", "|---|" + "---|" * len(THRESHOLDS)]
        for label, cells in tab.items():
            L.append(f"| {label} | " + " | ".join(
                f"{c['printed']} ({c['raw']:.5g}){'' if c['printed'] == c['page_printed'] else ' ≠ page ' + c['page_printed']}"
                for c in cells) + " |")
        L.append("")
    L += ["### What the project's simulator says on the same scenario", "",
          "M workers (one per datacenter) of T = 1 s per step on `+allreduce=ring:B:0`, bytes = N x 2; "
          "`bsp` for Data Parallel, `diloco:H` for DiLoCo; the bandwidth found by the page's own bisection applied to "
          "the simulator's goodput (so only the timing model differs). Streaming DiLoCo at H=100, P=16 cannot be "
          "expressed: the project's `streaming_diloco` needs H to be a multiple of P (one fragment every whole "
          "H/P steps; the page sends one every 6.25 steps).", "",
          "| setting | method | simulator | " + " | ".join(f"{t}%" for t in THRESHOLDS) + " |",
          "|---|---|---|" + "---|" * len(THRESHOLDS)]
    for name, rows in d["simulator"].items():
        for label, row in rows.items():
            L.append(f"| {name} | {label} | page | " + " | ".join(c["page_printed"] for c in d["tables"][name][label]) + " |")
            for key, txt in (("no_overlap", "no overlap"), ("overlap", "overlap=True")):
                L.append(f"| {name} | {label} | {txt} | " + " | ".join(row[key]["printed"]) + " |")
    dd = d["simulator"]["defaults"]
    L += ["", "At the page's own bandwidths (defaults), the page's CU vs the simulator's:", "",
          "| method | Gbit/s | page CU | simulator, no overlap | simulator, overlap=True |", "|---|---|---|---|---|"]
    for label, row in dd.items():
        for c in row["at_page_bandwidth"]:
            L.append(f"| {label} | {c['gbps']:.4g} | {c['page_cu']:.2f}% | {c['sim_no_overlap']:.2f}% | "
                     f"{c['sim_overlap']:.2f}% |")
    L += ["", "Why they differ (conventions, not errors): without overlap the simulator's CU is H T / (H T + C) "
          "(checked to 1e-9): the whole sync stalls. The page hides all but max(C/128, C − 127/128 x T_bwd) of each "
          "sync behind the backward pass of the sync step, so at the same bandwidth it reports a higher CU; the "
          "difference is large for Data Parallel (C is paid every step) and small for DiLoCo at the low thresholds "
          "(2/3 s hidden out of C ≈ 30 s at 50%). With `overlap=True` the simulator starts the data phase with the "
          "round's compute (the whole step for `bsp`, the whole H-step round for `diloco`) rather than with the "
          "backward pass's buckets, so it hides more than the page: DiLoCo reaches 100% as soon as C <= H T (the "
          "outer gradient of a round cannot really leave before the round ends — `overlap=True` credits what "
          "one-step-delayed outer updates would give). The page also counts floor(2000/H) syncs in 2000 steps where "
          "the simulator runs whole rounds, and its '> 1000' means 'not reached at 100000 Gbit/s'."]
    path.write_text("\n".join(L) + "\n")


def summary_gap(m: dict) -> list[str]:
    rows0 = [r for r in m["rows"] if r["repeat"] == 0]
    by = {}
    for r in rows0:
        by.setdefault(r["level"], []).append(r)
    L = ["Diagnosis, per bandwidth level (r0; ratios = simulator CU / measured CU, median over H):", ""]
    for lvl in LEVELS:
        rs = by.get(lvl, [])
        if not rs:
            continue
        med = lambda k: statistics.median(r[k] / r["measured"] for r in rs)
        effs = [r["bandwidth_efficiency"] for r in rs if r["bandwidth_efficiency"] is not None]
        L.append(f"- {lvl}: analytic {med('analytic'):.3f} → +ring {med('ring'):.3f} → +latency "
                 f"{med('ring_latency'):.3f} → +jitter {med('jitter'):.3f} → +window {med('window'):.3f} → +first "
                 f"collective {med('first_collective'):.3f}; the all-reduce got {statistics.median(effs):.3f} of the "
                 "iperf3 rate")
    share = []
    for r in rows0:
        tot = math.log(r["analytic"] / r["measured"])
        share.append({k: math.log(a / b) / tot for k, a, b in (
            ("ring", r["analytic"], r["ring"]), ("latency", r["ring"], r["ring_latency"]),
            ("jitter", r["ring_latency"], r["jitter"]), ("window", r["jitter"], r["window"]),
            ("first collective", r["window"], r["first_collective"]))})
    keys = ("ring", "latency", "jitter", "window", "first collective")
    L += ["", "Share of the gap (in log CU) per step, median over the 16 points: " + ", ".join(
        f"{k} {statistics.median(s[k] for s in share):+.0%}" for k in keys) + "; left unexplained "
        f"{statistics.median(1 - sum(s[k] for k in keys) for s in share):+.0%} (negative: a step overshoots).",
        "", "- The ring all-reduce's 1.5x bytes is most of the gap everywhere; at 1 and 5 Gbit/s, with the fitted "
        "latency, the simulator reproduces H = 1 and 8 to within a few percent (1.00-1.02).",
        "- Jitter: the measured per-step compute σ is 0.5-1.8%, a few tenths of a millisecond per round: no visible "
        "share (even with σ unreduced per round, i.e. fully correlated steps, the ratios move by < 0.1%: JSON "
        "`jitter_correlated`).",
        "- The window: diloco-measured counts only the syncs that fall in its kept steps (H = 128: 1 sync in 180 "
        "steps, where the steady state has 180/128 = 1.41; H = 32: 4 in 140, not 4.375; H = 8: 17 in 140, not 17.5), "
        "which makes its measured CU *higher* than the steady-state CU that the analytic formula and the simulator's "
        "goodput describe. Before this step the simulator is *below* the measurement at H = 128 (ratios 0.86-0.96): "
        "the analytic formula's gap there is smaller than its real error. Counting the same window raises the "
        "model's CU (the `+window` column).",
        "- The first collective: the run's first all-reduce costs ~0.3-0.4 s more than the steady state at 1 and "
        "5 Gbit/s (consistent with NCCL creating its communicator at the first collective — the driver calls "
        "init_process_group without a device — not verified); it is inside the window only at H = 32 and 128 "
        "(its step H−1 is after the warmup), and it is most of what is left there.",
        "- Not modelled, and left as the residual: at 50 and 200 Mbit/s the all-reduce gets only ~0.8 and ~0.9 of "
        "the iperf3-verified rate (a shortfall proportional to the bytes — NCCL's sockets through the tbf shaper; "
        "no latency produces it): the 50m points stay at ~1.2-1.3 and the 200m points at ~1.1. The simulator "
        "represents this only as a lower bandwidth (B x 0.8), which would be fitting the answer."]
    return L


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="r0 runs only, 2 jitter seeds, the JS port's data-parallel "
                                                         "bisection on the defaults only")
    ap.add_argument("--derive", action="store_true", help=f"rebuild {DATA.relative_to(ROOT)} from the mirrored repo first")
    ap.add_argument("--mirror", default=str(MIRROR), help="git directory of the Adnan082/diloco-measured mirror")
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/results; quick: runs/...)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    command = shlex.join(["python", f"benchmarks/{NAME}.py", *(sys.argv[1:] if argv is None else argv)])

    def log(msg):
        print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)

    if args.derive:
        data = derive(Path(args.mirror))
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        log(f"wrote {DATA} ({len(data['runs'])} runs)")
    data = json.loads(DATA.read_text())
    out = Path(args.out) if args.out else (ROOT / "runs" / f"{NAME}_quick" if args.quick else ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)

    checks = [Agreement("parse_bandwidth('1gbps'), ('125MB/s')", "1e9 bits/s / 8 = 1.25e8 bytes/s",
                        max(abs(parse_bandwidth("1gbps") - 1.25e8), abs(parse_bandwidth("125MB/s") - 1.25e8)), 0.0,
                        "max |difference| (B/s)", "the unit convention the script relies on")]
    res = {"source": data["source"]}
    ts = time.perf_counter()
    res["measured"], c1 = part_measured(data, (0,) if args.quick else (0, 1, 2), 2 if args.quick else 8, log)
    t_measured = time.perf_counter() - ts
    ts = time.perf_counter()
    res["douillard"], c2 = part_douillard(args.quick, log)
    t_douillard = time.perf_counter() - ts
    checks += c1 + c2
    png = plot(res, out)
    wall = time.perf_counter() - t0
    agree = all(c.ok for c in checks)
    meta = {"command": command, "wall": wall, "agree": agree, "checks": [c.record() for c in checks]}
    res["_meta"] = {**meta, "quick": args.quick, "part_wall_s": {"measured": t_measured, "douillard": t_douillard}}
    (out / f"{NAME}.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    write_markdown(out / f"{NAME}.md", res, meta, png)

    # console summary
    rows0 = [r for r in res["measured"]["rows"] if r["repeat"] == 0]
    print("diloco-measured r0: H level | analytic  simulator | measured | analytic/measured -> after ring, "
          "+latency, +jitter, +window, +first collective")
    for r in rows0:
        print(f"  H={r['H']:<3} {r['level']:>4} | {r['analytic']:.6f} {r['sim_links']:.6f} | {r['measured']:.6f} | "
              f"{r['analytic'] / r['measured']:.3f} -> {r['ring'] / r['measured']:.3f} {r['ring_latency'] / r['measured']:.3f} "
              f"{r['jitter'] / r['measured']:.3f} {r['window'] / r['measured']:.3f} {r['first_collective'] / r['measured']:.3f}")
    for name, tab in res["douillard"]["tables"].items():
        print(f"Douillard {name}:")
        for label, cells in tab.items():
            print(f"  {label:<17} " + "  ".join(f"{c['printed']:>5}" for c in cells)
                  + ("" if all(c["printed"] == c["page_printed"] for c in cells) else "   (page: "
                     + " ".join(c["page_printed"] for c in cells) + ")"))
    print(f"wrote {out / f'{NAME}.md'}; wall {wall:.1f} s")
    fit = res["measured"]["latency_fit"]
    finish({"benchmark": NAME, "quick": args.quick, "wall_s": round(wall, 1),
            "runs": len(res["measured"]["rows"]),
            "douillard_cells": sum(len(c) for t in res["douillard"]["tables"].values() for c in t.values()),
            "latency_fit_ms": round(fit["latency_s"] * 1e3, 3),
            "gap_r0": {"analytic": [round(min(r["analytic"] / r["measured"] for r in rows0), 3),
                                    round(max(r["analytic"] / r["measured"] for r in rows0), 3)],
                       "after_ring_latency_jitter_window": [round(min(r["window"] / r["measured"] for r in rows0), 3),
                                                            round(max(r["window"] / r["measured"] for r in rows0), 3)],
                       "after_first_collective": [round(min(r["first_collective"] / r["measured"] for r in rows0), 3),
                                                  round(max(r["first_collective"] / r["measured"] for r in rows0), 3)]}},
           checks)


if __name__ == "__main__":
    main()
