"""A drop-in for Flax's `TrainState` that carries a loss scaler, and the one update step.

`TrainState` is `flax.training.train_state.TrainState` plus `loss_scale` and a precision
name. `create` wraps the optimizer in `skip_nonfinite` (unless it already is), so the skip
accounting lives in the optimizer state alone; `skipped`, `skip_streak` and `halted` read it.
`apply_gradients(grads=..., grads_finite=..., loss_scale=...)` takes `value_and_grad`'s
outputs as they come:

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> loss_fn = lambda params, x: jnp.mean(jnp.square(x @ params["w"]))
>>> state = amp.TrainState.create(apply_fn=None, params={"w": jnp.ones((3, 1))}, tx=optax.sgd(0.1),
...                               loss_scale=amp.DynamicLossScale())
>>> grad_fn = amp.value_and_grad(loss_fn)
>>> loss, grads, finite, scaler = grad_fn(state.loss_scale, state.params, jnp.ones((4, 3)))
>>> state = state.apply_gradients(grads=grads, grads_finite=finite, loss_scale=scaler)
>>> int(state.step), int(state.skipped), float(state.loss_scale.loss_scale)
(1, 0, 65536.0)

`train_step(state, batch, loss_fn)` is that composition (value_and_grad, then
apply_gradients) with the metrics every trainer logs: genesis-jax's algorithms all use it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct
from flax.training import train_state

from genesis_jax.amp.grads import value_and_grad
from genesis_jax.amp.guard import DivergenceGuard, FaultInjection
from genesis_jax.amp.loss_scale import LossScale, NoOpLossScale, check_scaler, make_loss_scale
from genesis_jax.amp.optim import check_max_grad_norm, is_skip_nonfinite, skip_nonfinite, skip_state
from genesis_jax.amp.policy import Precision, get_precision

# loss_fn(params, batch) -> (float32 loss, aux pytree)
LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]


def _check_create_args(
    tx, apply_fn, loss_scale, precision, max_grad_norm, guard, advance_schedule_on_skip, strict
) -> None:
    """`TrainState.create`'s arguments, each refused with a sentence naming it, before any array is made."""
    if not isinstance(tx, optax.GradientTransformation):
        raise TypeError(f"tx must be an optax GradientTransformation (such as optax.adam(1e-3)), got {tx!r}")
    if apply_fn is not None and not callable(apply_fn):
        raise TypeError(f"apply_fn must be callable or None, got {apply_fn!r}")
    if loss_scale is not None:
        check_scaler(loss_scale)
    if precision is not None and not isinstance(precision, (str, Precision)):
        raise TypeError(f"precision must be a precision name, a Precision or None, got {precision!r}")
    check_max_grad_norm(max_grad_norm)
    if guard is not None and not isinstance(guard, DivergenceGuard):
        raise TypeError(f"guard must be a DivergenceGuard or None, got {guard!r}")
    if not isinstance(advance_schedule_on_skip, bool):
        raise TypeError(f"advance_schedule_on_skip must be True or False, got {advance_schedule_on_skip!r}")
    if strict is not None and not isinstance(strict, bool):
        raise TypeError(f"strict must be True, False or None, got {strict!r}")


def _check_train_step_args(state, loss_fn, faults, grad_transform) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"state must be an amp.TrainState, got {type(state).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
    if faults is not None and not isinstance(faults, FaultInjection):
        raise TypeError(f"faults must be a FaultInjection or None, got {faults!r}")
    if grad_transform is not None and not callable(grad_transform):
        raise TypeError(f"grad_transform must be callable or None, got {grad_transform!r}")


def stores_float16(params) -> bool:
    """Whether any parameter is stored in float16 (fp16-full): where a step can overflow them."""
    return any(jnp.asarray(leaf).dtype == jnp.float16 for leaf in jax.tree.leaves(params))


def _keep_if(keep, new, old):
    return jax.tree.map(lambda n, o: jnp.where(keep, n, o).astype(o.dtype), new, old)


class TrainState(train_state.TrainState):
    """Flax's `TrainState` with a loss scaler; the optimizer is wrapped in `skip_nonfinite`.

    Fields beyond Flax's: `loss_scale` (a scaler pytree) and `precision` (its name, static:
    checkpoints record it). `step` counts updates attempted while not halted.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16")
        >>> type(state.loss_scale).__name__, state.precision, int(state.skipped), bool(state.halted)
        ('DynamicLossScale', 'fp16', 0, False)
    """

    loss_scale: LossScale = struct.field(default_factory=NoOpLossScale)
    precision: str = struct.field(pytree_node=False, default="fp32")

    @classmethod
    def create(
        cls,
        *,
        params,
        tx: optax.GradientTransformation,
        apply_fn: Callable | None = None,
        loss_scale: LossScale | None = None,
        precision: Precision | str | None = None,
        max_grad_norm: float | None = None,
        guard: DivergenceGuard | None = None,
        advance_schedule_on_skip: bool = False,
        strict: bool | None = None,
        **kwargs,
    ) -> "TrainState":
        """A new state; `tx` is wrapped in `skip_nonfinite(tx, max_grad_norm=..., guard=...,
        advance_schedule_on_skip=..., strict=...)` unless it already is one.

        Args:
            params: the parameters (cast to the precision's param dtype when one is given).
            tx: any optax optimizer.
            apply_fn: the network's apply function, as in Flax (None: not used).
            loss_scale: the scaler; None: the precision's own (`DynamicLossScale` for fp16,
                none for fp32 and bf16), or no scaling without a precision.
            precision: a precision name or `Precision`; None: parameters as given, "fp32".
            max_grad_norm: `skip_nonfinite`'s: clip the unscaled global norm (None: no clipping).
            guard: `skip_nonfinite`'s: a `DivergenceGuard` that halts the state (None: none).
            advance_schedule_on_skip: `skip_nonfinite`'s: whether a skipped step advances
                learning-rate schedules.
            strict: `skip_nonfinite`'s post-step checks (no non-finite value is ever written
                to the params or optimizer state); None: on exactly where the parameters
                are stored in float16 (fp16-full), off elsewhere.
            **kwargs: other fields, as in Flax.
        """
        _check_create_args(tx, apply_fn, loss_scale, precision, max_grad_norm, guard, advance_schedule_on_skip, strict)
        prec = get_precision(precision) if isinstance(precision, str) else precision
        if prec is not None:
            params = prec.policy.cast_to_param(params)
        if loss_scale is None:
            loss_scale = make_loss_scale(prec.loss_scaling) if prec is not None else NoOpLossScale()
        if is_skip_nonfinite(tx):
            if max_grad_norm is not None or guard is not None or advance_schedule_on_skip or strict is not None:
                raise ValueError("tx is already wrapped in skip_nonfinite: give its options there, not here")
        else:
            tx = skip_nonfinite(
                tx,
                max_grad_norm=max_grad_norm,
                guard=guard,
                advance_schedule_on_skip=advance_schedule_on_skip,
                strict=stores_float16(params) if strict is None else strict,
            )
        return cls(
            step=jnp.asarray(0, jnp.int32),
            apply_fn=apply_fn,
            params=params,
            tx=tx,
            opt_state=tx.init(params),
            loss_scale=loss_scale,
            precision=prec.name if prec is not None else "fp32",
            **kwargs,
        )

    def apply_gradients(
        self, *, grads, grads_finite=None, grad_norm=None, loss_scale: LossScale | None = None, **kwargs
    ):
        """One optimizer step from unscaled gradients; a non-finite one changes nothing but
        the skip counts (and the scaler, which the caller adjusted).

        Args:
            grads: unscaled gradients (cast to the params' dtypes: float16 in fp16-full).
            grads_finite: the finite decision from `value_and_grad` (None: from the norm).
            grad_norm: the unscaled global norm it was taken on, for clipping (None: computed).
            loss_scale: the scaler adjusted for this step (None: keep the current one). A
                halted state keeps its scaler, whatever is passed.
            **kwargs: other fields to replace, as in Flax.
        """
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, self.params)
        new_scale = self.loss_scale if loss_scale is None else loss_scale
        was_halted = self.halted
        updates, opt_state = self.tx.update(
            grads,
            self.opt_state,
            self.params,
            grads_finite=grads_finite,
            grad_norm=grad_norm,
            loss_scale=new_scale.loss_scale,
        )
        halted = skip_state(opt_state).halted
        return self.replace(
            step=self.step + (~was_halted).astype(jnp.int32),
            params=optax.apply_updates(self.params, updates),
            opt_state=opt_state,
            # A scaler that did not change (NoOpLossScale, StaticLossScale) needs no select.
            loss_scale=self.loss_scale
            if new_scale is self.loss_scale
            else _keep_if(~halted, new_scale, self.loss_scale),
            **kwargs,
        )

    @property
    def skipped(self) -> jax.Array:
        """Updates skipped because a gradient was not finite."""
        return skip_state(self.opt_state).skipped

    @property
    def skip_streak(self) -> jax.Array:
        """Skipped updates in a row, up to now."""
        return skip_state(self.opt_state).consecutive_skips

    @property
    def halted(self) -> jax.Array:
        """The divergence guard stopped training; the state no longer changes."""
        return skip_state(self.opt_state).halted


def train_step(
    state: TrainState,
    batch: Any,
    loss_fn: LossFn,
    *,
    axis_name: str | None = None,
    faults: FaultInjection | None = None,
    grad_transform: Callable[[Any, TrainState], Any] | None = None,
) -> tuple[TrainState, dict]:
    """`value_and_grad` then `apply_gradients`: one pure, jit-able update.

    Args:
        state: a `TrainState`.
        batch: `loss_fn`'s second argument.
        loss_fn: `(params, batch) -> (loss, aux)`; the loss is taken in float32.
        axis_name: inside `pmap` / `shard_map`, the axis to average gradients over.
        faults: a `FaultInjection`: its loss spikes and non-finite gradients, by `state.step`.
        grad_transform: `(scaled_grads, state) -> scaled_grads` before the finite decision.

    Returns:
        (the new state, metrics: loss, grad_norm (unscaled, before clipping), grads_finite,
        loss_scale, halted, aux).

    Examples:
        >>> import functools, jax, jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> def loss_fn(params, batch):
        ...     x, y = batch
        ...     return jnp.mean((x @ params["w"] - y) ** 2), {}
        >>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
        >>> step = jax.jit(functools.partial(amp.train_step, loss_fn=loss_fn))
        >>> state, metrics = step(state, (jnp.ones((4, 3)), jnp.zeros(4)))
        >>> float(metrics["loss"]), bool(metrics["grads_finite"]), int(state.step)
        (9.0, True, 1)
    """

    _check_train_step_args(state, loss_fn, faults, grad_transform)

    def loss_with_faults(params, batch):
        loss, aux = loss_fn(params, batch)
        if faults is not None and faults.loss_spike_steps:
            loss = faults.spike_loss(jnp.asarray(loss, jnp.float32), state.step)
        return loss, aux

    def transform(grads):
        if faults is not None and faults.nonfinite_rate > 0:
            grads = faults.poison_grads(grads, state.step)
        return grads if grad_transform is None else grad_transform(grads, state)

    hooked = faults is not None or grad_transform is not None
    grad_fn = value_and_grad(
        loss_with_faults, has_aux=True, axis_name=axis_name, grad_transform=transform if hooked else None
    )
    ((loss, aux), grads, finite, scaler), grad_norm = grad_fn.with_norm(state.loss_scale, state.params, batch)
    new_state = state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=grad_norm, loss_scale=scaler)
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
    """Host-side summary: training_steps, overflow_steps, overflow_rate, current_scale, precision.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> amp.stats(amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16"))
        {'training_steps': 0, 'overflow_steps': 0, 'overflow_rate': 0.0, 'current_scale': 65536.0, 'precision': 'fp16'}
    """
    steps = int(state.step)
    overflow = int(state.skipped)
    return {
        "training_steps": steps,
        "overflow_steps": overflow,
        "overflow_rate": overflow / steps if steps else 0.0,
        "current_scale": float(state.loss_scale.loss_scale),
        "precision": state.precision,
    }
