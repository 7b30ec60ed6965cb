"""Actor-critic for discrete (categorical) and continuous (diagonal Gaussian) actions."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.rules import precision_rules
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import ACTIVATIONS
from genesis_jax.nets.torsos import IMAGE_NETWORKS, make_torso


class ActorCritic(nn.Module):
    """An actor and a critic on a torso (`network`), orthogonal init (PureJaxRL / CleanRL).

    - `mlp`: separate tanh towers of `hidden` widths (PureJaxRL's layout; params
      `actor_0`, ..., `actor_head`, `critic_0`, ...);
    - `resmlp`: separate SimBa residual towers of `width` x `depth` blocks;
    - `cnn`, `impala`: one convolutional torso shared by both heads (CleanRL's Atari
      layout), for observations of `obs_shape` = (height, width, channels), uint8 or float.

    `__call__` returns `(pi_params, value)`: for discrete actions `pi_params` is `(logits,)`,
    for continuous ones `(mean, log_std)` with a state-independent float32 log-std. The
    `policy` and `value` methods run what their head needs only. Observations may carry any
    batch dimensions before `obs_shape`. The torsos' matmuls and convolutions run in
    `dtype`; the heads (logits, mean, value) and the norms run in float32, as does every
    output: the methods run under `genesis_jax.amp.FLOAT32_RULES` (modules named `*head`, norms).
    """

    action_dim: int
    continuous: bool = False
    hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    network: str = "mlp"
    obs_shape: Sequence[int] | None = None  # None: flat vectors, whatever their length
    width: int = 256  # resmlp
    depth: int = 2  # resmlp

    def _mlp_layers(self, name: str):
        init = nn.initializers.orthogonal(np.sqrt(2))
        return [Dense(w, self.dtype, self.param_dtype, init, name=f"{name}_{i}") for i, w in enumerate(self.hidden)]

    def _torso(self, name: str):
        if self.network == "mlp":
            return self._mlp_layers(name)
        return make_torso(
            self.network,
            self.obs_shape or (1,),
            width=self.width,
            depth=self.depth,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name=name,
        )

    def _head(self, features: int, scale: float, name: str):
        # float32 by the precision rules (the name ends in "head"), not by its own dtype.
        return Dense(features, self.dtype, self.param_dtype, nn.initializers.orthogonal(scale), name=name)

    def setup(self):
        if self.network in IMAGE_NETWORKS:
            self.shared_torso = self._torso("torso")
        else:
            self.actor_torso, self.critic_torso = self._torso("actor"), self._torso("critic")
        self.critic_head = self._head(1, 1.0, "critic_head")
        self.actor_head = self._head(self.action_dim, 0.01, "actor_head")
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)

    def _features(self, torso, obs):
        """torso(obs) for obs [*batch, *obs_shape]: the torso sees one flat batch dimension."""
        obs_rank = len(self.obs_shape) if self.obs_shape is not None else 1
        batch_shape = obs.shape[: obs.ndim - obs_rank]
        x = obs.reshape((-1, *obs.shape[obs.ndim - obs_rank :]))
        if self.network == "mlp":  # its own towers: a sequence of Dense layers
            act = ACTIVATIONS[self.activation]
            x = x.reshape(x.shape[0], -1).astype(jnp.float32)
            for layer in torso:
                x = act(layer(x))
        else:
            x = torso(x if self.network in IMAGE_NETWORKS else x.reshape(x.shape[0], -1))
        return x.reshape((*batch_shape, x.shape[-1])).astype(jnp.float32)

    def _trunks(self):
        if self.network in IMAGE_NETWORKS:
            return self.shared_torso, self.shared_torso
        return self.actor_torso, self.critic_torso

    def _policy_from(self, features):
        out = self.actor_head(features)
        if not self.continuous:
            return (out,)
        return (out, jnp.broadcast_to(self.log_std.astype(jnp.float32), out.shape))

    @precision_rules()
    def value(self, obs):
        return self.critic_head(self._features(self._trunks()[1], obs))[..., 0]

    @precision_rules()
    def policy(self, obs):
        return self._policy_from(self._features(self._trunks()[0], obs))

    @precision_rules()
    def __call__(self, obs):
        actor, critic = self._trunks()
        if actor is critic:  # one shared torso pass
            features = self._features(actor, obs)
            return self._policy_from(features), self.critic_head(features)[..., 0]
        return self.policy(obs), self.value(obs)
