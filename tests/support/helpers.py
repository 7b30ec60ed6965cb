"""Small shared fixtures: a regression MLP and its data, and an exact comparison of two pytrees."""

import jax
import jax.numpy as jnp
import numpy as np

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


def tree_equal(a, b):
    """Every leaf of `a` equal to the same leaf of `b`, bit for bit, in shape and dtype too. The
    leaves are compared in order, not the structures: train states built apart hold optimizers
    of different identities."""
    leaves_a, leaves_b = jax.tree.leaves(jax.device_get(a)), jax.tree.leaves(jax.device_get(b))
    assert len(leaves_a) == len(leaves_b), (len(leaves_a), len(leaves_b))
    for x, y in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(x, y, strict=True)
