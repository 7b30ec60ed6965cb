"""PQN configuration: defaults are purejaxql's CartPole settings (Gallici et al. 2024)."""

from __future__ import annotations

import dataclasses

from genesis_jax.algos.base import ActingFields, Config
from genesis_jax.algos.explore import EpsilonGreedyFields
from genesis_jax.algos.onpolicy import OnPolicyFields
from genesis_jax.run.config import POSITIVE


@dataclasses.dataclass(frozen=True)
class PQNFields(OnPolicyFields, EpsilonGreedyFields, ActingFields):
    """PQN's fields: the shared groups it composes (environments, run, seeds, network,
    epsilon-greedy exploration, the on-policy update) and its own (`PQNConfig` adds the shared
    mixed-precision and data-parallel ones). Each field's text is also its `--help` line."""

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


@dataclasses.dataclass(frozen=True)
class PQNConfig(PQNFields, Config):
    """A PQN run: `PQNFields`, and the shared `Config` fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = 10.0  # purejaxql's

    FIELD_BOUNDS = {"reward_scale": POSITIVE}
    # PQN's first spellings, before it shared PPO's on-policy fields: a resume compares what they gave.
    RENAMED = {"num_epochs": "update_epochs", "lam": "gae_lambda"}
    RESUMABLE = tuple(RENAMED)

    def check(self):  # OnPolicyFields checks the rollout and its minibatches
        self.validate_parallel("a minibatch's transitions", self.minibatch_size)
