"""An Equinox loop: the model is an `eqx.Module`, its arrays the params (`eqx.partition`), the
update one jitted function. `equinox_regression.py` trains in float32;
`equinox_regression_fp16.py` is the same file in float16 with a loss scaler and skipped
non-finite steps: `diff` the two to see the change. The model has no `dtype` field:
`amp.autocast` runs the whole module in float16 and returns float32.

Usage: python examples/equinox_regression[_fp16].py [steps]
"""

import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


def init_model(key):
    return eqx.nn.MLP(8, 1, 64, 2, activation=jax.nn.relu, key=key)


def loss_fn(params, static, x, y):
    model = eqx.combine(params, static)
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


tx = optax.adam(3e-3)


@eqx.filter_jit
def update(params, static, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, static, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def train(steps, seed=0):
    """Returns (the losses, the params, the optimizer state)."""
    x = jax.random.normal(jax.random.PRNGKey(seed), (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    params, static = eqx.partition(init_model(jax.random.PRNGKey(seed + 1)), eqx.is_inexact_array)
    opt_state = tx.init(params)
    losses = []
    for _ in range(steps):
        params, opt_state, loss = update(params, static, opt_state, x, y)
        losses.append(float(loss))
    return losses, params, opt_state


if __name__ == "__main__":
    losses, params, opt_state = train(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
