"""A Flax world model trained in mixed precision on synthetic, random-policy or collected data."""

from genesis_jax.algos.base import RunResult as WorldModelResult
from genesis_jax.algos.world_model.config import WorldModelConfig, WorldModelFields
from genesis_jax.algos.world_model.train import WorldModelTrainer, train

__all__ = ["WorldModelConfig", "WorldModelFields", "WorldModelResult", "WorldModelTrainer", "train"]
