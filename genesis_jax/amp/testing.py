"""Test helpers for a mixed-precision loop: seeded faults to prove that skipping works.

`FaultInjection` makes the gradients non-finite on a seeded random subset of optimizer
steps and spikes the loss on chosen steps; give it to `amp.train_step(..., faults=...)`.
Whether step k is hit depends only on (seed, k), so a resumed run injects exactly where a
straight run does.

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> from genesis_jax.amp.testing import FaultInjection
>>> loss_fn = lambda params: jnp.sum(params**2)
>>> state = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")
>>> state, metrics = amp.train_step(state, loss_fn, faults=FaultInjection(nonfinite_rate=1.0))
>>> int(state.skipped), state.params   # the poisoned step changed nothing
(1, Array([1., 1.], dtype=float32))
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from genesis_jax.amp.guard import _as_float32, _is_int, _is_real
from genesis_jax.amp.loss_scale import INT32_MAX

__all__ = ["FaultInjection"]


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
