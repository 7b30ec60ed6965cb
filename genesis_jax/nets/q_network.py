"""A Q network for discrete actions (DQN, PQN): a torso (an MLP, or one of `nets.torsos`),
LayerNorm where asked (PQN), and a float32 Q head."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from genesis_jax.amp.rules import precision_rules
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import ACTIVATIONS
from genesis_jax.nets.torsos import make_torso


class QNetwork(nn.Module):
    """Q-values [batch, action_dim] in float32 for observations [batch, *obs_shape].

    `mlp`: Dense layers of `hidden` widths (PureJaxRL's and CleanRL's DQN: 120, 84, ReLU);
    other torsos from `nets.torsos.make_torso` (`cnn`: MinAtar's one-layer CNN for small
    frames). `layer_norm` (PQN's stabiliser): a LayerNorm after each hidden layer, and after
    another torso one hidden layer of `hidden[-1]` units with its LayerNorm. The matmuls run in
    `dtype`; the LayerNorms, the head (a module named `*head`) and its output are float32 by
    the precision rules.

    >>> import jax, jax.numpy as jnp
    >>> net = QNetwork(action_dim=2, obs_shape=(4,), dtype=jnp.float16)
    >>> q = net.apply(net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4))), jnp.ones((3, 4)))
    >>> q.shape, q.dtype
    ((3, 2), dtype('float32'))
    """

    action_dim: int
    obs_shape: Sequence[int]
    network: str = "mlp"
    hidden: Sequence[int] = (120, 84)
    activation: str = "relu"
    layer_norm: bool = False
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @precision_rules()
    @nn.compact
    def __call__(self, obs):
        mlp = self.network == "mlp"
        x = obs.astype(jnp.float32) if obs.dtype == jnp.bool_ or mlp else obs  # uint8 frames: the torso scales them
        x = x.reshape(x.shape[0], -1) if mlp or len(self.obs_shape) != 3 else x
        if not mlp:
            x = make_torso(self.network, self.obs_shape, dtype=self.dtype, param_dtype=self.param_dtype)(x)
        widths = self.hidden if mlp else self.hidden[-1:] if self.layer_norm else ()
        for i, width in enumerate(widths):
            x = Dense(width, self.dtype, self.param_dtype, name=f"dense_{i}")(x)
            if self.layer_norm:
                x = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name=f"norm_{i}")(x)
            x = ACTIVATIONS[self.activation](x)
        return Dense(self.action_dim, self.dtype, self.param_dtype, name="q_head")(x).astype(jnp.float32)
