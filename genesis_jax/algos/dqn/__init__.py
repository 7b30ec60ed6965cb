"""DQN in mixed precision on gymnax and gymnasium (ALE Atari) environments, with a flashbax replay buffer."""

from genesis_jax.algos.dqn.config import DQNConfig, DQNFields, minatar
from genesis_jax.algos.dqn.train import DQN, train

__all__ = ["DQN", "DQNConfig", "DQNFields", "minatar", "train"]
