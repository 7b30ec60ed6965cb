"""Deprecated (0.3): 0.2's three names for several optimizers under one scaler.

`TrainState.create(..., shared_scaler=True)` and one `update_scaler(*states)` per iteration
replace `shared_scale_step`, `update_shared_scale` and `share_scale`; each still works here,
with a DeprecationWarning, until 0.4.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.guard import FaultInjection
from genesis_jax.amp.loss_scale import LossScale, check_scaler, is_bool_flag
from genesis_jax.amp.state import LossFn, TrainState, deprecated, train_step


def _check_loss_scale(loss_scale) -> None:
    check_scaler(loss_scale, "loss_scale")


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

    """
    deprecated("amp.shared_scale_step", "TrainState.create(..., shared_scaler=True) and amp.train_step")
    if not _is_train_state(state):
        raise TypeError(f"state must be an amp.TrainState, got {type(state).__name__}")
    _check_loss_scale(loss_scale)
    stepped, metrics = train_step(
        state.replace(scaler=loss_scale),
        loss_fn,
        batch,
        has_aux=True,
        axis_name=axis_name,
        faults=faults,
        grad_transform=grad_transform,
    )
    # train_step adjusted the scaler by this optimizer's decision alone; the iteration's
    # adjustment waits for every optimizer's (update_shared_scale).
    metrics = {**metrics, "loss_scale": loss_scale.loss_scale}
    return stepped.replace(scaler=state.scaler), metrics


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

    """
    deprecated("amp.update_shared_scale", "amp.update_scaler(*states)")
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

    """
    deprecated("amp.share_scale", "amp.update_scaler(*states)")
    _check_loss_scale(loss_scale)
    nodes = jax.tree.leaves(states, is_leaf=_is_train_state)
    if not any(_is_train_state(node) for node in nodes):
        raise ValueError(f"states must hold at least one amp.TrainState, got {type(states).__name__}")
    return jax.tree.map(
        lambda node: node.replace(scaler=loss_scale) if _is_train_state(node) else node,
        states,
        is_leaf=_is_train_state,
    )
