"""A Flax NNX training loop as Flax's own guides write it: an `nnx.Module`, an `nnx.Optimizer`,
`nnx.value_and_grad` and `nnx.jit`. `nnx_regression.py` trains in float32;
`nnx_regression_fp16.py` is the same file in float16 with a loss scaler and skipped
non-finite steps: `diff` the two to see the change.

Usage: python examples/nnx_regression[_fp16].py [steps]
"""

import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from genesis_jax import amp

DTYPE = jnp.float16


class MLP(nnx.Module):
    def __init__(self, din, dhidden, dout, *, rngs):
        self.hidden1 = nnx.Linear(din, dhidden, dtype=DTYPE, rngs=rngs)
        self.hidden2 = nnx.Linear(dhidden, dhidden, dtype=DTYPE, rngs=rngs)
        self.out = nnx.Linear(dhidden, dout, dtype=DTYPE, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.hidden1(x))
        x = nnx.relu(self.hidden2(x))
        return self.out(x).astype(jnp.float32)  # what the loss reads stays float32


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads, finite, norm, _ = amp.scaled_value_and_grad(loss_fn)(optimizer, model)  # the scale from optimizer
    optimizer.update(model, grads, grads_finite=finite, grad_norm=norm)  # a non-finite step changes nothing
    return loss


def train(steps, seed=0):
    """Returns (the losses, the model, the optimizer)."""
    x = jax.random.normal(jax.random.PRNGKey(seed), (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    model = MLP(8, 64, 1, rngs=nnx.Rngs(seed))
    optimizer = amp.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param, precision="fp16")  # owns a loss scaler, skips
    losses = [float(train_step(model, optimizer, x, y)) for _ in range(steps)]
    return losses, model, optimizer


if __name__ == "__main__":
    losses, model, optimizer = train(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
