"""Every registered algorithm at its own `tiny` size (`Algorithm.tiny`), as a config and as a
command line, for the generic tests; run as a module (`python -m tests.support.registry
devices`, with 4 forced CPU devices) it trains each on 1 and on 4 devices and prints the results."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np

from genesis_jax.algos import REGISTRY, get_algorithm
from genesis_jax.run.parallel import replicas_agree

NAMES = sorted(REGISTRY)


def tiny_settings(name: str, **overrides) -> dict:
    return {**get_algorithm(name).tiny, **overrides}


def tiny_config(name: str, **overrides):
    """The algorithm's tiny config (fp32 unless `overrides` say otherwise)."""
    return get_algorithm(name).config_class(**tiny_settings(name, **overrides))


def tiny_argv(name: str, **overrides) -> list[str]:
    """`genesis-jax train NAME` options for the tiny config, --no-progress included."""
    argv = []
    for field, value in tiny_settings(name, **overrides).items():
        flag = "--" + field.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + field.replace("_", "-"))
        else:
            argv += [flag, *map(str, value if isinstance(value, tuple) else (value,))]
    return argv + ["--no-progress"]


def on_one_and_four_devices() -> dict:
    """Each algorithm's tiny run (fp32) on 1 and on 4 devices: optimizer steps, parameters, and
    whether every device holds the same copy of each replicated leaf of the state."""
    runs = {}
    for name in NAMES:
        algorithm = get_algorithm(name)
        runs[name] = []
        for devices in (1, 4):
            result = algorithm.train(tiny_config(name, devices=devices), progress=False)
            ts, leaves = result.train_state, jax.tree.leaves(result.state)
            params = [np.asarray(x, np.float32).ravel().tolist() for x in jax.tree.leaves(ts.params)]
            replicated = [x for x in leaves if isinstance(x, jax.Array) and x.is_fully_replicated]
            agree = all(replicas_agree(x) for x in replicated)
            runs[name].append({"updates": int(np.sum(ts.step)), "params": params, "replicas_agree": agree})
    return {"device_count": jax.device_count(), "algorithms": runs}


if __name__ == "__main__":
    assert sys.argv[1:] == ["devices"], sys.argv
    print("RESULT " + json.dumps(on_one_and_four_devices()))
