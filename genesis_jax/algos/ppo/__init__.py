"""PPO in mixed precision on gymnax (JAX) and gymnasium (host) environments."""

from genesis_jax.algos.base import RunResult as PPOResult
from genesis_jax.algos.ppo.config import PPOConfig, PPOFields
from genesis_jax.algos.ppo.train import PPO, load_policy, train

__all__ = ["PPO", "PPOConfig", "PPOFields", "PPOResult", "load_policy", "train"]
