"""PQN configuration: defaults are purejaxql's CartPole settings (Gallici et al. 2024)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.nets.torsos import NETWORKS
from genesis_jax.run.config import (
    INT64_MAX,
    POSITIVE,
    POSITIVE_INT,
    RESUMABLE_BASE_FIELDS,
    UNIT_INTERVAL,
    Bounds,
    MixedPrecisionConfig,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class PQNFields:
    """PQN's own fields (`PQNConfig` adds the shared mixed-precision and data-parallel ones).
    Each field's text below is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ...)."""
    env_backend: Literal["gymnax", "gymnasium"] | None = None
    """None: gymnax where it has the id, else gymnasium."""
    total_steps: int = 500_000
    """Environment steps in all (all environments together)."""
    num_envs: int = 32
    """Environments stepped in parallel: PQN's decorrelation, in place of a replay buffer."""
    num_steps: int = 64
    """Steps per environment per update."""
    num_epochs: int = 4
    """Passes over each update's transitions."""
    num_minibatches: int = 16
    """Minibatches per pass."""
    lr: float = 1e-4
    """Adam's learning rate."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.95
    """Q(lambda)'s lambda: how far the targets look ahead before bootstrapping."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before they enter the targets."""
    epsilon_start: float = 1.0
    """Exploration's epsilon at the start."""
    epsilon_end: float = 0.2
    """Exploration's epsilon after epsilon-fraction of the run."""
    epsilon_fraction: float = 0.2
    """The fraction of total-steps over which epsilon falls linearly from start to end."""
    network: str | None = None
    """Torso: mlp (LayerNorm after each layer) | cnn | impala | resmlp. None: cnn for images, mlp otherwise."""
    hidden: tuple[int, ...] = (256, 256)
    """mlp: hidden widths."""
    seed: int = 0
    """Seed of the parameters, the environments, exploration and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run (gymnax)."""
    updates_per_chunk: int | None = None
    """Updates per compiled chunk between progress reports. None: about 25 reports per run."""


@dataclasses.dataclass(frozen=True)
class PQNConfig(PQNFields, MixedPrecisionConfig, ParallelConfig):
    """A PQN run: `PQNFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 10.0  # purejaxql's

    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk")  # longer: allowed
    FIELD_BOUNDS = {
        **{n: POSITIVE_INT for n in ("num_envs", "num_steps", "num_epochs", "num_minibatches", "num_seeds")},
        "total_steps": Bounds(f"a positive integer (at most {INT64_MAX})", 1, INT64_MAX),
        "hidden": POSITIVE_INT,
        "lr": POSITIVE,
        "reward_scale": POSITIVE,
        **{n: UNIT_INTERVAL for n in ("gamma", "lam", "epsilon_start", "epsilon_end", "epsilon_fraction")},
        "updates_per_chunk": POSITIVE_INT,
    }

    def __post_init__(self):
        super().__post_init__()  # types and ranges of every field first
        if not self.hidden:
            raise ValueError("hidden needs at least one width")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} is not divisible into {self.num_minibatches} minibatches"
            )
        if self.total_steps < self.batch_size:
            raise ValueError(f"total-steps {self.total_steps} is less than one update ({self.batch_size} steps)")
        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")
        if self.devices > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")
        self.validate_parallel("a minibatch's transitions", self.batch_size // self.num_minibatches)

    @property
    def batch_size(self) -> int:
        """Transitions per update: num-envs x num-steps."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
