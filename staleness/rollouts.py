"""What asynchronous RL consumed: staleness per rollout and per token, lengths consumed vs generated.

    table = st.rollouts.table(result.schedule, task)      # one row per rollout of the schedule
    s = st.rollouts.summary(result.schedule, task)        # histograms and length distributions

Each row of an RL schedule is one rollout (an actor's B prompts × G completions,
generated on `pull_version`, consumed by update `apply_version` unless it was
dropped or lost). Its prompts are the task's counter-based draw for (actor,
iteration) from the run's data key, as in the replay, so the lengths here are
the ones that were generated. Staleness per token weights each rollout by its
completion tokens (Σ over its B·G completions of their lengths): long
rollouts take longer to generate, so they tend to be staler, and a per-rollout
histogram understates what the learner trained on.
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
    learner trains on) and mean_length (its completions' mean length).

    seed: the replay's seed (default the schedule's), which draws the prompts."""
    import pandas as pd

    from staleness.tasks import rl

    if not rl.is_task(task):
        raise ValueError(f"task = {getattr(task, 'name', task)!r} is not an RL task (staleness.tasks.rl)")
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
    return pd.DataFrame({
        "worker": worker, "iteration": iteration, "pull_version": cols["pull_version"],
        "apply_version": cols["apply_version"], "staleness": stal, "consumed": consumed,
        "dropped": np.asarray(cols["dropped"], bool), "lost": np.asarray(cols["lost"], bool),
        "decode_tokens": np.asarray(task.lengths)[idx].max(axis=1) if len(worker) else np.zeros(0, np.int64),
        "completion_tokens": comp.sum(axis=1) * task.group_size,
        "mean_length": comp.mean(axis=1) if len(worker) else np.zeros(0)})


def summary(schedule, task, seed: int | None = None) -> dict:
    """Staleness and lengths of what was generated and what the learner consumed:

    rollouts, consumed, dropped, lost: counts;
    staleness_per_rollout / staleness_per_token: [s_max + 1] fractions of consumed
      rollouts / of their completion tokens at each staleness;
    mean_staleness_per_rollout / mean_staleness_per_token;
    max_staleness: the largest consumed staleness;
    length_generated / length_consumed: {mean, median, p90} of the rollouts' mean
      completion length, over all generated (pushed or lost) and over consumed ones.
    """
    t = table(schedule, task, seed)
    used = t[t["consumed"]]
    s = used["staleness"].to_numpy(np.int64)
    tok = used["completion_tokens"].to_numpy(np.float64)
    size = int(s.max()) + 1 if len(s) else 1
    per_rollout = np.bincount(s, minlength=size) / max(len(s), 1)
    per_token = np.bincount(s, weights=tok, minlength=size) / max(tok.sum(), 1.0)

    def dist(x):
        x = np.asarray(x, np.float64)
        if not len(x):
            return {"mean": float("nan"), "median": float("nan"), "p90": float("nan")}
        return {"mean": float(x.mean()), "median": float(np.median(x)), "p90": float(np.percentile(x, 90))}

    return {"rollouts": int(len(t)), "consumed": int(len(used)), "dropped": int(t["dropped"].sum()),
            "lost": int(t["lost"].sum()),
            "staleness_per_rollout": per_rollout.tolist(), "staleness_per_token": per_token.tolist(),
            "mean_staleness_per_rollout": float(s.mean()) if len(s) else float("nan"),
            "mean_staleness_per_token": float((s * tok).sum() / tok.sum()) if tok.sum() else float("nan"),
            "max_staleness": int(s.max()) if len(s) else 0,
            "length_generated": dist(t["mean_length"]), "length_consumed": dist(used["mean_length"])}
