"""A loop of plain pytrees and optax, no framework: params are a dict, the network a function,
the update one jitted function (Equinox models go the same way through `eqx.partition`).
`pytree_regression.py` trains in float32; `pytree_regression_fp16.py` is the same file in
float16 with a loss scaler and skipped non-finite steps: `diff` the two to see the change.

Usage: python examples/pytree_regression[_fp16].py [steps]
"""

import sys

import jax
import jax.numpy as jnp
import optax

from genesis_jax import amp


def init_params(key, sizes=(8, 64, 64, 1)):
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": jax.random.normal(k, (m, n)) / jnp.sqrt(m), "b": jnp.zeros(n)}
        for k, m, n in zip(keys, sizes[:-1], sizes[1:])
    ]


def forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    return jnp.mean((amp.autocast(forward, "fp16")(params, x) - y) ** 2)  # float16 inside, float32 out


tx = amp.skip_nonfinite(optax.adam(3e-3))  # a step whose gradients are not finite changes nothing


@jax.jit
def update(params, opt_state, scaler, x, y):
    loss, grads, _, _, scaler = amp.scaled_value_and_grad(loss_fn)((scaler, opt_state), params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, scaler, loss


def train(steps, seed=0):
    """Returns (the losses, the params, the optimizer state)."""
    x = jax.random.normal(jax.random.PRNGKey(seed), (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    params = init_params(jax.random.PRNGKey(seed + 1))
    opt_state, scaler = tx.init(params), amp.DynamicLossScale()
    losses = []
    for _ in range(steps):
        params, opt_state, scaler, loss = update(params, opt_state, scaler, x, y)
        losses.append(float(loss))
    return losses, params, opt_state


if __name__ == "__main__":
    losses, params, opt_state = train(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
