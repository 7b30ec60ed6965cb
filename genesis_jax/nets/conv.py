"""A 2-D convolution (NHWC) in the compute dtype, with flax's `nn.Conv` parameters."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from genesis_jax.nets.dense import Dense

_NHWC = ("NHWC", "HWIO", "NHWC")


def conv2d(x, kernel, stride: int, padding: str, as_patches: bool | None = None):
    """x [N, H, W, C] * kernel [kh, kw, C, F]. `as_patches` (default: on a CPU) computes it
    as patches @ kernel: XLA's CPU backend computes a convolution's gradient inside a loop
    (PPO's minibatch scan) about 5x slower than the same gradient through
    `conv_general_dilated_patches` and a matmul (24 vs 136 ms for a 3x3 layer on 1024
    MinAtar frames, 2 cores). Elsewhere the native convolution (cuDNN on a GPU)."""
    kh, kw, channels, features = kernel.shape
    as_patches = jax.default_backend() == "cpu" if as_patches is None else as_patches
    if not as_patches:
        return jax.lax.conv_general_dilated(x, kernel, (stride, stride), padding, dimension_numbers=_NHWC)
    patches = jax.lax.conv_general_dilated_patches(x, (kh, kw), (stride, stride), padding, dimension_numbers=_NHWC)
    # Patch features are ordered (channel, row, column).
    return patches @ jnp.transpose(kernel, (2, 0, 1, 3)).reshape(channels * kh * kw, features)


class Conv(Dense):
    """Square-kernel convolution plus bias, computed in `dtype` (params in `param_dtype`),
    its output in `dtype` as with flax's `nn.Conv(dtype=...)`, whose `kernel` and `bias`
    it shares (`Dense`'s fields, then the window's). The bias is added in float32 and the sum
    rounded to `dtype` once, so the bias gradient, a sum over batch and positions, accumulates
    in float32 (added in `dtype`, its gradient would sum in `dtype`).

    >>> import jax, jax.numpy as jnp
    >>> layer = Conv(8, dtype=jnp.float16, kernel_size=3)
    >>> params = layer.init(jax.random.PRNGKey(0), jnp.ones((2, 10, 10, 4)))
    >>> layer.apply(params, jnp.ones((2, 10, 10, 4))).shape
    (2, 8, 8, 8)
    """

    kernel_size: int = 3
    stride: int = 1
    padding: str = "VALID"

    @nn.compact
    def __call__(self, x):
        kernel, bias = self._weights(x, (self.kernel_size, self.kernel_size))
        out = conv2d(jnp.asarray(x, self.dtype), kernel, self.stride, self.padding)
        return (out.astype(jnp.float32) + bias.astype(jnp.float32)).astype(self.dtype)
