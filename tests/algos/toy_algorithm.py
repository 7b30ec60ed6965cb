"""A whole algorithm on the template, as a new one would be written: noisy linear regression
by minibatch SGD, several seeds at once. Its config, four pure functions and a registration
line give it the CLI, the Session, checkpoints and resume, its metric rows and plot, and bench rows."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct

from genesis_jax.algos.base import Algorithm, Config, Presets
from genesis_jax.amp import TrainState
from genesis_jax.run.config import SeedFields


@dataclasses.dataclass(frozen=True)
class ToyFields(SeedFields):
    """The toy's fields: the shared seeds group, and its own."""

    total_steps: int = 256
    """Optimizer steps in all."""
    batch_size: int = 32
    """Samples per step."""
    lr: float = 0.8
    """SGD's learning rate."""


@dataclasses.dataclass(frozen=True)
class ToyConfig(ToyFields, Config):
    """The toy's whole config: its fields and the shared mixed-precision and parallel ones."""

    RESUMABLE = ("total_steps",)  # a longer run extends this one


class ToyState(struct.PyTreeNode):
    train_state: TrainState
    rng: jax.Array


TRUE_W = jnp.array([1.0, -2.0, 0.5])


def loss_fn(params, batch):
    x, y = batch  # x in the precision's compute dtype: the matmul runs in it, the loss in float32
    return jnp.mean(jnp.square((x @ params["w"].astype(x.dtype)).astype(jnp.float32) - y)), None


class Toy(Algorithm):
    name = "toy"
    config_class = ToyConfig
    presets = Presets(tiny=dict(total_steps=32))

    def init(self, key):
        params = {"w": jnp.zeros(3)}
        return ToyState(self.config.create_train_state(params, optax.sgd(self.config.lr)), key)

    def update(self, state, data):
        rng, key = jax.random.split(state.rng)
        x = 0.25 * jax.random.normal(key, (self.config.batch_size, 3))  # its float16 gradients stay below 65504 at 2^16
        y = x @ TRUE_W + 0.01 * jax.random.normal(rng, (self.config.batch_size,))
        compute = self.config.train_precision().compute_dtype
        ts, m = self.train_step(state.train_state, loss_fn, (x.astype(compute), y))
        return ToyState(ts, rng), {"loss": m["loss"]}  # the scale, the skips and the guard's halt: the template's

    def summary(self, rows, state):
        # The bench scores an algorithm that does not act by `eval_loss`: here the loss on a batch it
        # never trained on (averaged over the seeds trained together).
        x = jax.random.normal(jax.random.key(12345), (256, 3))
        w = jnp.atleast_2d(state.train_state.params["w"])  # [seeds, 3]
        eval_loss = jnp.mean(jnp.square(x @ w.T - (x @ TRUE_W)[:, None]))
        return {"final_loss": rows[-1]["loss"], "eval_loss": float(eval_loss)}


ALGORITHM = Toy
