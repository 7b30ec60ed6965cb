"""The algorithms, each on the template of `genesis_jax.algos.base`.

`REGISTRY` maps a `genesis-jax train NAME` subcommand to the module whose `ALGORITHM` is
the `Algorithm` subclass: registering a new algorithm is one line here. Modules load on
first use, so the CLI starts without importing every algorithm.
"""

import importlib

# name: (module, the `genesis-jax train` help line)
REGISTRY = {
    "ppo": ("genesis_jax.algos.ppo.train", "PPO on a gymnax, gymnasium or envpool environment"),
    "world-model": ("genesis_jax.algos.world_model.train", "a world model from trajectories"),
    "sac": ("genesis_jax.algos.sac.train", "SAC on a continuous-action gymnax or gymnasium environment"),
    "dqn": ("genesis_jax.algos.dqn.train", "DQN (double, Huber, replay buffer) on a gymnax environment"),
}


def get_algorithm(name: str):
    """The `Algorithm` subclass registered as `name`."""
    if name not in REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}; accepted: {', '.join(REGISTRY)}")
    return importlib.import_module(REGISTRY[name][0]).ALGORITHM
