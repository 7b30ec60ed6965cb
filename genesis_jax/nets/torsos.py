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

import functools
from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp.rules import precision_rules
from genesis_jax.nets.conv import Conv
from genesis_jax.nets.dense import Dense

NETWORKS = ("mlp", "resmlp", "cnn", "impala")
IMAGE_NETWORKS = ("cnn", "impala")
RELU_INIT = nn.initializers.orthogonal(np.sqrt(2))  # the orthogonal init of a layer a ReLU or tanh follows

# ((features, kernel, stride) per convolution, dense features): Mnih et al. 2015 for
# Atari-sized frames; the MinAtar paper's single 3x3 layer and 128 units (Young & Tian 2019)
# for frames below 36 pixels a side, where the Nature stack's 8x8 stride-4 kernel would
# leave nothing to convolve.
NATURE_CNN = (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512)
MINATAR_CNN = (((16, 3, 1),), 128)


def default_network(obs_shape: Sequence[int]) -> str:
    """`cnn` for image observations (height x width x channels) the CNN can take, `mlp` for anything else."""
    return "cnn" if len(obs_shape) == 3 and min(obs_shape[:2]) >= MINATAR_CNN[0][0][1] else "mlp"


def cnn_layout_for(obs_shape: Sequence[int]):
    """`NATURE_CNN` for frames of at least 36 pixels a side, `MINATAR_CNN` below."""
    return NATURE_CNN if min(obs_shape[0], obs_shape[1]) >= 36 else MINATAR_CNN


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


class PixelTorso(nn.Module):
    """A CNN's frame: uint8 pixels scaled to [0, 1] in float32, the `body`'s layers, then ReLU,
    flatten and a dense layer of `features` with ReLU."""

    features: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)
        x = nn.relu(self.body(x)).reshape(x.shape[0], -1)
        return nn.relu(Dense(self.features, self.dtype, self.param_dtype, RELU_INIT, name="dense")(x))


class NatureCNN(PixelTorso):
    """Convolutions (`convs`: (features, kernel, stride), VALID padding, ReLU) then a dense
    layer of `features` with ReLU; CleanRL's Atari PPO torso by default."""

    features: int = NATURE_CNN[1]
    convs: Sequence[tuple[int, int, int]] = NATURE_CNN[0]

    def body(self, x):
        for i, (f, k, s) in enumerate(self.convs):  # features, kernel size, stride
            x = nn.relu(Conv(f, self.dtype, self.param_dtype, RELU_INIT, kernel_size=k, stride=s, name=f"conv_{i}")(x))
        return x


class ImpalaBlock(nn.Module):
    """conv 3x3, max-pool 3x3 stride 2, then two residual units relu-conv-relu-conv."""

    channels: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(Conv, self.channels, self.dtype, self.param_dtype, kernel_size=3, padding="SAME")
        x = nn.max_pool(conv(name="conv")(x), (3, 3), (2, 2), padding="SAME")
        for i in range(2):
            x = x + conv(name=f"res_{i}_b")(nn.relu(conv(name=f"res_{i}_a")(nn.relu(x))))
        return x


class ImpalaCNN(PixelTorso):
    """IMPALA's ResNet (Espeholt et al. 2018): blocks of `channels`, then relu, flatten and a
    dense layer of `features` with ReLU."""

    features: int = 256
    channels: Sequence[int] = (16, 32, 32)

    def body(self, x):
        for i, channels in enumerate(self.channels):
            x = ImpalaBlock(channels, self.dtype, self.param_dtype, name=f"block_{i}")(x)
        return x


def check_network(network: str | None, obs_shape: Sequence[int]) -> None:
    """Refuses an image network for observations that are not images: a trainer calls it as it
    is set up, before its run directory is touched (the torso itself is built later)."""
    if network in IMAGE_NETWORKS and len(obs_shape) != 3:
        raise ValueError(
            f"network {network!r} needs image observations (height, width, channels), got shape {tuple(obs_shape)}"
        )
    kernel = MINATAR_CNN[0][0][1]  # its smallest: a smaller image convolved to nothing, and the net saw no input
    if network == "cnn" and min(obs_shape[:2]) < kernel:
        raise ValueError(f"network 'cnn' needs images of at least {kernel} x {kernel}, got shape {tuple(obs_shape)}")


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
    check_network(network, obs_shape)
    common = {"dtype": dtype, "param_dtype": param_dtype, "name": name}
    if network == "resmlp":
        return ResidualMLP(width, depth, **common)
    if network == "cnn":
        convs, features = cnn_layout_for(obs_shape)
        return NatureCNN(features, convs=convs, **common)
    if network == "impala":
        return ImpalaCNN(**common)
    raise ValueError(f"unknown network {network!r}; accepted: {', '.join(NETWORKS)}")
