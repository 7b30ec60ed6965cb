"""Test helpers for a mixed-precision loop: seeded faults to prove that skipping works.

`FaultInjection` makes the gradients non-finite on a seeded random subset of optimizer
steps and spikes the loss on chosen steps; give it to `amp.train_step(..., faults=...)`.

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> from genesis_jax.amp.testing import FaultInjection
>>> loss_fn = lambda params: jnp.sum(params**2)
>>> state = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")
>>> state, metrics = amp.train_step(state, loss_fn, faults=FaultInjection(nonfinite_rate=1.0))
>>> int(state.skipped), state.params   # the poisoned step changed nothing
(1, Array([1., 1.], dtype=float32))
"""

from genesis_jax.amp.guard import FaultInjection

__all__ = ["FaultInjection"]
