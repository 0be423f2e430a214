"""Reproduce asynchronous RL's staleness findings in the simulator, with real numerics
(rl-digits: a small transformer reversing digit strings, 4 actors, a learner).

Sections (each a claim; every number is computed here, from this run):

1. `areal` (AReaL, Fu et al. 2025, Table "staleness"): for η in {0, 1, 2, 4, 8, ∞}
   (`rl_async:η:batch=2` on 8 actors, AReaL's pacing: the learner updates from 2
   rollouts at a time, so rollouts reach staleness 8), naive PPO (clip against the behavior policy)
   degrades as η grows while decoupled PPO stays near η = 0 up to about η = 8,
   and throughput (updates per simulated second) rises with η. Learning rates
   tuned per objective at η = 0 on separate seeds; final reward = mean sampled
   reward on held-out prompts over the last two evaluations.
2. `one_step_off` (verl#4449, verl#6780): one-step off-policy with staleness
   "threshold 0" is one version stale: the versions of the first rounds and the
   staleness of every consumed rollout, next to `rl_sync`.
3. `lengths` (tinker-cookbook#822): dropping rollouts staler than η shifts the
   consumed length distribution toward short prompts; pacing the actors does not
   (one prompt per rollout, so a rollout's generation time is its prompt's length).
4. `inflight` (PipelineRL, Piché et al. 2025): in-flight weight updates lower the
   staleness of what the learner trains on at equal throughput. On 8 actors with
   long-tailed rollout lengths, for G learner updates per λ rollouts: conventional RL
   (`rl_sync:minibatches=G`, G optimizer steps per generation batch), asynchronous RL
   (`rl_async:batch=λ/G`) and the same with in-flight updates (`rl_inflight:batch=λ/G`):
   throughput (updates per simulated second), staleness per token (mean, max) and the
   staleness of each rollout's newest token; then the final reward of rl_async vs
   rl_inflight with decoupled PPO (in-flight updates do not harm training).
The seed-to-seed spread (the interval of the baseline's median, and the standard
deviation over seeds) is printed next to each effect (UniRL#310).

    python benchmarks/reproduce_async_rl.py            # full: 5 seeds
    python benchmarks/reproduce_async_rl.py --quick    # smoke run: runs/reproduce_async_rl_quick/
    python benchmarks/reproduce_async_rl.py --sections lengths --resume

Every section writes its results into `<out>/reproduce_async_rl.json` (atomically) as
soon as it ends; `--resume` skips the sections found there. Then a markdown report with
a verdict per claim (`staleness.results.stats`' scale) and the plots.
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
from _report import versions
from staleness.infra import files
from staleness.results import stats

ROOT = Path(__file__).resolve().parent.parent
NAME = "reproduce_async_rl"
SECTIONS = ("areal", "one_step_off", "lengths", "inflight")
INF = "inf"

FULL = {
    "areal": dict(workers=8, batch=2, cluster="1*8+jitter=0.5", updates=60, etas=[0, 1, 2, 4, 8, None],
                  objectives=["ppo", "decoupled_ppo"], grid=[1e-3, 3e-3], tune_seeds=[100], num_evals=6,
                  learner=0.5),
    "one_step_off": dict(workers=4, cluster="1,1,1.5,3+jitter=0.3", updates=40, show_rounds=3),
    "lengths": dict(workers=4, cluster="1,1,1.5,3+jitter=0.5", updates=300, eta=1, prompts_per_rollout=1),
    "inflight": dict(workers=8, cluster="1*8+jitter=0.5", updates=60, steps=[1, 2, 4], objective="decoupled_ppo",
                     reward_steps=4, lr=None, grid=[1e-3, 3e-3], tune_seeds=[100], num_evals=6, learner=0.5),
}
QUICK = {
    "areal": dict(workers=8, batch=2, cluster="1*8+jitter=0.5", updates=12, etas=[0, 2, None],
                  objectives=["ppo", "decoupled_ppo"], grid=[1e-3], tune_seeds=[100], num_evals=2, learner=0.5),
    "one_step_off": dict(workers=4, cluster="1,1,1.5,3+jitter=0.3", updates=12, show_rounds=2),
    "lengths": dict(workers=4, cluster="1,1,1.5,3+jitter=0.5", updates=80, eta=1, prompts_per_rollout=1),
    "inflight": dict(workers=8, cluster="1*8+jitter=0.5", updates=12, steps=[1, 4], objective="decoupled_ppo",
                     reward_steps=4, lr=1e-3, grid=[1e-3], tune_seeds=[100], num_evals=2, learner=0.5),
}


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


# -- section 1: AReaL's staleness table ------------------------------------------------------
def section_areal(cfg, seeds, log) -> dict:
    cluster = st.cluster.parse(cfg["cluster"])
    out = {"settings": cfg, "objectives": {}}
    for obj in cfg["objectives"]:
        task = st.tasks.get("rl-digits", num_workers=cfg["workers"], objective=obj)
        sync = spec(0, cfg["learner"], batch=cfg["batch"])
        t0 = time.time()
        tune = st.sweep(task, [sync], cluster, seeds=cfg["tune_seeds"], lrs=cfg["grid"], num_updates=cfg["updates"],
                        num_evals=cfg["num_evals"])
        scores = {}
        for i, lr in enumerate(cfg["grid"]):
            runs = [r for r in tune if r.config["lr"] == lr]
            scores[lr] = float(np.nanmean([final_reward(r) for r in runs])) if runs else math.nan
        best = max(scores, key=lambda k: -math.inf if math.isnan(scores[k]) else scores[k])
        log(f"  areal {obj}: tuned lr {best:g} ({', '.join(f'{k:g}: {v:.3f}' for k, v in scores.items())}) "
            f"in {time.time() - t0:.0f}s")
        pols = [spec(e, cfg["learner"], batch=cfg["batch"]) for e in cfg["etas"]]
        t0 = time.time()
        res = st.sweep(task, pols, cluster, seeds=seeds, lrs=[best], num_updates=cfg["updates"],
                       num_evals=cfg["num_evals"])
        rows = {}
        for k, eta in enumerate(cfg["etas"]):
            rs = res[k * len(seeds):(k + 1) * len(seeds)]
            summ = [st.rollouts.summary(r.schedule, task, seed=r.config["seed"]) for r in rs]
            rows[label(eta)] = {
                "policy": pols[k],
                "reward": [final_reward(r) for r in rs],
                "throughput": [r.schedule.num_updates / float(r.schedule.update_time[-1]) for r in rs],
                "staleness_per_token": [s["mean_staleness_per_token"] for s in summ],
                "max_staleness": [s["max_staleness"] for s in summ],
                "dropped": [s["dropped"] for s in summ],
                "curves": [{"time": r.history["time"].tolist(), "reward": r.history["reward"].tolist()} for r in rs],
            }
            log(f"  areal {obj} η={label(eta)}: reward {fmt(med_iv(rows[label(eta)]['reward']))}, throughput "
                f"{fmt(med_iv(rows[label(eta)]['throughput']), 4)} upd/s, staleness/token "
                f"{np.mean(rows[label(eta)]['staleness_per_token']):.2f}")
        out["objectives"][obj] = {"lr": best, "tuning": {f"{k:g}": v for k, v in scores.items()}, "rows": rows,
                                  "wall_s": time.time() - t0}
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
                                              "length_consumed", "max_staleness")} | {"time": float(sch.update_time[-1])})
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
    out = {"settings": cfg, "steps": {}}
    for g in cfg["steps"]:
        pols = {"conventional": st.policies.rl_sync(learner, minibatches=g).spec,
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
        tune = st.sweep(task, pols[:1], cluster, seeds=cfg["tune_seeds"], lrs=cfg["grid"], num_updates=cfg["updates"],
                        num_evals=cfg["num_evals"])
        scores = {x: float(np.nanmean([final_reward(r) for r in tune if r.config["lr"] == x])) for x in cfg["grid"]}
        lr = max(scores, key=lambda k: -math.inf if math.isnan(scores[k]) else scores[k])
    res = st.sweep(task, pols, cluster, seeds=seeds, lrs=[lr], num_updates=cfg["updates"], num_evals=cfg["num_evals"])
    rewards = {p: [final_reward(r) for r in res if r.config["policy"] == p] for p in pols}
    out["training"] = {"lr": lr, "tuning": {f"{k:g}": v for k, v in scores.items()}, "reward": rewards,
                       "wall_s": time.time() - t0}
    for p in pols:
        log(f"  inflight training {p} (lr {lr:g}): final reward {fmt(med_iv(rewards[p]))}")
    return out


# -- claims ----------------------------------------------------------------------------------------
def claims(res: dict) -> list[dict]:
    out = []
    areal = res.get("areal")
    if areal:
        objs = areal["objectives"]
        etas = list(next(iter(objs.values()))["rows"])
        big = [e for e in etas if e not in ("0", "1", "2")]
        mid = [e for e in etas if e != "0" and e != INF and e != "∞"]
        if "ppo" in objs:
            rows = objs["ppo"]["rows"]
            effs = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in big]
            j = stats.judge(effs, claimed="below") if effs else None
            out.append({"claim": "naive PPO's final reward degrades at large η (η ≥ 4 vs η = 0)",
                        "verdict": j.text() if j else stats.NOT_TESTED,
                        "details": [f"η={e}: {x.text()}; seed spread at η=0: {fmt(med_iv(rows['0']['reward']))}"
                                    for e, x in zip(big, effs)]})
        if "decoupled_ppo" in objs:
            rows = objs["decoupled_ppo"]["rows"]
            effs = [stats.effect(rows[e]["reward"], rows["0"]["reward"]) for e in mid]
            held = sum(x.side() != "below" for x in effs)
            out.append({"claim": "decoupled PPO stays near η = 0 up to η = 8 (not distinguishably worse)",
                        "verdict": stats.verdict(held, len(effs)) if effs else stats.NOT_TESTED,
                        "details": [f"η={e}: {x.text()} ({x.side()})" for e, x in zip(mid, effs)]})
        if {"ppo", "decoupled_ppo"} <= set(objs):
            a, b = objs["decoupled_ppo"]["rows"], objs["ppo"]["rows"]
            effs = [stats.effect(a[e]["reward"], b[e]["reward"]) for e in big]
            j = stats.judge(effs, claimed="above") if effs else None
            out.append({"claim": "decoupled PPO beats naive PPO at large η",
                        "verdict": j.text() if j else stats.NOT_TESTED,
                        "details": [f"η={e}: {x.text()}" for e, x in zip(big, effs)]})
        rows = next(iter(objs.values()))["rows"]
        pairs = list(zip(etas[:-1], etas[1:]))
        effs = [stats.effect(rows[b]["throughput"], rows[a]["throughput"], ratio=True) for a, b in pairs]
        held = sum(x.side() != "below" for x in effs)
        grow = stats.effect(rows[etas[-1]]["throughput"], rows["0"]["throughput"], ratio=True)
        out.append({"claim": "throughput rises with η (never distinguishably lower at the next η; η = ∞ vs 0 above 1)",
                    "verdict": stats.verdict(held + (grow.side() == "above"), len(effs) + 1),
                    "details": [f"η={a}→{b}: {x.text()}" for (a, b), x in zip(pairs, effs)]
                    + [f"η=∞ vs 0: {grow.text()}"]})
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
        held = (e_drop.side() == "below") + (e_diff.side() == "below")
        out.append({"claim": "dropping stale rollouts shifts the consumed lengths toward short prompts; pacing less",
                    "verdict": stats.verdict(held, 2),
                    "details": [f"{drop}: consumed − generated mean length {e_drop.text()}",
                                f"{pace}: {e_pace.text()} ({e_pace.side()})",
                                f"drop − pace: {e_diff.text()}"]})
    inf = res.get("inflight")
    out += _inflight_claims(inf) if inf else [
        {"claim": "in-flight weight updates lower the maximum staleness at equal throughput (PipelineRL)",
         "verdict": stats.NOT_TESTED + " (section not run)", "details": []}]
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
                     "(rl_sync:minibatches=G) while its newest tokens are no staler than conventional's max",
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


# -- report ----------------------------------------------------------------------------------------
def plots(res: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    areal = res.get("areal")
    if areal:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for obj, o in areal["objectives"].items():
            etas = list(o["rows"])
            x = np.arange(len(etas))
            m = [med_iv(o["rows"][e]["reward"]) for e in etas]
            axes[0].errorbar(x, [d["median"] for d in m], yerr=[[d["median"] - d["lo"] for d in m],
                                                                 [d["hi"] - d["median"] for d in m]],
                             marker="o", capsize=3, label=f"{obj} (lr {o['lr']:g})")
            axes[0].set_xticks(x, etas)
        axes[0].set(xlabel="η (max staleness)", ylabel="final held-out reward", title="reward vs η")
        axes[0].legend()
        o = next(iter(areal["objectives"].values()))
        etas = list(o["rows"])
        m = [med_iv(o["rows"][e]["throughput"]) for e in etas]
        axes[1].plot(np.arange(len(etas)), [d["median"] for d in m], marker="o")
        axes[1].set_xticks(np.arange(len(etas)), etas)
        axes[1].set(xlabel="η", ylabel="updates / simulated s", title="throughput vs η")
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


def report(res: dict, out: Path, meta: dict) -> Path:
    L = [f"# {NAME}", "", "Asynchronous RL's staleness findings, reproduced in `staleness`' simulator with real "
         "numerics. Generated by `python benchmarks/reproduce_async_rl.py"
         + (" --quick" if meta.get("quick") else "") + "`; every number below was measured in this run.", "",
         f"Seeds: {meta['seeds']}. Versions: `{json.dumps(meta['versions'])}`.", "",
         "Verdict scale (`staleness.results.stats.verdict`): HOLDS / MOSTLY / MIXED / MOSTLY NOT / DOES NOT HOLD over the "
         "scenarios of a claim; intervals are bootstrap 95% of the median from 5 seeds (min-max below 5).", "",
         "## Claims", ""]
    for c in claims(res):
        L += [f"### {c['claim']}", "", f"**{c['verdict']}**", ""] + [f"- {d}" for d in c["details"]] + [""]
    areal = res.get("areal")
    if areal:
        L += ["## AReaL's table (rl-digits)", "", f"Settings: `{json.dumps(areal['settings'])}`", "",
              "| objective | η | final reward (median [95%], sd) | updates/s | staleness per token | max | dropped |",
              "|---|---|---|---|---|---|---|"]
        for obj, o in areal["objectives"].items():
            for e, r in o["rows"].items():
                L.append(f"| {obj} (lr {o['lr']:g}) | {e} | {fmt(med_iv(r['reward']))} | "
                         f"{fmt(med_iv(r['throughput']), 4)} | {np.mean(r['staleness_per_token']):.2f} | "
                         f"{max(r['max_staleness'])} | {int(np.sum(r['dropped']))} |")
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
    ap.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 5; quick 3)")
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
    seeds = list(range(args.seeds if args.seeds is not None else (3 if args.quick else 5)))
    store = out / f"{NAME}.json"
    res = json.loads(store.read_text()) if args.resume and store.exists() else {}
    meta = res.pop("_meta", {"section_wall": {}})
    log = lambda m: print(m, flush=True)  # noqa: E731
    fns = {"areal": section_areal, "one_step_off": section_one_step_off, "lengths": section_lengths,
           "inflight": section_inflight}
    for name in sections:
        if name in res or name not in fns:
            continue
        t0 = time.time()
        log(f"[{name}]")
        res[name] = fns[name](cfg[name], seeds, log)
        meta["section_wall"][name] = time.time() - t0
        meta.update(seeds=seeds, quick=args.quick, versions=versions())
        files.write_text(store, json.dumps({**res, "_meta": meta}, default=float))
    meta.update(seeds=seeds, quick=args.quick, versions=versions())
    path = report(res, out, meta)
    verdicts = {c["claim"]: c["verdict"].split(":")[0] for c in claims(res)}
    print(f"report: {path}")
    print(json.dumps({"benchmark": NAME, "quick": args.quick, "seeds": len(seeds), "verdicts": verdicts,
                      "section_wall_s": {k: round(v, 1) for k, v in meta["section_wall"].items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
