"""Keeping long half-precision runs honest: the divergence guard (fault injection, which
proves the skips, is `amp.testing.FaultInjection`).

`DivergenceGuard` is checked inside the update step: a skip that would push the loss scale
below `min_scale`, or more than `max_consecutive_skips` skips in a row, halts the train state
(it is then frozen), and the host loop stops with `DivergenceError`.

>>> DivergenceGuard().min_scale, DivergenceGuard().max_consecutive_skips
(6.103515625e-05, 100)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from genesis_jax.amp._checks import INT32_MAX, finite_above, number


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
        check = functools.partial(number, type_error=ValueError)
        if self.min_scale is not None:
            check("guard-min-scale", self.min_scale, ">= 0 and finite (None: no floor)", finite_above(0, True))
        if self.max_consecutive_skips is not None:
            accepted, ok = "a positive integer below 2^31 (None: no limit)", lambda x: 1 <= x <= INT32_MAX
            check("max-consecutive-skips", self.max_consecutive_skips, accepted, ok, integer=True)

    def tripped(self, new_scale, skip_streak) -> jax.Array:
        low = jnp.asarray(False) if self.min_scale is None else new_scale < self.min_scale
        return low | (self.max_consecutive_skips is not None and skip_streak > self.max_consecutive_skips)

    def explain(self, scale: float, skip_streak: int, step: int, dynamic_scale: bool = True) -> str:
        """The sentence a user reads when the guard stops a run. The advice depends on
        `dynamic_scale`: only a dynamic loss scale can be tuned out of a skip streak; without
        one (fp32, bf16, a static scale) the gradients themselves are non-finite."""
        if self.max_consecutive_skips is not None and skip_streak > self.max_consecutive_skips:
            # strict mode (fp16-full's default) also skips a finite gradient's non-finite update
            cause = f"{skip_streak} consecutive updates were skipped as non-finite (their gradients, or in strict mode "
            cause += f"the update or new state; limit {self.max_consecutive_skips})"
        elif self.min_scale is not None:
            cause = f"the loss scale would fall below the floor {self.min_scale:g} (it is {scale:g})"
        else:  # no limit of this guard explains it: the state was halted before (a resumed, stopped run)
            cause = (
                f"the state was halted by the divergence guard before (scale {scale:g}, {skip_streak} skips in a row)"
            )
        advice = (
            "Non-finite steps halve the scale faster than clean steps can grow it back; a scale floor "
            "(--min-loss-scale 1) or a shorter --growth-interval helps, or train in bf16/fp32"
            if dynamic_scale
            else "No loss scale is being adjusted here, so the loss or its gradients are themselves non-finite: "
            "check the inputs and hyperparameters, lower the learning rate or clip gradients (--max-grad-norm)"
        )
        return f"training diverged at optimizer step {step}: {cause}. {advice}"
