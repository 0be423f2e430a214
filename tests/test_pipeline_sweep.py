"""`staleness.pipeline.sweep`: a grid of (lr, seed) runs in one compiled call, and lr tuning on it.

Differential first: every member of a sweep is bitwise the run `simulate` makes with
that lr and seed (the members run one after the other, each with its run's ops).
"""

import math

import numpy as np
import pytest

import staleness.pipeline as pp
from staleness.pipeline.sweep import holdout, sweep, tune_lr


@pytest.fixture(scope="module")
def ptask():
    return pp.tasks.get("digits-resmlp", num_stages=3, batch_size=16, width=16)


@pytest.mark.parametrize("spec", ["dsp:1,1,0", "gpipe:2", "ddg"])
def test_members_equal_simulate(ptask, spec):
    out = sweep(ptask, spec, 60, lrs=[0.01, 0.03], seeds=[0, 3], eval_every=20)
    assert out.members == [(0.01, 0), (0.01, 3), (0.03, 0), (0.03, 3)]
    for lr, seed in [(0.03, 3), (0.01, 0)]:
        r = pp.simulate(ptask, spec, 60, lr=lr, seed=seed, eval_every=20)
        i = out.index(lr, seed)
        assert out.update.tolist() == r.history["update"].tolist()
        assert out.status[i] == "complete"
        np.testing.assert_array_equal(out.train_loss[i], r.train_loss)
        np.testing.assert_array_equal(out.accuracy[i], r.history["accuracy"].to_numpy())
        np.testing.assert_array_equal(out.loss[i], r.history["loss"].to_numpy())
        assert out.final(i) == float(r.history["accuracy"].iloc[-1])


def test_a_diverged_member_is_marked_and_the_others_are_untouched(ptask):
    out = sweep(ptask, "dsp:1,1,0", 60, lrs=[0.01, 50.0], seeds=[0], eval_every=20)
    assert out.status == ["complete", "diverged"]
    assert math.isnan(out.final(1)) and np.isnan(out.accuracy[1, -1])
    alone = sweep(ptask, "dsp:1,1,0", 60, lrs=[0.01], seeds=[0], eval_every=20)
    np.testing.assert_array_equal(out.train_loss[0], alone.train_loss[0])
    with pytest.raises(KeyError, match="not a member"):
        out.index(0.02, 0)


def test_tune_lr_on_the_validation_split(ptask):
    val = holdout(ptask)
    assert val.task.train_size < ptask.task.train_size
    # a rate that diverges is out, a tiny one barely learns: the middle one is chosen
    t = tune_lr(ptask, "dsp:1,1,0", 60, grid=[1e-4, 0.01, 50.0], seeds=[1001, 1002], eval_every=20)
    assert t["lr"] == 0.01 and not t["edge"] and math.isnan(t["scores"][2]) and t["runs"] == 6
    assert t["scores"][1] > t["scores"][0]
    # best at the top edge: one step beyond is tried (one more value x one seed)
    t = tune_lr(ptask, "backprop", 60, grid=[1e-4, 3e-4], seeds=[1001], eval_every=20, extend=1)
    assert t["grid"] == pytest.approx([1e-4, 3e-4, 9e-4]) and t["runs"] == 3
    assert t["lr"] == pytest.approx(9e-4) and t["edge"]
    with pytest.raises(ValueError, match="every learning rate of the grid"):
        tune_lr(ptask, "dsp:1,1,0", 60, grid=[50.0], seeds=[1001], eval_every=20)


@pytest.mark.parametrize("kw, match", [
    (dict(lrs=[], seeds=[0]), "lrs is empty"),
    (dict(lrs=[0.0], seeds=[0]), "finite number > 0"),
    (dict(lrs=[0.01], seeds=[-1]), "integer >= 0"),
    (dict(lrs=[0.01], seeds=[True]), "integer >= 0"),
])
def test_bad_grids(ptask, kw, match):
    with pytest.raises(ValueError, match=match):
        sweep(ptask, "backprop", 10, **kw)


def test_a_clocked_outer_step_is_refused_before_computing(ptask):
    """`clocked_nesterov` reads a local-update merge's share of a round: a pipeline has none."""
    msg = "optimizer = 'clocked_nesterov:0.9,lr=0.1' is the outer step of local-update merges.*the pipeline has none"
    with pytest.raises(ValueError, match=msg):
        sweep(ptask, "backprop", 10, lrs=[0.1], seeds=[0], optimizer="clocked_nesterov:lr=0.1")
    with pytest.raises(ValueError, match=msg):
        pp.simulate(ptask, "backprop", 10, optimizer="clocked_nesterov:lr=0.1")
