"""PPO configuration: defaults are PureJaxRL's CartPole settings."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.algos.base import ActingFields, Config
from genesis_jax.algos.onpolicy import OnPolicyFields
from genesis_jax.amp.policy import Precision, check_precision, get_precision
from genesis_jax.run.config import NON_NEGATIVE, POSITIVE, ResMLPFields


@dataclasses.dataclass(frozen=True)
class PPOFields(OnPolicyFields, ResMLPFields, ActingFields):
    """PPO's fields: the shared groups it composes (run, environments, seeds, network, the
    on-policy update) and its own (`PPOConfig` adds the shared mixed-precision and data-parallel
    ones). Each field's text is also its `--help` line."""

    rollout_precision: str | None = None
    """Precision of the acting policy. None: the training precision."""
    clip_eps: float = 0.2
    """PPO's ratio clip."""
    clip_value: bool = True
    """Clip the value loss as PPO's policy loss is clipped."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    """mlp: activation."""


@dataclasses.dataclass(frozen=True)
class PPOConfig(PPOFields, Config):
    """A PPO run: `PPOFields`, and the shared `Config` fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 0.5  # PPO's own default for the shared clipping field

    # Each field's accepted range (types come from the annotations): `run.config.check_fields`.
    FIELD_BOUNDS = {"clip_eps": POSITIVE, "ent_coef": NON_NEGATIVE, "vf_coef": NON_NEGATIVE}

    def check(self):  # OnPolicyFields checks the rollout and its minibatches
        self.validate_parallel("num-envs", self.num_envs)
        check_precision(self.rollout_precision or self.precision)  # fail now, not after env set-up

    def rollout_precision_resolved(self) -> Precision:
        return get_precision(self.rollout_precision or self.precision)
