"""DQN configuration: defaults are PureJaxRL's (CleanRL's) CartPole settings; `minatar`
gives the MinAtar ones."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.data.replay import check_replay_sizes
from genesis_jax.nets.torsos import NETWORKS
from genesis_jax.run.config import RESUMABLE_BASE_FIELDS, MixedPrecisionConfig
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class DQNFields:
    """DQN's own fields (`DQNConfig` adds the shared mixed-precision and data-parallel ones).
    Each field's text below is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ALE/Pong-v5, ...)."""
    env_backend: Literal["gymnax", "gymnasium"] | None = None
    """None: gymnax where it has the id, else gymnasium (Atari: pip install 'genesis-jax[atari]')."""
    total_steps: int = 500_000
    """Environment steps in all (all environments together)."""
    num_envs: int = 10
    """Environments stepped in parallel."""
    buffer_size: int = 10_000
    """Transitions the replay buffer holds (per seed)."""
    batch_size: int = 128
    """Transitions per gradient step."""
    lr: float = 2.5e-4
    """Adam's learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    train_frequency: int = 10
    """Environment steps (all environments together) per gradient step; a multiple of num-envs."""
    learning_starts: int = 10_000
    """Environment steps of pure collection before the first gradient step."""
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
    network: str | None = None
    """Torso: mlp | resmlp | cnn | impala. None: cnn for image observations, mlp otherwise."""
    hidden: tuple[int, ...] = (120, 84)
    """mlp: hidden widths."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """mlp: activation."""
    replay_dtype: Literal["float32", "compute"] = "float32"
    """How the buffer stores float observations: float32, or the compute dtype (fp16/bf16
    runs: half the memory, rounded once). Frames (MinAtar's 0/1, Atari's pixels) are stored as uint8 either way."""
    seed: int = 0
    """Seed of the parameters, the environments, exploration and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run (gymnax)."""
    row_steps: int = 5_000
    """Environment steps per metrics row (the template's position: progress and checkpoints fall on rows)."""
    updates_per_chunk: int | None = None
    """Rows per compiled chunk between progress reports. None: about 25 reports per run."""


@dataclasses.dataclass(frozen=True)
class DQNConfig(DQNFields, MixedPrecisionConfig, ParallelConfig):
    """A DQN run: `DQNFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = None  # CleanRL and PureJaxRL's DQN do not clip

    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk")

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        positive = (
            "total_steps",
            "num_envs",
            "buffer_size",
            "batch_size",
            "train_frequency",
            "target_update_interval",
            "epsilon_steps",
            "num_seeds",
            "row_steps",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        check_replay_sizes(self.buffer_size, self.batch_size)
        multiples = (
            ("train-frequency", self.train_frequency, "num-envs", self.num_envs),
            ("target-update-interval", self.target_update_interval, "train-frequency", self.train_frequency),
            ("row-steps", self.row_steps, "train-frequency", self.train_frequency),
        )
        for name, value, of_name, of in multiples:
            if value % of:
                raise ValueError(f"{name} {value} must be a multiple of {of_name} {of}")
        if self.total_steps < self.row_steps:
            raise ValueError(f"total-steps {self.total_steps} is less than one row (row-steps {self.row_steps})")
        if not 0 <= self.learning_starts < self.total_steps:  # at or past the end: not one gradient step
            raise ValueError(
                f"learning-starts must lie in [0, total-steps {self.total_steps}) for any gradient step to be "
                f"taken, got {self.learning_starts}"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not (0 <= self.gamma <= 1 and 0 < self.tau <= 1):
            raise ValueError(f"gamma must lie in [0, 1] and tau in (0, 1], got {self.gamma}, {self.tau}")
        if not (0 <= self.epsilon_end <= 1 and 0 <= self.epsilon_start <= 1):
            raise ValueError(f"epsilon-start and -end must lie in [0, 1], got {self.epsilon_start}, {self.epsilon_end}")
        if self.huber_delta is not None and not self.huber_delta > 0:
            raise ValueError(f"huber-delta must be > 0, got {self.huber_delta!r}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be positive integers, got {self.hidden!r}")
        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")
        if self.env_backend not in (None, "gymnax", "gymnasium"):
            raise ValueError(
                f"dqn runs on gymnax or gymnasium environments; env-backend {self.env_backend!r} is not supported"
            )
        if self.updates_per_chunk is not None and self.updates_per_chunk < 1:
            raise ValueError(f"updates-per-chunk must be >= 1, got {self.updates_per_chunk}")
        if self.devices > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")
        self.validate_parallel("batch-size", self.batch_size)

    @property
    def num_rows(self) -> int:
        return self.total_steps // self.row_steps

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


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
