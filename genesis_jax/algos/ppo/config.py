"""PPO configuration: defaults are PureJaxRL's CartPole settings."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.amp.policy import Precision, check_precision, get_precision
from genesis_jax.nets.torsos import NETWORKS
from genesis_jax.run.config import (
    INT32_MAX,
    INT64_MAX,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    RESUMABLE_BASE_FIELDS,
    SEED_MAX,
    UNIT_INTERVAL,
    Bounds,
    MixedPrecisionConfig,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class PPOFields:
    """PPO's own fields (`PPOConfig` adds the shared mixed-precision and data-parallel ones).
    Each field's text below is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id (Atari ids with the envpool backend)."""
    env_backend: Literal["gymnax", "gymnasium", "envpool"] | None = None
    """None: gymnax where it has the id, else gymnasium. envpool: Atari (pip install -e '.[envpool]')."""
    rollout_precision: str | None = None
    """Precision of the acting policy. None: the training precision."""
    total_steps: int = 500_000
    """Environment steps in all."""
    num_envs: int = 4
    """Environments stepped in parallel."""
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
    network: str | None = None
    """Policy torso: mlp | resmlp | cnn | impala. None: cnn for image observations, mlp otherwise."""
    hidden: tuple[int, ...] = (64, 64)
    """mlp: hidden widths."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    """mlp: activation."""
    width: int = 256
    """resmlp: residual stream width."""
    depth: int = 2
    """resmlp: residual blocks."""
    seed: int = 0
    """Seed of the parameters, the environments and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run (gymnax)."""
    vectorization: Literal["sync", "async"] = "sync"
    """gymnasium: sync (in this process) or async (a subprocess per environment)."""
    action_repeat: int = 1
    """gymnasium: repeat each action this many steps."""
    updates_per_chunk: int | None = None
    """Updates per compiled chunk between progress reports. None: about 25 reports per run."""


# The counts that must be positive integers.
_COUNTS = ("num_envs", "num_steps", "update_epochs", "num_minibatches", "num_seeds", "action_repeat", "width", "depth")


@dataclasses.dataclass(frozen=True)
class PPOConfig(PPOFields, MixedPrecisionConfig, ParallelConfig):
    """A PPO run: `PPOFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 0.5  # PPO's own default for the shared clipping field

    # What a resume may change without changing what the run is (see `train`).
    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk", "vectorization")

    # Each field's accepted range (types come from the annotations): `run.config.check_fields`.
    FIELD_BOUNDS = {
        **{name: POSITIVE_INT for name in _COUNTS},
        "total_steps": Bounds(f"a positive integer (at most {INT64_MAX})", 1, INT64_MAX),
        "lr": POSITIVE,
        "gamma": UNIT_INTERVAL,
        "gae_lambda": UNIT_INTERVAL,
        "clip_eps": POSITIVE,
        "ent_coef": NON_NEGATIVE,
        "vf_coef": NON_NEGATIVE,
        "updates_per_chunk": POSITIVE_INT,
    }

    def __post_init__(self):
        super().__post_init__()  # types and ranges of every field first
        if any(h < 1 for h in self.hidden) or not self.hidden:
            raise ValueError(f"hidden sizes must be positive integers, got {self.hidden!r}")
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
        if self.seed + self.num_seeds - 1 > SEED_MAX:
            raise ValueError(f"seed + num-seeds - 1 must be at most {SEED_MAX}, got {self.seed + self.num_seeds - 1}")
        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")
        self.validate_parallel("num-envs", self.num_envs)
        if self.devices > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")
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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
