"""Actor-critic for discrete (categorical) and continuous (diagonal Gaussian) actions."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from genesis_jax.nets.mlp import ACTIVATIONS


class ActorCritic(nn.Module):
    """Separate actor and critic towers (PureJaxRL / CleanRL layout, orthogonal init).

    Returns `(pi_params, value)`: for discrete actions `pi_params` is `(logits,)`, for
    continuous ones `(mean, log_std)` with a state-independent float32 log-std. Hidden
    layers run in `dtype`; every output is float32.
    """

    action_dim: int
    continuous: bool = False
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def _tower(self, x, out_features: int, head_scale: float, name: str):
        act = ACTIVATIONS[self.activation]
        for i, width in enumerate(self.hidden):
            x = nn.Dense(
                width,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                bias_init=nn.initializers.zeros,
                name=f"{name}_{i}",
            )(x)
            x = act(x)
        out = nn.Dense(
            out_features,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=nn.initializers.orthogonal(head_scale),
            bias_init=nn.initializers.zeros,
            name=f"{name}_head",
        )(x)
        return out.astype(jnp.float32)

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32)
        value = self._tower(x, 1, 1.0, "critic")[..., 0]
        actor_out = self._tower(x, self.action_dim, 0.01, "actor")
        if not self.continuous:
            return (actor_out,), value
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)
        return (actor_out, jnp.broadcast_to(log_std.astype(jnp.float32), actor_out.shape)), value
