"""Length rules: how many tokens each prompt's completion has, drawn once per prompt.

A task draws every prompt's completion length once, at construction (from its seed), and
every completion of that prompt has exactly that length, so a run's schedule is known before
any numerics run (`staleness.tasks.rl.base`).

A length rule is a callable `rule(prompts, rng) -> [N] int` (`prompts` the task's prompt
pytree with leading axis N, `rng` a `numpy.random.Generator`); the rules here are small
immutable values that also say their bounds (`low`, `high`), so a rule that could draw past
the model's context is an error before anything is drawn:

    lengths.lognormal(median=64, sigma=1.0, high=1024)    # long-tailed (the usual shape of LLM outputs)
    lengths.zipf(a=1.5, high=512)                          # heavier tail: P(L = k) ∝ k^-a on [low, high]
    lengths.constant(1)                                    # every completion one token (the bandit)
    lengths.from_prompts("length")                         # prompts["length"] (a length the prompt carries)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import numpy as np

__all__ = ["LogNormal", "Zipf", "Constant", "Empirical", "FromPrompts", "lognormal", "zipf", "constant", "empirical",
           "from_prompts", "num_prompts", "draw", "summary"]


def num_prompts(prompts: Any) -> int:
    """N, the leading axis shared by every leaf of a prompt pytree."""
    leaves = jax.tree.leaves(prompts)
    if not leaves:
        raise ValueError("prompts must be a pytree of arrays with a leading axis of one row per prompt; got no arrays")
    return int(np.shape(leaves[0])[0])


def _by_prompts(rule, prompts: Any, rng: np.random.Generator) -> np.ndarray:
    """A rule's `__call__`: one `draw` per prompt."""
    return rule.draw(rng, num_prompts(prompts))


class LogNormal(NamedTuple):
    """L = clip(round(median · exp(sigma · z)), low, high), z ~ N(0, 1): long-tailed lengths."""

    median: float
    sigma: float
    high: int
    low: int = 1

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        z = rng.standard_normal(n)
        return np.clip(np.rint(self.median * np.exp(self.sigma * z)), self.low, self.high).astype(np.int32)

    __call__ = _by_prompts

    def __str__(self) -> str:
        return f"lognormal(median={self.median:g}, sigma={self.sigma:g}, high={self.high}, low={self.low})"


class Zipf(NamedTuple):
    """P(L = k) ∝ k^-a for k in [low, high] (a truncated Zipf law)."""

    a: float
    high: int
    low: int = 1

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        support = np.arange(self.low, self.high + 1)
        p = support.astype(np.float64) ** -self.a
        return rng.choice(support, size=n, p=p / p.sum()).astype(np.int32)

    __call__ = _by_prompts

    def __str__(self) -> str:
        return f"zipf(a={self.a:g}, high={self.high}, low={self.low})"


class Constant(NamedTuple):
    """Every completion has `length` tokens."""

    length: int

    low = high = property(lambda self: self.length)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        del rng
        return np.full(n, self.length, np.int32)

    __call__ = _by_prompts

    def __str__(self) -> str:
        return f"constant({self.length})"


class Empirical(NamedTuple):
    """Lengths drawn (with replacement) from measured ones: `values` [K] tokens with their
    `weights` [K] (counts or probabilities; None: equal), e.g. a histogram of a real run's
    completion lengths."""

    values: tuple
    weights: tuple | None = None

    low = property(lambda self: int(min(self.values)))
    high = property(lambda self: int(max(self.values)))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        p = None if self.weights is None else np.asarray(self.weights, np.float64) / np.sum(self.weights)
        return rng.choice(np.asarray(self.values, np.int32), size=n, p=p).astype(np.int32)

    __call__ = _by_prompts

    def __str__(self) -> str:
        return f"empirical({len(self.values)} lengths, {self.low}..{self.high})"


class FromPrompts(NamedTuple):
    """The length each prompt carries: prompts[field] ([N] int)."""

    field: str

    def __call__(self, prompts: Any, rng: np.random.Generator) -> np.ndarray:
        del rng
        if not isinstance(prompts, dict) or self.field not in prompts:
            raise ValueError(f"length_rule = {self}: the prompts have no field {self.field!r}")
        return np.asarray(prompts[self.field])

    def __str__(self) -> str:
        return f"from_prompts({self.field!r})"


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} = {value!r} must be an int >= {low}")
    return int(value)


def _bounds(low: Any, high: Any) -> tuple[int, int]:
    low, high = _int("low", low, 1), _int("high", high, 1)
    if high < low:
        raise ValueError(f"high = {high} must be >= low = {low} (tokens)")
    return low, high


def lognormal(median: float, sigma: float, high: int, low: int = 1) -> LogNormal:
    """Lengths round(median · e^(sigma z)) clipped to [low, high] tokens (median > 0, sigma >= 0)."""
    if isinstance(median, bool) or not isinstance(median, (int, float)) or not (0 < median < math.inf):
        raise ValueError(f"median = {median!r} must be a number > 0 (tokens)")
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (0 <= sigma < math.inf):
        raise ValueError(f"sigma = {sigma!r} must be a number >= 0 (the log-length's std)")
    low, high = _bounds(low, high)
    return LogNormal(float(median), float(sigma), high, low)


def zipf(a: float, high: int, low: int = 1) -> Zipf:
    """Lengths k in [low, high] tokens with P(k) ∝ k^-a (a > 0)."""
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not (0 < a < math.inf):
        raise ValueError(f"a = {a!r} must be a number > 0 (the Zipf exponent)")
    low, high = _bounds(low, high)
    return Zipf(float(a), high, low)


def empirical(values, weights=None) -> Empirical:
    """Lengths drawn from measured `values` (ints >= 1) with `weights` (>= 0, not all 0; None:
    equal); ValueError naming a bad one."""
    vals = np.asarray(values).reshape(-1)
    if not len(vals) or vals.dtype.kind not in "iuf" or not np.all(np.isfinite(vals)) or np.any(vals < 1) or \
            np.any(vals != np.round(vals)):
        raise ValueError(f"values = {values!r} must be lengths in tokens: integers >= 1, at least one")
    w = None
    if weights is not None:
        w = np.asarray(weights, np.float64).reshape(-1)
        if w.shape != vals.shape or not np.all(np.isfinite(w)) or np.any(w < 0) or not w.sum() > 0:
            raise ValueError(f"weights = {weights!r} must be {len(vals)} numbers >= 0, not all 0 (one per value)")
        w = tuple(float(x) for x in w)
    return Empirical(tuple(int(v) for v in vals), w)


def constant(length: int) -> Constant:
    """Every completion `length` tokens (>= 1)."""
    return Constant(_int("length", length, 1))


def from_prompts(field: str = "length") -> FromPrompts:
    """The length each prompt carries in prompts[field]."""
    return FromPrompts(field)


def draw(rule: Any, prompts: Any, rng: np.random.Generator, max_length: int | None, what: str) -> np.ndarray:
    """rule(prompts, rng) checked: [N] int32 lengths in [1, max_length] (no upper bound if None).

    Raises ValueError naming `what` (the argument the rule was given as) when the rule's declared
    `high` or a drawn length exceeds max_length, a length is < 1, or the shape is not [N]."""
    if not callable(rule):
        raise ValueError(f"{what} = {rule!r} must be a length rule: a callable (prompts, rng) -> [N] int, "
                         "e.g. staleness.tasks.rl.lengths.lognormal(median=64, sigma=1.0, high=1024)")
    context = "" if max_length is None else f" > max_length = {max_length} (the completion positions the model holds)"
    high = getattr(rule, "high", None)
    if max_length is not None and isinstance(high, (int, np.integer)) and high > max_length:
        raise ValueError(f"{what} = {rule} can draw lengths up to {high}{context}; lower its high or "
                         "raise the model's context")
    n = num_prompts(prompts)
    out = np.asarray(rule(prompts, rng))
    if out.shape != (n,) or not np.issubdtype(out.dtype, np.integer):
        raise ValueError(f"{what} must return [{n}] ints (one length per prompt); got {out.dtype} {out.shape}")
    if out.min() < 1:
        raise ValueError(f"{what} drew a length of {int(out.min())} tokens; every completion needs >= 1")
    if max_length is not None and out.max() > max_length:
        raise ValueError(f"{what} drew a length of {int(out.max())} tokens{context}")
    out = out.astype(np.int32)
    out.flags.writeable = False
    return out


def summary(lengths: np.ndarray) -> dict[str, float]:
    """{"mean", "median", "p90", "p99", "max"} of lengths (tokens): what a config records."""
    a = np.asarray(lengths, np.float64)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}
