"""The K-device engine (stage k on virtual CPU device k) against the one-device engine.

Both run the same per-stage code in the same per-stage order, so they agree
up to float reassociation by the compiler; on CPU we observe bitwise
equality and allow 1e-6 absolute (parameters of order 0.1-1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import staleness.pipeline as pp
from staleness.engine import core
from staleness.tasks import optim
from staleness.pipeline import devices as D
from staleness.pipeline import sim
from staleness.pipeline import stage as S
from staleness.engine.result import Result

ATOL = 1e-6


@pytest.fixture(scope="module")
def digits3():
    return pp.tasks.get("digits-resmlp", num_stages=3, batch_size=8, width=32)


def _tree_close(a, b, atol=ATOL):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


def test_eight_virtual_devices():
    assert len(jax.devices()) >= 4, "tests/conftest.py sets XLA_FLAGS for 8 CPU devices"


@pytest.mark.parametrize("sched", [pp.ddg(), pp.gpipe(2)], ids=lambda s: s.describe())
def test_device_engine_equals_one_device_engine(digits3, sched):
    """DDG: forward sub-steps within a tick (delay-0 links), stored autodiff graphs
    packed across devices. GPipe: micro-batches, accumulation, flush."""
    n = 5
    plan = pp.make_plan(sched, 3, n)
    opt = optim.resolve("momentum:0.9", 0.05)
    init_key, data_key = core.keys(0)
    params = digits3.init_stage_params(init_key)
    ctx = S.Context(digits3, data_key)
    cfgs, carry = sim.init(digits3, plan, opt, params, ctx)
    carry, loss_sim = sim.run_chunk(cfgs, plan, opt, ctx, carry, plan.xs(0, plan.num_ticks))
    engine = D.DeviceEngine(digits3, plan, opt, params, ctx)
    assert [d.id for d in engine.devices] == [d.id for d in jax.devices()[:3]]
    dcarry, loss_dev = engine.run_chunk(engine.init_carry(), plan.xs(0, plan.num_ticks))
    _tree_close(engine.stage_params(dcarry), sim.stage_params(carry))
    np.testing.assert_allclose(np.asarray(loss_dev), np.asarray(loss_sim), rtol=1e-6)
    # every stage's parameters live on its own device
    for k in range(3):
        shard = [s for s in dcarry.state["float32"].addressable_shards if s.index[0] == slice(k, k + 1)]
        assert shard[0].device == jax.devices()[k]


def test_run_devices_agrees_with_simulate_and_writes_a_result(digits3, tmp_path):
    """DSP(2,0,1): a same-tick link (two forward sub-steps), a delayed loss link, two chunks."""
    kwargs = dict(lr=0.05, eval_every=4, seed=1, cluster="1,2,1")
    sim_r = pp.simulate(digits3, "dsp:2,0,1", 8, **kwargs)
    dev_r = pp.run_devices(digits3, "dsp:2,0,1", 8, **kwargs)
    _tree_close(dev_r.params, sim_r.params)
    cols = ["update", "tick", "sim_time", "train_loss", "loss", "accuracy"]
    np.testing.assert_allclose(dev_r.history[cols].to_numpy(), sim_r.history[cols].to_numpy(), rtol=1e-5)
    assert dev_r.config["engine"] == "devices" and sim_r.config["engine"] == "sim"
    assert dev_r.schedule.equals(sim_r.schedule)  # the same plan on the same simulated timeline
    assert dev_r.config["lags"] == [6, 2, 2] and dev_r.schedule.summary()["staleness_max"] == 6
    loaded = Result.load(dev_r.save(tmp_path / "dev"))
    _tree_close(loaded.params, dev_r.params, atol=0)
    assert loaded.config["schedule"] == "dsp:2,0,1" and len(loaded.train_loss) == 8


def test_too_few_devices_is_a_clear_error(digits3):
    plan = pp.make_plan(pp.dsp((1, 1, 0)), 3, 2)
    params = digits3.init_stage_params(jax.random.key(0))
    ctx = S.Context(digits3, jax.random.key(1))
    with pytest.raises(ValueError, match="3 stages but only 2 device"):
        D.DeviceEngine(digits3, plan, optim.resolve("sgd", 0.1), params, ctx, devices=jax.devices()[:2])
