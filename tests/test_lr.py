"""Tests for staleness.lr: staleness-aware learning-rate rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from staleness import lr

RULES = [lr.constant(), lr.per_gradient(), lr.per_update(), lr.delay_adaptive(2),
         lr.delay_adaptive(8)]

TAU = np.array([[0, 1, 2, 4],
                [3, 3, 0, 0],
                [5, 9, 9, 9]])
MASK = np.array([[1, 1, 1, 1],
                 [1, 1, 0, 0],
                 [0, 0, 0, 0]], dtype=bool)


def test_constant_exact():
    np.testing.assert_array_equal(lr.constant().scale(TAU, MASK),
                                  [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])


def test_per_gradient_exact_and_not_one_over_tau_plus_one():
    np.testing.assert_array_equal(lr.per_gradient().scale(TAU, MASK),
                                  [[1, 1, 1 / 2, 1 / 4], [1 / 3, 1 / 3, 0, 0], [0, 0, 0, 0]])
    # alpha0 / tau (Rudra IJCAI), not alpha0 / (tau + 1).
    assert lr.per_gradient().scale(np.array([2]))[0] == 0.5


def test_per_update_exact():
    # Row 0: mean tau = 7/4 -> 4/7. Row 1: mean over the 2 real slots = 3 -> 1/3.
    # Row 2: no real slot -> zeros.
    np.testing.assert_allclose(lr.per_update().scale(TAU, MASK),
                               [[4 / 7] * 4, [1 / 3, 1 / 3, 0, 0], [0, 0, 0, 0]], rtol=1e-15)
    # Mean below 1 is clamped: factor 1, never > 1.
    np.testing.assert_array_equal(lr.per_update().scale(np.array([[0, 1]])), [[1.0, 1.0]])
    np.testing.assert_array_equal(lr.per_update().scale(np.array([[0, 0, 0]])), [[1, 1, 1]])


def test_delay_adaptive_exact():
    np.testing.assert_allclose(lr.delay_adaptive(2).scale(TAU, MASK),
                               [[1, 1, 1, 1 / 2], [2 / 3, 2 / 3, 0, 0], [0, 0, 0, 0]], rtol=1e-15)
    np.testing.assert_array_equal(lr.delay_adaptive(8).scale(np.array([0, 8, 16])), [1, 1, 0.5])


def test_mask_defaults_to_all_real_and_accepts_ints():
    for rule in RULES:
        np.testing.assert_array_equal(rule.scale(TAU), rule.scale(TAU, np.ones_like(MASK)))
        np.testing.assert_array_equal(rule.scale(TAU, MASK.astype(int)), rule.scale(TAU, MASK))


def test_leading_batch_axes():
    tau = np.arange(24).reshape(2, 3, 4) % 7
    mask = (np.arange(24).reshape(2, 3, 4) % 3) != 0
    for rule in RULES:
        out = rule.scale(tau, mask)
        assert out.shape == (2, 3, 4)
        flat = rule.scale(tau.reshape(6, 4), mask.reshape(6, 4))
        np.testing.assert_array_equal(out.reshape(6, 4), flat)


def test_lists_and_python_scalars_rows():
    np.testing.assert_array_equal(lr.per_gradient().scale([0, 4], [True, True]), [1, 0.25])


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
def test_numpy_and_jax_agree(rule):
    a = rule.scale(TAU, MASK)
    b = rule.scale(jnp.asarray(TAU), jnp.asarray(MASK))
    assert isinstance(a, np.ndarray) and isinstance(b, jax.Array)
    # JAX computes in float32 by default; 1e-6 relative covers its rounding.
    np.testing.assert_allclose(np.asarray(b), a, rtol=1e-6)
    # Either argument being a JAX array selects jax.numpy.
    assert isinstance(rule.scale(TAU, jnp.asarray(MASK)), jax.Array)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.describe())
def test_under_jit_no_retrace(rule):
    traces = []

    @jax.jit
    def f(tau, mask):
        traces.append(None)
        return rule.scale(tau, mask)

    out = f(jnp.asarray(TAU), jnp.asarray(MASK))
    np.testing.assert_allclose(np.asarray(out), rule.scale(TAU, MASK), rtol=1e-6)
    f(jnp.asarray(TAU + 1), jnp.asarray(~MASK))
    assert len(traces) == 1
    # Rules are hashable values, so they can also be static arguments.
    g = jax.jit(lambda r, t, m: r.scale(t, m), static_argnums=0)
    np.testing.assert_allclose(np.asarray(g(rule, jnp.asarray(TAU), jnp.asarray(MASK))),
                               rule.scale(TAU, MASK), rtol=1e-6)


def test_under_vmap_and_strict_promotion():
    with jax.numpy_dtype_promotion("strict"):
        for rule in RULES:
            out = jax.vmap(rule.scale)(jnp.asarray(TAU), jnp.asarray(MASK))
            np.testing.assert_allclose(np.asarray(out), rule.scale(TAU, MASK), rtol=1e-6)


def test_negative_staleness_numpy_raises_padding_ignored():
    for rule in RULES:
        with pytest.raises(ValueError, match=r"staleness = -1 in a real \(masked\) slot"):
            rule.scale(np.array([[1, -1]]), np.array([[True, True]]))
        # A sentinel in a padded slot is fine.
        out = rule.scale(np.array([[1, -1]]), np.array([[True, False]]))
        assert out[0, 1] == 0
    with pytest.raises(ValueError, match="staleness = nan"):
        lr.per_gradient().scale(np.array([np.nan]))


def test_shape_errors():
    with pytest.raises(ValueError, match=r"mask has shape \(2,\) but staleness has shape \(3,\)"):
        lr.per_update().scale(np.zeros(3), np.ones(2, bool))
    with pytest.raises(ValueError, match="mask has shape"):
        lr.per_update().scale(jnp.zeros(3), jnp.ones(2, bool))
    with pytest.raises(ValueError, match=r"staleness has shape \(\)"):
        lr.constant().scale(np.int64(3))


def test_get_names_aliases_and_round_trip():
    assert lr.get("constant") == lr.constant()
    assert lr.get("per_gradient") == lr.get("tau") == lr.get("Per-Gradient") == lr.per_gradient()
    assert lr.get("per_update") == lr.get("mean_tau") == lr.per_update()
    assert lr.get("delay_adaptive:8") == lr.delay_adaptive(8)
    for rule in RULES:
        assert lr.get(rule.describe()) == rule
        assert lr.get(rule) is rule
    assert {r.name for r in RULES} == set(lr.NAMES)


@pytest.mark.parametrize("spec, needle", [
    ("sgd", "valid: constant, per_gradient"),
    ("", "is empty"),
    ("constant:3", "'constant' takes no positional value ('3')"),
    ("delay_adaptive", "needs num_workers"),
    ("delay_adaptive:x", "num_workers = 'x' must be an integer"),
    ("delay_adaptive:0", "num_workers = 0 must be an integer >= 1"),
    ("per_gradient+cosine", "is not a learning-rate rule"),
    (3, "must be a spec string"),
])
def test_get_errors(spec, needle):
    with pytest.raises(ValueError) as e:
        lr.get(spec)
    assert needle in str(e.value)


def test_delay_adaptive_validation():
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="delay_adaptive: num_workers"):
            lr.delay_adaptive(bad)


@st.composite
def slots(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    tau = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, 10_000)))
    mask = draw(hnp.arrays(np.bool_, shape))
    return tau, mask


@settings(max_examples=150, deadline=None)
@given(slots(), st.integers(1, 64))
def test_property_factors_in_unit_interval_and_zero_padding(data, num_workers):
    tau, mask = data
    for rule in (lr.constant(), lr.per_gradient(), lr.per_update(),
                 lr.delay_adaptive(num_workers)):
        out = rule.scale(tau, mask)
        assert out.shape == tau.shape
        assert np.all(out[~mask] == 0)
        real = out[mask]
        assert np.all((real > 0) & (real <= 1))
        # Fresh gradients (tau = 0) are never scaled down by per-gradient rules.
        if not isinstance(rule, lr.PerUpdate):
            assert np.all(out[mask & (tau == 0)] == 1)
    # per_update gives every real slot of one update the same factor.
    pu = lr.per_update().scale(tau, mask)
    for idx in np.ndindex(tau.shape[:-1]):
        vals = pu[idx][mask[idx]]
        assert vals.size == 0 or np.all(vals == vals[0])


@settings(max_examples=25, deadline=None)
@given(slots())
def test_property_jax_matches_numpy(data):
    tau, mask = data
    for rule in RULES:
        np.testing.assert_allclose(np.asarray(rule.scale(jnp.asarray(tau), jnp.asarray(mask))),
                                   rule.scale(tau, mask), rtol=1e-6)
