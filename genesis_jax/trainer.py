"""A thin stateful wrapper for users coming from PyTorch's FP16-trainer pattern.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import MixedPrecisionTrainer
>>> loss_fn = lambda params, batch: jnp.mean(jnp.square((batch @ params["w"]).astype(jnp.float32)))
>>> params = {"w": jnp.ones((4, 1))}
>>> trainer = MixedPrecisionTrainer(loss_fn, params, optax.sgd(0.1), precision="fp16", cast_params=True)
>>> metrics = trainer.step(jnp.full((8, 4), 0.1))   # jitted; device arrays, no host sync
>>> trainer.stats()["training_steps"], trainer.stats()["overflow_steps"]
(1, 0)
>>> float(params["w"][0, 0])   # the caller's params are untouched and still usable
1.0
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import optax

from genesis_jax.checkpoint import CheckpointStore
from genesis_jax.loss_scale import LossScale, make_loss_scale
from genesis_jax.precision import Precision, get_precision
from genesis_jax.update import LossFn, TrainState, mixed_precision_update, stats


class MixedPrecisionTrainer:
    """Holds a `TrainState` and runs the jitted `mixed_precision_update` on it.

    `loss_fn(params, batch) -> (loss, aux)` or `-> loss`. With `cast_params=True` the
    whole params tree is cast to the compute dtype before `loss_fn` (for plain functions);
    Flax modules built with `dtype=` do their own casting and leave it False.

    The caller's arrays stay valid: `params` passed in, and `trainer.params` read before a
    `step`, can still be used afterwards. `donate=True` lets XLA reuse the state's buffers
    for the next state (one copy of params and optimizer state less in memory), at the cost
    of that guarantee: the params passed in and every earlier `trainer.params` are then
    deleted by the first `step`.
    """

    def __init__(
        self,
        loss_fn: LossFn,
        params: Any,
        optimizer: optax.GradientTransformation,
        precision: str | Precision = "fp16",
        loss_scale: LossScale | None = None,
        max_grad_norm: float | None = 1.0,
        cast_params: bool = False,
        has_aux: bool = False,
        seed: int = 0,
        donate: bool = False,
    ):
        self.precision = precision if isinstance(precision, Precision) else get_precision(precision)
        scaler = loss_scale if loss_scale is not None else make_loss_scale(self.precision.loss_scaling)
        self.state = TrainState.create(params, optimizer, scaler, jax.random.PRNGKey(seed), self.precision)
        wrapped = loss_fn if has_aux else (lambda p, b: (loss_fn(p, b), None))
        compute_dtype = self.precision.compute_dtype if cast_params else None
        self._update = jax.jit(
            functools.partial(
                mixed_precision_update, loss_fn=wrapped, max_grad_norm=max_grad_norm, compute_dtype=compute_dtype
            ),
            donate_argnums=0 if donate else (),
        )

    def step(self, batch) -> dict:
        """One update; returns its metrics as device arrays (no host synchronisation)."""
        self.state, metrics = self._update(self.state, batch)
        return metrics

    def stats(self) -> dict:
        return stats(self.state)

    @property
    def params(self):
        return self.state.params

    def save(self, directory: str, meta: dict | None = None) -> None:
        with CheckpointStore(directory, async_save=False) as store:
            store.save(int(self.state.step), self.state, meta, force=True)

    def restore(self, directory: str, step: int | None = None) -> dict:
        with CheckpointStore(directory, async_save=False) as store:
            self.state, meta = store.restore(self.state, step)
        return meta
