"""Keeping long half-precision runs honest: fault injection, the divergence guard and
clean stops on SIGINT / SIGTERM.

- `FaultInjection` makes the gradients non-finite on a seeded random subset of optimizer
  steps and multiplies the loss by a large factor on chosen steps. Whether step k is hit
  depends only on (seed, k), so a resumed run injects exactly where a straight run does.
- `DivergenceGuard` is checked inside the update step: a skip that would push the loss
  scale below `min_scale`, or more than `max_consecutive_skips` skips in a row, halts the
  train state (it is then frozen), and the host loop stops with `DivergenceError`.
- `StopSignals` turns SIGINT / SIGTERM into a flag the host loop reads between chunks,
  so it can save a final checkpoint and exit cleanly.

>>> faults = FaultInjection(nonfinite_rate=0.05, seed=0)
>>> int(faults.count_nonfinite(1000))  # doctest: +SKIP
47
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp

from genesis_jax.loss_scale import DynamicLossScale

DEFAULT_GUARD_MIN_SCALE = 2.0**-14
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100


class DivergenceError(RuntimeError):
    """Training stopped by the divergence guard; metrics and a checkpoint of the last good
    state were written first. `summary` is the run's summary at the stop."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a final checkpoint was saved. `signum` names the signal."""

    def __init__(self, message: str, signum: int, summary: dict | None = None):
        super().__init__(message)
        self.signum = signum
        self.summary = summary


@dataclasses.dataclass(frozen=True)
class FaultInjection:
    """Seeded faults for tests and for tuning a scaler; pure functions of the step count."""

    nonfinite_rate: float = 0.0
    loss_spike_steps: tuple[int, ...] = ()
    loss_spike_factor: float = 1e6
    seed: int = 0

    def __post_init__(self):
        if not 0.0 <= self.nonfinite_rate <= 1.0:
            raise ValueError(f"inject-nonfinite must be a rate in [0, 1], got {self.nonfinite_rate!r}")
        if any((not isinstance(s, int)) or s < 0 for s in self.loss_spike_steps):
            raise ValueError(f"inject-loss-spike steps must be integers >= 0, got {self.loss_spike_steps!r}")
        if not (math.isfinite(self.loss_spike_factor) and self.loss_spike_factor > 0):
            raise ValueError(f"loss-spike factor must be finite and > 0, got {self.loss_spike_factor!r}")

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

    def grad_transform(self, grads, state):
        """Adds inf to one gradient leaf on the chosen steps: the global norm becomes inf."""
        poison = jnp.where(self.is_nonfinite_step(state.step), jnp.inf, 0.0)
        leaves, treedef = jax.tree.flatten(grads)
        leaves[0] = leaves[0] + poison.astype(leaves[0].dtype)
        return jax.tree.unflatten(treedef, leaves)

    def loss_transform(self, loss, state):
        spike = jnp.isin(state.step, jnp.asarray(self.loss_spike_steps, jnp.int32))
        return loss * jnp.where(spike, jnp.float32(self.loss_spike_factor), jnp.float32(1.0))


@dataclasses.dataclass(frozen=True)
class DivergenceGuard:
    """When to give up: a skip that would bring the scale below `min_scale`, or more than
    `max_consecutive_skips` skips in a row. `None` turns either check off."""

    min_scale: float | None = DEFAULT_GUARD_MIN_SCALE
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS

    def __post_init__(self):
        if self.min_scale is not None and not self.min_scale >= 0:
            raise ValueError(f"guard-min-scale must be >= 0, got {self.min_scale!r}")
        if self.max_consecutive_skips is not None and (
            not isinstance(self.max_consecutive_skips, int) or self.max_consecutive_skips < 1
        ):
            raise ValueError(f"max-consecutive-skips must be a positive integer, got {self.max_consecutive_skips!r}")

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
            cause = f"{skip_streak} consecutive updates had non-finite gradients (limit {self.max_consecutive_skips})"
        else:
            cause = f"the loss scale would fall below the floor {self.min_scale:g} (it is {scale:g})"
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


def combine_grad_transforms(*transforms: Callable | None) -> Callable | None:
    """One grad_transform(grads, state) applying each given one in order."""
    chosen = [t for t in transforms if t is not None]
    if not chosen:
        return None

    def apply(grads, state):
        for t in chosen:
            grads = t(grads, state)
        return grads

    return apply


def update_options(config, seed: int, grad_transform: Callable | None = None) -> dict[str, Any]:
    """Keyword arguments for `mixed_precision_update` from a `MixedPrecisionConfig`:
    clipping, the guard and the fault hooks (the user's `grad_transform` runs last)."""
    faults = config.fault_injection(seed)
    return {
        "max_grad_norm": config.max_grad_norm,
        "guard": config.divergence_guard(),
        "grad_transform": combine_grad_transforms(
            faults.grad_transform if faults.nonfinite_rate > 0 else None, grad_transform
        ),
        "loss_transform": faults.loss_transform if faults.loss_spike_steps else None,
    }


def halted_report(train_state, guard: DivergenceGuard) -> str | None:
    """The guard's message if any (of possibly vmapped) train states halted, else None."""
    halted = jnp.atleast_1d(train_state.halted)
    if not bool(jnp.any(halted)):
        return None
    i = int(jnp.argmax(halted))
    pick = lambda x: float(jnp.atleast_1d(x)[i])  # noqa: E731
    dynamic = isinstance(train_state.loss_scale, DynamicLossScale)
    return guard.explain(
        pick(train_state.loss_scale.loss_scale),
        int(pick(train_state.skip_streak)),
        int(pick(train_state.step)),
        dynamic,
    )


class StopSignals:
    """Context manager: SIGINT and SIGTERM set `received` (the signal number) instead of
    killing the process; the loop checks it between chunks. Outside the main thread, where
    Python cannot install handlers, it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
