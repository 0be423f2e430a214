"""An own RL task: sort 4 digits with an MLP policy (the issue's trial, ~30 lines)."""
import jax
import jax.numpy as jnp
import numpy as np
from staleness.tasks import rl

T, V = 4, 10


def make_task(num_workers=4, seed=0, objective="decoupled_ppo", **kw):
    rng = np.random.default_rng(seed)
    digits = rng.integers(0, V, size=(64, T)).astype(np.int32)

    def init_fn(key):
        k1, k2 = jax.random.split(key)
        return {"w1": 0.1 * jax.random.normal(k1, (2 * T * V, 64)), "w2": 0.1 * jax.random.normal(k2, (64, V))}

    def logits_fn(params, prompt, completion):
        def at(t):
            seen = jnp.where(jnp.arange(T) < t, completion, V)   # tokens so far
            x = jnp.concatenate([jax.nn.one_hot(prompt["d"], V).ravel(), jax.nn.one_hot(seen, V + 1)[:, :V].ravel()])
            return jnp.tanh(x @ params["w1"]) @ params["w2"]
        return jax.vmap(at)(jnp.arange(T))

    def reward_fn(prompt, completion, length):
        return jnp.mean((completion == jnp.sort(prompt["d"])).astype(jnp.float32))

    return rl.from_functions(rl.Policy(init_fn, logits_fn, T), rl.PromptSet({"d": digits}, rl.lengths.constant(T)),
                             reward_fn, name="sort-digits", num_workers=num_workers, seed=seed, objective=objective,
                             optimizer="adam:lr=3e-3", **kw)
