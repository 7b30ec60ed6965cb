"""Small shared fixtures: a regression MLP and its data."""

import jax
import jax.numpy as jnp

from genesis_jax.nets import MLP


def regression_problem(seed=0, n=256, dim=4, hidden=(32, 32)):
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (n, dim))
    y = jnp.sin(x).sum(-1, keepdims=True)
    return x, y


def mlp_loss(dtype, hidden=(32, 32)):
    model = MLP(features=(*hidden, 1), dtype=dtype)

    def loss_fn(params, batch):
        x, y = batch
        return jnp.mean((model.apply(params, x) - y) ** 2), None

    return model, loss_fn
