"""PPO in mixed precision on gymnax (JAX) and gymnasium (host) environments."""

from genesis_jax.ppo.config import PPOConfig, PPOFields
from genesis_jax.ppo.train import PPOResult, train

__all__ = ["PPOConfig", "PPOFields", "PPOResult", "train"]
