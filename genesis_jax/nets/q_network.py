"""A Q network for discrete actions (DQN and its kin): a torso (an MLP, or one of `nets.torsos`)
and a float32 Q head."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from genesis_jax.amp.rules import with_precision_rules
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import ACTIVATIONS
from genesis_jax.nets.torsos import make_torso


class QNetwork(nn.Module):
    """Q-values [batch, action_dim] in float32 for observations [batch, *obs_shape].

    `mlp`: Dense layers of `hidden` widths (PureJaxRL's and CleanRL's DQN: 120, 84, ReLU);
    other torsos from `nets.torsos.make_torso` (`cnn`: MinAtar's one-layer CNN for small
    frames). The matmuls run in `dtype`; the head (a module named `*head`) and its output
    are float32 by the precision rules.

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
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @with_precision_rules
    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32) if obs.dtype == jnp.bool_ else obs
        if self.network == "mlp":
            x = x.reshape(x.shape[0], -1).astype(jnp.float32)
            for i, width in enumerate(self.hidden):
                x = ACTIVATIONS[self.activation](Dense(width, self.dtype, self.param_dtype, name=f"dense_{i}")(x))
        else:
            torso = make_torso(self.network, self.obs_shape, dtype=self.dtype, param_dtype=self.param_dtype)
            x = torso(x if len(self.obs_shape) == 3 else x.reshape(x.shape[0], -1))
        return Dense(self.action_dim, self.dtype, self.param_dtype, name="q_head")(x).astype(jnp.float32)


def epsilon_greedy(explore_key, random_key, q_values, epsilon):
    """Actions [batch] from Q-values [batch, actions]: each row's argmax, or with probability
    `epsilon` a uniformly random action (`explore_key` decides which rows, `random_key` draws them).

    >>> import jax, jax.numpy as jnp
    >>> q = jnp.array([[0.0, 1.0], [2.0, 0.0]])
    >>> epsilon_greedy(jax.random.PRNGKey(0), jax.random.PRNGKey(1), q, 0.0).tolist()
    [1, 0]
    """
    rows, actions = q_values.shape
    greedy = jnp.argmax(q_values, -1)
    explore = jax.random.uniform(explore_key, (rows,)) < epsilon
    return jnp.where(explore, jax.random.randint(random_key, (rows,), 0, actions), greedy)
