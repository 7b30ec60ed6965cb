"""The part of distrax (https://github.com/google-deepmind/distrax) that PureJaxRL's ppo.py uses:
`Categorical(logits=...)` with `sample(seed=...)`, `log_prob` and `entropy`, computed as
distrax 0.1.9 computes them (sampling: `jax.random.categorical` on the logits; log-probs from
`jax.nn.log_softmax`; entropy: -sum(p * log p) with p * log p taken as 0 where p is 0).
distrax 0.1.9 requires tfp-nightly, which this benchmark does not install for four methods;
experiments/cost_of_safety.py registers this module as `distrax` while it loads the peer."""

import jax
import jax.numpy as jnp


class Categorical:
    def __init__(self, logits):
        self.logits = logits

    def sample(self, *, seed):
        return jax.random.categorical(seed, self.logits, axis=-1)

    def log_prob(self, value):
        log_probs = jax.nn.log_softmax(self.logits, axis=-1)
        return jnp.take_along_axis(log_probs, jnp.expand_dims(value, -1).astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self):
        log_probs = jax.nn.log_softmax(self.logits, axis=-1)
        probs = jnp.exp(log_probs)
        return -jnp.sum(jnp.where(probs == 0, 0.0, probs * log_probs), axis=-1)
