"""PQN (parallelised Q-learning: no replay, no target network, LayerNorm, Q(lambda)) in mixed precision."""

from genesis_jax.algos.pqn.config import PQNConfig, PQNFields
from genesis_jax.algos.pqn.train import PQN, train

__all__ = ["PQN", "PQNConfig", "PQNFields", "train"]
