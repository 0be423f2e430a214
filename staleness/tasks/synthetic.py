"""Synthetic tasks with known optima, for exact checks: `quadratic` and `linreg`."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from staleness.tasks import data
from staleness.tasks.base import Task
from staleness.tasks.batches import PyTree, example_key
from staleness.tasks.checks import check_common, check_shard


def quadratic(batch_size: int, num_workers: int, partition: str, seed: int, *,
              dim: int = 10, condition_number: float = 10.0, noise_scale: float = 0.0) -> Task:
    """f(θ) = ½ (θ − θ*)ᵀ A (θ − θ*): the exact-check task.

    A is symmetric positive definite with eigenvalues geometrically spaced in [1, condition_number],
    rotated by an orthogonal matrix close to the identity (so A is diagonally dominant); θ* ~ N(0,
    I). Both come from `seed`; the task exposes them as `optimum` ({"theta": θ*}) and `hessian` (A).

    The gradient is defined (custom JVP) as exactly `A @ (θ − θ*)` in float32, so with
    `noise_scale=0` (default) it is deterministic and a delayed recurrence θ_{u+1} = θ_u −
    α·A(θ_{u−τ_u} − θ*) can be checked in closed form. The batch is then a fixed-shape dummy ({"x":
    [μ, 0]}) that the loss ignores, and `partition`/`num_workers` have no effect (there is no data
    to split). With `noise_scale=σ > 0`, batch["x"] holds μ draws of N(0, σ²I) and the minibatch
    gradient is A(θ − θ*) + mean(x): unbiased, with per-coordinate standard deviation σ/√μ.

    params: {"theta": [dim]}; evaluate: {"loss": f(θ)} (= f(θ) − f(θ*)).
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be an int >= 1; got {dim!r}.")
    if not condition_number >= 1.0:
        raise ValueError(f"condition_number must be >= 1; got {condition_number!r}.")
    if not noise_scale >= 0.0:
        raise ValueError(f"noise_scale must be >= 0; got {noise_scale!r}.")
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(np.eye(dim) + 0.1 * rng.normal(size=(dim, dim)))
    q = q * np.sign(np.diag(r))  # the QR factor closest to the identity
    a = q @ np.diag(np.geomspace(1.0, condition_number, dim)) @ q.T
    a32 = ((a + a.T) / 2).astype(np.float32)
    theta_star = rng.normal(size=dim).astype(np.float32)
    hessian, optimum = jnp.asarray(a32), jnp.asarray(theta_star)

    @jax.custom_jvp
    def f(theta: jax.Array) -> jax.Array:
        d = theta - optimum
        return 0.5 * jnp.dot(d, hessian @ d)

    @f.defjvp
    def f_jvp(primals, tangents):
        (theta,), (t,) = primals, tangents
        g = hessian @ (theta - optimum)
        return 0.5 * jnp.dot(theta - optimum, g), jnp.dot(g, t)

    def init_fn(key: jax.Array) -> PyTree:
        return {"theta": jax.random.normal(key, (dim,), jnp.float32)}

    if noise_scale == 0.0:
        sample_fn = data.empty_sample_fn(batch_size)

        def loss_fn(params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
            del batch
            return f(params["theta"])
    else:
        empty = data.empty_sample_fn(batch_size)

        @jax.jit
        def sample_fn(d: PyTree, key: jax.Array, worker: Any, iteration: Any) -> dict[str, jax.Array]:
            noise = noise_scale * jax.random.normal(example_key(key, worker, iteration), (batch_size, dim))
            return {**empty(d, key, worker, iteration), "x": noise}

        def loss_fn(params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
            return f(params["theta"]) + jnp.dot(jnp.mean(batch["x"], axis=0), params["theta"])

    return Task(
        name="quadratic", batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=("loss",), train_size=0, test_size=0, seed=seed,
        init_fn=jax.jit(init_fn), loss_fn=loss_fn, sample_fn=sample_fn,
        eval_fn=jax.jit(lambda params, d: {"loss": f(params["theta"])}),
        data={}, optimum={"theta": optimum}, hessian=hessian,
    )


def _linreg_predict(params: PyTree, x: jax.Array) -> jax.Array:
    return x @ params["w"] + params["b"]


def _linreg_loss(params: PyTree, batch: dict[str, jax.Array]) -> jax.Array:
    return 0.5 * jnp.mean((_linreg_predict(params, batch["x"]) - batch["y"]) ** 2)


def _linreg_per_example(params: PyTree, x: jax.Array, y: jax.Array) -> dict[str, jax.Array]:
    return {"loss": 0.5 * (_linreg_predict(params, x) - y) ** 2}


@functools.lru_cache(maxsize=16)
def _linreg_init(dim: int):
    def init_fn(key: jax.Array) -> PyTree:
        return {"w": 0.01 * jax.random.normal(key, (dim,), jnp.float32), "b": jnp.zeros((), jnp.float32)}

    return jax.jit(init_fn)


def linreg(batch_size: int, num_workers: int, partition: str, seed: int, *,
           dim: int = 20, num_train: int = 2000, num_test: int = 500, noise_scale: float = 0.1) -> Task:
    """Linear regression with a known least-squares optimum.

    Data y = x·w* + b* + noise_scale·ε generated from `seed` (see `data.linreg`).
    Loss ½·mean((x·w + b − y)²). `optimum` is the exact minimiser of the full training loss
    ({"w": [dim], "b": []}, float64 least squares cast to float32), which differs from (w*, b*) by
    the noise. Under `shard`, examples are sorted by target value before sharding. evaluate:
    {"loss"} on the test set.
    """
    for arg, v in (("dim", dim), ("num_train", num_train), ("num_test", num_test)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{arg} must be an int >= 1; got {v!r}.")
    if not noise_scale >= 0.0:
        raise ValueError(f"noise_scale must be >= 0; got {noise_scale!r}.")
    check_common(batch_size, num_workers, partition, seed)
    check_shard(partition, num_workers, num_train, "linreg")
    arrays, _, _ = data.linreg(seed, dim, num_train, num_test, noise_scale)
    design = np.concatenate([arrays.x_train, np.ones((num_train, 1), np.float32)], axis=1).astype(np.float64)
    coef = np.linalg.lstsq(design, arrays.y_train.astype(np.float64), rcond=None)[0]
    optimum = {"w": jnp.asarray(coef[:dim], jnp.float32), "b": jnp.asarray(coef[dim], jnp.float32)}

    arrays_data = {"x_train": arrays.x_train, "y_train": arrays.y_train,
                   **data.sampler_data(arrays.y_train, partition, num_workers, seed),
                   **data.chunked_test_data(arrays.x_test, arrays.y_test, data.DEFAULT_EVAL_CHUNK)}
    return Task(
        name="linreg", batch_size=batch_size, num_workers=num_workers, partition=partition,
        metric_names=("loss",), train_size=num_train, test_size=num_test, seed=seed,
        init_fn=_linreg_init(dim), loss_fn=_linreg_loss, gather_fn=data.make_gather_fn(),
        sample_fn=data.make_sample_fn(batch_size, partition, num_train),
        eval_fn=data.make_eval_fn(_linreg_per_example, num_test), data=data.device_data(arrays_data), optimum=optimum,
    )
