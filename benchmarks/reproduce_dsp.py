"""Reproduce the DSP findings (Xu, Huo, Huang, CVPR 2020) in the pipeline simulator.

A residual MLP split into K = 4 stages (one residual block per stage, the
input layer on stage 0 and the classifier on stage 3) trains on digits (and
MNIST-1D in the full run) along the schedules of `staleness.pipeline`:
backprop (reference), GPipe with 4 micro-batches, DDG, DSP(1,1,1,0) (lags
m = 6,4,2,0), DSP(2,2,2,0) (m = 12,8,4,0) and DSP(1,1,1,0) with PipeDream
weight stashing. Each schedule's learning rate (momentum SGD 0.9) is tuned on
a validation split of the training set (`staleness.pipeline.sweep.tune_lr`:
the grid, score and edge extension of `staleness.results.compare`), then every
schedule trains 5 seeds at its chosen rate (and at one common rate) and is
evaluated on the test set. A grid or a set of seeds is one compiled call
(`staleness.pipeline.sweep`).

A run's numbers do not depend on the cluster, so its time axis comes from
`simulate_timing` on three per-stage cluster models (constant speeds, stage 2
twice as slow, random transient stragglers) under the modelling alternatives
the verdicts are checked against: the recomputation of a stale backward (DSP,
GPipe's re-materialisation, weight stashing) charged as a full forward
(recompute_cost = 1) or fully overlapped (0, the paper's claim), and DDG with
its per-iteration barrier (Huo et al.'s Algorithm 1, the default) or without
(stages wait only for data). A verdict that one of these assumptions decides
reads "set by the model: ...". The timing models are printed against their
closed forms (GPipe against the fill/drain formula).

Writes `<out>/reproduce_dsp.md`, `<out>/reproduce_dsp_<task>.png` and
`<out>/reproduce_dsp_throughput.png` (atomically, `staleness.infra.files`); lists
every verdict that changed against the results file it replaces; ends with one
JSON line.

    python benchmarks/reproduce_dsp.py --jobs 2   # full: digits + MNIST-1D, one process per task (~14 min)
    python benchmarks/reproduce_dsp.py --quick    # smoke run (~5 min on 2 loaded cores), writes runs/reproduce_dsp_quick/
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

from _report import previous_verdicts, versions
import staleness.pipeline as pp
from staleness import cluster as C
from staleness.results import compare as _compare
from staleness.infra import files
from staleness.results import stats as S
from staleness.pipeline.sweep import TUNE_SCORE, sweep, tune_lr
from staleness.pipeline.timing import closed_form_time, recomputes

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_dsp"
K = 4

# trained schedules (distinct numbers); timed ones add variants with the numbers of a trained one
SCHEDULES = ["backprop", "gpipe:4", "ddg", "dsp:1,1,1,0", "dsp:2,2,2,0", "dsp:1,1,1,0+stash"]
NUMBERS_OF = {"ddg:nobarrier": "ddg", "gpipe:8": "gpipe:4"}   # timing-only: same numbers (same gradients)
TIMED = SCHEDULES[:3] + ["ddg:nobarrier"] + SCHEDULES[3:] + ["gpipe:8"]
DSP, STASH, GPIPE, DDG, DDG_FREE, BACKPROP = ("dsp:1,1,1,0", "dsp:1,1,1,0+stash", "gpipe:4", "ddg",
                                              "ddg:nobarrier", "backprop")
RECOMPUTE = (1.0, 0.0)
RC_NAME = {1.0: "recompute charged (rc=1)", 0.0: "recompute overlapped (rc=0)"}
DDG_NAME = {DDG: "DDG with its barrier", DDG_FREE: "DDG without barrier"}

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

# Learning rates: a grid around COMMON_LR (compare's factors), tuned per schedule and task on
# a validation split with compare's tuning seeds, extended past an edge up to compare.EXTEND
# times. COMMON_LR is also trained by every schedule for the equal-lr comparison.
COMMON_LR = 0.005
TASKS = {
    "digits-resmlp": dict(batches=1000, seeds=5, target=0.93, eval_every=40),
    "mnist1d-resmlp": dict(batches=2000, seeds=5, target=0.55, eval_every=80),
}
QUICK = {"digits-resmlp": dict(batches=300, seeds=5, target=0.85, eval_every=30)}
QUICK_FACTORS = (0.3, 1.0, 3.0)
BATCH_SIZE = 32

# Thresholds of the verdicts (stated in the report).
SIGNIFICANT = 1.2   # "significant speed-up": throughput (or time-to-target) ratio at least this
ACC_TOL = 0.01      # "no accuracy loss": DSP's median final accuracy at most 1 point below the reference


# -- running -----------------------------------------------------------------------
def tune_all(task: str, cfg: dict, bar) -> dict:
    """{schedule: tune_lr record} on the validation split of `task`."""
    ptask = pp.tasks.get(task, num_stages=K, batch_size=BATCH_SIZE)
    out = {}
    for spec in SCHEDULES:
        bar.set_postfix_str(f"{task} tune {spec}")
        out[spec] = tune_lr(ptask, spec, cfg["batches"], grid=[COMMON_LR * f for f in cfg["factors"]],
                            seeds=cfg["tune_seeds"], eval_every=cfg["eval_every"], extend=cfg["extend"])
        bar.update(1)
    return out


def train_all(task: str, cfg: dict, tuned: dict, bar) -> dict:
    """{(schedule, lr, seed): run dict} on the test set: each schedule at its tuned lr and at COMMON_LR."""
    ptask = pp.tasks.get(task, num_stages=K, batch_size=BATCH_SIZE)
    out = {}
    for spec in SCHEDULES:
        bar.set_postfix_str(f"{task} train {spec}")
        lrs = sorted({tuned[spec]["lr"], COMMON_LR})
        res = sweep(ptask, spec, cfg["batches"], lrs=lrs, seeds=list(range(cfg["seeds"])),
                    eval_every=cfg["eval_every"])
        for i, (lr, seed) in enumerate(res.members):
            ok = res.status[i] == "complete"
            out[(spec, lr, seed)] = {
                "status": res.status[i], "update": res.update, "accuracy": res.accuracy[i],
                # a diverged run counts as accuracy 0 in medians (it is also counted separately)
                "final": res.final(i) if ok else 0.0, "lags": tuple(res.plan.lags)}
        bar.update(1)
    return out


class _Log:
    """A progress 'bar' for worker processes: one line per finished sweep."""

    def __init__(self, task):
        self.task, self.n, self.t0, self.what = task, 0, time.perf_counter(), ""

    def set_postfix_str(self, what):
        self.what = what

    def update(self, n):
        self.n += n
        print(f"[{time.perf_counter() - self.t0:6.0f} s] done: {self.what}", flush=True)


def _train_in_worker(cache: str, task: str, cfg: dict):
    return cached(cache, task, cfg, lambda: _train(task, cfg, _Log(task)))


def _train(task: str, cfg: dict, bar):
    tuned = tune_all(task, cfg, bar)
    return tuned, train_all(task, cfg, tuned, bar)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the --jobs workers)."""
    import resource

    return sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
               for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def cached(cache: str, task: str, cfg: dict, compute):
    """compute() or its pickled result from an earlier run with the same task, settings,
    schedules, grid base and source of the training code (`cache` = '' : always compute)."""
    import hashlib
    import pickle

    if not cache:
        return compute(), None
    src = "".join(Path(m.__file__).read_text() for m in (pp.sweep, pp.sim, pp.stage, pp.plan, pp.schedules))
    key = hashlib.sha256(json.dumps([task, {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()},
                                     SCHEDULES, COMMON_LR, BATCH_SIZE, K], sort_keys=True).encode()
                         + src.encode()).hexdigest()[:16]
    path = Path(cache) / f"{task}-{key}.pkl"
    if path.is_file():
        print(f"{task}: training results from the cache {path}")
        stored = pickle.loads(path.read_bytes())
        return stored["out"], {"path": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                               "trained": stored["trained"], "wall_s": stored["wall_s"]}
    t0 = time.perf_counter()
    out = compute()
    files.write_with(path, lambda tmp: tmp.write_bytes(pickle.dumps(
        {"out": out, "trained": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "wall_s": time.perf_counter() - t0})))
    return out, None


def timelines(cfg: dict) -> dict:
    """{(schedule, cluster, recompute_cost, seed): Timeline} for the number of batches of `cfg`.

    Deterministic clusters are simulated once (seed 0) and shared by every seed; schedules
    that recompute nothing share one timeline over recompute costs."""
    out = {}
    n = cfg["batches"]
    for spec in TIMED:
        plan = pp.make_plan(pp.parse(spec), K, n)
        charged = any(recomputes(plan))
        for cname, cluster in CLUSTERS.items():
            random = cname == "stragglers"
            for rc in RECOMPUTE:
                for seed in range(cfg["seeds"]):
                    if (not random and seed > 0) or (not charged and rc != RECOMPUTE[0]):
                        out[(spec, cname, rc, seed)] = out[(spec, cname, rc if charged else RECOMPUTE[0],
                                                            seed if random else 0)]
                        continue
                    out[(spec, cname, rc, seed)] = pp.simulate_timing(plan, cluster, seed, recompute_cost=rc)
    return out


def memory_and_invariants(task: str) -> dict:
    """Per schedule: lags m_k, the plan's forward/backward gap and queue length per
    stage, and the bytes each stage stores between a forward and its backward."""
    import jax

    from staleness.engine import core
    from staleness.tasks.optim import resolve as resolve_optimizer
    from staleness.pipeline import sim
    from staleness.pipeline import stage as St

    ptask = pp.tasks.get(task, num_stages=K, batch_size=BATCH_SIZE)
    params = ptask.init_stage_params(core.keys(0)[0])
    ctx = St.Context(ptask, core.keys(0)[1])
    out = {}
    for spec in SCHEDULES + ["dsp:0,0,0,0"]:
        plan = pp.make_plan(pp.parse(spec), K, 50)
        _, carry = sim.init(ptask, plan, resolve_optimizer("momentum:0.9", 0.1), params, ctx)
        out[spec] = {"lags": list(plan.lags), "gaps": [int(g) for g in plan.gaps()],
                     "queue_max": [int(q) for q in plan.in_flight().max(0)],
                     "stored_bytes": sim.stored_bytes(carry), "backward": plan.schedule.backward,
                     "fwd": plan.fwd, "bwd": plan.bwd, "weights_bytes": [
                         int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(params[k]))) for k in range(K)]}
    return out


# -- statistics ----------------------------------------------------------------------
def finals(runs: dict, spec: str, lr: float, seeds: int) -> np.ndarray:
    return np.array([runs[(NUMBERS_OF.get(spec, spec), lr, s)]["final"] for s in range(seeds)])


def diverged(runs: dict, spec: str, lr: float, seeds: int) -> int:
    return int(sum(runs[(NUMBERS_OF.get(spec, spec), lr, s)]["status"] == "diverged" for s in range(seeds)))


def batches_to(run: dict, target: float) -> int | None:
    """First evaluated batch count at which the run's accuracy reached `target` (None: never)."""
    hit = np.flatnonzero(np.nan_to_num(run["accuracy"], nan=-1.0) >= target)
    return int(run["update"][hit[0]]) if len(hit) else None


def time_to(run: dict, tl, target: float) -> float:
    n = batches_to(run, target)
    if n is None:
        return math.inf
    return 0.0 if n == 0 else float(tl.batch_done_time()[n - 1])


def times_to_target(runs, tls, tuned, cfg, spec, cname, rc) -> np.ndarray:
    """[seeds] simulated seconds to the target at the schedule's tuned lr (inf: never)."""
    base = NUMBERS_OF.get(spec, spec)
    lr = tuned[base]["lr"]
    return np.array([time_to(runs[(base, lr, s)], tls[(spec, cname, rc, s)], cfg["target"])
                     for s in range(cfg["seeds"])])


def throughputs(tls: dict, spec: str, cname: str, rc: float, seeds: int) -> np.ndarray:
    return np.array([tls[(spec, cname, rc, s)].throughput for s in range(seeds)])


# -- verdicts ------------------------------------------------------------------------
def majority(label: str) -> bool | None:
    """The third of the scale: True for HOLDS / MOSTLY, False for MOSTLY NOT / DOES NOT HOLD, None for MIXED."""
    return {"HOLDS": True, "MOSTLY": True, "MIXED": None, "MOSTLY NOT": False, "DOES NOT HOLD": False}[label]


def judge_claim(scen: list[dict], *, claimed: str, null: float, assumptions: dict) -> dict:
    """Judge a claim over scenarios [{"name", "effect", attrs...}].

    assumptions: {attribute: (what it models, {value: description})}. An assumption
    decides the verdict when the verdicts under its values fall in different thirds of
    the scale (held in >= 2/3 of the scenarios: HOLDS, MOSTLY; in between: MIXED; in
    <= 1/3: MOSTLY NOT, DOES NOT HOLD): the verdict then reads 'set by the model: ...'
    with the verdict under each value, and is not evidence. Scenarios without the
    attribute count under every value."""
    j = S.judge([s["effect"] for s in scen], claimed=claimed, null=null)
    out = {"judgement": j, "label": j.label, "by_assumption": {}}
    deciding = []
    for attr, (what, values) in assumptions.items():
        per = {}
        for v in values:
            sub = [s for s in scen if s.get(attr, v) == v]
            if sub:
                per[values[v]] = S.judge([s["effect"] for s in sub], claimed=claimed, null=null)
        out["by_assumption"][what] = per
        if len({majority(jv.label) for jv in per.values()}) > 1:
            deciding.append(f"{what} ({'; '.join(f'{k}: {jv.label}, {jv.held}/{jv.total}' for k, jv in per.items())})")
    if deciding:
        out["label"] = S.model_set("; ".join(deciding))
    return out


def scenario_lines(scen: list[dict], claimed: str, null: float, fmt=".2f") -> list[str]:
    rows = []
    for s in scen:
        side = s["effect"].side(null)
        mark = "held" if side == claimed else ("opposite" if side != "not distinguishable" else side)
        rows.append(f"{s['name']}: {s['effect'].text(fmt)} -> {mark}" + (f" ({s['extra']})" if s.get("extra") else ""))
    return rows


def claims(tls: dict, stats: dict, settings: dict, mem: dict, t_tp: str) -> list[dict]:
    out = []
    seeds_tp = settings[t_tp]["seeds"]
    rc_assume = ("the cost of the recomputation", {1.0: "charged as a forward (rc=1)", 0.0: "overlapped (rc=0)"})
    barrier_assume = ("DDG's per-iteration barrier", {True: "with it", False: "without it"})

    def speedup(bases: list[str], label: str) -> dict:
        scen = []
        for base in bases:
            for rc in RECOMPUTE:
                for cname in CLUSTERS:
                    a = throughputs(tls[t_tp], DSP, cname, rc, seeds_tp)
                    b = throughputs(tls[t_tp], base, cname, rc, seeds_tp)
                    e = S.effect(a, b, ratio=True)
                    scen.append({"name": f"{cname}, {RC_NAME[rc]}" + (f", vs {DDG_NAME[base]}" if base in DDG_NAME
                                                                       else "")
                                 + f": DSP {np.median(a):.3f} vs {np.median(b):.3f} batches/s",
                                 "effect": e, "rc": rc, "barrier": base == DDG})
        asm = ({"barrier": barrier_assume} if DDG in bases else {}) | {"rc": rc_assume}
        r = judge_claim(scen, claimed="above", null=SIGNIFICANT, assumptions=asm)
        return {"test": f"simulated throughput ratio DSP(1,1,1,0) / {label} (over seeds; deterministic clusters "
                        f"have one value) with its interval wholly above {SIGNIFICANT}, per (cluster, recompute "
                        "cost" + (", DDG barrier)" if DDG in bases else ")") + f", {settings[t_tp]['batches']} "
                        f"batches of {t_tp}",
                **r, "details": scenario_lines(scen, "above", SIGNIFICANT)}

    def end_to_end(bases: list[str], label: str) -> dict:
        scen = []
        for t, s in stats.items():
            cfg = settings[t]
            for base in bases:
                for rc in RECOMPUTE:
                    for cname in CLUSTERS:
                        td = times_to_target(s["runs"], s["tls"], s["tuned"], cfg, DSP, cname, rc)
                        tb = times_to_target(s["runs"], s["tls"], s["tuned"], cfg, base, cname, rc)
                        e = S.effect(tb, td, ratio=True)   # speed-up: base's time / DSP's
                        scen.append({"name": f"{t}, {cname}, {RC_NAME[rc]}"
                                     + (f", vs {DDG_NAME[base]}" if base in DDG_NAME else ""),
                                     "effect": e, "rc": rc, "barrier": base == DDG,
                                     "extra": f"median {np.median(tb):.0f} s vs DSP {np.median(td):.0f} s; reached "
                                              f"{int(np.isfinite(tb).sum())}/{len(tb)} and "
                                              f"{int(np.isfinite(td).sum())}/{len(td)}"})
        asm = ({"barrier": barrier_assume} if DDG in bases else {}) | {"rc": rc_assume}
        r = judge_claim(scen, claimed="above", null=SIGNIFICANT, assumptions=asm)
        lrs = "; ".join(f"{t}: DSP {s['tuned'][DSP]['lr']:.3g}, "
                        + ", ".join(f"{NUMBERS_OF.get(b, b)} {s['tuned'][NUMBERS_OF.get(b, b)]['lr']:.3g}"
                                    for b in dict.fromkeys(NUMBERS_OF.get(b, b) for b in bases))
                        for t, s in stats.items())
        return {"test": f"ratio of median simulated times to the target accuracy, {label} / DSP(1,1,1,0), each "
                        f"at its tuned lr, interval wholly above {SIGNIFICANT}, per (task, cluster, recompute cost"
                        + (", DDG barrier)" if DDG in bases else ")"),
                **r, "details": scenario_lines(scen, "above", SIGNIFICANT) + [f"tuned lrs: {lrs}"],
                "note": "this combines throughput with how many batches each schedule needs at the lr it tolerates"}

    c = speedup([GPIPE], "GPipe(4)")
    g8 = [f"{cname} {RC_NAME[rc]} "
          f"{np.median(throughputs(tls[t_tp], DSP, cname, rc, seeds_tp)) / np.median(throughputs(tls[t_tp], 'gpipe:8', cname, rc, seeds_tp)):.2f}x"
          for rc in RECOMPUTE for cname in CLUSTERS]
    c["details"].append("against GPipe with 8 micro-batches (not part of the test): " + ", ".join(g8))
    out.append({"claim": "Significant speed-up over GPipe (throughput)", **c})
    out.append({"claim": "Significant speed-up over GPipe (time to accuracy)", **end_to_end([GPIPE], "GPipe(4)")})
    out.append({"claim": "Significant speed-up over DDG (throughput)", **speedup([DDG, DDG_FREE], "DDG"),
                "tp_ddg": tuple(float(np.median(throughputs(tls[t_tp], spec, "constant", 1.0, seeds_tp)))
                                for spec in (DDG_FREE, DDG))})
    out.append({"claim": "Significant speed-up over DDG (time to accuracy)", **end_to_end([DDG, DDG_FREE], "DDG")})

    # no accuracy loss: DSP vs backprop and GPipe after the same batches, tuned and equal lr
    scen, rows = [], []
    for t, s in stats.items():
        cfg = settings[t]
        for ref in (BACKPROP, GPIPE):
            for mode in ("tuned", "common"):
                lr_d, lr_r = ((s["tuned"][DSP]["lr"], s["tuned"][ref]["lr"]) if mode == "tuned"
                              else (COMMON_LR, COMMON_LR))
                d, r = finals(s["runs"], DSP, lr_d, cfg["seeds"]), finals(s["runs"], ref, lr_r, cfg["seeds"])
                scen.append({"name": f"{t}, {'each at its tuned lr' if mode == 'tuned' else f'equal lr {COMMON_LR:g}'}"
                                     f": DSP {np.median(d):.3f} (lr {lr_d:.3g}) vs {ref} {np.median(r):.3f} "
                                     f"(lr {lr_r:.3g}), difference", "effect": S.effect(d, r)})
        for spec in SCHEDULES:
            lr = s["tuned"][spec]["lr"]
            v = finals(s["runs"], spec, lr, cfg["seeds"])
            lo, hi, kind = S.interval(v)
            dv = diverged(s["runs"], spec, lr, cfg["seeds"])
            rows.append(f"{t}, {spec} at its tuned lr {lr:.3g}: median test accuracy {np.median(v):.3f} "
                        f"[{lo:.3f}, {hi:.3f}] ({kind})" + (f", {dv} diverged" if dv else ""))
    r = judge_claim(scen, claimed="above", null=-ACC_TOL, assumptions={})
    out.append({"claim": "No accuracy loss (DSP vs backpropagation after the same number of batches)",
                "test": f"median test accuracy of DSP(1,1,1,0) minus the reference's (backprop, GPipe(4); each at "
                        f"its tuned lr and both at lr {COMMON_LR:g}), interval wholly above -{ACC_TOL}",
                **r, "details": scenario_lines(scen, "above", -ACC_TOL, ".3f") + rows})

    # robustness to stragglers: the fraction of its constant-speed throughput each schedule keeps
    scen, rows = [], []
    for rc in RECOMPUTE:
        kept = {spec: throughputs(tls[t_tp], spec, "stragglers", rc, seeds_tp)
                / throughputs(tls[t_tp], spec, "constant", rc, seeds_tp)[0] for spec in (DSP, GPIPE, DDG, DDG_FREE,
                                                                                          "dsp:2,2,2,0")}
        for base in (GPIPE, DDG, DDG_FREE):
            scen.append({"name": f"{RC_NAME[rc]}: DSP keeps {np.median(kept[DSP]):.2f}, {DDG_NAME.get(base, base)} "
                                 f"{np.median(kept[base]):.2f}; difference", "effect": S.effect(kept[DSP], kept[base]),
                         "rc": rc, **({"barrier": base == DDG} if base in DDG_NAME else {})})
        rows.append(f"{RC_NAME[rc]}: DSP(2,2,2,0) keeps {np.median(kept['dsp:2,2,2,0']):.2f} (larger delays, more "
                    "slack)")
        slow = {spec: np.median(throughputs(tls[t_tp], spec, "slow stage", rc, seeds_tp))
                / np.median(throughputs(tls[t_tp], spec, "constant", rc, seeds_tp)) for spec in (DSP, GPIPE, DDG,
                                                                                                  DDG_FREE)}
        rows.append(f"slow stage, {RC_NAME[rc]} (not part of the test): kept " + ", ".join(
            f"{DDG_NAME.get(k, k)} {v:.2f}" for k, v in slow.items()))
    r = judge_claim(scen, claimed="above", null=0.0, assumptions={"barrier": barrier_assume, "rc": rc_assume})
    out.append({"claim": "Stronger robustness to random stragglers",
                "test": "fraction of its constant-speed throughput DSP(1,1,1,0) keeps under random stragglers "
                        f"(prob {STRAGGLERS['prob']}, {STRAGGLERS['slowdown']:g}x, {STRAGGLERS['duration']:g} s; "
                        f"{seeds_tp} cluster seeds) minus that of GPipe(4) / DDG, interval wholly above 0",
                **r, "details": scenario_lines(scen, "above", 0.0, ".3f") + rows})

    # memory: m_k stored inputs per stage, not whole graphs (exact byte counts of the carries)
    rows = []
    m = mem[DSP]
    for k in range(K):
        if m["lags"][k] == 0:
            continue
        d, g, w = m["stored_bytes"][k], mem[DDG]["stored_bytes"][k], mem[STASH]["stored_bytes"][k]
        rows.append(f"stage {k}: DSP stores {m['lags'][k]} inputs = {d / 1024:.1f} KiB ({d / m['lags'][k] / 1024:.1f} "
                    f"KiB each); DDG (lag {mem[DDG]['lags'][k]}) stores {g / 1024:.1f} KiB of graphs "
                    f"({g / mem[DDG]['lags'][k] / 1024:.1f} KiB each); DSP+stash {w / 1024:.1f} KiB (inputs + "
                    f"{m['lags'][k]} weight copies of {m['weights_bytes'][k] / 1024:.1f} KiB)")
    per_d = max(m["stored_bytes"][k] / m["lags"][k] for k in range(K) if m["lags"][k])
    per_g = min(mem[DDG]["stored_bytes"][k] / mem[DDG]["lags"][k] for k in range(K) if mem[DDG]["lags"][k])
    ok = int(per_d < per_g)
    out.append({"claim": "Memory: m_k stored inputs per block rather than whole activation graphs",
                "test": "bytes stored per in-flight batch, DSP (largest stage) < DDG (smallest stage) "
                        f"on {t_tp}, batch {BATCH_SIZE}: exact byte counts, one scenario, no interval",
                "label": S.verdict(ok, 1), "details": rows,
                "effect_text": f"{per_d / 1024:.1f} KiB vs {per_g / 1024:.1f} KiB per in-flight batch "
                               f"(ratio {per_d / per_g:.2f}x)",
                "note": "in total DSP stores more here, because its lags m_k (6,4,2) exceed DDG's (3,2,1)"})

    # invariants of PAPERS.md
    rows, ok, n = [], 0, 0
    for spec in (DSP, "dsp:2,2,2,0"):
        v = mem[spec]
        good = v["gaps"] == v["lags"] and v["queue_max"] == v["lags"]
        ok, n = ok + good, n + 1
        rows.append(f"{spec}: m_k {v['lags']}, forward/backward gap {v['gaps']}, max queue {v['queue_max']}")
    z, b = mem["dsp:0,0,0,0"], mem[BACKPROP]
    same = (np.array_equal(z["fwd"], b["fwd"]) and np.array_equal(z["bwd"], b["bwd"]) and z["lags"] == b["lags"]
            and z["backward"] == b["backward"])
    ok, n = ok + same, n + 1
    rows.append(f"dsp:0,0,0,0 has the tick tables of backprop: {same}")
    out.append({"claim": "(PAPERS.md invariants) stage k's forward/backward gap = m_k, its queue holds m_k "
                         "inputs; all s_k = 0 is backpropagation",
                "test": f"from the plans' tick tables (exact, {n} checks)", "label": S.verdict(ok, n),
                "details": rows, "effect_text": f"{ok}/{n} checks"})

    rows = []
    for t, s in stats.items():
        rows.append(f"{t}: tuned lr per schedule (validation score {TUNE_SCORE.split(',')[0]}): " + ", ".join(
            f"{spec} {s['tuned'][spec]['lr']:.3g}" + (" (grid edge)" if s["tuned"][spec]["edge"] else "")
            for spec in SCHEDULES))
    out.append({"claim": "Theory: convergence to critical points with a step size bounded by the largest staleness",
                "test": "a proof, not a measurement; shown: the tuned lr per schedule (larger staleness, smaller "
                        "tolerated lr)", "label": S.NOT_TESTED, "details": rows})
    return out


# -- timing models against their closed forms ----------------------------------------------
def timing_models() -> list[str]:
    """Markdown lines: simulated seconds vs the closed forms of `staleness.pipeline.timing`
    on K equal stages (1 s per forward + backward of a batch, backward = 2 forwards)."""
    lines = ["| schedule | K | batches N | rc | simulated s per batch | closed form s per batch | textbook fill/drain "
             "(M+K-1)/M |", "|---|---|---|---|---|---|---|"]
    for k in (2, 3, 4):
        for spec in ("gpipe:1", "gpipe:4", "gpipe:8"):
            m = int(spec.split(":")[1])
            for rc in RECOMPUTE:
                n = 10
                sim_t = pp.simulate_timing(pp.make_plan(pp.parse(spec), k, n), C.constant(k),
                                           recompute_cost=rc).end_time / n
                lines.append(f"| {spec} | {k} | {n} | {rc:g} | {sim_t:.4f} | "
                             f"{closed_form_time(spec, k, n, recompute_cost=rc) / n:.4f} | {(m + k - 1) / m:.4f} |")
    lines += ["", "| schedule (K = 4) | N | rc | simulated throughput (batches/s) | closed form | limit N → ∞ |",
              "|---|---|---|---|---|---|"]
    f, b = 1 / 3, 2 / 3
    for spec in (DSP, STASH, DDG, DDG_FREE, BACKPROP):
        for rc in RECOMPUTE:
            n = 1000
            tp = pp.simulate_timing(pp.make_plan(pp.parse(spec), K, n), C.constant(K), recompute_cost=rc).throughput
            limit = {DSP: 1 / (f + b + rc * f), STASH: 1 / (f + b + rc * f), DDG: 1 / (K * f + b),
                     DDG_FREE: 1 / (f + b), BACKPROP: 1 / K}[spec]
            lines.append(f"| {spec} | {n} | {rc:g} | {tp:.4f} | {n / closed_form_time(spec, K, n, recompute_cost=rc):.4f} "
                         f"| {limit:.4f} |")
    return lines


# -- reporting -------------------------------------------------------------------------
def throughput_table(tls: dict, seeds: int, md: bool) -> str:
    cols = [(c, rc) for rc in RECOMPUTE for c in CLUSTERS]
    heads = [f"{c} rc={rc:g}" for c, rc in cols]

    def cell(spec, c, rc):
        v = throughputs(tls, spec, c, rc, seeds)
        if c != "stragglers":
            return f"{v[0]:.3f}"
        lo, hi, _ = S.interval(v)
        return f"{np.median(v):.3f} [{lo:.3f}, {hi:.3f}]"

    if md:
        lines = ["| schedule | " + " | ".join(heads) + " |", "|---" * (len(cols) + 1) + "|"]
        for spec in TIMED:
            lines.append(f"| {spec} | " + " | ".join(cell(spec, c, rc) for c, rc in cols) + " |")
        return "\n".join(lines) + "\n"
    lines = [f"{'schedule':<20}" + "".join(f"{h:>26}" for h in heads)]
    for spec in TIMED:
        lines.append(f"{spec:<20}" + "".join(f"{cell(spec, c, rc):>26}" for c, rc in cols))
    return "\n".join(lines)


def staleness_label(spec: str, lags) -> str:
    """Per-stage staleness of the gradients, in batches (GPipe's lags are ticks within a flush)."""
    return "0 (sync)" if spec.startswith("gpipe") else ",".join(map(str, lags))


def accuracy_table(s: dict, cfg: dict, md: bool) -> str:
    heads = ["tuned lr", "tuning grid (validation score; - = a seed diverged)", "test accuracy at tuned lr",
             f"test accuracy at lr {COMMON_LR:g}"]

    def acc(spec, lr):
        v = finals(s["runs"], spec, lr, cfg["seeds"])
        lo, hi, kind = S.interval(v)
        dv = diverged(s["runs"], spec, lr, cfg["seeds"])
        return f"{np.median(v):.3f} [{lo:.3f}, {hi:.3f}]" + (f" ({dv} div.)" if dv else "")

    def grid(spec):
        t = s["tuned"][spec]
        return " ".join(f"{g:.3g}:{'-' if not math.isfinite(sc) else format(sc, '.3f')}"
                        for g, sc in zip(t["grid"], t["scores"]))

    rows = []
    for spec in SCHEDULES:
        t = s["tuned"][spec]
        rows.append([spec, staleness_label(spec, s["lags"][spec]),
                     f"{t['lr']:.3g}" + (" (edge)" if t["edge"] else ""), grid(spec), acc(spec, t["lr"]),
                     acc(spec, COMMON_LR)])
    if md:
        lines = ["| schedule | m_k | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    return "\n".join("  ".join(r) for r in [["schedule", "m_k", *heads], *rows])


def ttt_table(s: dict, cfg: dict, md: bool) -> str:
    cols = [(c, rc) for rc in RECOMPUTE for c in CLUSTERS]

    def cell(spec, c, rc):
        v = times_to_target(s["runs"], s["tls"], s["tuned"], cfg, spec, c, rc)
        med = np.median(v)
        t = "never" if math.isinf(med) else f"{med:.0f}"
        lo, hi, _ = S.interval(v)
        iv = "" if math.isnan(lo) else f" [{lo:.0f}, {hi:.0f}]"
        return f"{t}{iv} ({int(np.isfinite(v).sum())}/{cfg['seeds']})"

    heads = [f"{c} rc={rc:g}" for c, rc in cols]
    specs = [x for x in TIMED if x != "gpipe:8"]
    if md:
        lines = ["| schedule | tuned lr | " + " | ".join(heads) + " |", "|---" * (len(cols) + 2) + "|"]
        for spec in specs:
            lines.append(f"| {spec} | {s['tuned'][NUMBERS_OF.get(spec, spec)]['lr']:.3g} | "
                         + " | ".join(cell(spec, c, rc) for c, rc in cols) + " |")
        return "\n".join(lines) + "\n"
    lines = [f"{'schedule':<20}" + "".join(f"{h:>26}" for h in heads)]
    for spec in specs:
        lines.append(f"{spec:<20}" + "".join(f"{cell(spec, c, rc):>26}" for c, rc in cols))
    return "\n".join(lines)


def _curve_band(runs: dict, spec: str, lr: float, seeds: int, x_of=None):
    """(x, median, min, max) of accuracy over seeds (a diverged run counts 0 after it diverged)."""
    base = NUMBERS_OF.get(spec, spec)
    ups = runs[(base, lr, 0)]["update"]
    ys = np.stack([np.nan_to_num(runs[(base, lr, s)]["accuracy"], nan=0.0) for s in range(seeds)])
    x = ups if x_of is None else x_of(ups)
    return x, np.median(ys, 0), ys.min(0), ys.max(0)


def plot_task(task: str, cfg: dict, s: dict, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from staleness.results import plots

    specs = [x for x in TIMED if x != "gpipe:8"]
    colors = {spec: f"C{i}" for i, spec in enumerate(specs)}
    runs, tls = s["runs"], s["tls"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5), layout="constrained")
    for ax, mode in zip(axes[0, :2], ("tuned", "common")):
        for spec in SCHEDULES:
            lr = COMMON_LR if mode == "common" else s["tuned"][spec]["lr"]
            x, mid, lo, hi = _curve_band(runs, spec, lr, cfg["seeds"])
            ax.fill_between(x, lo, hi, color=colors[spec], alpha=0.15, linewidth=0)
            ax.plot(x, mid, color=colors[spec], label=f"{spec} (lr {lr:.3g})")
        ax.set_xlabel("batches")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.set_title("each at its tuned lr" if mode == "tuned" else f"lr {COMMON_LR:g} for all", fontsize="medium")
        ax.legend(fontsize="x-small")
    ax = axes[0, 2]
    for spec in SCHEDULES:
        t = s["tuned"][spec]
        ax.plot(t["grid"], t["scores"], color=colors[spec], marker="o", markersize=4, label=spec)
        ax.plot([t["lr"]], [t["scores"][t["grid"].index(t["lr"])]], color=colors[spec], marker="*", markersize=12)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate (momentum 0.9)")
    ax.set_ylabel("validation score (mean accuracy over the run)")
    ax.set_title(f"lr tuning on the validation split ({len(cfg['tune_seeds'])} seeds; gaps: diverged; *: chosen)",
                 fontsize="medium")
    ax.legend(fontsize="x-small")
    for ax, cname in zip(axes[1], CLUSTERS):
        for spec in specs:
            lr = s["tuned"][NUMBERS_OF.get(spec, spec)]["lr"]
            done = tls[(spec, cname, 1.0, 0)].batch_done_time()
            x, mid, lo, hi = _curve_band(runs, spec, lr, cfg["seeds"],
                                         x_of=lambda u, done=done: np.where(u > 0, done[np.maximum(u, 1) - 1], 0.0))
            ax.fill_between(x, lo, hi, color=colors[spec], alpha=0.12, linewidth=0)
            ax.plot(x, mid, color=colors[spec], label=spec, linestyle="--" if spec in NUMBERS_OF else "-")
        ax.axhline(cfg["target"], color="0.3", linestyle=":", linewidth=1.0)
        ax.set_xlim(0, tls[(DSP, cname, 1.0, 0)].end_time)  # backprop's 4x longer run would squeeze the rest
        ax.set_xlabel("simulated time (s; seed 0's timeline, recompute charged)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"{cname}: {CLUSTERS[cname].describe()}", fontsize="medium")
        ax.legend(fontsize="x-small")
    fig.suptitle(f"{task}, K = {K} stages, batch {BATCH_SIZE}: test accuracy vs batches and vs simulated time "
                 f"(median and min–max over {cfg['seeds']} seeds; dotted: target {cfg['target']:g})")
    plots.save(fig, path)
    plt.close(fig)
    return path


def plot_throughput(tls: dict, seeds: int, n: int, path: Path) -> Path:
    import matplotlib.pyplot as plt

    from staleness.results import plots

    fig, axes = plt.subplots(1, 2, figsize=(14, 4.4), layout="constrained", sharey=True)
    width = 0.8 / len(CLUSTERS)
    for ax, rc in zip(axes, RECOMPUTE):
        for j, cname in enumerate(CLUSTERS):
            vals = [np.median(throughputs(tls, spec, cname, rc, seeds)) for spec in TIMED]
            ax.bar(np.arange(len(TIMED)) - 0.4 + width * (j + 0.5), vals, width, label=cname)
        ax.set_xticks(np.arange(len(TIMED)), TIMED, rotation=25, fontsize="small")
        ax.set_title(f"recompute_cost = {rc:g} ({'charged as a full forward' if rc else 'fully overlapped'})",
                     fontsize="medium")
        ax.set_ylabel("batches per simulated second")
        ax.legend(fontsize="small")
    fig.suptitle(f"Simulated throughput over {n} batches, K = {K} stages at 1 s per batch per stage "
                 f"(stragglers: median over {seeds} seeds)")
    plots.save(fig, path)
    plt.close(fig)
    return path


# why a verdict may differ from the committed results (what changed in the method, per claim)
def _counts(v: dict) -> str:
    j = v["judgement"]
    return f"now held in {j.held}/{j.total}, opposite in {j.opposite}, not distinguishable in {j.undecided}"


WHY = {
    "Significant speed-up over GPipe (throughput)": lambda v:
        "each scenario is now judged by the interval of the ratio against 1.2 (" + _counts(v) + "); GPipe's timing "
        "is unchanged (its extra over fill/drain is the re-materialisation of stages 0..K-2, now stated and tested)",
    "Significant speed-up over GPipe (time to accuracy)": lambda v:
        "learning rates tuned on a validation split (before: the best of a 4-value grid by test accuracy) and the "
        "interval of the ratio of median times (" + _counts(v) + ")",
    "Significant speed-up over DDG (throughput)": lambda v:
        "DDG is now timed with its per-iteration barrier by default (before: none, which gave it DSP's "
        f"pipelining: {v['tp_ddg'][0]:.3f} batches/s on the constant cluster, as ddg:nobarrier now; with the "
        f"barrier {v['tp_ddg'][1]:.3f}) and the barrier-free variant is a second set of scenarios; the two give "
        "opposite answers, so the verdict is the model's (" + _counts(v) + ")",
    "Significant speed-up over DDG (time to accuracy)": lambda v:
        "DDG with its barrier (half the batches per second on equal stages) beside DDG without it, tuned learning "
        "rates and intervals of the ratio of median times (" + _counts(v) + ")",
    "No accuracy loss (DSP vs backpropagation after the same number of batches)": lambda v:
        "the old test compared medians (2 of 8 within 0.01); now a scenario holds only where the interval of the "
        "difference lies above -0.01 (" + _counts(v) + "): with 5 seeds no interval excludes a loss of more than "
        "a point, and none shows one either; learning rates tuned on a validation split",
    "Stronger robustness to random stragglers": lambda v:
        "DDG with its barrier waits for the slowest stage once per batch and keeps more of its (lower) "
        "constant-speed throughput under stragglers than DSP does; without the barrier DSP keeps more (" + _counts(v)
        + ")",
}


def write_markdown(path: Path, *, command: str, wall: float, cpu: float, vers: dict, settings: dict, tls_tp: dict,
                   t_tp: str, stats: dict, verdicts: list[dict], mem: dict, pngs: list[Path], quick: bool,
                   previous: dict, budget: dict, from_cache: dict, jobs: int) -> None:
    lines = [f"# Reproducing DSP (Xu, Huo, Huang, CVPR 2020){' — QUICK smoke run' if quick else ''}", "",
             "Produced by `benchmarks/reproduce_dsp.py`; every number below is computed by the script "
             "from this run's results.", "",
             f"- command: `{command}`",
             f"- wall time: {wall:.0f} s ({wall / 60:.1f} min), {jobs} process(es) training the tasks; CPU time "
             f"{cpu:.0f} s (this process and its workers)",
             *[f"- {t}: training results loaded from the cache `{c['path']}` (trained {c['trained']} in "
               f"{c['wall_s']:.0f} s wall); the wall time above excludes that" for t, c in from_cache.items() if c],
             "- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()),
             "", "## Setup", "",
             f"- model: residual MLP (`staleness.pipeline.tasks`, width 64), K = {K} stages: stage 0 = input "
             "layer + residual block, stages 1–2 = one residual block each, stage 3 = residual block + classifier; "
             f"batch {BATCH_SIZE}; momentum SGD 0.9 per stage",
             "- schedules (per-stage staleness m_k in batches): "
             + ", ".join(f"{spec} (m = {staleness_label(spec, mem[spec]['lags'])})" for spec in SCHEDULES)
             + "; timed only, with the numbers of another: " + ", ".join(f"{a} (numbers of {b})"
                                                                         for a, b in NUMBERS_OF.items()),
             "- learning rates: each schedule's own, chosen per task by `staleness.pipeline.sweep.tune_lr` on a "
             "validation split of the training set (10%, `Task.holdout`; the test set is not used): grid "
             f"{COMMON_LR:g} × `staleness.results.compare.GRID_FACTORS` (quick: {QUICK_FACTORS}), extended by one step past "
             f"an edge up to `compare.EXTEND` times (quick: once), tuning seeds "
             + ", ".join(f"{t}: {cfg['tune_seeds']}" for t, cfg in settings.items())
             + f" (`compare.TUNE_SEEDS`, not the test seeds); score: {TUNE_SCORE}. Every "
             f"schedule also trains at lr {COMMON_LR:g} (the equal-lr comparison).",
             "- budget: " + "; ".join(f"{t}: {b['tune_runs']} tuning runs ({b['grid']} grid values × "
                                       f"{b['tune_seeds']} seed(s) per schedule, plus edge extensions), "
                                       f"{b['test_runs']} test runs (≤ 2 lrs × {b['seeds']} seeds × "
                                       f"{len(SCHEDULES)} schedules)" for t, b in budget.items()),
             "- clusters (stage k = worker k, 1 s per forward + backward of a whole batch; a backward costs 2 "
             "forwards): " + "; ".join(f"{k}: {CLUSTER_TEXT[k]} (`{c.describe()}`)" for k, c in CLUSTERS.items()),
             "- modelling alternatives: the recomputation of a stale backward (DSP, GPipe's re-materialisation on "
             "stages 0..K-2, weight stashing, which re-runs the forward with the stashed weights) charged as a "
             "full forward (rc = 1) or fully overlapped (rc = 0, the paper's claim); DDG with its per-iteration "
             "barrier (each batch's forward crosses every stage, then every stage backpropagates, then the next "
             "batch; `ddg`, the default) or without (`ddg:nobarrier`, stages wait only for data). DDG and "
             "backprop never recompute.",
             "- each (schedule, lr, seed) is trained once; its time axis comes from `simulate_timing` per "
             "cluster; seed s uses cluster seed s (random stragglers differ per seed)",
             "- intervals: `staleness.results.stats` (percentile bootstrap 95% of the median over seeds, min-max below 5 "
             "values); an effect is the ratio or difference of medians with its bootstrap interval; a scenario "
             "counts as held only where that interval lies wholly on the claimed side. Verdicts: HOLDS (all "
             "scenarios) / MOSTLY (≥ 2/3) / MIXED (> 1/3) / MOSTLY NOT (> 0) / DOES NOT HOLD, with the effect "
             "over scenarios (median of the per-scenario estimates and its interval). When the verdicts under the "
             "alternatives of a modelling assumption (below) fall in different thirds of the scale (HOLDS / MOSTLY; "
             "MIXED; MOSTLY NOT / DOES NOT HOLD), the verdict reads 'set by the model: <assumption>' with the "
             "verdict under each alternative, and is not evidence.",
             "- diverged runs (a non-finite loss) count as accuracy 0 in medians and are counted",
             ""]
    for t, cfg in settings.items():
        lines.append(f"- {t}: {cfg['batches']} batches per run, seeds {list(range(cfg['seeds']))}, target accuracy "
                     f"{cfg['target']:g}, evaluation every {cfg['eval_every']} batches")
    lines += ["", "## Verdicts", "", "| claim (PAPERS.md section 3) | verdict here | effect over scenarios |",
              "|---|---|---|"]
    for v in verdicts:
        lines.append(f"| {v['claim']} | {v['label']} | {effect_summary(v)} |")
    lines += ["", "### Verdicts that changed against the results this run replaced", ""]
    changed = [(v, previous[v["claim"]]) for v in verdicts if v["claim"] in previous
               and previous[v["claim"]] != v["label"]]
    if not previous:
        lines.append("(no earlier results file to compare with)")
    for v, old in changed:
        lines.append(f"- **{v['claim']}**: {old} → {v['label']}. Why: {WHY[v['claim']](v) if v['claim'] in WHY else 'the verdict scale and intervals'}.")
    for v in verdicts:
        if previous and v["claim"] in previous and previous[v["claim"]] == v["label"]:
            lines.append(f"- {v['claim']}: unchanged ({v['label']})")
    lines += ["", "Caveats that apply to every verdict: a residual MLP on digits / MNIST-1D with K = 4 stages on a "
              "simulated time axis, not the paper's ResNets on CIFAR / ImageNet on GPUs; accuracy is compared after a "
              "fixed number of batches, not at convergence; throughput comes from the cost model of "
              "`staleness.pipeline.timing` (no per-micro-batch overhead, so GPipe gains from more micro-batches; "
              "the recomputation and DDG's barrier as above).", "", "## Timing models against their closed forms",
              "", "Equal stages, 1 s per forward + backward of a batch, backward = 2 forwards (f = 1/3, b = 2/3 s), "
              "recomputation ρ = rc·f, no messages. GPipe(M) per batch: (M+K-1)(f+b)/M, the textbook fill/drain, "
              "when the re-materialisation is free; charged, stages 0..K-2 recompute each micro-batch's forward in "
              "its backward (the last stage has lag 0) and the closed form of `staleness.pipeline.timing` adds it "
              "(e.g. K = 4, M = 1: 5.00 s vs 4.00). DSP(1,1,1,0) and weight stashing (which recomputes too): "
              "throughput → 1/(f+b+ρ). DDG with its barrier: T = N(K·f+b) + (K-1)·b, throughput → 1/(K·f+b); "
              "without it: (N+K-1)(f+b).", ""]
    lines += timing_models()
    lines += ["", "## Claims", ""]
    for v in verdicts:
        lines.append(f"### {v['claim']}")
        j = v.get("judgement")
        lines.append(f"**{v['label']}** — test: {v['test']}.")
        if j is not None:
            lines.append(f"Held in {j.held}/{j.total} scenarios, opposite in {j.opposite}, not distinguishable in "
                         f"{j.undecided}; effect over scenarios {j.overall.text('.3f')}."
                         + (" Not shown either way: no scenario's interval lies on either side of the threshold."
                            if j.held == 0 and j.opposite == 0 else ""))
            for attr, per in v.get("by_assumption", {}).items():
                lines.append(f"By {attr}: " + "; ".join(f"{k}: {jv.label} ({jv.held}/{jv.total})"
                                                      for k, jv in per.items()) + ".")
        if v.get("note"):
            lines.append(f"({v['note']}.)")
        lines.append("")
        lines += [f"- {d}" for d in v["details"]]
        lines.append("")
    lines += ["## Tables", "", f"### Simulated throughput (batches per simulated second, "
              f"{settings[t_tp]['batches']} batches; stragglers: median [interval] over {settings[t_tp]['seeds']} "
              "seeds)", "", throughput_table(tls_tp, settings[t_tp]["seeds"], md=True)]
    for t, cfg in settings.items():
        lines += [f"### {t}: learning rates and test accuracy after {cfg['batches']} batches", "",
                  "Median [interval] over seeds.", "", accuracy_table(stats[t], cfg, md=True),
                  f"### {t}: simulated seconds to test accuracy {cfg['target']:g} at the tuned lr (median "
                  "[interval]; seeds that reached it)", "", ttt_table(stats[t], cfg, md=True)]
    lines += ["### Memory: bytes each stage stores between a forward and its backward", "",
              "| schedule | forward→backward lag per stage (ticks) | KiB per stage |", "|---|---|---|"]
    for spec in SCHEDULES:
        lines.append(f"| {spec} | {','.join(map(str, mem[spec]['lags']))} | "
                     + ", ".join(f"{b / 1024:.1f}" for b in mem[spec]["stored_bytes"]) + " |")
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in pngs]
    files.write_text(path, "\n".join(lines) + "\n")


def effect_summary(v: dict) -> str:
    j = v.get("judgement")
    if j is not None:
        return (f"{j.overall.text('.2f')}; held {j.held}/{j.total}, opposite {j.opposite}, not distinguishable "
                f"{j.undecided}")
    return v.get("effect_text", "")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (~5 min): digits, 300 batches, 3-value grid, "
                                                         "one tuning seed, 5 seeds")
    ap.add_argument("--seeds", type=int, default=None, help="test seeds per task (default 5)")
    ap.add_argument("--tasks", default=None, help="comma-separated subset of " + ",".join(TASKS))
    ap.add_argument("--cache", default=str(ROOT / "runs" / f"{NAME}_cache"),
                    help="directory of cached training results (tuned lrs and runs per task and settings), so a "
                         "re-run that only changes the report does not retrain; '' disables it")
    ap.add_argument("--previous", default=None, help="results file whose verdicts this run is compared with "
                                                     "(default: the one it replaces in the output directory)")
    ap.add_argument("--jobs", type=int, default=1, help="train the tasks in this many processes at once "
                                                         "(each task's sweeps stay sequential)")
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/results; quick: "
                                                "runs/reproduce_dsp_quick)")
    args = ap.parse_args(argv)
    t0, c0 = time.perf_counter(), _cpu()
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["python", "benchmarks/reproduce_dsp.py",
                                                                                 *argv])
    tasks = list(QUICK) if args.quick else list(TASKS)
    if args.tasks:
        tasks = [t.strip() for t in args.tasks.split(",")]
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        ap.error(f"--tasks: unknown {bad}; valid: {', '.join(TASKS)}")
    if args.seeds is not None and args.seeds < 1:
        ap.error(f"--seeds {args.seeds} must be >= 1")
    settings = {}
    for t in tasks:
        cfg = {**TASKS[t], **(QUICK.get(t, {}) if args.quick else {})}
        cfg["factors"] = QUICK_FACTORS if args.quick else _compare.GRID_FACTORS
        cfg["tune_seeds"] = list(_compare.TUNE_SEEDS[:1] if args.quick else _compare.TUNE_SEEDS)
        cfg["extend"] = 1 if args.quick else _compare.EXTEND
        if args.seeds is not None:
            cfg["seeds"] = args.seeds
        settings[t] = cfg
    out = Path(args.out) if args.out else (ROOT / "runs" / f"{NAME}_quick" if args.quick else ROOT / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    md_path = out / f"{NAME}.md"
    prev_path = Path(args.previous) if args.previous else md_path
    if args.previous and not prev_path.is_file():
        ap.error(f"--previous {args.previous}: no such file")
    previous = previous_verdicts(prev_path)

    from tqdm.auto import tqdm

    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs} must be >= 1")
    trained = {}
    if args.jobs > 1 and len(settings) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(args.jobs, len(settings)), mp_context=multiprocessing.get_context("spawn")) as ex:
            futs = {t: ex.submit(_train_in_worker, args.cache, t, cfg) for t, cfg in settings.items()}
            trained = {t: f.result() for t, f in futs.items()}
    stats, budget, from_cache = {}, {}, {}
    with tqdm(total=2 * len(SCHEDULES) * len(settings), desc=NAME, unit="sweep", disable=bool(trained)) as bar:
        for t, cfg in settings.items():
            (tuned, runs), from_cache[t] = trained[t] if t in trained else cached(
                args.cache, t, cfg, lambda t=t, cfg=cfg: _train(t, cfg, bar))
            stats[t] = {"tuned": tuned, "runs": runs, "tls": timelines(cfg),
                        "lags": {spec: runs[(spec, tuned[spec]["lr"], 0)]["lags"] for spec in SCHEDULES}}
            budget[t] = {"tune_runs": sum(x["runs"] for x in tuned.values()), "grid": len(cfg["factors"]),
                         "tune_seeds": len(cfg["tune_seeds"]), "seeds": cfg["seeds"],
                         "test_runs": sum(len({tuned[s]["lr"], COMMON_LR}) for s in SCHEDULES) * cfg["seeds"]}
    t_tp = tasks[0]
    mem = memory_and_invariants(t_tp)
    verdicts = claims({t: s["tls"] for t, s in stats.items()}, stats, settings, mem, t_tp)

    print(f"Simulated throughput (batches per simulated second, {settings[t_tp]['batches']} batches):")
    print(throughput_table(stats[t_tp]["tls"], settings[t_tp]["seeds"], md=False))
    for t, cfg in settings.items():
        print(f"\n{t}: learning rates and test accuracy after {cfg['batches']} batches (median [interval])")
        print(accuracy_table(stats[t], cfg, md=False))
        print(f"\n{t}: simulated seconds to accuracy {cfg['target']:g} at each schedule's tuned lr")
        print(ttt_table(stats[t], cfg, md=False))
    print("\nClaims of the DSP paper (PAPERS.md section 3):")
    for v in verdicts:
        print(f"- {v['claim']}: {v['label']}  [{effect_summary(v)}]")
        for d in v["details"]:
            print(f"    {d}")

    pngs = [plot_task(t, settings[t], stats[t], out / f"{NAME}_{t}.png") for t in tasks]
    pngs.append(plot_throughput(stats[t_tp]["tls"], settings[t_tp]["seeds"], settings[t_tp]["batches"],
                                out / f"{NAME}_throughput.png"))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    write_markdown(md_path, command=command, wall=wall, cpu=cpu, vers=versions(), settings=settings,
                   tls_tp=stats[t_tp]["tls"], t_tp=t_tp, stats=stats, verdicts=verdicts, mem=mem, pngs=pngs,
                   quick=args.quick, previous=previous, budget=budget, from_cache=from_cache, jobs=args.jobs)
    print(f"wrote {md_path} and {', '.join(p.name for p in pngs)}; wall {wall:.0f} s, CPU {cpu:.0f} s")

    summary = {
        "benchmark": NAME, "quick": args.quick, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "seeds": {t: c["seeds"] for t, c in settings.items()}, "budget": budget,
        "verdicts": {v["claim"]: v["label"] for v in verdicts},
        "changed": {v["claim"]: [previous[v["claim"]], v["label"]] for v in verdicts
                    if v["claim"] in previous and previous[v["claim"]] != v["label"]},
        "tuned_lr": {f"{t}|{spec}": s["tuned"][spec]["lr"] for t, s in stats.items() for spec in SCHEDULES},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
