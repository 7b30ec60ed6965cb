"""Flax modules: compute in the policy's dtype, params in float32, outputs in float32."""

from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.mlp import MLP

__all__ = ["Dense", "MLP", "ActorCritic"]
