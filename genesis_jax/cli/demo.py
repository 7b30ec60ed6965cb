"""A small demo: an MLP regression trained with `amp.TrainState` and `amp.train_step`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from genesis_jax import amp
from genesis_jax.nets.mlp import MLP
from genesis_jax.run.config import SEED_MAX, MixedPrecisionConfig


def run_demo(
    precision: str = "fp16",
    steps: int = 500,
    seed: int = 0,
    loss_scaling=None,
    init_loss_scale=2.0**16,  # PyTorch GradScaler's defaults
    growth_interval=2000,
    min_loss_scale=None,
) -> dict:
    """Fits y = sum(sin(x)) with a 64x64 MLP; returns final loss, loss scale and skipped steps."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer from 0 to {SEED_MAX}, got {seed}")
    scaling = dict(loss_scaling=loss_scaling, init_loss_scale=init_loss_scale, growth_interval=growth_interval)
    MixedPrecisionConfig(precision=precision, min_loss_scale=min_loss_scale, **scaling)  # refused as train's flags are
    prec = amp.get_precision(precision, loss_scaling)
    kx, kp = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    model = MLP(features=(64, 64, 1), dtype=prec.compute_dtype)

    def loss_fn(params, x, y):
        return jnp.mean((model.apply(params, x).astype(jnp.float32) - y) ** 2)

    state = amp.TrainState.create(
        apply_fn=model.apply,
        params=model.init(kp, x),
        tx=optax.adam(3e-3, eps=1e-5 if prec.param_dtype == jnp.float16 else 1e-8),  # 1e-8 is 0 in float16
        precision=prec,
        scaler=prec.scaler(init_loss_scale, growth_interval, min_loss_scale),
        max_grad_norm=1.0,
    )
    step = jax.jit(amp.train_step, static_argnums=1)
    for _ in range(steps):
        state, metrics = step(state, loss_fn, x, y)
    stats = amp.stats(state)
    return {
        "precision": prec.name,
        "final_loss": float(metrics["loss"]),
        "loss_scale": stats["scale"],
        "skipped_steps": stats["skipped"],
        "training_steps": stats["steps"],
    }
