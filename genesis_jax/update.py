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


def unscale_and_clip(scaled_grads, inv_scale, max_norm: float | None):
    """(unscaled, clipped float32 grads, unscaled global norm) in one pass over the grads.

    Same as unscaling then `torch.nn.utils.clip_grad_norm_` (coefficient
    max_norm / (norm + 1e-6), at most 1), up to one rounding: each gradient is multiplied
    once, by coefficient x 1/scale, instead of twice.
    """
    grads = jax.tree.map(lambda g: g.astype(jnp.promote_types(g.dtype, jnp.float32)), scaled_grads)
    norm = optax.tree.norm(grads) * inv_scale
    factor = inv_scale if max_norm is None else inv_scale * jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * factor, grads), norm


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
    """One pure, jit-able update. Returns the new state and float32 metrics.

    `compute_dtype` (optional) casts floating params to it before `loss_fn` sees them.
    `grad_transform(grads, state)` / `loss_transform(loss, state)` (optional) edit the
    (scaled) gradients before the finite check / the float32 loss before scaling; fault
    injection uses them. `guard` (a `reliability.DivergenceGuard`, optional) halts the
    state instead of taking a skip that gives up on training: a halted state no longer
    changes, so it stays the last good state.
    """

    def scaled_loss(params):
        if compute_dtype is not None:
            params = jax.tree.map(
                lambda p: p.astype(compute_dtype) if jnp.issubdtype(p.dtype, jnp.floating) else p, params
            )
        loss, aux = loss_fn(params, batch)
        loss = loss.astype(jnp.float32)
        if loss_transform is not None:
            loss = loss_transform(loss, state)
        return state.loss_scale.scale(loss), (loss, aux)

    scaled_grads, (loss, aux) = jax.grad(scaled_loss, has_aux=True)(state.params)
    if axis_name is not None:
        # Averaging is linear, so the scaled gradients can be averaged before unscaling:
        # every replica then sees the same gradients and takes the same finite decision.
        scaled_grads = jax.lax.pmean(scaled_grads, axis_name)
        loss = jax.lax.pmean(loss, axis_name)
    if grad_transform is not None:
        scaled_grads = grad_transform(scaled_grads, state)
    grads, grad_norm = unscale_and_clip(scaled_grads, jnp.reciprocal(state.loss_scale.loss_scale), max_grad_norm)
    # An inf or NaN anywhere makes the global norm inf or NaN, so one scalar decides for all
    # gradients. (Unlike PyTorch, finite gradients whose unscaled norm overflows float32,
    # |g| > 1e19, also count as non-finite: torch would clip them to zero and step.)
    finite = jnp.isfinite(grad_norm)
    # Back to the params' dtypes (float16 in fp16-full) so the optimizer state keeps its dtype.
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    def optimizer_step():
        updates, new_opt_state = state.tx.update(grads, state.opt_state, state.params)
        return optax.apply_updates(state.params, updates), new_opt_state

    streak = jnp.where(finite, 0, state.skip_streak + 1).astype(jnp.int32)
    new_scale = state.loss_scale.adjust(finite)
    active = jnp.logical_not(state.halted)
    tripped = jnp.asarray(False) if guard is None else active & guard.tripped(new_scale.loss_scale, streak)
    # A skipped (or halted) step returns the old params and optimizer state untouched, so they
    # stay bit-identical. (`lax.cond` rather than a select of new and old: with a select, XLA
    # recomputes Adam's moments inside the params update and copies every moment buffer on
    # each step, 24 copies per PPO minibatch step on CPU. Under vmap it becomes a select.)
    take = finite & active
    new_params, new_opt_state = jax.lax.cond(take, optimizer_step, lambda: (state.params, state.opt_state))
    new_state = state.replace(
        params=new_params,
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
