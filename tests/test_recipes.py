"""The recipes of ARCHITECTURE.md, each followed exactly as written there, in a
file outside the package, and checked against what it must reduce to:

1. a new gate (or aggregation): a from-scratch clock gate equals the built-in SSP;
2. a new kind of worker work: local steps for a fixed time equal DiLoCo's H steps;
3. a new cluster layer: a throttled worker takes `factor` times as long;
4. a new task: registered by name, it trains under `st.simulate` and the CLI.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import staleness as st
from staleness.cluster import layers
from staleness.policies import AllLive, ClockBound, EachGradient, Policy

CLUSTER = "1*2,1.7,2.6+jitter=0.2"


# -- recipe 1: a gate ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MaxGap:
    """No worker starts an iteration more than `s` clocks ahead of the slowest live one,
    written from the `Gate` protocol alone (the built-in `ClockBound` is the same rule)."""

    s: int

    def init(self, num_workers, now):
        return None

    def level(self, state):
        return state.min_clock

    def after_push(self, state, worker, pull_version, now):
        return self.on_join(state, worker)

    def on_join(self, state, worker):
        key = state.clocks[worker] - self.s
        return None if key <= state.min_clock else key

    def pushed(self, state, worker, now):
        pass

    def failed(self, state, worker):
        pass

    def joined(self, state, worker, now):
        pass

    def bound(self):
        return self.s


def max_gap(s: int = 3) -> Policy:
    return Policy(MaxGap(s), EachGradient(), f"max_gap:{s}")


def test_recipe_a_gate_written_from_the_protocol_equals_the_built_in_ssp():
    st.policies.register("max_gap", max_gap, overwrite=True)
    for s in (0, 2):
        mine = st.simulate_schedule(f"max_gap:{s}", CLUSTER + "+fail=1@7-12", num_updates=150, seed=3)
        ref = st.simulate_schedule(st.policies.ssp(s), CLUSTER + "+fail=1@7-12", num_updates=150, seed=3)
        assert mine.policy.describe() == f"max_gap:{s}"
        for name, col in ref.columns.items():
            np.testing.assert_array_equal(mine.columns[name], col, err_msg=name)
        np.testing.assert_array_equal(mine.update_time, ref.update_time)


# -- recipe 2: a kind of worker work ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TimedLocalSteps:
    """Local steps for a fixed time: each worker takes as many inner steps as fit in
    `seconds` at its mean speed (at least 1), then pushes its delta."""

    seconds: float
    local = True
    collective_round = False
    compiled_what = "nothing"
    iterations_per_sync = 1

    def steps_per_worker(self, mean_seconds):
        return tuple(max(1, int(self.seconds / t + 1e-9)) for t in mean_seconds)

    def timing(self, one_step, steps, num_workers):
        return (lambda w, it, start: steps[w] * one_step(w, it, start)), None

    numerics = "local"   # the engine's local steps (`engine.local.NUMERICS`)

    def payload_bytes(self, shapes):
        n = st.policies.payload.tree_bytes(shapes)
        return n, n

    def numerics_options(self, shapes):
        return {}

    def replay_settings(self):
        return ()

    def describe(self):
        return f"timed:{self.seconds:g}"


def test_recipe_a_new_work_reduces_to_diloco_when_every_worker_fits_the_same_steps():
    cluster = st.cluster.heterogeneous([0.5] * 4)
    timed = Policy(ClockBound(0), AllLive(), "timed_diloco:2", TimedLocalSteps(2.0), "nesterov:0.9,lr=0.7")
    a = st.simulate_schedule(timed, cluster, num_updates=6, seed=0)
    b = st.simulate_schedule(st.policies.diloco(4), cluster, num_updates=6, seed=0)
    assert a.meta["local_steps"] == b.meta["local_steps"] == [4, 4, 4, 4]
    np.testing.assert_array_equal(a.update_time, b.update_time)
    task = st.tasks.get("quadratic", num_workers=4)
    ra = st.simulate(task, timed, cluster, num_updates=6, seed=0, inner_optimizer="sgd:lr=0.05")
    rb = st.simulate(task, st.policies.diloco(4), cluster, num_updates=6, seed=0, inner_optimizer="sgd:lr=0.05")
    for x, y in zip(jax.tree.leaves(ra.params), jax.tree.leaves(rb.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # unequal speeds: fewer steps for the slower workers (the engine's masked local steps)
    c = st.simulate_schedule(timed, st.cluster.heterogeneous([0.5, 0.5, 1.0, 2.0]), num_updates=3, seed=0)
    assert c.meta["local_steps"] == [4, 4, 2, 1]


# -- recipe 3: a cluster layer ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Throttle:
    """Worker `worker` computes `factor` times slower (a thermally throttled GPU)."""

    worker: int
    factor: float

    def describe(self):
        return f"throttle={self.worker}:{self.factor:g}"

    def wrap(self, inner, seed, stream):
        layer = layers.Layer(inner)
        below, w, f = inner.compute_time, self.worker, self.factor
        layer.compute_time = lambda worker, it, start: below(worker, it, start) * (f if worker == w else 1.0)
        return layer


def test_recipe_a_cluster_layer_slows_its_worker_by_its_factor():
    base = st.cluster.heterogeneous([1.0, 1.0, 1.0]).jitter(0.1)
    slow = base.with_modifier(Throttle(1, 3.0))
    assert slow.describe().endswith("throttle=1:3")
    a = st.simulate_schedule("asp", base, max_time=60.0, seed=1).columns
    b = st.simulate_schedule("asp", slow, max_time=60.0, seed=1).columns
    took = lambda c, w: (c["end"] - c["start"])[c["worker"] == w]
    n = len(took(b, 1))
    np.testing.assert_allclose(took(b, 1), 3.0 * took(a, 1)[:n])
    np.testing.assert_allclose(took(b, 0)[:5], took(a, 0)[:5])


# -- recipe 4: a task ------------------------------------------------------------------------------
def toy_task(num_workers: int = 2, batch_size: int = 4, seed: int = 0, partition: str = "iid"):
    target = jnp.array([1.0, -2.0, 0.5])

    def sample(key, worker, iteration):
        return {"noise": 0.1 * jax.random.normal(jax.random.fold_in(key, iteration), (batch_size, 3))}

    return st.tasks.from_functions(
        init=lambda key: {"w": jnp.zeros(3)},
        loss=lambda p, b: jnp.sum((p["w"] - target + b["noise"].mean(0)) ** 2),
        sample=sample, evaluate=lambda p: {"dist": jnp.linalg.norm(p["w"] - target)},
        batch_size=batch_size, num_workers=num_workers, metrics=[st.metrics.Metric("dist", "lower", 0.0)],
        name="toy")


def test_recipe_a_registered_task_trains_by_name_in_the_library_and_the_cli(tmp_path):
    from staleness.cli import main

    st.tasks.register("recipe-toy", toy_task, overwrite=True)
    res = st.simulate("recipe-toy", "ssp:1", CLUSTER, num_updates=60, lr=0.2, num_evals=2)
    dist = res.history["dist"].to_numpy()
    assert dist[-1] < 0.5 * dist[0]
    assert main(["simulate", "--task", "recipe-toy", "--policy", "asp", "--cluster", CLUSTER, "--updates", "20",
                 "--lr", "0.2", "--no-progress", "--out", str(tmp_path / "toy")]) == 0


def _arch_block(after: str) -> str:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "ARCHITECTURE.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(after):], re.S).group(1)


def test_recipe_an_rl_policy_from_its_parts_runs_from_a_file(tmp_path, monkeypatch, capsys):
    """Recipe 5, as written: the block saved as a user's file, named module:factory:ARGS."""
    from staleness.cli import main

    (tmp_path / "my_rl_policies.py").write_text(_arch_block("### 5. An RL gate or aggregation"))
    monkeypatch.syspath_prepend(str(tmp_path))
    pol = st.policies.parse("my_rl_policies:paced_small_batches:2:2")
    sched = st.simulate_schedule(pol, "1,1,2,3", num_updates=20, seed=0,
                                 sizes=st.tasks.get("rl-bandit", num_workers=4).rollout_sizes(
                                     st.engine.core.keys(0)[1]))
    assert sched.staleness[sched.applied].max() <= 2 and np.bincount(sched.columns["apply_version"][sched.applied]).max() == 2
    assert main(["simulate", "--task", "rl-bandit", "--cluster", "1,1,2,3", "--policy",
                 "my_rl_policies:paced_small_batches:2:2", "--updates", "4", "--no-progress"]) == 0
    capsys.readouterr()


def test_recipe_an_rl_objective_has_the_bandits_exact_gradient(monkeypatch):
    """Recipe 6: the user's registered objective (tests/plugins/user_objectives.py, CISPO)
    against the bandit's float64 expected gradient, off-policy, through its reference."""
    from pathlib import Path

    from staleness.tasks import rl
    from staleness.tasks.rl import bandit

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
    task = rl.get("rl-bandit", objective="user_objectives:cispo", eps_high=0.3)
    params = {"W": 0.8 * jax.random.normal(jax.random.key(1), (8, 4))}
    behavior = {"W": params["W"] + 0.7 * jax.random.normal(jax.random.key(2), (8, 4))}
    ref = bandit.expected_gradient(task, params, [0, 5], behavior_params=behavior)["W"]
    got = []
    for p in (0, 5):
        rollouts, weight = bandit.enumerated(task, behavior, p)
        g = jax.vmap(jax.grad(task.loss), (None, 0))(params, rollouts)["W"]
        got.append(np.einsum("m,mij->ij", weight, np.asarray(g, np.float64)))
    assert np.abs(np.mean(got, axis=0) - ref).max() <= 1e-5 * np.abs(ref).max()
