"""PPO configuration: defaults are PureJaxRL's CartPole settings."""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from genesis_jax.amp.policy import Precision, check_precision, get_precision
from genesis_jax.nets.torsos import NETWORKS
from genesis_jax.run.config import RESUMABLE_BASE_FIELDS, MixedPrecisionConfig
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


@dataclasses.dataclass(frozen=True)
class PPOConfig(PPOFields, MixedPrecisionConfig, ParallelConfig):
    """A PPO run: `PPOFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 0.5  # PPO's own default for the shared clipping field

    # What a resume may change without changing what the run is (see `train`).
    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk", "vectorization")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.hidden, (str, bytes)) or not all(isinstance(h, (int, np.integer)) for h in self.hidden):
            raise ValueError(f"hidden must be a sequence of integers such as (64, 64), got {self.hidden!r}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        positive = (
            "total_steps",
            "num_envs",
            "num_steps",
            "update_epochs",
            "num_minibatches",
            "num_seeds",
            "action_repeat",
            "width",
            "depth",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
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
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"gamma and gae-lambda must lie in [0, 1], got {self.gamma}, {self.gae_lambda}")
        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")
        if self.vectorization not in ("sync", "async"):
            raise ValueError(f"vectorization must be sync or async, got {self.vectorization!r}")
        if self.updates_per_chunk is not None and self.updates_per_chunk < 1:
            raise ValueError(f"updates-per-chunk must be >= 1, got {self.updates_per_chunk}")
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
