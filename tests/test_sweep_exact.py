"""A sweep's configuration is bitwise its own `st.simulate`, whatever else is in the grid.

Issues 39 and 40: a configuration's numbers depended on its neighbours in the batch.
Three causes, each covered here:
  - the ring: the batched step wrote every configuration's version into the slot of the
    first configuration's plan, while each plan read from slots laid out for its own
    ring size (ssp:3 next to asp: 0.225 accuracy instead of 0.869);
  - the settings compiled from the whole grid instead of each configuration's own:
    local_sgd:4 next to local_sgd:8 took its minibatches and inner steps at H = 8, its
    optimizer's schedule ran over the longest run's updates, padded gradient slots
    computed gradients a configuration's own replay does not;
  - `vmap` over configurations: XLA chose other kernels for the batched shapes
    (bsp, softsync, backup: 2e-7 apart after 200 updates; rl-digits: 6e-6).
A sweep now runs every configuration with its own replay's static settings, on its
own slots, one configuration after the other (`engine.core.chunk_batched`).
"""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

import staleness as st
from staleness.tasks import data as task_data
from staleness.tasks import models
from staleness.tasks.registry import classification_task

GRADIENT_POLICIES = ["asp", "ssp:1", "ssp:3", "dssp:1:4", "bsp", "softsync:2", "backup:1"]


@functools.lru_cache(maxsize=None)
def _tiny():
    return classification_task("tiny-mlp", models.MLP(hidden=(16,), num_outputs=10), task_data.digits(),
                               batch_size=8, num_workers=4)


def _bitwise(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def _assert_each_is_its_simulate(task, results, cluster, budget, **kw):
    for r in results:
        c = r.config
        one = st.simulate(task, c["policy"], cluster, seed=c["seed"], lr_rule=c["lr_rule"], lr=c["lr"], **budget,
                          **kw)
        where = f"{c['policy']} seed {c['seed']} {c['lr_rule']} lr {c['lr']} (sweep index {c['sweep_index']})"
        assert one.schedule.to_frame().equals(r.schedule.to_frame()), where
        assert _bitwise(r.params, one.params), f"{where}: parameters differ from its simulate"
        assert np.array_equal(r.train_loss, one.train_loss, equal_nan=True), where
        assert r.history.drop(columns="time").equals(one.history.drop(columns="time")), where
        assert r.status == one.status, where


@hst.composite
def _clusters(draw):
    cluster = st.cluster.heterogeneous(draw(hst.lists(hst.sampled_from([1.0, 1.3, 2.0, 2.6, 3.5]), min_size=4,
                                                      max_size=4)))
    return cluster.jitter(draw(hst.sampled_from([0.0, 0.1, 0.3])))


@settings(max_examples=6)
@given(policies=hst.lists(hst.sampled_from(GRADIENT_POLICIES), min_size=1, max_size=3, unique=True),
       seeds=hst.lists(hst.integers(0, 5), min_size=1, max_size=2, unique=True),
       rules=hst.lists(hst.sampled_from(["constant", "per_gradient", "per_update"]), min_size=1, max_size=2,
                       unique=True),
       lrs=hst.lists(hst.sampled_from([0.03, 0.1, 0.3]), min_size=1, max_size=2, unique=True),
       cluster=_clusters(),
       budget=hst.sampled_from([dict(num_updates=30), dict(max_time=18.0)]),
       pins=hst.sampled_from([{}, dict(ring=64), dict(slots=4), dict(ring=64, slots=4)]),
       block=hst.sampled_from([None, 1, 3]))
def test_every_configuration_of_a_random_grid_is_its_simulate(policies, seeds, rules, lrs, cluster, budget, pins,
                                                               block):
    """Random grids of gradient policies (one gradient per update and several: bsp,
    softsync, backup workers), seeds, lr rules and lrs on random clusters, with an update
    or a time budget (runs of different lengths), pinned rings and slots and any block
    size: every configuration equals its own `st.simulate`, bit for bit."""
    task = _tiny()
    results = st.sweep(task, policies, cluster, seeds=seeds, lr_rules=rules, lrs=lrs, eval_every=10, block=block,
                       **budget, **pins)
    assert len(results) == len(policies) * len(seeds) * len(rules) * len(lrs)
    _assert_each_is_its_simulate(task, results, cluster, budget, eval_every=10)


@settings(max_examples=3)
@given(policies=hst.lists(hst.sampled_from(["local_sgd:2", "local_sgd:4", "local_sgd:6"]), min_size=1,
                          max_size=2, unique=True),
       seeds=hst.lists(hst.integers(0, 5), min_size=1, max_size=2, unique=True),
       lrs=hst.lists(hst.sampled_from([0.5, 1.0]), min_size=1, max_size=2, unique=True),
       cluster=_clusters())
def test_local_update_grids_are_their_simulates(policies, seeds, lrs, cluster):
    """Local SGD with other H side by side (before: every configuration took the grid's
    largest H for its minibatches and inner steps), seeds and outer lrs, with a cosine
    inner optimizer (its schedule runs over each configuration's own rounds)."""
    task = _tiny()
    kw = dict(inner_optimizer="sgd:lr=0.05+cosine", eval_every=4)
    results = st.sweep(task, policies, cluster, seeds=seeds, lrs=lrs, num_updates=8, **kw)
    _assert_each_is_its_simulate(task, results, cluster, dict(num_updates=8), **kw)


def test_the_issues_cases():
    """Issue 39's grid (ssp:3 beside asp on 16 workers, ring 64 from asp) and issue 40's
    (one policy, seeds x lrs; bsp and softsync whose updates hold several gradients)."""
    task = classification_task("tiny-mlp", models.MLP(hidden=(16,), num_outputs=10), task_data.digits(),
                               batch_size=8, num_workers=16)
    cluster = st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1)
    kw = dict(num_updates=300, eval_every=100)
    out = st.sweep(task, ["asp", "ssp:3"], cluster, seeds=[0], lr_rules=["constant"], lrs=[0.05], **kw)
    assert out[0].config["ring"] == 64 and int(out[1].schedule.staleness.max()) < 32   # its own ring: 32
    _assert_each_is_its_simulate(task, out, cluster, dict(num_updates=300), eval_every=100)
    out = st.sweep(task, ["softsync:4"], cluster, seeds=[1], lr_rules=["constant"], lrs=[0.03, 0.1], **kw)
    _assert_each_is_its_simulate(task, out, cluster, dict(num_updates=300), eval_every=100)


def test_rl_grids_mixing_learners_are_their_simulates():
    """Rollout policies side by side: synchronous, bounded staleness, in-flight segments
    (another learner step and an index input), partial rollouts; each equals its simulate."""
    task = st.tasks.get("rl-bandit", num_workers=3)
    cluster = st.cluster.heterogeneous([1.0, 1.6, 2.5]).jitter(0.2)
    pols = ["rl_sync", "rl_async:2", "rl_inflight:1", "rl_partial:2"]
    out = st.sweep(task, pols, cluster, seeds=[0, 2], num_updates=12, eval_every=4)
    for r in out:
        c = r.config
        one = st.simulate(task, c["policy"], cluster, seed=c["seed"], num_updates=12, eval_every=4)
        assert _bitwise(r.params, one.params), c["policy"]
        assert np.array_equal(r.train_loss, one.train_loss, equal_nan=True), c["policy"]


@pytest.mark.parametrize("ring", [None, 40])
def test_pad_plan_lays_versions_in_the_pinned_ring(ring):
    """The direct cause of issue 39: `pad_plan` gave a plan the pinned ring size but kept the
    slots of its own ring (v % 32 read from a ring written at v % 64)."""
    from staleness.engine.grid import pad_plan

    sched = st.simulate_schedule("ssp:3", st.cluster.heterogeneous([1.0] * 8 + [2.6] * 8).jitter(0.1),
                                 num_updates=400, seed=0)
    plan = pad_plan(sched, 100, ring=64 if ring is None else ring, slots=None)
    r = plan.ring
    assert r == (64 if ring is None else ring)
    assert np.array_equal(plan.write, np.arange(len(plan.write)) % r)
    real = plan.mask
    assert np.array_equal(plan.slot[real], plan.pull_version[real] % r)


# -- the same kind of bug elsewhere: batched, padded or pooled -----------------------------
def test_a_sharded_sweep_is_each_configurations_simulate():
    """The configuration axis sharded over 2 of the process's virtual CPU devices (conftest),
    a mixed grid with blocks of 2: every configuration is still its own simulate."""
    task = _tiny()
    cluster = st.cluster.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1)
    out = st.sweep(task, ["asp", "bsp", "ssp:2"], cluster, seeds=[0, 1], lrs=[0.1], num_updates=20, eval_every=10,
                   devices=2, block=2)
    assert len({r.config["devices"][1] for r in out}) == 1 and len(out[0].config["devices"]) == 2
    _assert_each_is_its_simulate(task, out, cluster, dict(num_updates=20), eval_every=10)


def test_pooled_schedules_replay_as_simulated_here(monkeypatch):
    """A sweep whose schedules were simulated in worker processes (`sim.pool`): the schedules
    keep their meta (a local-update method's steps per worker, which the replay reads) and
    every configuration is its simulate."""
    from staleness.sim import pool as sim_pool

    task = _tiny()
    cluster = st.cluster.heterogeneous([1.0, 1.3, 2.0, 2.6]).jitter(0.1).failures([(1, 3.0, 7.0)])
    pols = ["local_sgd:2", "local_sgd:3"]
    monkeypatch.setattr(sim_pool, "MIN_SECONDS", 0.0)
    out = st.sweep(task, pols, cluster, seeds=[0, 1], lrs=[1.0], num_updates=8, eval_every=4,
                   inner_optimizer="sgd:lr=0.05")
    assert all("local_steps" in r.schedule.meta for r in out)
    monkeypatch.setattr(sim_pool, "MIN_SECONDS", 1e9)
    kept = st.sweep(task, pols, cluster, seeds=[0, 1], lrs=[1.0], num_updates=8, eval_every=4,
                    inner_optimizer="sgd:lr=0.05")
    for a, b in zip(out, kept):
        assert a.schedule.meta == b.schedule.meta and a.schedule.to_frame().equals(b.schedule.to_frame())
        assert _bitwise(a.params, b.params)
    _assert_each_is_its_simulate(task, out, cluster, dict(num_updates=8), eval_every=4,
                                 inner_optimizer="sgd:lr=0.05")


@pytest.mark.parametrize("kv_cache", [True, False])
def test_a_rollout_does_not_depend_on_the_others_of_its_update(kv_cache):
    """The RL replay's slots: the rollouts of one update are generated each with the ops an
    actor uses for it alone (`engine.rollout.generate_rollout`), so a rollout's tokens and
    behaviour log-probs do not depend on how many rollouts share its update (a `vmap` over the
    slots changed their log-probs by 5e-7 on rl-digits, which sampling then amplifies); and
    a simulated run replays bitwise with one standalone call per slot (slot_mode 'map')."""
    from staleness.engine import core, rollout

    task = st.tasks.get("rl-digits", num_workers=3, kv_cache=kv_cache, warm_start_steps=10)
    params = task.init_params(jax.random.key(0))
    key = core.keys(0)[1]
    worker, iteration = np.array([2, 0, 1], np.int32), np.array([5, 3, 4], np.int32)
    behavior = jax.tree.map(lambda a: np.stack([a] * 3), params)
    got = jax.jit(lambda b, w, i: rollout.Learner().rollouts(task, "vmap", key, b, w, i))(behavior, worker, iteration)
    alone = jax.jit(lambda w, i: rollout.generate_rollout(task, params, key, w, i))
    for k in range(3):
        assert _bitwise(jax.tree.map(lambda g, k=k: g[k], got), alone(worker[k], iteration[k])), k
    cluster = st.cluster.heterogeneous([1.0, 1.6, 2.5])
    res = st.simulate(task, "rl_async:1", cluster, num_updates=3, eval_every=3)
    assert _bitwise(st.engine.replay(res.schedule, task, slot_mode="map", eval_every=3).params, res.params)
