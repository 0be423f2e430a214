"""A staleness planner for asynchronous RL: which policy, from timing alone, in seconds.

    import staleness as st
    table = st.rl.plan("1*6,3*2+jitter=0.2", lengths=st.tasks.rl.lengths.lognormal(256, 1.0, 4096),
                       etas=[0, 1, 2, 4, 8, None], modes=["pace", "drop"], learner=0.5, num_updates=1000)
    st.rl.frontier(table)            # per mode: the η after which throughput stops rising

No numerics run: a row's values are medians over `seeds` of simulated schedules
(`st.simulate_schedule`) of a policy on the actors' speeds, and `st.rollouts.summary` of
what the learner consumed:

    updates_per_s      learner updates per simulated second
    tokens_per_s       consumed completion tokens per simulated second
    staleness_mean / staleness_max   of the consumed tokens, each at its own version (in-flight
                       segments count apart); the max is of a rollout's oldest tokens
    dropped_share      rollouts dropped (too stale) / rollouts generated
    length_shift       mean completion length consumed − generated (tokens): < 0 when the long
                       rollouts are the ones that go stale and are dropped
    actor_utilization  1 − the actors' mean share of time blocked at the gate (paced)
    learner_utilization  the learner's training time / the run's simulated time

The frontier: with policies that differ only in η, the smallest η whose throughput is within
`tolerance` of the largest η's: a larger η only adds staleness. Applied Compute's closed form
for the mean staleness is not shown: its formula could not be retrieved (only the post's
opening is available here), see benchmarks/results/reproduce_async_rl.md.
"""

from __future__ import annotations

import inspect
import math

import numpy as np

__all__ = ["plan", "frontier", "policies_of", "COLUMNS"]

COLUMNS = ("policy", "eta", "mode", "updates", "sim_time_s", "updates_per_s", "tokens_per_s", "staleness_mean",
           "staleness_max", "dropped_share", "length_shift", "actor_utilization", "learner_utilization")


def policies_of(etas=(0, 1, 2, 4, 8, None), modes=("pace",), *, inflight: bool = False, one_step_off: bool = False,
                minibatches: int = 1, batch: int | None = None, learner: float = 0.5) -> list[str]:
    """Policy specs of a sweep over η (None: unbounded) × modes: η = 0 is `rl_sync`; with
    inflight, the `rl_inflight` twin of every bounded policy; one_step_off adds `rl_one_step_off`."""
    from staleness import policies as P

    out = []
    for mode in modes:
        for eta in etas:
            if eta == 0:
                spec = P.rl_sync(learner, minibatches=minibatches).spec
            elif eta is None and mode != "pace":
                continue   # without a bound nothing is too stale: the mode would change nothing
            else:
                spec = P.rl_async(eta, mode=mode, learner=learner, batch=batch, minibatches=minibatches).spec
            out.append(spec)
            if inflight and eta != 0:
                out.append(P.rl_inflight(eta, mode=mode, learner=learner, batch=batch, minibatches=minibatches).spec)
    if one_step_off:
        out.append(P.rl_one_step_off(learner, minibatches=minibatches).spec)
    return list(dict.fromkeys(out))


def _timing_task(num_workers: int, lengths, prompts_per_rollout: int, num_prompts: int, prefill: float):
    """An RL task for timing only (its policy is a stub that is never run): `num_prompts`
    prompts whose completion lengths come from the rule `lengths`."""
    import jax.numpy as jnp

    from staleness.tasks import rl

    high = int(getattr(lengths, "high", 0) or 4096)
    stub = rl.Policy(lambda key: {"w": jnp.zeros(2)}, lambda p, prompt, c: jnp.zeros((c.shape[0], 2)), high)
    return rl.from_functions(stub, rl.PromptSet({"i": np.arange(num_prompts)}, lengths),
                             lambda prompt, completion, length: jnp.float32(0), name="rl-plan", num_workers=num_workers,
                             group_size=2, prompts_per_rollout=prompts_per_rollout, prefill=prefill)


def _row(sched, task, seed: int, mean_seconds: float) -> dict:
    from staleness.results import rollouts

    s = rollouts.summary(sched, task, seed=seed)
    end = float(sched.update_time[-1]) if sched.num_updates else math.nan
    c, a = sched.columns, sched.applied
    idx = np.asarray(task.prompt_indices(seed, np.asarray(c["worker"], np.int64)[a][:, None],
                                         np.asarray(c["iteration"], np.int64)[a][:, None])).reshape(int(a.sum()), -1)
    tokens = float(np.asarray(task.completion_lengths)[idx].sum())   # one completion per prompt
    sizes = task.prefill + np.asarray(task.lengths)[idx].max(axis=1)   # as `RLTask.rollout_sizes`
    # the learner's time, as the simulator charges it (linear in the rollouts' sizes)
    busy = sched.policy.work.learner_seconds([float(sizes.sum())], mean_seconds, sched.num_workers)
    return {"updates": sched.num_updates, "sim_time_s": end, "updates_per_s": sched.num_updates / end,
            "tokens_per_s": tokens / end, "staleness_mean": s["mean_staleness_per_token"],
            "staleness_max": s["max_staleness"], "dropped_share": s["dropped"] / max(s["rollouts"], 1),
            "length_shift": s["length_consumed"]["mean"] - s["length_generated"]["mean"],
            "actor_utilization": 1.0 - float(np.mean(sched.wait_fraction())),
            "learner_utilization": busy / end}


def plan(actors, *, lengths=None, policies=None, num_updates: int = 1000, seeds=(0,), prompts_per_rollout: int = 8,
         num_prompts: int = 256, prefill: float = 0.0, progress: bool = False, **grid):
    """The planner's table (a pandas DataFrame, one row per policy, `COLUMNS`).

    Args:
      actors: the actors' speeds: a cluster spec or `Cluster` (seconds per decoded token, per
        actor), e.g. a measured trace (`st.cluster` trace-driven speeds).
      lengths: each prompt's completion length: a length rule (`st.tasks.rl.lengths`:
        lognormal, zipf, constant, or `empirical(measured lengths)`); default the bandit's
        long-tailed one (lognormal, median 128, at most 1024 tokens).
      policies: policy specs; default `policies_of(**grid)`.
      grid: `policies_of`'s keywords (etas, modes, inflight, one_step_off, minibatches, batch,
        learner: the learner's time per update, in units of an average actor's rollout, see
        `st.policies.rl_async`), instead of `policies`.
      num_updates: learner updates per schedule; seeds: schedules per policy (medians).
      prompts_per_rollout: B prompts per rollout (a batch decodes as long as its longest);
        prefill: a prompt's cost in decoded tokens.
    """
    import pandas as pd

    from staleness import cluster as _cluster
    from staleness import policies as _policies
    from staleness.engine import core
    from staleness.sim.scheduler import simulate_schedule
    from staleness.tasks import rl

    cluster = _cluster.resolve(actors)
    known = set(inspect.signature(policies_of).parameters)
    if set(grid) - known:
        raise TypeError(f"plan: unknown keyword {sorted(set(grid) - known)[0]!r}; the policy grid's keywords are "
                        f"{', '.join(sorted(known))}")
    if policies is not None and grid:
        raise ValueError(f"plan: give policies= or the policy grid's keywords ({', '.join(sorted(grid))}), not both")
    specs = list(policies) if policies is not None else policies_of(**grid)
    pols = [_policies.resolve(p) for p in specs]
    bad = [p.describe() for p in pols if not p.learner]
    if bad:
        raise ValueError(f"policies = {bad}: the planner plans asynchronous RL; give rl_* policies")
    lengths = rl.bandit.DEFAULT_LENGTHS if lengths is None else lengths
    task = _timing_task(cluster.num_workers, lengths, prompts_per_rollout, num_prompts, prefill)
    rows = []
    from tqdm.auto import tqdm

    for pol in tqdm(pols, desc="plan", unit="policy", disable=not progress):
        per = []
        for seed in seeds:
            sched = simulate_schedule(pol, cluster, num_updates=num_updates, seed=seed,
                                      sizes=task.rollout_sizes(core.keys(seed)[1]))
            per.append(_row(sched, task, seed, float(np.mean(cluster.mean_seconds))))
        row = {k: float(np.median([r[k] for r in per])) for k in per[0]}
        row["staleness_max"] = int(max(r["staleness_max"] for r in per))
        row["updates"] = int(row["updates"])
        eta = getattr(pol.gate, "eta", getattr(pol.aggregation, "eta", None))   # RoundLag's, else Fresh's bound
        rows.append({"policy": pol.describe(), "eta": eta, "mode": _mode(pol), **row})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _mode(pol) -> str:
    """'pace', 'drop' or 'requeue', with '+inflight' / '+partial' for in-flight updates."""
    spec = pol.describe()
    mode = next((m for m in ("drop", "requeue") if f"mode={m}" in spec), "pace")
    if pol.work.inflight:
        mode += "+inflight" if pol.work.refill is None else "+partial"
    return mode


def frontier(table, tolerance: float = 0.02) -> dict:
    """{mode: the smallest η whose throughput is within `tolerance` (a fraction) of the best
    of its mode's bounded-or-not η sweep} (None where the mode has no η sweep)."""
    out = {}
    for mode, rows in table.groupby("mode", sort=False):
        rows = rows[rows["policy"].str.startswith(("rl_async", "rl_inflight", "rl_partial", "rl_sync"))]
        if len(rows) < 2:
            out[mode] = None
            continue
        best = rows["updates_per_s"].max()
        ok = rows[rows["updates_per_s"] >= (1 - tolerance) * best]
        etas = [e for e in ok["eta"] if e is not None and not (isinstance(e, float) and math.isnan(e))]
        out[mode] = int(min(etas)) if etas else None
    return out


def __dir__():
    return sorted(__all__)
