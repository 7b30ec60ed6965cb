"""PQN configuration: defaults are purejaxql's CartPole settings (Gallici et al. 2024)."""

from __future__ import annotations

import dataclasses

from genesis_jax.algos.explore import EpsilonGreedyFields
from genesis_jax.run.config import (
    POSITIVE,
    POSITIVE_INT,
    UNIT_INTERVAL,
    EnvFields,
    MixedPrecisionConfig,
    NetworkFields,
    RunFields,
    SeedFields,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class PQNFields(EpsilonGreedyFields, NetworkFields, SeedFields, RunFields, EnvFields):
    """PQN's fields: the shared groups it composes (environments, run, seeds, network,
    epsilon-greedy exploration) and its own (`PQNConfig` adds the shared mixed-precision and
    data-parallel ones). Each field's text is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ...)."""
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
    epsilon_end: float = 0.2
    epsilon_fraction: float = 0.2
    hidden: tuple[int, ...] = (256, 256)
    """mlp: hidden widths, each layer followed by LayerNorm."""


@dataclasses.dataclass(frozen=True)
class PQNConfig(PQNFields, MixedPrecisionConfig, ParallelConfig):
    """A PQN run: `PQNFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 10.0  # purejaxql's

    FIELD_BOUNDS = {
        **{n: POSITIVE_INT for n in ("num_steps", "num_epochs", "num_minibatches")},
        "lr": POSITIVE,
        "reward_scale": POSITIVE,
        **{n: UNIT_INTERVAL for n in ("gamma", "lam")},
    }

    def check(self):
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} is not divisible into {self.num_minibatches} minibatches"
            )
        if self.total_steps < self.batch_size:
            raise ValueError(f"total-steps {self.total_steps} is less than one update ({self.batch_size} steps)")
        self.validate_parallel("a minibatch's transitions", self.batch_size // self.num_minibatches)

    @property
    def batch_size(self) -> int:
        """Transitions per update: num-envs x num-steps."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size
