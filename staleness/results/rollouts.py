"""What asynchronous RL consumed: staleness per rollout and per token, lengths consumed vs generated.

    table = st.rollouts.table(result.schedule, task)      # one row per rollout of the schedule
    s = st.rollouts.summary(result.schedule, task)        # histograms and length distributions

Each row of an RL schedule is one rollout (an actor's B prompts × G completions, generated
on `pull_version`, consumed by update `apply_version` unless dropped or lost); its prompts
are drawn as in the replay, so the lengths here are the ones that were generated.
Staleness per token weights each rollout by its completion tokens: long rollouts take
longer to generate, so they tend to be staler, and a per-rollout histogram understates
what the learner trained on. With in-flight weight updates (`rl_inflight`) each token
counts at its own segment's version (`Schedule.meta['segments']`), while the per-rollout
staleness is that of its oldest tokens (its `pull_version`, what the policy bounds).
"""

from __future__ import annotations

import numpy as np

__all__ = ["table", "summary"]


def _data_bits(seed: int) -> np.ndarray:
    import jax

    from staleness.engine import core

    return np.asarray(jax.random.key_data(core.keys(int(seed))[1]))


def table(schedule, task, seed: int | None = None):
    """A pandas DataFrame, one row per rollout in `schedule`: worker, iteration, pull_version,
    apply_version, staleness (−1 where not consumed), consumed, dropped, lost, decode_tokens
    (what its batch decodes: the simulated time), completion_tokens (B·G·mean length: what the
    learner trains on), mean_length (its completions' mean length), segments (the versions its
    tokens come from: 1 unless in-flight updates) and token_staleness (the mean staleness of
    its completion tokens; −1 where not consumed).

    seed: the replay's seed (default the schedule's), which draws the prompts."""
    return _build(schedule, task, seed)[0]


def _build(schedule, task, seed):
    """(table, [P] staleness and [P] completion tokens of every consumed piece: a rollout's
    tokens of one version)."""
    import pandas as pd

    from staleness.engine import plan
    from staleness.tasks import rl

    if not rl.is_task(task):
        raise ValueError(f"task = {getattr(task, 'name', task)!r} is not an RL task (staleness.tasks.rl)")
    policy = getattr(schedule, "policy", None)
    if policy is not None and not policy.learner:
        raise ValueError(f"schedule = a schedule of {policy.describe()!r}, whose workers push gradients: it has no "
                         "rollouts (give the schedule of an rl_* policy)")
    cols = schedule.columns
    bits = _data_bits(schedule.seed if seed is None else seed)
    worker = np.asarray(cols["worker"], np.int64)
    iteration = np.asarray(cols["iteration"], np.int64)
    idx = task.prompt_indices(bits, worker[:, None], iteration[:, None]) if len(worker) else \
        np.zeros((0, task.prompts_per_rollout), np.int64)
    idx = np.asarray(idx).reshape(len(worker), -1)
    comp = np.asarray(task.completion_lengths)[idx]                     # [R, B]
    consumed = schedule.applied
    stal = np.where(consumed, schedule.staleness, -1)
    tokens = comp.sum(axis=1) * task.group_size
    count = np.ones(len(worker), np.int64)
    tok_stal = stal.astype(np.float64)
    piece_s, piece_t = [], []
    whole = consumed.copy()     # consumed rollouts of one version
    for row, switches in (plan.segment_lists(schedule) or {}).items():
        starts = plan.positions([0] + [k for k, _ in switches], task.prefill)
        versions = np.asarray([cols["pull_version"][row]] + [v for _, v in switches], np.int64)
        bounds = np.append(starts, np.iinfo(np.int64).max)
        lo, hi, lengths = bounds[:-1, None], bounds[1:, None], comp[row][None, :]
        per = (np.minimum(lengths, hi) - np.minimum(lengths, lo)).clip(0).sum(axis=1) * task.group_size   # [S]
        count[row] = int((per > 0).sum())
        if consumed[row] and per.sum():
            ages = cols["apply_version"][row] - versions
            tok_stal[row] = float((ages * per).sum() / per.sum())
            piece_s.append(ages)
            piece_t.append(per.astype(np.float64))
            whole[row] = False
    frame = pd.DataFrame({
        "worker": worker, "iteration": iteration, "pull_version": cols["pull_version"],
        "apply_version": cols["apply_version"], "staleness": stal, "consumed": consumed,
        "dropped": np.asarray(cols["dropped"], bool), "lost": np.asarray(cols["lost"], bool),
        "decode_tokens": np.asarray(task.lengths)[idx].max(axis=1) if len(worker) else np.zeros(0, np.int64),
        "completion_tokens": tokens,
        "mean_length": comp.mean(axis=1) if len(worker) else np.zeros(0),
        "segments": count, "token_staleness": tok_stal})
    s_all = np.concatenate([stal[whole], *piece_s]).astype(np.int64)
    t_all = np.concatenate([tokens[whole].astype(np.float64), *piece_t])
    return frame, s_all, t_all


def summary(schedule, task, seed: int | None = None) -> dict:
    """Staleness and lengths of what was generated and what the learner consumed:

    rollouts, consumed, dropped, lost: counts;
    staleness_per_rollout / staleness_per_token: [s_max + 1] fractions of consumed
      rollouts / of their completion tokens at each staleness;
    mean_staleness_per_rollout / mean_staleness_per_token (each token at its own version's
      staleness: in-flight segments count apart);
    mean_segments: versions per consumed rollout (1 without in-flight updates);
    max_staleness: the largest consumed staleness (of a rollout's oldest tokens);
    length_generated / length_consumed: {mean, median, p90} of the rollouts' mean
      completion length, over all generated (pushed or lost) and over consumed ones.
    """
    t, ts, tok = _build(schedule, task, seed)
    used = t[t["consumed"]]
    s = used["staleness"].to_numpy(np.int64)
    size = int(max(s.max(), ts.max())) + 1 if len(s) else 1
    per_rollout = np.bincount(s, minlength=size) / max(len(s), 1)
    per_token = np.bincount(ts, weights=tok, minlength=size) / max(tok.sum(), 1.0)

    def dist(x):
        x = np.asarray(x, np.float64)
        if not len(x):
            return {"mean": float("nan"), "median": float("nan"), "p90": float("nan")}
        return {"mean": float(x.mean()), "median": float(np.median(x)), "p90": float(np.percentile(x, 90))}

    return {"rollouts": int(len(t)), "consumed": int(len(used)), "dropped": int(t["dropped"].sum()),
            "lost": int(t["lost"].sum()),
            "staleness_per_rollout": per_rollout.tolist(), "staleness_per_token": per_token.tolist(),
            "mean_staleness_per_rollout": float(s.mean()) if len(s) else float("nan"),
            "mean_staleness_per_token": float((ts * tok).sum() / tok.sum()) if tok.sum() else float("nan"),
            "mean_segments": float(used["segments"].mean()) if len(used) else float("nan"),
            "max_staleness": int(s.max()) if len(s) else 0,
            "length_generated": dist(t["mean_length"]), "length_consumed": dist(used["mean_length"])}
