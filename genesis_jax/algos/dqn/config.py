"""DQN configuration: defaults are PureJaxRL's (CleanRL's) CartPole settings; `minatar`
gives the MinAtar ones."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.run.config import (
    POSITIVE,
    POSITIVE_INT,
    RATE,
    UNIT_INTERVAL,
    EnvFields,
    MixedPrecisionConfig,
    NetworkFields,
    ReplayFields,
    RunFields,
    SeedFields,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class DQNFields(NetworkFields, ReplayFields, SeedFields, RunFields, EnvFields):
    """DQN's fields: the shared groups it composes (environments, run, seeds, replay, network)
    and its own (`DQNConfig` adds the shared mixed-precision and data-parallel ones). Each
    field's text is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ALE/Pong-v5, ...)."""
    num_envs: int = 10
    buffer_size: int = 10_000
    batch_size: int = 128
    lr: float = 2.5e-4
    """Adam's learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    train_frequency: int = 10
    """Environment steps (all environments together) per gradient step; a multiple of num-envs."""
    target_update_interval: int = 500
    """Environment steps between target-network updates; a multiple of train-frequency."""
    tau: float = 1.0
    """Target update: target <- tau * online + (1 - tau) * target. 1: a copy (periodic); < 1: Polyak."""
    epsilon_start: float = 1.0
    """Exploration's epsilon at the start."""
    epsilon_end: float = 0.05
    """Exploration's epsilon after epsilon-steps."""
    epsilon_steps: int = 250_000
    """Environment steps over which epsilon falls linearly from start to end."""
    double_q: bool = True
    """Double DQN: the online network picks the next action, the target network values it."""
    huber_delta: float | None = None
    """The Huber loss's delta (where the TD loss turns from quadratic to linear). None: the
    squared TD error (CleanRL, PureJaxRL): on CartPole's returns of 100s, a delta of 1 makes the
    loss nearly L1, which ignores the few terminal transitions, and the Q-values diverge."""
    hidden: tuple[int, ...] = (120, 84)
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """mlp: activation."""
    replay_dtype: Literal["float32", "compute"] = "float32"
    """How the buffer stores float observations: float32, or the compute dtype (fp16/bf16
    runs: half the memory, rounded once). Frames (MinAtar's 0/1, Atari's pixels) are stored as uint8 either way."""
    row_steps: int = 5_000
    """Environment steps per metrics row (the template's step: progress and checkpoints fall on rows)."""


@dataclasses.dataclass(frozen=True)
class DQNConfig(DQNFields, MixedPrecisionConfig, ParallelConfig):
    """A DQN run: `DQNFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = None  # CleanRL and PureJaxRL's DQN do not clip

    FIELD_BOUNDS = {
        **{n: POSITIVE_INT for n in ("train_frequency", "target_update_interval", "epsilon_steps", "row_steps")},
        "lr": POSITIVE,
        "gamma": UNIT_INTERVAL,
        "tau": RATE,
        "epsilon_start": UNIT_INTERVAL,
        "epsilon_end": UNIT_INTERVAL,
        "huber_delta": POSITIVE,
    }
    FIELD_MULTIPLES = {  # gradient steps, target updates and rows fall on whole vector steps
        "train_frequency": "num_envs",
        "target_update_interval": "train_frequency",
        "row_steps": "train_frequency",
    }

    def check(self):
        if self.total_steps < self.row_steps:
            raise ValueError(f"total-steps {self.total_steps} is less than one row (row-steps {self.row_steps})")
        if not self.learning_starts < self.total_steps:  # at or past the end: not one gradient step
            raise ValueError(
                f"learning-starts must lie in [0, total-steps {self.total_steps}) for any gradient step to be "
                f"taken, got {self.learning_starts}"
            )
        self.validate_parallel("batch-size", self.batch_size)

    @property
    def num_rows(self) -> int:
        return self.total_steps // self.row_steps


def minatar(env: str = "Breakout-MinAtar", **overrides) -> DQNConfig:
    """MinAtar settings in the manner of CleanRL's Atari DQN and the MinAtar paper (Young &
    Tian 2019): a 100k buffer, batch 32, a gradient step every 4 environment steps, a target
    copy every 1000, epsilon 1 -> 0.01 over the first 10% of 5M steps, the CNN torso.

    >>> minatar(total_steps=1_000_000).buffer_size
    100000
    """
    settings = dict(
        env=env,
        total_steps=5_000_000,
        num_envs=4,
        buffer_size=100_000,
        batch_size=32,
        lr=1e-4,
        train_frequency=4,
        learning_starts=20_000,
        target_update_interval=1_000,
        epsilon_end=0.01,
        epsilon_steps=500_000,
        row_steps=20_000,
        network="cnn",
        huber_delta=1.0,
    )
    return DQNConfig(**{**settings, **overrides})
