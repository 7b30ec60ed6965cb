"""genesis-jax: safe, fast reduced-precision reinforcement-learning training in JAX/Flax.

The package is layered (each layer imports only those below it):

- `genesis_jax.amp`: the precision core, usable alone in any JAX loop;
- `genesis_jax.nets`, `genesis_jax.envs`: Flax networks and environments;
- `genesis_jax.run`: a run's outer layer (session, run directory, checkpoints, writers,
  several devices and processes); beside it `genesis_jax.data`: replay buffers and
  trajectory datasets;
- `genesis_jax.algos`: the algorithms (PPO, DQN, SAC, PQN, the world model), each on one template;
- `genesis_jax.cli`: the front ends (the `genesis-jax` command; its bench, mismatch grid,
  study and demo in `genesis_jax/cli/`).

Names re-exported here load their module on first use, so `import genesis_jax.amp` loads
nothing else from the package.
"""

import importlib

__version__ = "0.4.4"

_EXPORTS = {
    "DynamicLossScale": "genesis_jax.amp",
    "NoOpLossScale": "genesis_jax.amp",
    "StaticLossScale": "genesis_jax.amp",
    "Precision": "genesis_jax.amp",
    "TrainState": "genesis_jax.amp",
    "get_precision": "genesis_jax.amp",
    "scaled_value_and_grad": "genesis_jax.amp",
    "skip_nonfinite": "genesis_jax.amp",
    "stats": "genesis_jax.amp",
    "train_step": "genesis_jax.amp",
    "update_scaler": "genesis_jax.amp",
    "CheckpointMismatchError": "genesis_jax.run.checkpoint",
    "CheckpointStore": "genesis_jax.run.checkpoint",
    "Session": "genesis_jax.run.session",
    "load": "genesis_jax.algos.evaluate",
    "evaluate": "genesis_jax.algos.evaluate",
}

__all__ = sorted(_EXPORTS)

# 0.2's names at the package root, removed in 0.4: the error names what to write now (amp's table).
_REMOVED = ("all_finite", "get_policy", "make_loss_scale", "resolve_precision_name")


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    removed = ""
    if name in _REMOVED:
        removed = f" (0.2's name, removed): use {importlib.import_module('genesis_jax.amp')._REMOVED[name]}"
    raise AttributeError(f"module 'genesis_jax' has no attribute {name!r}{removed}")
