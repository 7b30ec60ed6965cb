"""Actor-critic for discrete (categorical) and continuous (diagonal Gaussian) actions."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from genesis_jax.amp.rules import precision_rules
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import ACTIVATIONS
from genesis_jax.nets.torsos import IMAGE_NETWORKS, RELU_INIT, make_torso


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

    def _torso(self, name: str):
        if self.network == "mlp":  # PureJaxRL's towers: Dense layers named f"{name}_{i}"
            widths = enumerate(self.hidden)
            return [Dense(w, self.dtype, self.param_dtype, RELU_INIT, name=f"{name}_{i}") for i, w in widths]
        common = dict(width=self.width, depth=self.depth, dtype=self.dtype, param_dtype=self.param_dtype, name=name)
        return make_torso(self.network, self.obs_shape or (1,), **common)

    def setup(self):
        # (the actor's torso, the critic's): one shared by both for the image networks
        shared = self.network in IMAGE_NETWORKS
        self.torsos = (self._torso("torso"),) * 2 if shared else (self._torso("actor"), self._torso("critic"))
        # float32 by the precision rules (the names end in "head"), not by their own dtype.
        orthogonal = nn.initializers.orthogonal
        self.critic_head = Dense(1, self.dtype, self.param_dtype, orthogonal(1.0), name="critic_head")
        self.actor_head = Dense(self.action_dim, self.dtype, self.param_dtype, orthogonal(0.01), name="actor_head")
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,), jnp.float32)

    def _features(self, torso, obs):
        """torso(obs) for obs [*batch, *obs_shape]: the torso sees one flat batch dimension (and
        flat vectors, but for the image networks)."""
        obs_rank = len(self.obs_shape) if self.obs_shape is not None else 1
        batch_shape, x = obs.shape[: obs.ndim - obs_rank], obs.reshape((-1, *obs.shape[obs.ndim - obs_rank :]))
        x = x if self.network in IMAGE_NETWORKS else x.reshape(x.shape[0], -1)
        if self.network == "mlp":  # its own towers: a sequence of Dense layers
            x = x.astype(jnp.float32)
            for layer in torso:
                x = ACTIVATIONS[self.activation](layer(x))
        else:
            x = torso(x)
        return x.reshape((*batch_shape, x.shape[-1])).astype(jnp.float32)

    def _policy_from(self, features):
        out = self.actor_head(features)
        return (out, jnp.broadcast_to(self.log_std.astype(jnp.float32), out.shape)) if self.continuous else (out,)

    @precision_rules()
    def value(self, obs):
        return self.critic_head(self._features(self.torsos[1], obs))[..., 0]

    @precision_rules()
    def policy(self, obs):
        return self._policy_from(self._features(self.torsos[0], obs))

    @precision_rules()
    def __call__(self, obs):
        actor = self._features(self.torsos[0], obs)
        policy = self._policy_from(actor)  # the actor's whole pass first, then the critic's
        critic = actor if self.network in IMAGE_NETWORKS else self._features(self.torsos[1], obs)  # one pass if shared
        return policy, self.critic_head(critic)[..., 0]
