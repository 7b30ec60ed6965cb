"""A small demo: an MLP regression trained with the mixed-precision update step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from genesis_jax.loss_scale import DEFAULT_GROWTH_INTERVAL, DEFAULT_INIT_SCALE, make_loss_scale
from genesis_jax.nets.mlp import MLP
from genesis_jax.precision import get_precision
from genesis_jax.trainer import MixedPrecisionTrainer


def run_demo(
    precision: str = "fp16",
    steps: int = 500,
    seed: int = 0,
    loss_scaling=None,
    init_loss_scale=DEFAULT_INIT_SCALE,
    growth_interval=DEFAULT_GROWTH_INTERVAL,
    min_loss_scale=None,
) -> dict:
    """Fits y = sum(sin(x)) with a 64x64 MLP; returns final loss, loss scale and skipped steps."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    prec = get_precision(precision, loss_scaling)
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    model = MLP(features=(64, 64, 1), dtype=prec.compute_dtype)
    scaler = make_loss_scale(prec.loss_scaling, init_loss_scale, growth_interval, min_loss_scale)

    def loss_fn(params, batch):
        return jnp.mean((model.apply(params, batch[0]) - batch[1]) ** 2)

    trainer = MixedPrecisionTrainer(loss_fn, model.init(kp, x), optax.adam(3e-3), prec, loss_scale=scaler)
    for _ in range(steps):
        metrics = trainer.step((x, y))
    stats = trainer.stats()
    return {
        "precision": prec.name,
        "final_loss": float(metrics["loss"]),
        "loss_scale": stats["current_scale"],
        "skipped_steps": stats["overflow_steps"],
        "training_steps": stats["training_steps"],
    }
