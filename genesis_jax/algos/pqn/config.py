"""PQN configuration: defaults are purejaxql's CartPole settings (Gallici et al. 2024)."""

from __future__ import annotations

import dataclasses
import warnings

from genesis_jax.algos.explore import EpsilonGreedyFields
from genesis_jax.algos.onpolicy import OnPolicyFields
from genesis_jax.run.config import (
    POSITIVE,
    EnvFields,
    MixedPrecisionConfig,
    NetworkFields,
    RunFields,
    SeedFields,
)
from genesis_jax.run.parallel import ParallelConfig


@dataclasses.dataclass(frozen=True)
class PQNFields(OnPolicyFields, EpsilonGreedyFields, NetworkFields, SeedFields, RunFields, EnvFields):
    """PQN's fields: the shared groups it composes (environments, run, seeds, network,
    epsilon-greedy exploration, the on-policy update) and its own (`PQNConfig` adds the shared
    mixed-precision and data-parallel ones). Each field's text is also its `--help` line."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ...)."""
    num_envs: int = 32
    """Environments stepped in parallel: PQN's decorrelation, in place of a replay buffer."""
    num_steps: int = 64
    num_minibatches: int = 16
    lr: float = 1e-4
    reward_scale: float = 0.1
    """Rewards are multiplied by this before they enter the targets."""
    epsilon_end: float = 0.2
    epsilon_fraction: float = 0.2
    hidden: tuple[int, ...] = (256, 256)
    """mlp: hidden widths, each layer followed by LayerNorm."""
    num_epochs: int | None = None
    """Deprecated (goes in 0.5): update-epochs."""
    lam: float | None = None
    """Deprecated (goes in 0.5): gae-lambda."""


# PQN's first spellings, before it shared PPO's on-policy fields: old name -> today's.
RENAMED = {"num_epochs": "update_epochs", "lam": "gae_lambda"}


@dataclasses.dataclass(frozen=True)
class PQNConfig(PQNFields, MixedPrecisionConfig, ParallelConfig):
    """A PQN run: `PQNFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 10.0  # purejaxql's

    FIELD_BOUNDS = {"reward_scale": POSITIVE}
    RESUMABLE = tuple(RENAMED)  # `check_resume` compares what they gave

    def __post_init__(self):
        for old, new in RENAMED.items():  # the old spellings, read for a release
            if getattr(self, old) is not None:
                flag, new_flag = old.replace("_", "-"), new.replace("_", "-")
                warnings.warn(f"{flag} is deprecated and goes in 0.5: write {new_flag}", FutureWarning, stacklevel=3)
                object.__setattr__(self, new, getattr(self, old))
                object.__setattr__(self, old, None)
        super().__post_init__()

    def check_resume(self, saved: dict) -> None:
        """A run recorded under the old spellings resumes with the same update-epochs and gae-lambda."""
        for old, new in RENAMED.items():
            value = saved.get(old)
            if value is not None and value != getattr(self, new):
                flag = new.replace("_", "-")
                raise ValueError(
                    f"this run's {flag} is {value}, these settings' {getattr(self, new)}: resume with --{flag} {value}"
                )

    def check(self):  # OnPolicyFields checks the rollout and its minibatches
        self.validate_parallel("a minibatch's transitions", self.minibatch_size)
