"""SAC in mixed precision: twin critics, a tanh-Gaussian actor and a learned temperature,
three optimizers under one loss scaler, replay in flashbax."""

from genesis_jax.algos.base import RunResult as SACResult
from genesis_jax.algos.sac.config import SACConfig, SACFields
from genesis_jax.algos.sac.train import SAC, train

__all__ = ["SAC", "SACConfig", "SACFields", "SACResult", "train"]
