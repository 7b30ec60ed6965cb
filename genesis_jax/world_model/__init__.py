"""A Flax world model trained in mixed precision from trajectories."""

from genesis_jax.world_model.train import WorldModelConfig, WorldModelFields, WorldModelResult, train

__all__ = ["WorldModelConfig", "WorldModelFields", "WorldModelResult", "train"]
