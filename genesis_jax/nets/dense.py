"""A dense layer whose matmul runs in the compute dtype and whose bias and activation do not."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


class Dense(nn.Module):
    """`x @ kernel + bias` with the matmul in `dtype` and everything after it in float32.

    The matmul's operands and product are in `dtype`, forward and backward (the gradient
    reaching it is cast back to `dtype`), as under `torch.autocast`, so a float16 run still
    has float16 matmuls and float16 gradients between layers, and still needs loss
    scaling. The product is then widened: the bias, the activation that follows and their
    gradients, the bias gradient's sum over the batch included, are float32.

    Why not `flax.linen.Dense(dtype=...)`: that one adds the bias and applies the
    activation in `dtype` too, and XLA's CPU backend computes every half-precision
    elementwise op through conversions. With flax's layer the float16 PPO ran at 0.72x
    the float32 steps/s on CPU, with this one at 0.78-0.85x (`experiments/ppo_speed.py`).
    The parameters (`kernel`, `bias`) are named and shaped as flax's.

    >>> import jax, jax.numpy as jnp
    >>> layer = Dense(3, dtype=jnp.float16)
    >>> params = layer.init(jax.random.PRNGKey(0), jnp.ones((2, 4)))
    >>> layer.apply(params, jnp.ones((2, 4))).dtype
    dtype('float32')
    """

    features: int
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros

    def _weights(self, x, window: tuple = ()):
        """The kernel [*window, x's features, features] cast to `dtype`, and the bias (`param_dtype`)."""
        kernel = self.param("kernel", self.kernel_init, (*window, jnp.shape(x)[-1], self.features), self.param_dtype)
        return kernel.astype(self.dtype), self.param("bias", self.bias_init, (self.features,), self.param_dtype)

    @nn.compact
    def __call__(self, x):
        kernel, bias = self._weights(x)
        contract_last = (((jnp.ndim(x) - 1,), (0,)), ((), ()))
        product = jax.lax.dot_general(jnp.asarray(x, self.dtype), kernel, contract_last)
        return product.astype(jnp.float32) + bias.astype(jnp.float32)
