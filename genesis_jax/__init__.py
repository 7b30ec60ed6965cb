"""genesis-jax: safe, fast reduced-precision reinforcement-learning training in JAX/Flax."""

from genesis_jax.checkpoint import CheckpointMismatchError, CheckpointStore
from genesis_jax.loss_scale import DynamicLossScale, NoOpLossScale, StaticLossScale, all_finite, make_loss_scale
from genesis_jax.precision import Precision, get_policy, get_precision, resolve_precision_name
from genesis_jax.trainer import MixedPrecisionTrainer
from genesis_jax.update import TrainState, mixed_precision_update, stats

__version__ = "0.1.0"

__all__ = [
    "CheckpointMismatchError",
    "CheckpointStore",
    "DynamicLossScale",
    "MixedPrecisionTrainer",
    "NoOpLossScale",
    "Precision",
    "StaticLossScale",
    "TrainState",
    "all_finite",
    "get_policy",
    "get_precision",
    "make_loss_scale",
    "mixed_precision_update",
    "resolve_precision_name",
    "stats",
]
