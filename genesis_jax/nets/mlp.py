"""A plain multilayer perceptron with a float32 output."""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp

ACTIVATIONS: dict[str, Callable] = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}


class MLP(nn.Module):
    """Dense layers in `dtype` (params in `param_dtype`); the last layer's output is cast to float32.

    >>> import jax, jax.numpy as jnp
    >>> m = MLP(features=(16, 1), dtype=jnp.float16)
    >>> params = m.init(jax.random.PRNGKey(0), jnp.ones((2, 3)))
    >>> m.apply(params, jnp.ones((2, 3))).dtype
    dtype('float32')
    """

    features: Sequence[int]
    activation: str = "tanh"
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x):
        common = dict(dtype=self.dtype, param_dtype=self.param_dtype, kernel_init=self.kernel_init)
        for i, width in enumerate(self.features):
            x = nn.Dense(width, name=f"dense_{i}", **common)(x)
            x = ACTIVATIONS[self.activation](x) if i < len(self.features) - 1 else x
        return x.astype(jnp.float32)
