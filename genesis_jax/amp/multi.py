"""Several optimizers under one loss scaler, as PyTorch shares one `GradScaler` among them.

One iteration in PyTorch is `scaler.scale(loss).backward()` for each loss, `scaler.step(opt)`
for each optimizer (skipped when that optimizer's own gradients are not finite) and one
`scaler.update()`, which backs off once if any optimizer saw an inf or NaN and grows only
after `growth_interval` iterations clean for all of them. Here each optimizer has its own
`TrainState` (its skip counts are its own `skipped`), and the scaler is a value passed to each:

- `shared_scale_step(state, batch, loss_fn, loss_scale)`: `scaler.step(opt)`; the loss is
  scaled by the iteration's `loss_scale`, which is not adjusted;
- `update_shared_scale(loss_scale, [finite, ...])`: `scaler.update()`, once per iteration;
- `share_scale(states, loss_scale)`: writes the scaler into every state, so a checkpoint or
  `amp.stats` reads it from any of them.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> def loss_fn(params, batch):   # a float32 loss; batch = (x, a factor: inf forces an overflow)
...     x, factor = batch
...     return factor * jnp.mean(jnp.square(x @ params["w"])), {}
>>> actor = amp.TrainState.create(params={"w": jnp.ones((3, 1))}, tx=optax.sgd(0.1))
>>> critic = amp.TrainState.create(params={"w": jnp.ones((3, 1))}, tx=optax.adam(1e-3))
>>> scaler, x = amp.DynamicLossScale(init_scale=2.0**8, growth_interval=2), jnp.ones((4, 3))
>>> actor, a = amp.shared_scale_step(actor, (x, 1.0), loss_fn, scaler)
>>> critic, c = amp.shared_scale_step(critic, (x, jnp.inf), loss_fn, scaler)   # the critic overflows
>>> scaler = amp.update_shared_scale(scaler, [a["grads_finite"], c["grads_finite"]])
>>> actor, critic = amp.share_scale((actor, critic), scaler)
>>> int(actor.skipped), int(critic.skipped), float(critic.loss_scale.loss_scale)
(0, 1, 128.0)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.guard import FaultInjection
from genesis_jax.amp.loss_scale import DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale, is_bool_flag
from genesis_jax.amp.state import LossFn, TrainState, train_step

_SCALER_CLASSES = (DynamicLossScale, StaticLossScale, NoOpLossScale)


def _check_loss_scale(loss_scale) -> None:
    if not isinstance(loss_scale, _SCALER_CLASSES):
        raise TypeError(
            f"loss_scale must be an amp.DynamicLossScale, StaticLossScale or NoOpLossScale, got {loss_scale!r}"
        )


def _is_train_state(node) -> bool:
    return isinstance(node, TrainState)


def shared_scale_step(
    state: TrainState,
    batch: Any,
    loss_fn: LossFn,
    loss_scale: LossScale,
    *,
    axis_name: str | None = None,
    faults: FaultInjection | None = None,
    grad_transform: Callable[[Any, TrainState], Any] | None = None,
) -> tuple[TrainState, dict]:
    """One optimizer's step under the iteration's shared scaler: torch's
    `scaler.scale(loss).backward(); scaler.step(opt)`.

    As `train_step`, but the loss is scaled by `loss_scale`, not by the state's own scaler, and
    no scaler is adjusted: the state's `loss_scale` field comes back as it was. A step whose own
    gradients are not finite is skipped (params and optimizer state bit-identical, `skipped`
    counts it), whatever the other optimizers saw. A `DivergenceGuard` in the state sees the
    scale its own decision gives, `loss_scale.adjust(grads_finite)`: on its own skips that is
    the next scale exactly, since `update_shared_scale` then backs off too.

    Args:
        state: this optimizer's `TrainState`.
        batch: `loss_fn`'s second argument.
        loss_fn: `(params, batch) -> (loss, aux)`; the loss is taken in float32.
        loss_scale: the iteration's scaler, the same for every optimizer of the iteration.
        axis_name: inside `pmap` / `shard_map`, the axis to average gradients over.
        faults: a `FaultInjection`, applied by this state's `step` as `train_step` does.
        grad_transform: `(scaled_grads, state) -> scaled_grads` before the finite decision
            (`state` carries `loss_scale` in its scaler field there).

    Returns:
        (the new state, metrics: loss, grad_norm, grads_finite, loss_scale (the scale this
        step used), halted, aux). Collect every optimizer's `grads_finite` for
        `update_shared_scale`.

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> loss_fn = lambda params, x: (jnp.mean(jnp.square(x @ params["w"])), {})
        >>> state = amp.TrainState.create(params={"w": jnp.ones((3, 1))}, tx=optax.sgd(0.1))
        >>> scaler = amp.DynamicLossScale(init_scale=2.0**8)
        >>> state, metrics = jax.jit(amp.shared_scale_step, static_argnums=2)(state, jnp.ones((4, 3)), loss_fn, scaler)
        >>> bool(metrics["grads_finite"]), float(metrics["loss_scale"]), int(state.step), int(state.skipped)
        (True, 256.0, 1, 0)
        >>> type(state.loss_scale).__name__   # its own field, untouched (no scaling by default)
        'NoOpLossScale'
    """
    if not _is_train_state(state):
        raise TypeError(f"state must be an amp.TrainState, got {type(state).__name__}")
    _check_loss_scale(loss_scale)
    stepped, metrics = train_step(
        state.replace(loss_scale=loss_scale),
        batch,
        loss_fn,
        axis_name=axis_name,
        faults=faults,
        grad_transform=grad_transform,
    )
    # train_step adjusted the scaler by this optimizer's decision alone; the iteration's
    # adjustment waits for every optimizer's (update_shared_scale).
    metrics = {**metrics, "loss_scale": loss_scale.loss_scale}
    return stepped.replace(loss_scale=state.loss_scale), metrics


def update_shared_scale(loss_scale: LossScale, grads_finite: Sequence[jax.Array]) -> LossScale:
    """The scaler for the next iteration: torch's one `scaler.update()` after every
    `scaler.step(opt)`, i.e. `loss_scale.adjust(all(grads_finite))`. It backs off once when
    any optimizer saw a non-finite gradient (however many did), and its growth count advances
    only on iterations clean for all of them.

    Args:
        loss_scale: the iteration's scaler, the one each `shared_scale_step` used.
        grads_finite: every optimizer's finite decision (`metrics["grads_finite"]`), scalar
            bools, in a list, tuple or any pytree.

    Raises:
        ValueError: no decision, or one that is not a scalar bool.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> scaler = amp.DynamicLossScale(init_scale=8.0, growth_interval=2)
        >>> both_bad = amp.update_shared_scale(scaler, [jnp.array(False), jnp.array(False)])
        >>> float(both_bad.loss_scale)   # one backoff, not two
        4.0
        >>> clean = amp.update_shared_scale(scaler, [jnp.array(True), jnp.array(True)])
        >>> float(clean.loss_scale), int(clean.growth_tracker)
        (8.0, 1)
    """
    _check_loss_scale(loss_scale)
    if isinstance(grads_finite, Iterator):  # a generator is no pytree: take its flags once
        grads_finite = list(grads_finite)
    flags = jax.tree.leaves(grads_finite)
    if not flags:
        raise ValueError(f"grads_finite must hold each optimizer's finite decision, got none: {grads_finite!r}")
    for flag in flags:
        if not is_bool_flag(flag) or np.shape(flag) != ():
            raise ValueError(
                "grads_finite must hold scalar bools (each shared_scale_step's metrics['grads_finite']), "
                f"got {type(flag).__name__} of shape {np.shape(flag)} and dtype {getattr(flag, 'dtype', None)}"
            )
    return loss_scale.adjust(jnp.all(jnp.stack([jnp.asarray(flag) for flag in flags])))


def share_scale(states, loss_scale: LossScale):
    """`states` with every `TrainState` in it carrying `loss_scale`: call it after
    `update_shared_scale`, so that at iteration boundaries each optimizer's state holds the
    shared scaler (a checkpoint of any of them, or `amp.stats`, then reads it).

    Args:
        states: a `TrainState`, or a dict, tuple, list or other pytree holding them; other
            leaves are returned as they are.
        loss_scale: the shared scaler.

    Raises:
        ValueError: `states` holds no `TrainState`.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> states = {name: amp.TrainState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), precision="fp16")
        ...           for name in ("actor", "critic")}
        >>> states = amp.share_scale(states, amp.DynamicLossScale(init_scale=1024.0))
        >>> [float(s.loss_scale.loss_scale) for s in states.values()]
        [1024.0, 1024.0]
    """
    _check_loss_scale(loss_scale)
    nodes = jax.tree.leaves(states, is_leaf=_is_train_state)
    if not any(_is_train_state(node) for node in nodes):
        raise ValueError(f"states must hold at least one amp.TrainState, got {type(states).__name__}")
    return jax.tree.map(
        lambda node: node.replace(loss_scale=loss_scale) if _is_train_state(node) else node,
        states,
        is_leaf=_is_train_state,
    )
