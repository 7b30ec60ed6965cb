"""A world model: observation encoder, action embedding, dynamics core, prediction heads."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from genesis_jax.nets.dense import Dense


class HiddenDense(Dense):
    """A hidden layer as flax's `nn.Dense(dtype=...)` gives it, its output in `dtype` (the
    activations the backward pass keeps stay half precision), with `Dense`'s bias added in
    float32 before the rounding: the bias gradient, a sum over the batch, accumulates in
    float32 (flax's sums it in `dtype`)."""

    @nn.compact
    def __call__(self, x):
        return super().__call__(x).astype(self.dtype)


class GRUCell(nn.Module):
    """flax's `nn.GRUCell` (the same parameters, names and initialisers, the same arithmetic),
    its input layers' and `hn`'s bias added in float32 as `HiddenDense` adds them: flax's
    cell builds `nn.Dense(dtype=...)` layers, whose bias gradients sum in `dtype`."""

    features: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, h, x):
        orthogonal = nn.initializers.orthogonal()  # flax's recurrent_kernel_init
        given = lambda name: HiddenDense(self.features, self.dtype, self.param_dtype, name=name)(x)  # noqa: E731
        hidden = lambda name: nn.Dense(  # noqa: E731  (no bias: flax's hr and hz have none)
            self.features, False, self.dtype, self.param_dtype, kernel_init=orthogonal, name=name
        )(h)
        hn = HiddenDense(self.features, self.dtype, self.param_dtype, kernel_init=orthogonal, name="hn")(h)
        r, z = nn.sigmoid(given("ir") + hidden("hr")), nn.sigmoid(given("iz") + hidden("hz"))
        n = nn.tanh(given("in") + r * hn)
        new = (1.0 - z) * n + z * h
        return new, new


class WorldModel(nn.Module):
    """Predicts (next observation, reward, termination logit) from (observation, action).

    The dynamics core is a stack of `depth` residual MLP blocks or a GRU cell acting on a
    latent of size `width`; `unroll` applies it open-loop over a sequence of actions, so
    errors (and half-precision rounding) accumulate as they would in imagination.
    Hidden layers run in `dtype`; the three predictions are float32 (heads' matmuls in `dtype`,
    their bias in float32); every bias gradient sums in float32.
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
        dense = lambda n, name, layer=HiddenDense: layer(n, self.dtype, self.param_dtype, name=name)  # noqa: E731
        self.encoder = [dense(self.width, "enc_0"), dense(self.width, "enc_1")]
        self.action_embed = dense(self.width, "action_embed")
        if self.core == "gru":
            self.cell = GRUCell(self.width, self.dtype, self.param_dtype, name="gru")
        else:
            self.blocks = [tuple(dense(self.width, f"block_{i}_{part}") for part in "ab") for i in range(self.depth)]
        heads = ((self.obs_dim, "obs_head"), (1, "reward_head"), (1, "term_head"))
        self.heads = tuple(dense(n, name, Dense) for n, name in heads)

    def encode(self, obs):
        return self.encoder[1](nn.silu(self.encoder[0](obs.astype(jnp.float32))))

    def step_latent(self, h, action):
        if self.discrete_actions:
            action = jax.nn.one_hot(action, self.action_dim, dtype=jnp.float32)
        a = self.action_embed(action.astype(jnp.float32))
        if self.core == "gru":
            return self.cell(h, a)[0]
        x = h + a
        for first, second in self.blocks:
            x = x + second(nn.silu(first(nn.silu(x))))
        return x

    def decode(self, h, obs):
        delta, reward, term_logit = (head(nn.silu(h)).astype(jnp.float32) for head in self.heads)
        return obs.astype(jnp.float32) + delta if self.predict_delta else delta, reward[..., 0], term_logit[..., 0]

    def __call__(self, obs, action):
        return self.decode(self.step_latent(self.encode(obs), action), obs)

    def unroll(self, obs0, actions):
        """Open-loop predictions for actions [B, K, ...] from obs0 [B, D]: each [B, K, ...]."""
        h, outs = self.encode(obs0), [(obs0.astype(jnp.float32),)]
        for k in range(actions.shape[1]):  # K is small and static
            h = self.step_latent(h, actions[:, k])
            outs.append(self.decode(h, outs[-1][0]))  # (next obs, reward, termination logit)
        return tuple(jnp.stack(x, axis=1) for x in zip(*outs[1:]))
