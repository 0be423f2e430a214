"""Reproduce asynchronous RL's staleness findings in the simulator, with the learner the anchors
run and real numerics (rl-digits: a small transformer reversing digit strings, KV-cached decode).

The setting (`BASE`), chosen where staleness matters at CPU scale (naive PPO's final reward at
η = 4 is distinguishably below η = 0 over 8 seeds, measured while choosing it): 8 actors on a
1 : 1.2 : 1.5 : 3 cluster (two of each, 20% jitter), the learner updating from 2 rollouts at a
time (so rollouts reach mean staleness 2.7 at η = 4, 4.5 at η = ∞), 4 minibatch steps per version
(AReaL's `ppo_n_minibatches`: π_prox recomputed once per version, so the clip around it binds
from the second step on), Adam (the task's), 300 learner updates per run, 8 seeds. η = 0 is
`rl_sync` on 2 actors (the same 2 rollouts per update, all on the current version). Learning
rates are tuned per objective at η = 0 on the task's validation split (3 tuning seeds of their
own, `staleness.results.compare.tune_lr`: the mean held-out reward over the run). The final
reward is the mean sampled reward on held-out prompts over the last two evaluations.

The anchors' conventions matched (and where to read them): a version is one learner update of
M minibatch steps (AReaL `areal/trainer/ppo/actor.py`; `rl_*:minibatches=M`); π_prox is the
log-prob recomputed at the version's parameters before its first step; π_behav is what the
actor recorded when it sampled (its precision: `actor_dtype`); the decoupled loss is
w·min(ρ'A, clip(ρ')A) with w = π_prox/π_behav per token, no gradient, and tokens with w > cap
masked out of the sum but kept in the token-mean's denominator (`ppo_actor_loss_fn`); TIS is
min(π_θ/π_behav, C)·A·log π_θ with C = 2 (verl PR #2953); MIS (IcePop) drops tokens whose ratio
leaves [0.5, 5]; the loss is a token mean over each minibatch; advantages are group-mean
baselines (G = 8 completions per prompt); η bounds a rollout's staleness in versions, enforced
by pacing the actors (AReaL's admission control), a rollout that still arrives too stale dropped.

Sections (each a claim; every number is computed here, from this run):

1. `areal` (AReaL, Fu et al. 2025, Table 3: AIME24 at η = 0/1/2/4/8/16/∞, naive PPO 42.0 / 41.8 /
   40.0 / 23.3 / 35.7 / 35.8 / 34.0, decoupled 42.0 / 42.1 / 41.8 / 42.2 / 41.0 / 38.7 / 36.9): naive
   PPO, decoupled PPO and decoupled PPO with AReaL's behaviour-weight cap 5, for η in
   {0, 1, 2, 4, 8, ∞}; the shape: naive PPO degrades at large η, decoupled stays near η = 0,
   throughput rises with η; beside each, the learner's diagnostics (KL between versions,
   behaviour weights, clip and masked fractions).
2. `correction` (NeMo-RL PR #1098: async matches sync up to 8–16 steps and collapses without an
   IS correction; marin #8955: plain PPO 2/128, TIS 98/128): REINFORCE (no correction), TIS and
   MIS at η in {0, 8, ∞}: without a correction training degrades at large staleness, TIS/MIS
   recover it.
3. `mismatch` (training–inference mismatch: "Your Efficient RL Framework Secretly Brings You
   Off-Policy RL Training"; verl #6780): bfloat16 actors at η = 0 (`rl_sync`) with naive PPO,
   TIS and MIS against float32 actors: "staleness 0" is off-policy (kl_behav > 0), and whether
   the correction matters at this scale.
4. `lengths` (tinker-cookbook PR #822: pacing instead of discarding stale rollouts, nothing
   discarded where the old scheme discarded 8–13%): dropping rollouts staler than η shifts the
   consumed length distribution toward short prompts and raises the dropped share; pacing the
   actors (AReaL's rule here, which still drops a rollout that finishes too stale, unlike the
   PR's admission control, which discards nothing) shifts them less (timing only).
5. `closed_form` (Applied Compute, "Predicting and Controlling Staleness in Fully Asynchronous
   RL Training", 2026-07-03): not tested: only the post's opening could be retrieved here, not
   its formula; the section records the simulator's mean staleness over a grid of actors,
   batch size and length tail (what a formula would be checked against).
6. `lr_scaling` (arXiv 2607.01083: per-step bias O(S·η), so the stable learning rate falls as
   the maximum lag S grows): decoupled PPO at η in {0, 4, ∞} over a learning-rate grid, 3 seeds:
   the best and the largest stable rate per η.
7. `one_step_off` (verl#4449, verl#6780): one-step off-policy is one version stale.
8. `inflight` (PipelineRL): in-flight weight updates lower the staleness of what the learner
   trains on at equal throughput (timing), and do not harm training.
The seed-to-seed spread (the interval of the baseline's median, and the standard deviation over
seeds) is printed next to each effect.

    python benchmarks/reproduce_async_rl.py            # full: 8 seeds (see the report for its wall time)
    python benchmarks/reproduce_async_rl.py --quick    # smoke run: runs/reproduce_async_rl_quick/
    python benchmarks/reproduce_async_rl.py --sections lengths --resume

Every section writes its results into `<out>/reproduce_async_rl.json` (atomically) as soon as it
ends; `--resume` skips the sections found there. Then a markdown report with a verdict per claim
(`staleness.results.stats`' scale) and the plots.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

import staleness as st
from _report import tune, versions
from staleness.infra import files
from staleness.results import stats

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_async_rl"
SECTIONS = ("areal", "correction", "mismatch", "lengths", "closed_form", "lr_scaling", "one_step_off", "inflight")
INF = "inf"
DIAG = ("kl_version", "is_weight_mean", "is_weight_max", "kl_behav", "clip_fraction", "masked_fraction", "ess")

BASE = dict(workers=8, batch=2, cluster="1,1,1.2,1.2,1.5,1.5,3,3+jitter=0.2", sync_cluster="1,1+jitter=0.2",
            minibatches=4, updates=300, num_evals=6, learner=0.5, tune_seeds=[1001, 1002, 1003], base_lr=1e-3,
            factors=[0.3, 1.0, 2.0])
FULL = {
    "areal": dict(BASE, etas=[0, 1, 2, 4, 8, None], objectives=["ppo", "decoupled_ppo", "decoupled_ppo:cap=5"]),
    "correction": dict(BASE, etas=[0, 8, None], objectives=["reinforce", "tis", "mis"]),
    "mismatch": dict(BASE, objectives=["ppo", "tis", "mis"], dtypes=["float32", "bfloat16"]),
    "lengths": dict(workers=4, cluster="1,1,1.5,3+jitter=0.5", updates=300, eta=1, prompts_per_rollout=1),
    "closed_form": dict(workers=[4, 8, 16], batch=[1, 2, 4], sigma=[0.3, 0.7, 1.2], updates=400),
    "lr_scaling": dict(BASE, etas=[0, 4, None], objective="decoupled_ppo", lrs=[3e-4, 1e-3, 2e-3, 4e-3],
                       seeds=[2001, 2002, 2003]),
    "one_step_off": dict(workers=4, cluster="1,1,1.5,3+jitter=0.3", updates=40, show_rounds=3),
    "inflight": dict(workers=8, cluster="1*8+jitter=0.5", updates=60, steps=[1, 2, 4], objective="decoupled_ppo",
                     reward_steps=4, lr=None, grid=[1e-3, 3e-3], tune_seeds=[100], num_evals=6, learner=0.5),
}
_Q = dict(BASE, updates=24, num_evals=2, tune_seeds=[1001], factors=[1.0])
QUICK = {
    "areal": dict(_Q, etas=[0, 4, None], objectives=["ppo", "decoupled_ppo"]),
    "correction": dict(_Q, etas=[0, None], objectives=["tis"]),
    "mismatch": dict(_Q, objectives=["ppo"], dtypes=["float32", "bfloat16"]),
    "lengths": dict(workers=4, cluster="1,1,1.5,3+jitter=0.5", updates=80, eta=1, prompts_per_rollout=1),
    "closed_form": dict(workers=[4, 8], batch=[1, 2], sigma=[0.7], updates=100),
    "lr_scaling": dict(_Q, etas=[0, None], objective="decoupled_ppo", lrs=[1e-3, 4e-3], seeds=[2001]),
    "one_step_off": dict(workers=4, cluster="1,1,1.5,3+jitter=0.3", updates=12, show_rounds=2),
    "inflight": dict(workers=8, cluster="1*8+jitter=0.5", updates=12, steps=[1, 4], objective="decoupled_ppo",
                     reward_steps=4, lr=1e-3, grid=[1e-3], tune_seeds=[100], num_evals=2, learner=0.5),
}


def sweep(*args, **kwargs) -> list:
    """`st.sweep`, then JAX's compiled programs released: every row compiles its own (its policy
    and task), and a process that keeps them all runs out of memory maps (about 2,000 per
    program against vm.max_map_count 65,530: the whole script in one process died in its
    lr_scaling section, LLVM 'Cannot allocate memory', then a segmentation fault)."""
    out = st.sweep(*args, **kwargs)
    release()
    return out


def release() -> None:
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def label(eta) -> str:
    return "∞" if eta is None else str(eta)


def spec(eta, learner: float, mode: str = "pace", batch: int | None = None) -> str:
    return st.policies.rl_async(eta, mode=mode, learner=learner, batch=batch).spec


def final_reward(result) -> float:
    """Mean sampled held-out reward over the last two evaluations (NaN if the run diverged)."""
    h = result.history
    if result.status != "complete" or len(h) < 2:
        return math.nan
    return float(np.mean(h["reward"].to_numpy()[-2:]))


def med_iv(values) -> dict:
    v = np.asarray([x for x in values if np.isfinite(x)], np.float64)
    if not len(v):
        return {"median": math.nan, "lo": math.nan, "hi": math.nan, "std": math.nan, "n": 0}
    lo, hi, kind = stats.interval(v)
    return {"median": float(np.median(v)), "lo": lo, "hi": hi, "std": float(v.std()), "n": int(len(v)), "kind": kind}


def fmt(d: dict, p: int = 3) -> str:
    return f"{d['median']:.{p}f} [{d['lo']:.{p}f}, {d['hi']:.{p}f}] (sd {d['std']:.{p}f})"


# -- the common setting: η sweeps of one objective, tuned at η = 0 ---------------------------------
def objective_of(name: str) -> tuple[str, dict]:
    """'decoupled_ppo:cap=5' -> ('decoupled_ppo', {'cap': 5.0})."""
    base, _, rest = name.partition(":")
    return base, {k: float(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}


def task_of(cfg: dict, objective: str, workers: int, **extra):
    base, params = objective_of(objective)
    return st.tasks.get("rl-digits", num_workers=workers, objective=base, **params, **extra)


def policy_of(cfg: dict, eta) -> tuple[str, str, int]:
    """(policy spec, cluster spec, actors) of staleness bound η in the common setting."""
    m = cfg["minibatches"]
    if eta == 0:
        return st.policies.rl_sync(cfg["learner"], minibatches=m).spec, cfg["sync_cluster"], cfg["batch"]
    return (st.policies.rl_async(eta, learner=cfg["learner"], batch=cfg["batch"], minibatches=m).spec, cfg["cluster"],
            cfg["workers"])


def tuned_lr(cfg: dict, objective: str, cache: dict, log, **extra) -> dict:
    """The objective's learning rate, tuned at η = 0 on the validation split (cached per
    objective and task options for the whole run)."""
    key = objective + json.dumps(extra, sort_keys=True)
    if key not in cache:
        t0 = time.time()
        pol, cl, lam = policy_of(cfg, 0)
        t = tune(task_of(cfg, objective, lam, **extra), pol, st.cluster.parse(cl), base_lr=cfg["base_lr"],
                 factors=cfg["factors"], seeds=cfg["tune_seeds"], extend=int(len(cfg["factors"]) > 1), metric="reward", max_time=None,
                 num_updates=cfg["updates"], lr_rule="constant", optimizer=None, inner_optimizer=None,
                 num_evals=cfg["num_evals"])
        release()
        cache[key] = {"lr": t["lr"], "grid": t["grid"], "scores": t["scores"], "edge": t["edge"], "runs": t["runs"],
                      "within_noise": t["within_noise"], "wall_s": time.time() - t0}
        log(f"  tuned {objective}{' ' + json.dumps(extra) if extra else ''}: lr {t['lr']:.3g} (grid "
            f"{', '.join(f'{g:.3g}: {s:.3f}' for g, s in zip(t['grid'], t['scores']))}) in {time.time() - t0:.0f}s")
    return cache[key]


def diag_means(result) -> dict:
    d = result.diagnostics
    if d is None or result.status != "complete":
        return {k: math.nan for k in DIAG}
    return {k: float(d[k].max() if k == "is_weight_max" else d[k].mean()) for k in DIAG}


ROWS: dict = {}
"""Rows measured in this run or found in the results file (`remember`), by `row_key`: a row
that another section already measured (the mismatch section's float32 rows are the η = 0 rows
of `areal` and `correction`) is taken, not run again."""


def row_key(cfg: dict, objective: str, eta, seeds, lr: float, extra: dict) -> str:
    """What a row's numbers depend on: the objective, policy, cluster, learning rate, seeds, run
    length and task options (float32 actors are the task's default, so they are left out)."""
    pol, cl, lam = policy_of(cfg, eta)
    opts = {k: v for k, v in extra.items() if not (k == "actor_dtype" and v == "float32")}
    return json.dumps([objective, pol, cl, lam, float(lr), [int(x) for x in seeds], cfg["updates"], cfg["num_evals"],
                       opts], sort_keys=True)


def remember(res: dict) -> None:
    """Index the rows of the results file's sections (each row names its `key`) in `ROWS`."""
    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("key"), str) and "reward" in node:
                ROWS[node["key"]] = node
            for v in node.values():
                walk(v)
    walk(res)


def eta_rows(cfg: dict, objective: str, etas, seeds, lr: float, log, **extra) -> dict:
    """{η label: final rewards, throughput, staleness, dropped and diagnostics over `seeds`}
    (a row measured already, in `ROWS`, is taken from there)."""
    rows = {}
    for eta in etas:
        key = row_key(cfg, objective, eta, seeds, lr, extra)
        if key in ROWS:
            rows[label(eta)] = ROWS[key]
            log(f"  {objective}{' ' + json.dumps(extra) if extra else ''} η={label(eta)}: the row measured above")
            continue
        pol, cl, lam = policy_of(cfg, eta)
        task = task_of(cfg, objective, lam, **extra)
        t0 = time.time()
        rs = sweep(task, [pol], st.cluster.parse(cl), seeds=seeds, lrs=[lr], num_updates=cfg["updates"],
                      num_evals=cfg["num_evals"])
        summ = [st.rollouts.summary(r.schedule, task, seed=r.config["seed"]) for r in rs]
        dg = [diag_means(r) for r in rs]
        rows[label(eta)] = {
            "policy": pol, "actors": lam, "reward": [final_reward(r) for r in rs],
            "throughput": [r.schedule.num_updates / float(r.schedule.update_time[-1]) for r in rs],
            "staleness_per_token": [s["mean_staleness_per_token"] for s in summ],
            "max_staleness": [s["max_staleness"] for s in summ], "dropped": [s["dropped"] for s in summ],
            "diagnostics": {k: [x[k] for x in dg] for k in DIAG}, "wall_s": time.time() - t0,
            "curves": [{"update": r.history["update"].tolist(), "reward": r.history["reward"].tolist()} for r in rs],
            "key": key}
        r = ROWS[key] = rows[label(eta)]
        log(f"  {objective}{' ' + json.dumps(extra) if extra else ''} η={label(eta)} ({pol}): reward "
            f"{fmt(med_iv(r['reward']))}, staleness/token {np.mean(r['staleness_per_token']):.2f}, kl_version "
            f"{np.nanmean(r['diagnostics']['kl_version']):.2e}, max behaviour weight "
            f"{np.nanmax(r['diagnostics']['is_weight_max']):.2f}, clip {np.nanmean(r['diagnostics']['clip_fraction']):.3f}"
            f" ({time.time() - t0:.0f}s)")
    return rows


# -- 1. AReaL's table, 2. corrections at large staleness (NeMo-RL, marin): objectives x η ---------
def section_eta(cfg, seeds, log, cache) -> dict:
    out = {"settings": cfg, "objectives": {}}
    for obj in cfg["objectives"]:
        t = tuned_lr(cfg, obj, cache, log)
        out["objectives"][obj] = {"lr": t["lr"], "tuning": t, "rows": eta_rows(cfg, obj, cfg["etas"], seeds, t["lr"],
                                                                                 log)}
    return out


# -- 3. training–inference mismatch -----------------------------------------------------------------
def section_mismatch(cfg, seeds, log, cache) -> dict:
    out = {"settings": cfg, "objectives": {}}
    for obj in cfg["objectives"]:
        t = tuned_lr(cfg, obj, cache, log)   # tuned with float32 actors
        out["objectives"][obj] = {"lr": t["lr"], "dtypes": {
            dt: eta_rows(cfg, obj, [0], seeds, t["lr"], log, actor_dtype=dt)["0"] for dt in cfg["dtypes"]}}
    return out


# -- 5. closed form (not retrievable): the simulator's grid ----------------------------------------
def section_closed_form(cfg, seeds, log, cache) -> dict:
    from staleness.engine import core

    grid = []
    for lam in cfg["workers"]:
        for b in cfg["batch"]:
            for sigma in cfg["sigma"]:
                task = st.tasks.get("rl-digits", num_workers=lam, warm_start_steps=0,
                                    length_rule=st.tasks.rl.lengths.LogNormal(3.0, sigma, 8))
                pol = st.policies.rl_async(None, batch=b)
                vals, util = [], []
                for s in seeds[:3]:
                    sch = st.simulate_schedule(pol, st.cluster.parse(f"1*{lam}+jitter=0.2"), num_updates=cfg["updates"],
                                               seed=s, sizes=task.rollout_sizes(core.keys(s)[1]))
                    vals.append(st.rollouts.summary(sch, task, seed=s)["mean_staleness_per_rollout"])
                    util.append(1.0 - float(np.mean(sch.wait_fraction())))
                grid.append({"actors": lam, "batch": b, "sigma": sigma, "mean_staleness": float(np.mean(vals)),
                             "actor_utilization": float(np.mean(util))})
                log(f"  closed_form λ={lam} B={b} σ={sigma}: mean staleness {np.mean(vals):.2f} (λ/B = {lam / b:.1f})")
    return {"settings": cfg, "grid": grid, "formula": None,
            "why": "only the opening of the post could be retrieved here (its inputs: utilization, batch size, queue "
                   "capacity, rollout concurrency, the response-length tail; validated against a discrete-event "
                   "simulator and real runs); its formula and stated accuracy could not, so nothing is compared"}


# -- 6. staleness–learning-rate scaling --------------------------------------------------------------
def section_lr_scaling(cfg, seeds, log, cache) -> dict:
    out = {"settings": cfg, "etas": {}}
    for eta in cfg["etas"]:
        pol, cl, lam = policy_of(cfg, eta)
        task = task_of(cfg, cfg["objective"], lam)
        t0 = time.time()
        rs = sweep(task, [pol], st.cluster.parse(cl), seeds=cfg["seeds"], lrs=cfg["lrs"], num_updates=cfg["updates"],
                      num_evals=cfg["num_evals"])
        by = {f"{lr:g}": [final_reward(r) for r in rs if r.config["lr"] == lr] for lr in cfg["lrs"]}
        stal = [st.rollouts.summary(r.schedule, task, seed=r.config["seed"])["max_staleness"] for r in rs]
        out["etas"][label(eta)] = {"policy": pol, "reward": by, "max_staleness": int(max(stal))}
        log(f"  lr_scaling η={label(eta)}: " + ", ".join(f"lr {k}: {np.median(v):.3f}" for k, v in by.items())
            + f" ({time.time() - t0:.0f}s)")
    return out


# -- section 2: one-step off-policy is one version stale -----------------------------------------
def section_one_step_off(cfg, seeds, log) -> dict:
    cluster = st.cluster.parse(cfg["cluster"])
    out = {"settings": cfg, "policies": {}}
    for name in ("rl_sync", "rl_one_step_off"):
        per_seed, first = [], None
        for s in seeds:
            sch = st.simulate_schedule(name, cluster, num_updates=cfg["updates"], seed=s)
            a = sch.applied
            stal = sch.staleness[a]
            av = sch.columns["apply_version"][a]
            per_seed.append({"hist": np.bincount(stal).tolist(),
                             "after_first_exactly_1": float(np.mean(stal[av >= 1] == 1)),
                             "time": float(sch.update_time[-1])})
            if first is None:
                c = sch.columns
                keep = a & (c["apply_version"] < cfg["show_rounds"])
                first = [{"worker": int(w), "iteration": int(i), "pull_version": int(p), "apply_version": int(v)}
                         for w, i, p, v in zip(c["worker"][keep], c["iteration"][keep], c["pull_version"][keep],
                                               c["apply_version"][keep])]
        out["policies"][name] = {"seeds": per_seed, "first_rounds": first}
        log(f"  one_step_off {name}: staleness histograms {[p['hist'] for p in per_seed]}")
    return out


# -- section 3: dropping stale rollouts biases the consumed lengths ------------------------------
def section_lengths(cfg, seeds, log) -> dict:
    from staleness.engine import core

    cluster = st.cluster.parse(cfg["cluster"])
    task = st.tasks.get("rl-digits", num_workers=cfg["workers"], prompts_per_rollout=cfg["prompts_per_rollout"])
    eta = cfg["eta"]
    out = {"settings": cfg, "policies": {}}
    for name in (f"rl_async:{eta}:mode=drop", f"rl_async:{eta}", "rl_async"):
        shift, rows = [], []
        for s in seeds:
            sch = st.simulate_schedule(name, cluster, num_updates=cfg["updates"], seed=s,
                                       sizes=task.rollout_sizes(core.keys(s)[1]))
            summ = st.rollouts.summary(sch, task, seed=s)
            shift.append(summ["length_consumed"]["mean"] - summ["length_generated"]["mean"])
            rows.append({k: summ[k] for k in ("rollouts", "consumed", "dropped", "length_generated",
                                              "length_consumed", "max_staleness")}
                        | {"time": float(sch.update_time[-1]), "mean_staleness": summ["mean_staleness_per_rollout"]})
        out["policies"][name] = {"shift": shift, "seeds": rows}
        log(f"  lengths {name}: consumed − generated mean length {fmt(med_iv(shift))}, dropped "
            f"{[r['dropped'] for r in rows]}")
    return out


# -- section 4: in-flight weight updates (PipelineRL) ---------------------------------------------
def _token_ages(sch, task, seed) -> dict:
    """Per-token staleness of what the learner consumed: mean, max, and the largest staleness
    of a rollout's newest tokens (its last in-flight segment's version)."""
    from staleness.engine import plan

    summ = st.rollouts.summary(sch, task, seed=seed)
    hist = np.asarray(summ["staleness_per_token"])
    lists = plan.segment_lists(sch) or {}
    c, a = sch.columns, sch.applied
    newest = [int(c["apply_version"][r] - (lists[r][-1][1] if lists.get(r) else c["pull_version"][r]))
              for r in np.flatnonzero(a)]
    return {"mean": summ["mean_staleness_per_token"], "max": int(np.flatnonzero(hist > 0).max()),
            "newest_max": int(max(newest)), "newest_mean": float(np.mean(newest)),
            "segments": summ["mean_segments"], "throughput": sch.num_updates / float(sch.update_time[-1])}


def section_inflight(cfg, seeds, log) -> dict:
    from staleness.engine import core

    cluster = st.cluster.parse(cfg["cluster"])
    lam, learner = cfg["workers"], cfg["learner"]
    task = st.tasks.get("rl-digits", num_workers=lam, objective=cfg["objective"])
    log(f"  inflight: conventional = rl_sync:split=G (verl's counting: each of the G optimizer steps is a version)")
    out = {"settings": cfg, "steps": {}}
    for g in cfg["steps"]:
        pols = {"conventional": st.policies.rl_sync(learner, split=g).spec,
                "rl_async": st.policies.rl_async(None, learner=learner, batch=lam // g).spec,
                "rl_inflight": st.policies.rl_inflight(None, learner=learner, batch=lam // g).spec}
        row = {}
        for kind, name in pols.items():
            ages = [_token_ages(st.simulate_schedule(name, cluster, num_updates=cfg["updates"], seed=s,
                                                     sizes=task.rollout_sizes(core.keys(s)[1])), task, s)
                    for s in seeds]
            row[kind] = {"policy": name, **{k: [a[k] for a in ages] for k in ages[0]}}
            log(f"  inflight G={g} {name}: throughput {fmt(med_iv(row[kind]['throughput']), 4)} upd/s, staleness "
                f"per token mean {np.mean(row[kind]['mean']):.2f} max {max(row[kind]['max'])}, newest token max "
                f"{max(row[kind]['newest_max'])}, versions per rollout {np.mean(row[kind]['segments']):.2f}")
        out["steps"][str(g)] = row
    # training: rl_async vs rl_inflight at G = reward_steps, lr tuned on rl_async on separate seeds
    g = cfg["reward_steps"]
    pols = [st.policies.rl_async(None, learner=learner, batch=lam // g).spec,
            st.policies.rl_inflight(None, learner=learner, batch=lam // g).spec]
    lr, scores = cfg["lr"], {}
    t0 = time.time()
    if lr is None:
        tune = sweep(task, pols[:1], cluster, seeds=cfg["tune_seeds"], lrs=cfg["grid"], num_updates=cfg["updates"],
                        num_evals=cfg["num_evals"])
        scores = {x: float(np.nanmean([final_reward(r) for r in tune if r.config["lr"] == x])) for x in cfg["grid"]}
        lr = max(scores, key=lambda k: -math.inf if math.isnan(scores[k]) else scores[k])
    res = sweep(task, pols, cluster, seeds=seeds, lrs=[lr], num_updates=cfg["updates"], num_evals=cfg["num_evals"])
    rewards = {p: [final_reward(r) for r in res if r.config["policy"] == p] for p in pols}
    out["training"] = {"lr": lr, "tuning": {f"{k:g}": v for k, v in scores.items()}, "reward": rewards,
                       "wall_s": time.time() - t0}
    for p in pols:
        log(f"  inflight training {p} (lr {lr:g}): final reward {fmt(med_iv(rewards[p]))}")
    return out




def _inflight_claims(inf: dict) -> list[dict]:
    steps = inf["steps"]
    same = all(a == b for g in steps.values() for a, b in zip(g["rl_async"]["throughput"],
                                                             g["rl_inflight"]["throughput"]))
    mean = [stats.effect(g["rl_inflight"]["mean"], g["rl_async"]["mean"]) for g in steps.values()]
    mx = [stats.effect([float(x) for x in g["rl_inflight"]["max"]], [float(x) for x in g["rl_async"]["max"]])
          for g in steps.values()]
    newest = [stats.effect([float(x) for x in g["rl_inflight"]["newest_max"]],
                           [float(x) for x in g["rl_async"]["max"]]) for g in steps.values()]
    conv = [stats.effect([float(x) for x in g["rl_inflight"]["newest_max"]],
                         [float(x) for x in g["conventional"]["max"]]) for g in steps.values()]
    tput = [stats.effect(g["rl_inflight"]["throughput"], g["conventional"]["throughput"], ratio=True)
            for g in steps.values()]
    out = [{"claim": "in-flight weight updates lower the staleness per token at equal throughput (vs rl_async)",
            "verdict": stats.verdict(sum(x.side() == "below" for x in mean), len(mean))
            + f"; equal throughput {stats.model_set('the weight transfer overlaps the decode')}: identical "
              f"update times in every run: {same}",
            "details": [f"G={k}: mean staleness per token {x.text()}" for k, x in zip(steps, mean)]},
           {"claim": "in-flight weight updates lower the maximum staleness of a token at equal throughput (vs rl_async)",
            "verdict": stats.verdict(sum(x.side() == "below" for x in mx), len(mx)),
            "details": [f"G={k}: max token staleness {x.text()} (a rollout's oldest tokens keep its pulled version)"
                        for k, x in zip(steps, mx)]
            + [f"G={k}: max staleness of a rollout's newest tokens (in-flight) vs max of rl_async: {x.text()}"
               for k, x in zip(steps, newest)]},
           {"claim": "in-flight asynchronous RL runs faster than conventional RL with G optimizer steps per batch "
                     "(rl_sync:split=G) while its newest tokens are no staler than conventional's max",
            "verdict": stats.verdict(sum(t.side() == "above" and c.side() != "above" for t, c in zip(tput, conv)),
                                     len(tput)),
            "details": [f"G={k}: throughput ratio {t.text()}; newest-token max vs conventional max {c.text()}"
                        for k, t, c in zip(steps, tput, conv)]}]
    tr = inf.get("training")
    if tr:
        (pa, ra), (pb, rb) = list(tr["reward"].items())
        e = stats.effect(rb, ra)
        out.append({"claim": "in-flight weight updates do not harm training (final reward of rl_inflight not "
                             "distinguishably below rl_async's)",
                    "verdict": stats.verdict(int(e.side() != "below"), 1),
                    "details": [f"{pb} vs {pa} (lr {tr['lr']:g}): {e.text()}; seed spread of {pa}: {fmt(med_iv(ra))}"]})
    return out



# -- claims ----------------------------------------------------------------------------------------
def _big(etas):
    return [e for e in etas if e not in ("0", "1", "2")]


def _areal_claims(areal: dict) -> list[dict]:
    out = []
    objs = areal["objectives"]
    etas = list(next(iter(objs.values()))["rows"])
    big = _big(etas)
    mid = [e for e in etas if e not in ("0", "∞")]
    if "ppo" in objs:
        rows = objs["ppo"]["rows"]
        effs = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in big]
        j = stats.judge(effs, claimed="below") if effs else None
        out.append({"claim": "naive PPO's final reward degrades at large η (η ≥ 4 vs η = 0; AReaL: 42.0 → 23.3 at η = 4)",
                    "verdict": j.text() if j else stats.NOT_TESTED,
                    "details": [f"η={e}: {x.text()}; seed spread at η=0: {fmt(med_iv(rows['0']['reward']))}"
                                for e, x in zip(big, effs)]})
    for obj in [o for o in objs if o.startswith("decoupled_ppo")]:
        rows = objs[obj]["rows"]
        effs = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in mid]
        held = sum(x.side() != "below" for x in effs)
        out.append({"claim": f"{obj} stays near η = 0 up to η = 8 (not distinguishably worse; AReaL: 41.0-42.2)",
                    "verdict": stats.verdict(held, len(effs)) if effs else stats.NOT_TESTED,
                    "details": [f"η={e}: {x.text()} ({x.side()})" for e, x in zip(mid, effs)]})
        if "ppo" in objs:
            a, b = rows, objs["ppo"]["rows"]
            effs = [stats.effect(a[e]["reward"], b[e]["reward"]) for e in big]
            j = stats.judge(effs, claimed="above") if effs else None
            out.append({"claim": f"{obj} beats naive PPO at large η",
                        "verdict": j.text() if j else stats.NOT_TESTED,
                        "details": [f"η={e}: {x.text()}" for e, x in zip(big, effs)]})
    rows = next(iter(objs.values()))["rows"]
    order = [e for e in etas if e != "0"]
    pairs = list(zip(order[:-1], order[1:]))
    effs = [stats.effect(rows[b]["throughput"], rows[a]["throughput"], ratio=True) for a, b in pairs]
    held = sum(x.side() != "below" for x in effs)
    out.append({"claim": "throughput rises with η (never distinguishably lower at the next η)",
                "verdict": stats.verdict(held, len(effs)) if effs else stats.NOT_TESTED,
                "details": [f"η={a}→{b}: {x.text()}" for (a, b), x in zip(pairs, effs)]
                + [f"η=0 is rl_sync on {rows['0']['actors']} actors: {fmt(med_iv(rows['0']['throughput']), 4)} upd/s "
                   "(not on the same cluster: its actors are the batch)"]})
    return out


def _correction_claims(cor: dict, areal: dict | None) -> list[dict]:
    objs = dict(cor["objectives"])
    if areal and "ppo" in areal["objectives"]:
        objs = {"ppo": areal["objectives"]["ppo"], **objs}
    out = []
    plain = [o for o in ("reinforce", "ppo") if o in objs]
    etas = list(next(iter(cor["objectives"].values()))["rows"])
    big = [e for e in etas if e != "0"]
    for obj in plain:
        rows = objs[obj]["rows"]
        effs = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in big if e in rows]
        j = stats.judge(effs, claimed="below") if effs else None
        out.append({"claim": f"without an IS correction ({obj}) training degrades at large staleness (NeMo-RL #1098)",
                    "verdict": j.text() if j else stats.NOT_TESTED,
                    "details": [f"η={e}: {x.text()}" for e, x in zip(big, effs)]})
    for obj in [o for o in ("tis", "mis") if o in objs]:
        rows = objs[obj]["rows"]
        near = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in big]
        held = sum(x.side() != "below" for x in near)
        details = [f"η={e} vs 0: {x.text()} ({x.side()})" for e, x in zip(big, near)]
        for p in plain:
            details += [f"η={e}: {obj} − {p}: {stats.effect(rows[e]['reward'], objs[p]['rows'][e]['reward']).text()}"
                        for e in big if e in objs[p]["rows"]]
        out.append({"claim": f"{obj.upper()} recovers it: not distinguishably below its η = 0 at large staleness "
                             "(marin #8955: plain PPO 2/128, TIS 98/128)",
                    "verdict": stats.verdict(held, len(near)) if near else stats.NOT_TESTED, "details": details})
    return out


def _mismatch_claims(mm: dict) -> list[dict]:
    out = []
    objs = mm["objectives"]
    kl = {dt: [x for o in objs.values() for x in o["dtypes"][dt]["diagnostics"]["kl_behav"]] for dt in
          next(iter(objs.values()))["dtypes"]}
    if "bfloat16" in kl and "float32" in kl:
        e = stats.effect(kl["bfloat16"], kl["float32"])
        out.append({"claim": "bfloat16 actors make staleness 0 off-policy: KL(π_behav ‖ π_θ) > 0 at η = 0",
                    "verdict": stats.verdict(int(e.side() == "above"), 1),
                    "details": [f"kl_behav (k3, mean per update): bfloat16 {fmt(med_iv(kl['bfloat16']), 6)} vs float32 "
                                f"{fmt(med_iv(kl['float32']), 6)}"]})
    for obj, o in objs.items():
        if {"bfloat16", "float32"} <= set(o["dtypes"]):
            e = stats.effect(o["dtypes"]["bfloat16"]["reward"], o["dtypes"]["float32"]["reward"])
            out.append({"claim": f"{obj}: bfloat16 actors cost final reward at η = 0 (distinguishably below float32)",
                        "verdict": stats.verdict(int(e.side() == "below"), 1),
                        "details": [f"bfloat16 − float32: {e.text()}; float32 spread "
                                    f"{fmt(med_iv(o['dtypes']['float32']['reward']))}"]})
    return out


def _lr_claims(lr: dict) -> list[dict]:
    etas = list(lr["etas"])
    best, stable = {}, {}
    for e in etas:
        med = {float(k): float(np.nanmedian(v)) for k, v in lr["etas"][e]["reward"].items()}
        top = max(med.values())
        best[e] = max(med, key=med.get)
        stable[e] = max((k for k, v in med.items() if v >= 0.5 * top), default=math.nan)
    # held: never higher at the next η, and strictly lower at the largest η than at η = 0
    held = sum(stable[b] <= stable[a] for a, b in zip(etas[:-1], etas[1:])) + (stable[etas[-1]] < stable[etas[0]])
    return [{"claim": "the largest stable learning rate falls as staleness grows (arXiv 2607.01083: bias O(S·η))",
             "verdict": stats.verdict(held, len(etas)),
             "details": [f"η={e} (max staleness {lr['etas'][e]['max_staleness']}): best lr {best[e]:g}, largest lr within "
                         f"half the best reward {stable[e]:g}" for e in etas]
             + ["(3 seeds per rate: a coarse grid; a rate 'stable' when its median reward is at least half the best)"]}]


def claims(res: dict) -> list[dict]:
    out = []
    if res.get("areal"):
        out += _areal_claims(res["areal"])
    if res.get("correction"):
        out += _correction_claims(res["correction"], res.get("areal"))
    if res.get("mismatch"):
        out += _mismatch_claims(res["mismatch"])
    if res.get("lr_scaling"):
        out += _lr_claims(res["lr_scaling"])
    cf = res.get("closed_form")
    if cf:
        out.append({"claim": "Applied Compute's closed-form mean staleness matches the simulator",
                    "verdict": stats.NOT_TESTED + f": {cf['why']}",
                    "details": [f"simulated: λ={g['actors']} B={g['batch']} σ={g['sigma']}: mean staleness "
                                f"{g['mean_staleness']:.2f} (λ/B = {g['actors'] / g['batch']:.1f}), actor utilization "
                                f"{g['actor_utilization']:.2f}" for g in cf["grid"]]})
    one = res.get("one_step_off")
    if one:
        p = one["policies"]["rl_one_step_off"]
        exact = [s["after_first_exactly_1"] for s in p["seeds"]]
        sync0 = all(len(s["hist"]) == 1 for s in one["policies"]["rl_sync"]["seeds"])
        out.append({"claim": "one-step off-policy (threshold 0) is one version stale; rl_sync is 0",
                    "verdict": stats.model_set("round k + 1 is generated on the version before update k, which the "
                                               "gate enforces") + f"; measured: fraction exactly 1 after the first "
                                               f"round per seed {exact}, rl_sync all 0: {sync0}",
                    "details": [f"first rounds (worker, iteration, pull_version → apply_version): "
                                + ", ".join(f"({r['worker']},{r['iteration']},{r['pull_version']}→"
                                            f"{r['apply_version']})" for r in p["first_rounds"])]})
    ln = res.get("lengths")
    if ln:
        pols = ln["policies"]
        drop = next(k for k in pols if "drop" in k)
        pace = next(k for k in pols if "drop" not in k and ":" in k)
        zeros = [0.0] * len(pols[drop]["shift"])
        e_drop = stats.effect(pols[drop]["shift"], zeros)
        e_pace = stats.effect(pols[pace]["shift"], zeros)
        e_diff = stats.effect(pols[drop]["shift"], pols[pace]["shift"])
        share = {k: [r["dropped"] / max(r["rollouts"], 1) for r in v["seeds"]] for k, v in pols.items()}
        stal = {k: [r["mean_staleness"] for r in v["seeds"]] for k, v in pols.items()}
        held = (e_drop.side() == "below") + (e_diff.side() == "below")
        out.append({"claim": "dropping stale rollouts shifts the consumed lengths toward short prompts, more than "
                             "pacing the actors does (tinker-cookbook #822)",
                    "verdict": stats.verdict(held, 2),
                    "details": [f"{drop}: consumed − generated mean length {e_drop.text()}",
                                f"{pace}: {e_pace.text()} ({e_pace.side()})",
                                f"drop − pace: {e_diff.text()}"]
                    + [f"{k}: dropped share {fmt(med_iv(share[k]))}, mean staleness {fmt(med_iv(stal[k]), 2)}"
                       for k in pols]})
    inf = res.get("inflight")
    out += _inflight_claims(inf) if inf else []
    return out


# -- report ----------------------------------------------------------------------------------------
def plots(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    areal = res.get("areal")
    if areal:
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
        for obj, o in areal["objectives"].items():
            etas = list(o["rows"])
            x = np.arange(len(etas))
            m = [med_iv(o["rows"][e]["reward"]) for e in etas]
            axes[0].errorbar(x, [d["median"] for d in m], yerr=[[d["median"] - d["lo"] for d in m],
                                                                 [d["hi"] - d["median"] for d in m]],
                             marker="o", capsize=3, label=f"{obj} (lr {o['lr']:.3g})")
            axes[0].set_xticks(x, etas)
            kv = [np.nanmedian(o["rows"][e]["diagnostics"]["kl_version"]) for e in etas]
            wm = [np.nanmax(o["rows"][e]["diagnostics"]["is_weight_max"]) for e in etas]
            axes[1].plot(x, kv, marker="o", label=obj)
            axes[2].plot(x, wm, marker="o", label=obj)
        axes[0].set(xlabel="η (max staleness)", ylabel="final held-out reward", title="reward vs η (8 seeds, 95%)")
        axes[0].legend(fontsize=7)
        axes[1].set(xlabel="η", ylabel="KL between versions (probe)", title="kl_version, median over seeds",
                    yscale="log")
        axes[2].set(xlabel="η", ylabel="largest behaviour weight", title="max π_θ/π_behav over the run", yscale="log")
        axes[2].axhline(5, color="gray", lw=0.8, ls="--")
        for ax in axes[1:]:
            ax.set_xticks(np.arange(len(etas)), etas)
        fig.tight_layout()
        p = out / f"{NAME}_areal.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p.name)
    ln = res.get("lengths")
    if ln:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        names = list(ln["policies"])
        for i, n in enumerate(names):
            v = ln["policies"][n]["shift"]
            ax.scatter([i] * len(v), v, alpha=0.7)
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set(ylabel="consumed − generated\nmean length (tokens)", title="what the learner consumed, per seed")
        fig.tight_layout()
        p = out / f"{NAME}_lengths.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        made.append(p.name)
    return made


def _eta_table(title: str, objs: dict) -> list[str]:
    L = [title, "", "| objective | η | policy | final reward (median [95%], sd) | updates/s | staleness per token | max | "
         "dropped | kl_version | max behaviour weight | clip fraction | masked fraction | kl_behav |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for obj, o in objs.items():
        for e, r in o["rows"].items():
            d = r["diagnostics"]
            L.append(f"| {obj} (lr {o['lr']:.3g}) | {e} | `{r['policy']}` | {fmt(med_iv(r['reward']))} | "
                     f"{fmt(med_iv(r['throughput']), 4)} | {np.mean(r['staleness_per_token']):.2f} | "
                     f"{max(r['max_staleness'])} | {int(np.sum(r['dropped']))} | {np.nanmedian(d['kl_version']):.2e} | "
                     f"{np.nanmax(d['is_weight_max']):.2f} | {np.nanmedian(d['clip_fraction']):.3f} | "
                     f"{np.nanmedian(d['masked_fraction']):.3f} | {np.nanmedian(d['kl_behav']):.2e} |")
    return L + [""]


def report(res: dict, out: Path, meta: dict) -> Path:
    L = [f"# {NAME}", "", "Asynchronous RL's staleness findings, reproduced in `staleness`' simulator with the learner "
         "the anchors run and real numerics. Generated by `python benchmarks/reproduce_async_rl.py"
         + (" --quick" if meta.get("quick") else "") + "`; every number below was measured in this run.", "",
         f"Seeds: {meta['seeds']}. Versions: `{json.dumps(meta['versions'])}`.", "",
         "Verdict scale (`staleness.results.stats.verdict`): HOLDS / MOSTLY / MIXED / MOSTLY NOT / DOES NOT HOLD over the "
         f"scenarios of a claim; intervals are bootstrap 95% of the median over {len(meta['seeds'])} seeds (min-max "
         "below 5).", "", "## Conventions (matched to the anchors' code)", ""]
    L += [line.strip() for line in __doc__.split("The anchors' conventions matched")[1].split("Sections")[0]
          .split("\n") if line.strip()] + [""]
    missing = [s for s in SECTIONS if s not in res]
    if missing:
        L += [f"**Sections not in this run:** {', '.join(missing)} (their claims are absent below; "
              f"`python benchmarks/reproduce_async_rl.py --resume --sections {','.join(missing)}` adds them).", ""]
    L += ["## Claims", "", "| claim | verdict |", "|---|---|"]
    cl = claims(res)
    L += [f"| {c['claim']} | {c['verdict'].split(':')[0] if ':' in c['verdict'] else c['verdict']} |" for c in cl] + [""]
    for c in cl:
        L += [f"### {c['claim']}", "", f"**{c['verdict']}**", ""] + [f"- {d}" for d in c["details"]] + [""]
    if res.get("areal"):
        L += _eta_table("## AReaL's table (rl-digits)", res["areal"]["objectives"])
        L += [f"Settings: `{json.dumps(res['areal']['settings'])}`", ""]
    if res.get("correction"):
        L += _eta_table("## Corrections at large staleness", res["correction"]["objectives"])
    mm = res.get("mismatch")
    if mm:
        L += ["## Training–inference mismatch (η = 0)", "", "| objective | actors | final reward | kl_behav | "
              "max behaviour weight | masked fraction |", "|---|---|---|---|---|---|"]
        for obj, o in mm["objectives"].items():
            for dt, r in o["dtypes"].items():
                d = r["diagnostics"]
                L.append(f"| {obj} (lr {o['lr']:.3g}) | {dt} | {fmt(med_iv(r['reward']))} | "
                         f"{np.nanmedian(d['kl_behav']):.2e} | {np.nanmax(d['is_weight_max']):.3f} | "
                         f"{np.nanmedian(d['masked_fraction']):.4f} |")
        L.append("")
    lr = res.get("lr_scaling")
    if lr:
        lrs = list(next(iter(lr["etas"].values()))["reward"])
        L += ["## Learning rate vs staleness (decoupled PPO, median final reward)", "",
              "| η | max staleness | " + " | ".join(f"lr {k}" for k in lrs) + " |", "|---|---|" + "---|" * len(lrs)]
        for e, r in lr["etas"].items():
            L.append(f"| {e} | {r['max_staleness']} | " + " | ".join(f"{np.nanmedian(r['reward'][k]):.3f}" for k in lrs)
                     + " |")
        L.append("")
    inf = res.get("inflight")
    if inf:
        L += ["## In-flight weight updates (rl-digits timing, 8 actors)", "",
              f"Settings: `{json.dumps(inf['settings'])}`", "",
              "| G | policy | updates/s (median [95%]) | staleness per token: mean | max | newest token: max | "
              "versions per rollout |", "|---|---|---|---|---|---|---|"]
        for g, row in inf["steps"].items():
            for r in row.values():
                L.append(f"| {g} | `{r['policy']}` | {fmt(med_iv(r['throughput']), 4)} | {np.mean(r['mean']):.2f} | "
                         f"{max(r['max'])} | {max(r['newest_max'])} | {np.mean(r['segments']):.2f} |")
        L.append("")
    for p in plots(res, out):
        L += [f"![{p}]({p})", ""]
    L += [f"Section wall times (s): {json.dumps({k: round(v, 1) for k, v in meta['section_wall'].items()})}", ""]
    path = out / f"{NAME}.md"
    files.write_text(path, "\n".join(L) + "\n")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny budgets, 3 seeds")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 8; quick 3)")
    ap.add_argument("--resume", action="store_true", help="skip sections already in the results file")
    ap.add_argument("--out", default=None, help="output directory (default benchmarks/results; quick: runs/...)")
    args = ap.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print(f"reproduce_async_rl: --sections {','.join(bad)} unknown; valid: {','.join(SECTIONS)}", file=sys.stderr)
        return 2
    cfg = QUICK if args.quick else FULL
    out = Path(args.out) if args.out else (ROOT / "runs" / f"{NAME}_quick" if args.quick else ROOT / "benchmarks"
                                           / "results")
    out.mkdir(parents=True, exist_ok=True)
    seeds = list(range(args.seeds if args.seeds is not None else (3 if args.quick else 8)))
    store = out / f"{NAME}.json"
    res = json.loads(store.read_text()) if args.resume and store.exists() else {}
    meta = res.pop("_meta", {"section_wall": {}})
    cache = res.pop("_tuning", {})
    remember(res)
    log = lambda m: print(m, flush=True)  # noqa: E731
    fns = {"areal": section_eta, "correction": section_eta, "mismatch": section_mismatch,
           "closed_form": section_closed_form, "lr_scaling": section_lr_scaling,
           "one_step_off": lambda c, s, lg, _: section_one_step_off(c, s, lg),
           "lengths": lambda c, s, lg, _: section_lengths(c, s, lg),
           "inflight": lambda c, s, lg, _: section_inflight(c, s, lg)}
    for name in sections:
        if name in res or name not in fns:
            continue
        t0 = time.time()
        log(f"[{name}]")
        res[name] = fns[name](cfg[name], seeds, log, cache)
        meta["section_wall"][name] = time.time() - t0
        meta.update(seeds=seeds, quick=args.quick, versions=versions())
        files.write_text(store, json.dumps({**res, "_tuning": cache, "_meta": meta}, default=float))
    meta.update(seeds=seeds, quick=args.quick, versions=versions())
    path = report(res, out, meta)
    verdicts = {c["claim"]: c["verdict"].split(":")[0] for c in claims(res)}
    print(f"report: {path}")
    print(json.dumps({"benchmark": NAME, "quick": args.quick, "seeds": len(seeds), "verdicts": verdicts,
                      "section_wall_s": {k: round(v, 1) for k, v in meta["section_wall"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
