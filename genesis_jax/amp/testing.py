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

import jax
import jax.numpy as jnp

from genesis_jax.amp._checks import INT32_MAX, config_number, finite_above, refuse_unless

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
        """The rate must be a probability, the factor a finite float32 > 0 (an inf or NaN factor
        would make the spiked loss itself non-finite), the seed an integer a PRNG key takes
        (unchecked where traced: seed + axis index under the seeds' vmap), each spike step an
        optimizer step from 0 to 2^31-1."""
        steps, accepted = self.loss_spike_steps, "integers >= 0 (and < 2^31, a sequence)"
        iterable = not isinstance(steps, (str, bytes)) and hasattr(steps, "__iter__")
        refuse_unless(iterable, "inject-loss-spike steps", steps, accepted, ValueError)
        in_int32 = lambda x: 0 <= x <= INT32_MAX
        steps = tuple(config_number("inject-loss-spike steps", s, accepted, in_int32, integer=True) for s in steps)
        object.__setattr__(self, "loss_spike_steps", steps)
        rate = self.nonfinite_rate  # used as it is, not as a float32
        config_number("inject-nonfinite", rate, "a rate in [0, 1]", lambda _: 0 <= rate <= 1)
        config_number("loss-spike factor", self.loss_spike_factor, "finite and > 0 (as a float32)", finite_above(0))
        int64 = lambda x: -(2**63) <= x < 2**63
        config_number("the fault injection's seed", self.seed, "an integer (int64)", int64, integer=True)

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
