"""Network torsos: observation -> float32 feature vector, in the compute dtype where it pays.

`resmlp` (SimBa-style pre-LayerNorm residual MLP), `cnn` (Nature-CNN, or MinAtar's one-layer
CNN for small images) and `impala` (IMPALA-ResNet); the tanh MLP, `mlp`, is `nets.ActorCritic`'s
own. Every torso takes observations of shape [B, *obs_shape] and returns [B, features] float32.

What stays float32, and why: LayerNorm statistics and the residual stream (a sum of many
half-precision terms loses the small ones; SimBa, BRO and DreamerV3 keep norms in float32;
the norms are float32 by `genesis_jax.amp.FLOAT32_RULES`, which the residual MLP applies),
the image scaling of uint8 pixels, and every layer's output that leaves the torso. The
matmuls and convolutions, the bulk of the work, run in `dtype`.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.rules import precision_rules
from genesis_jax.nets.conv import Conv
from genesis_jax.nets.dense import Dense

NETWORKS = ("mlp", "resmlp", "cnn", "impala")
IMAGE_NETWORKS = ("cnn", "impala")

# ((features, kernel, stride) per convolution, dense features): Mnih et al. 2015 for
# Atari-sized frames; the MinAtar paper's single 3x3 layer and 128 units (Young & Tian 2019)
# for frames below 36 pixels a side, where the Nature stack's 8x8 stride-4 kernel would
# leave nothing to convolve.
NATURE_CNN = (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512)
MINATAR_CNN = (((16, 3, 1),), 128)


def default_network(obs_shape: Sequence[int]) -> str:
    """`cnn` for image observations (height x width x channels), `mlp` for anything else."""
    return "cnn" if len(obs_shape) == 3 else "mlp"


def cnn_layout_for(obs_shape: Sequence[int]):
    """`NATURE_CNN` for frames of at least 36 pixels a side, `MINATAR_CNN` below."""
    return NATURE_CNN if min(obs_shape[0], obs_shape[1]) >= 36 else MINATAR_CNN


def scale_pixels(obs) -> jnp.ndarray:
    """float32 in [0, 1] for uint8 frames; other observations only cast to float32."""
    if obs.dtype == jnp.uint8:
        return obs.astype(jnp.float32) / 255.0
    return obs.astype(jnp.float32)


class ResidualBlock(nn.Module):
    """SimBa's block: x + Dense(width)(relu(Dense(4 width)(LayerNorm(x)))), the sum in float32."""

    width: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @precision_rules()
    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="norm")(x)
        init = nn.initializers.he_normal()
        y = nn.relu(Dense(4 * self.width, self.dtype, self.param_dtype, init, name="expand")(y))
        return x + Dense(self.width, self.dtype, self.param_dtype, init, name="project")(y)


class ResidualMLP(nn.Module):
    """SimBa (Lee et al. 2024): a linear embedding, `depth` pre-LayerNorm residual blocks of
    width `width` (inner width 4 x `width`), and a final LayerNorm."""

    width: int = 256
    depth: int = 2
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @precision_rules()
    @nn.compact
    def __call__(self, x):
        x = Dense(self.width, self.dtype, self.param_dtype, nn.initializers.orthogonal(1.0), name="embed")(x)
        for i in range(self.depth):
            x = ResidualBlock(self.width, self.dtype, self.param_dtype, name=f"block_{i}")(x)
        return nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name="final_norm")(x)


def _conv(features, kernel, stride, padding, dtype, param_dtype, name, init=nn.initializers.lecun_normal()):
    return Conv(features, kernel, stride, padding, dtype, param_dtype, init, name=name)


class NatureCNN(nn.Module):
    """Convolutions (`convs`: (features, kernel, stride), VALID padding, ReLU) then a dense
    layer of `features` with ReLU; CleanRL's Atari PPO torso by default."""

    convs: Sequence[tuple[int, int, int]] = NATURE_CNN[0]
    features: int = NATURE_CNN[1]
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.orthogonal(np.sqrt(2))
        x = scale_pixels(x)
        for i, (features, kernel, stride) in enumerate(self.convs):
            x = nn.relu(_conv(features, kernel, stride, "VALID", self.dtype, self.param_dtype, f"conv_{i}", init)(x))
        x = x.reshape(x.shape[0], -1)
        return nn.relu(Dense(self.features, self.dtype, self.param_dtype, init, name="dense")(x))


class ImpalaBlock(nn.Module):
    """conv 3x3, max-pool 3x3 stride 2, then two residual units relu-conv-relu-conv."""

    channels: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = _conv(self.channels, 3, 1, "SAME", self.dtype, self.param_dtype, "conv")(x)
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for i in range(2):
            y = _conv(self.channels, 3, 1, "SAME", self.dtype, self.param_dtype, f"res_{i}_a")(nn.relu(x))
            x = x + _conv(self.channels, 3, 1, "SAME", self.dtype, self.param_dtype, f"res_{i}_b")(nn.relu(y))
        return x


class ImpalaCNN(nn.Module):
    """IMPALA's ResNet (Espeholt et al. 2018): blocks of `channels`, then relu, flatten and a
    dense layer of `features` with ReLU."""

    channels: Sequence[int] = (16, 32, 32)
    features: int = 256
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = scale_pixels(x)
        for i, channels in enumerate(self.channels):
            x = ImpalaBlock(channels, self.dtype, self.param_dtype, name=f"block_{i}")(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        init = nn.initializers.orthogonal(np.sqrt(2))
        return nn.relu(Dense(self.features, self.dtype, self.param_dtype, init, name="dense")(x))


def check_network(network: str | None, obs_shape: Sequence[int]) -> None:
    """Refuses an image network for observations that are not images: a trainer calls it as it
    is set up, before its run directory is touched (the torso itself is built later)."""
    if network in IMAGE_NETWORKS and len(obs_shape) != 3:
        raise ValueError(
            f"network {network!r} needs image observations (height, width, channels), got shape {tuple(obs_shape)}"
        )


def make_torso(
    network: str, obs_shape: Sequence[int], *, width=256, depth=2, dtype=jnp.float32, param_dtype=jnp.float32, name=None
) -> nn.Module:
    """The torso called `network` (`resmlp`, `cnn` or `impala`) for observations of `obs_shape`.
    (`mlp` is the actor-critic's own towers: see `nets.ActorCritic`.)

    >>> import jax, jax.numpy as jnp
    >>> torso = make_torso("cnn", (10, 10, 4), dtype=jnp.float16)
    >>> out = torso.apply(torso.init(jax.random.PRNGKey(0), jnp.zeros((2, 10, 10, 4))), jnp.zeros((2, 10, 10, 4)))
    >>> out.shape, out.dtype
    ((2, 128), dtype('float32'))
    """
    common = {"dtype": dtype, "param_dtype": param_dtype, "name": name}
    check_network(network, obs_shape)
    if network == "resmlp":
        return ResidualMLP(width, depth, **common)
    if network == "cnn":
        return NatureCNN(*cnn_layout_for(obs_shape), **common)
    if network == "impala":
        return ImpalaCNN(**common)
    raise ValueError(f"unknown network {network!r}; accepted: {', '.join(NETWORKS)}")
