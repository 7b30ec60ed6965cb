"""Actor-critic for discrete (categorical) and continuous (diagonal Gaussian) actions."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import ACTIVATIONS


class ActorCritic(nn.Module):
    """Separate actor and critic towers (PureJaxRL / CleanRL layout, orthogonal init).

    `__call__` returns `(pi_params, value)`: for discrete actions `pi_params` is `(logits,)`,
    for continuous ones `(mean, log_std)` with a state-independent float32 log-std. The
    `policy` and `value` methods run one tower only. The matmuls run in `dtype`; biases,
    activations and every output are float32 (see `nets.dense.Dense`).
    """

    action_dim: int
    continuous: bool = False
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def _tower(self, name: str, out_features: int, head_scale: float):
        def dense(width, scale, layer_name):
            return Dense(
                width,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=nn.initializers.orthogonal(scale),
                bias_init=nn.initializers.zeros,
                name=layer_name,
            )

        hidden = [dense(w, np.sqrt(2), f"{name}_{i}") for i, w in enumerate(self.hidden)]
        return hidden, dense(out_features, head_scale, f"{name}_head")

    def setup(self):
        self.critic_layers, self.critic_head = self._tower("critic", 1, 1.0)
        self.actor_layers, self.actor_head = self._tower("actor", self.action_dim, 0.01)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)

    def _run(self, layers, head, obs):
        act = ACTIVATIONS[self.activation]
        x = obs.astype(jnp.float32)
        for layer in layers:
            x = act(layer(x))
        return head(x)

    def value(self, obs):
        return self._run(self.critic_layers, self.critic_head, obs)[..., 0]

    def policy(self, obs):
        out = self._run(self.actor_layers, self.actor_head, obs)
        if not self.continuous:
            return (out,)
        return (out, jnp.broadcast_to(self.log_std.astype(jnp.float32), out.shape))

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)
