"""Keeping long half-precision runs honest: the divergence guard (fault injection, which
proves the skips, is `amp.testing.FaultInjection`).

`DivergenceGuard` is checked inside the update step: a skip that would push the loss scale
below `min_scale`, or more than `max_consecutive_skips` skips in a row, halts the train state
(it is then frozen): a `Session`'s loop stops with `DivergenceError`, and a loop of your own
reads it in `state.halted` or `amp.stats(...)["halted"]`.

>>> DivergenceGuard().min_scale, DivergenceGuard().max_consecutive_skips
(6.103515625e-05, 100)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from genesis_jax.amp._checks import INT32_MAX, config_number, finite_above


@dataclasses.dataclass(frozen=True)
class DivergenceGuard:
    """When to give up: a skip that would bring the scale below `min_scale`, or more than
    `max_consecutive_skips` skips in a row. `None` turns either check off.

    Give it to `TrainState.create(guard=...)` or `skip_nonfinite(guard=...)`: when it trips,
    the state halts, and every later update is skipped, so the params keep their last good values.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> guard = amp.DivergenceGuard(min_scale=None, max_consecutive_skips=1)
        >>> state = amp.TrainState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), guard=guard)
        >>> for _ in range(2):   # two non-finite steps in a row: over the limit of 1
        ...     state = state.apply_gradients(grads={"w": jnp.full(2, jnp.nan)})
        >>> int(state.skipped), bool(state.halted), state.params["w"]
        (2, True, Array([1., 1.], dtype=float32))
    """

    min_scale: float | None = 2.0**-14
    max_consecutive_skips: int | None = 100

    def __post_init__(self):  # a floor NaN or inf would halt or never halt at random; None turns either off
        if self.min_scale is not None:
            config_number("guard-min-scale", self.min_scale, ">= 0 and finite (None: no floor)", finite_above(0, True))
        if self.max_consecutive_skips is not None:
            accepted, ok = "a positive integer below 2^31 (None: no limit)", lambda x: 1 <= x <= INT32_MAX
            config_number("max-consecutive-skips", self.max_consecutive_skips, accepted, ok, integer=True)

    def tripped(self, new_scale, skip_streak) -> jax.Array:
        low = jnp.asarray(False) if self.min_scale is None else new_scale < self.min_scale
        return low | (self.max_consecutive_skips is not None and skip_streak > self.max_consecutive_skips)
