"""PPO in mixed precision on gymnax (JAX) and gymnasium (host) environments."""

from genesis_jax.algos.base import RunResult as PPOResult
from genesis_jax.algos.ppo.config import PPOConfig, PPOFields
from genesis_jax.algos.ppo.train import PPO, train

__all__ = ["PPO", "PPOConfig", "PPOFields", "PPOResult", "train"]
