"""Keeping long half-precision runs honest: fault injection and the divergence guard.

- `FaultInjection` makes the gradients non-finite on a seeded random subset of optimizer
  steps and multiplies the loss by a large factor on chosen steps. Whether step k is hit
  depends only on (seed, k), so a resumed run injects exactly where a straight run does.
- `DivergenceGuard` is checked inside the update step: a skip that would push the loss
  scale below `min_scale`, or more than `max_consecutive_skips` skips in a row, halts the
  train state (it is then frozen), and the host loop stops with `DivergenceError`.

>>> faults = FaultInjection(nonfinite_rate=0.05, seed=0)
>>> int(faults.count_nonfinite(1000))  # doctest: +SKIP
47
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.loss_scale import INT32_MAX

DEFAULT_GUARD_MIN_SCALE = 2.0**-14
"""`DivergenceGuard`'s default scale floor, 2^-14: a skip that takes the scale below it halts."""
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100
"""`DivergenceGuard`'s default limit of skipped updates in a row."""


@dataclasses.dataclass(frozen=True)
class FaultInjection:
    """Seeded faults for tests and for tuning a scaler; pure functions of the step count.

    `nonfinite_rate`: the fraction of optimizer steps whose gradients `poison_grads` makes
    infinite (chosen by `seed` and the step). `loss_spike_steps`: the steps whose loss
    `spike_loss` multiplies by `loss_spike_factor`. `amp.train_step(..., faults=...)` (`amp.testing.FaultInjection`)
    applies both.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> faults = amp.testing.FaultInjection(nonfinite_rate=1.0, loss_spike_steps=(3,), loss_spike_factor=100.0)
        >>> faults.poison_grads({"w": jnp.ones(2)}, step=0)
        {'w': Array([inf, inf], dtype=float32)}
        >>> float(faults.spike_loss(jnp.float32(2.0), step=3)), float(faults.spike_loss(jnp.float32(2.0), step=2))
        (200.0, 2.0)
    """

    nonfinite_rate: float = 0.0
    loss_spike_steps: tuple[int, ...] = ()
    loss_spike_factor: float = 1e6
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "loss_spike_steps", _checked_spike_steps(self.loss_spike_steps))
        _check_fault_args(self.nonfinite_rate, self.loss_spike_factor, self.seed)

    @property
    def active(self) -> bool:
        return self.nonfinite_rate > 0 or bool(self.loss_spike_steps)

    def is_nonfinite_step(self, step) -> jax.Array:
        """Whether optimizer step `step` (0-based) gets non-finite gradients."""
        if self.nonfinite_rate <= 0:
            return jnp.zeros(jnp.shape(step), bool)
        key = jax.random.fold_in(jax.random.PRNGKey(self.seed), step)
        return jax.random.bernoulli(key, self.nonfinite_rate)

    def count_nonfinite(self, num_steps: int) -> int:
        """How many of the first `num_steps` steps were (or will be) made non-finite."""
        if num_steps <= 0 or self.nonfinite_rate <= 0:
            return 0
        return int(jnp.sum(jax.vmap(self.is_nonfinite_step)(jnp.arange(num_steps))))

    def poison_grads(self, grads, step):
        """Adds inf to one gradient leaf on the chosen steps: the global norm becomes inf."""
        poison = jnp.where(self.is_nonfinite_step(step), jnp.inf, 0.0)
        leaves, treedef = jax.tree.flatten(grads)
        leaves[0] = leaves[0] + poison.astype(leaves[0].dtype)
        return jax.tree.unflatten(treedef, leaves)

    def spike_loss(self, loss, step):
        """The loss multiplied by `loss_spike_factor` on the chosen steps."""
        spike = jnp.isin(step, jnp.asarray(self.loss_spike_steps, jnp.int32))
        return loss * jnp.where(spike, jnp.float32(self.loss_spike_factor), jnp.float32(1.0))


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

    min_scale: float | None = DEFAULT_GUARD_MIN_SCALE
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS

    def __post_init__(self):
        _check_guard_args(self.min_scale, self.max_consecutive_skips)

    def tripped(self, new_scale, skip_streak) -> jax.Array:
        out = jnp.asarray(False)
        if self.min_scale is not None:
            out = out | (new_scale < self.min_scale)
        if self.max_consecutive_skips is not None:
            out = out | (skip_streak > self.max_consecutive_skips)
        return out

    def explain(self, scale: float, skip_streak: int, step: int, dynamic_scale: bool = True) -> str:
        """The sentence a user reads when the guard stops a run. The advice depends on
        `dynamic_scale`: only a dynamic loss scale can be tuned out of a skip streak; without
        one (fp32, bf16, a static scale) the gradients themselves are non-finite."""
        if self.max_consecutive_skips is not None and skip_streak > self.max_consecutive_skips:
            cause = (  # strict mode (fp16-full's default) also skips a finite gradient's non-finite update
                f"{skip_streak} consecutive updates were skipped as non-finite (their gradients, or in strict mode "
                f"the update or new state; limit {self.max_consecutive_skips})"
            )
        elif self.min_scale is not None:
            cause = f"the loss scale would fall below the floor {self.min_scale:g} (it is {scale:g})"
        else:  # no limit of this guard explains it: the state was halted before (a resumed, stopped run)
            cause = (
                f"the state was halted by the divergence guard before (scale {scale:g}, {skip_streak} skips in a row)"
            )
        if dynamic_scale:
            advice = (
                "Non-finite steps halve the scale faster than clean steps can grow it back; a scale floor "
                "(--min-loss-scale 1) or a shorter --growth-interval helps, or train in bf16/fp32"
            )
        else:
            advice = (
                "No loss scale is being adjusted here, so the loss or its gradients are themselves non-finite: "
                "check the inputs and hyperparameters, lower the learning rate or clip gradients (--max-grad-norm)"
            )
        return f"training diverged at optimizer step {step}: {cause}. {advice}"


def _is_int(value) -> bool:
    """A Python, numpy or 0-d array integer (not a bool)."""
    if isinstance(value, (np.ndarray, jax.Array)) and value.shape == ():
        return np.issubdtype(value.dtype, np.integer)
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _as_float32(value) -> float:
    """The float32 a number is used as (inf where it overflows, 0 where it underflows)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


def _check_fault_args(nonfinite_rate, loss_spike_factor, seed) -> None:
    """The rate must be a probability, the factor a finite float32 > 0 (an inf or NaN factor
    would make the spiked loss itself non-finite), the seed an integer a PRNG key takes."""
    if not (_is_real(nonfinite_rate) and 0.0 <= nonfinite_rate <= 1.0):
        raise ValueError(f"inject-nonfinite must be a rate in [0, 1], got {nonfinite_rate!r}")
    if not (_is_real(loss_spike_factor) and 0 < _as_float32(loss_spike_factor) < math.inf):
        raise ValueError(f"loss-spike factor must be finite and > 0 (as a float32), got {loss_spike_factor!r}")
    if isinstance(seed, jax.core.Tracer):  # seed + axis index under the seeds' vmap: not checkable, nor needed
        return
    if not (_is_int(seed) and -(2**63) <= int(seed) < 2**63):
        raise ValueError(f"the fault injection's seed must be an integer (int64), got {seed!r}")


def _checked_spike_steps(steps) -> tuple[int, ...]:
    """The loss-spike steps as a tuple of ints, each an optimizer step from 0 to 2^31-1."""
    if isinstance(steps, (str, bytes)) or not hasattr(steps, "__iter__"):
        raise ValueError(f"inject-loss-spike steps must be integers >= 0 (a sequence), got {steps!r}")
    steps = tuple(steps)
    if not all(_is_int(s) and 0 <= s <= INT32_MAX for s in steps):
        raise ValueError(f"inject-loss-spike steps must be integers >= 0 (and < 2^31), got {steps!r}")
    return tuple(int(s) for s in steps)


def _check_guard_args(min_scale, max_consecutive_skips) -> None:
    """The floor must be a finite float32 >= 0 (NaN or inf would halt or never halt at
    random), the skip limit an int32 >= 1; None turns either off."""
    if min_scale is not None and not (_is_real(min_scale) and 0 <= _as_float32(min_scale) < math.inf):
        raise ValueError(f"guard-min-scale must be >= 0 and finite (None: no floor), got {min_scale!r}")
    if max_consecutive_skips is not None and not (
        _is_int(max_consecutive_skips) and 1 <= max_consecutive_skips <= INT32_MAX
    ):
        raise ValueError(
            "max-consecutive-skips must be a positive integer below 2^31 (None: no limit), "
            f"got {max_consecutive_skips!r}"
        )
