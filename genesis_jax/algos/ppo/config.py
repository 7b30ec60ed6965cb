"""PPO configuration: defaults are PureJaxRL's CartPole settings."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.amp.policy import Precision, check_precision, get_precision
from genesis_jax.run.config import (
    INT32_MAX,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    UNIT_INTERVAL,
    EnvFields,
    MixedPrecisionConfig,
    NetworkFields,
    ResMLPFields,
    RunFields,
    SeedFields,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class PPOFields(ResMLPFields, NetworkFields, SeedFields, RunFields, EnvFields):
    """PPO's fields: the shared groups it composes (run, environments, seeds, network) and its
    own (`PPOConfig` adds the shared mixed-precision and data-parallel ones). Each field's text
    is also its `--help` line."""

    rollout_precision: str | None = None
    """Precision of the acting policy. None: the training precision."""
    num_steps: int = 128
    """Rollout length per environment per update."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 4
    """Minibatches per pass."""
    lr: float = 2.5e-4
    """Adam's learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
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
class PPOConfig(PPOFields, MixedPrecisionConfig, ParallelConfig):
    """A PPO run: `PPOFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 0.5  # PPO's own default for the shared clipping field

    # Each field's accepted range (types come from the annotations): `run.config.check_fields`.
    FIELD_BOUNDS = {
        **{name: POSITIVE_INT for name in ("num_steps", "update_epochs", "num_minibatches")},
        "lr": POSITIVE,
        "gamma": UNIT_INTERVAL,
        "gae_lambda": UNIT_INTERVAL,
        "clip_eps": POSITIVE,
        "ent_coef": NON_NEGATIVE,
        "vf_coef": NON_NEGATIVE,
    }

    def check(self):
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} is not divisible into {self.num_minibatches} minibatches"
            )
        if self.total_steps < self.batch_size:
            raise ValueError(
                f"total-steps {self.total_steps} is less than one rollout (num-envs x num-steps = {self.batch_size})"
            )
        steps_per_update = self.update_epochs * self.num_minibatches
        if self.num_updates * steps_per_update > INT32_MAX:  # optax and TrainState count steps in int32
            raise ValueError(
                f"total-steps {self.total_steps} would take {self.num_updates * steps_per_update} optimizer steps, "
                f"but the step counters are int32: at most {INT32_MAX // steps_per_update * self.batch_size} "
                f"total-steps with num-envs x num-steps = {self.batch_size} and update-epochs x num-minibatches = "
                f"{steps_per_update}"
            )
        self.validate_parallel("num-envs", self.num_envs)
        check_precision(self.rollout_precision or self.precision)  # fail now, not after env set-up

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def rollout_precision_resolved(self) -> Precision:
        return get_precision(self.rollout_precision or self.precision)
