"""A world model: observation encoder, action embedding, dynamics core, prediction heads."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class WorldModel(nn.Module):
    """Predicts (next observation, reward, termination logit) from (observation, action).

    The dynamics core is a stack of `depth` residual MLP blocks or a GRU cell acting on a
    latent of size `width`; `unroll` applies it open-loop over a sequence of actions, so
    errors (and half-precision rounding) accumulate as they would in imagination.
    Hidden layers run in `dtype`; the three predictions are float32.
    """

    obs_dim: int
    action_dim: int
    discrete_actions: bool = False
    width: int = 256
    depth: int = 2
    core: str = "mlp"  # mlp | gru
    predict_delta: bool = True
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        dense = lambda n, name: nn.Dense(n, dtype=self.dtype, param_dtype=self.param_dtype, name=name)  # noqa: E731
        self.encoder = [dense(self.width, "enc_0"), dense(self.width, "enc_1")]
        self.action_embed = dense(self.width, "action_embed")
        if self.core == "gru":
            self.cell = nn.GRUCell(self.width, dtype=self.dtype, param_dtype=self.param_dtype, name="gru")
        else:
            self.blocks = [
                (dense(self.width, f"block_{i}_a"), dense(self.width, f"block_{i}_b")) for i in range(self.depth)
            ]
        self.obs_head = dense(self.obs_dim, "obs_head")
        self.reward_head = dense(1, "reward_head")
        self.term_head = dense(1, "term_head")

    def encode(self, obs):
        h = nn.silu(self.encoder[0](obs.astype(jnp.float32)))
        return self.encoder[1](h)

    def _embed_action(self, action):
        if self.discrete_actions:
            action = jax.nn.one_hot(action, self.action_dim, dtype=jnp.float32)
        return self.action_embed(action.astype(jnp.float32))

    def step_latent(self, h, action):
        a = self._embed_action(action)
        if self.core == "gru":
            h, _ = self.cell(h, a)
            return h
        x = h + a
        for first, second in self.blocks:
            x = x + second(nn.silu(first(nn.silu(x))))
        return x

    def decode(self, h, obs):
        delta = self.obs_head(nn.silu(h)).astype(jnp.float32)
        next_obs = obs.astype(jnp.float32) + delta if self.predict_delta else delta
        reward = self.reward_head(nn.silu(h)).astype(jnp.float32)[..., 0]
        term_logit = self.term_head(nn.silu(h)).astype(jnp.float32)[..., 0]
        return next_obs, reward, term_logit

    def __call__(self, obs, action):
        return self.decode(self.step_latent(self.encode(obs), action), obs)

    def unroll(self, obs0, actions):
        """Open-loop predictions for actions [B, K, ...] from obs0 [B, D]: each [B, K, ...]."""
        h = self.encode(obs0)
        obs = obs0.astype(jnp.float32)
        outs = []
        for k in range(actions.shape[1]):  # K is small and static
            h = self.step_latent(h, actions[:, k])
            obs, reward, term = self.decode(h, obs)
            outs.append((obs, reward, term))
        return tuple(jnp.stack(x, axis=1) for x in zip(*outs))
