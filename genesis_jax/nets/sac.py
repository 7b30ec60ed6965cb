"""SAC's networks (`genesis_jax.algos.sac`): `Net` is the tanh-Gaussian actor (a mean and a
log-std per action dimension) and each critic; `TwinQ` the twin critics, two `Net`s as one
params tree."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from genesis_jax.nets.dense import Dense
from genesis_jax.nets.torsos import ResidualMLP


class Net(nn.Module):
    """Inputs concatenated, a torso in `dtype` (ReLU MLP or SimBa's resmlp), a float32 linear head."""

    torso: tuple
    outputs: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, *inputs):
        x = jnp.concatenate(inputs, axis=-1)
        if self.torso[0] == "resmlp":
            x = ResidualMLP(*self.torso[1:], self.dtype)(x)
        for width in self.torso[1] if self.torso[0] == "mlp" else ():
            x = nn.relu(Dense(width, self.dtype)(x))
        # float32, as PPO's heads (FLOAT32_RULES): a Q value or a log-std past float16's 65504 is
        # an inf no loss scale undoes. (Its params keep the name they had: checkpoints still fit.)
        return Dense(self.outputs, jnp.float32)(x)


# The twin critics as one params tree with a leading axis of 2: one batched matmul per layer.
TwinQ = nn.vmap(Net, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, axis_size=2)
