"""The one mixed-precision update step every trainer uses.

Order of operations (PyTorch's FP16-trainer pattern): scale the loss, differentiate,
unscale in float32, decide "all gradients finite" (on the all-reduced gradients under
data parallelism), clip the *unscaled* global norm, apply the optimizer, keep the old
params and optimizer state where the step was not finite, adjust the scale, count.

Casting to the compute dtype happens inside the networks (Flax `dtype=` / `param_dtype=`
at each matmul, like `torch.autocast`), so float32-only parts such as a log-std stay
exact; `cast_params=True` additionally casts the whole params tree for plain functions.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from genesis_jax import amp
from genesis_jax.loss_scale import LossScale
from genesis_jax.precision import Precision

# loss_fn(params, batch) -> (float32 loss, aux pytree)
LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]


class TrainState(struct.PyTreeNode):
    """Everything one update needs and a checkpoint keeps."""

    params: Any
    opt_state: Any
    loss_scale: LossScale
    step: jax.Array  # updates attempted
    skipped: jax.Array  # updates skipped because a gradient was not finite
    rng: jax.Array
    skip_streak: jax.Array  # consecutive skipped updates up to now
    halted: jax.Array  # the divergence guard stopped training; the state is frozen
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    precision: str = struct.field(pytree_node=False, default="fp32")

    @classmethod
    def create(cls, params, tx, loss_scale, rng=None, precision: Precision | str = "fp32"):
        name = precision.name if isinstance(precision, Precision) else precision
        if isinstance(precision, Precision):
            params = precision.policy.cast_to_param(params)
        return cls(
            params=params,
            opt_state=tx.init(params),
            loss_scale=loss_scale,
            step=jnp.asarray(0, jnp.int32),
            skipped=jnp.asarray(0, jnp.int32),
            rng=jax.random.PRNGKey(0) if rng is None else rng,
            skip_streak=jnp.asarray(0, jnp.int32),
            halted=jnp.asarray(False),
            tx=tx,
            precision=name,
        )


def _keep_if(finite, new, old):
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o).astype(o.dtype), new, old)


def mixed_precision_update(
    state: TrainState,
    batch: Any,
    loss_fn: LossFn,
    *,
    max_grad_norm: float | None = 1.0,
    axis_name: str | None = None,
    compute_dtype=None,
    grad_transform: Callable[[Any, Any], Any] | None = None,
    loss_transform: Callable[[Any, Any], Any] | None = None,
    guard=None,
) -> tuple[TrainState, dict]:
    """One pure, jit-able update, built from the pieces of `genesis_jax.amp`.

    Args:
        state: the `TrainState` (params, optimizer state, loss scaler, counters).
        batch: whatever `loss_fn` takes as its second argument.
        loss_fn: `(params, batch) -> (loss, aux)`; the loss is taken in float32.
        max_grad_norm: clip the unscaled global norm to this (None: no clipping).
        axis_name: inside `pmap` / `shard_map`, the axis to average gradients over.
        compute_dtype: cast floating params to it before `loss_fn` sees them (None: don't).
        grad_transform: `(grads, state) -> grads` on the scaled gradients before the finite
            check (fault injection uses it).
        loss_transform: `(loss, state) -> loss` on the float32 loss before scaling.
        guard: a `reliability.DivergenceGuard`; instead of a skip that gives up on training
            it halts the state, which then no longer changes (the last good state).

    Returns:
        (the new state, float32 metrics: loss, grad_norm, grads_finite, loss_scale, ...).
    """

    def loss_with_hooks(params, batch):
        if compute_dtype is not None:
            params = jax.tree.map(
                lambda p: p.astype(compute_dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params
            )
        loss, aux = loss_fn(params, batch)
        loss = amp.float32_loss(loss)
        if loss_transform is not None:
            loss = loss_transform(loss, state)
        return loss, aux

    scaled_grads, (loss, aux) = amp.scaled_loss_grad(loss_with_hooks, has_aux=True)(
        state.loss_scale, state.params, batch
    )
    if axis_name is not None:
        # Averaging is linear, so the scaled gradients can be averaged before unscaling:
        # every replica then sees the same gradients and takes the same finite decision.
        scaled_grads, loss = jax.lax.pmean((scaled_grads, loss), axis_name)
    if grad_transform is not None:
        scaled_grads = grad_transform(scaled_grads, state)
    # Unscaling and clipping in one pass (torch's unscale_ then clip_grad_norm_, up to one
    # rounding); the optimizer below then needs no clipping of its own.
    grads, grad_norm, finite = amp.unscale(scaled_grads, state.loss_scale, max_grad_norm)
    # Back to the params' dtypes (float16 in fp16-full) so the optimizer state keeps its dtype.
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    streak = jnp.where(finite, 0, state.skip_streak + 1).astype(jnp.int32)
    new_scale = state.loss_scale.adjust(finite)
    active = jnp.logical_not(state.halted)
    tripped = jnp.asarray(False) if guard is None else active & guard.tripped(new_scale.loss_scale, streak)
    # A skipped (or halted) step keeps params and optimizer state bit-identical.
    take = finite & active
    updates, new_opt_state = amp.step_if_finite(state.tx, grads, state.opt_state, state.params, take)
    new_state = state.replace(
        params=optax.apply_updates(state.params, updates),
        opt_state=new_opt_state,
        loss_scale=_keep_if(active & ~tripped, new_scale, state.loss_scale),
        step=state.step + active.astype(jnp.int32),
        skipped=state.skipped + (active & ~finite).astype(jnp.int32),
        skip_streak=jnp.where(active, streak, state.skip_streak),
        halted=state.halted | tripped,
    )
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm.astype(jnp.float32),
        "loss_scale": new_state.loss_scale.loss_scale,
        "grads_finite": finite,
        "halted": new_state.halted,
        "aux": aux,
    }
    return new_state, metrics


def stats(state: TrainState) -> dict:
    """Host-side summary: training_steps, overflow_steps, overflow_rate, current_scale, precision."""
    steps = int(state.step)
    overflow = int(state.skipped)
    return {
        "training_steps": steps,
        "overflow_steps": overflow,
        "overflow_rate": overflow / steps if steps else 0.0,
        "current_scale": float(state.loss_scale.loss_scale),
        "precision": state.precision,
    }
