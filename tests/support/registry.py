"""Every registered algorithm at its own `tiny` size (`Presets.tiny`), as a config and as a
command line, for the generic tests, and its tiny run trained once per test process
(`tiny_run`); run as a module (`python -m tests.support.registry devices`, with 4 forced CPU
devices) it trains each on 4 devices and prints the results."""

from __future__ import annotations

import functools
import json
import sys

import jax
import numpy as np

from genesis_jax.algos import REGISTRY, get_algorithm
from genesis_jax.run.parallel import replicas_agree

NAMES = sorted(REGISTRY)


def tiny_settings(name: str, **overrides) -> dict:
    return {**get_algorithm(name).presets.tiny, **overrides}


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


def tiny_run(name: str, **overrides):
    """The algorithm's tiny run (`tiny_config(name, **overrides)`, no run directory), trained once
    per process and config: the tests that read the same run (its params, metrics, summary)
    share it and never change it."""
    return _trained(name, tiny_config(name, **overrides))


@functools.cache
def _trained(name: str, config):  # keyed by the config: precision="fp32" is the default's run
    return get_algorithm(name).train(config, progress=False)


def run_record(result) -> dict:
    """A run's optimizer steps, parameters (float32, flattened), and whether every device holds
    the same copy of each replicated leaf of its state."""
    ts, leaves = result.train_state, jax.tree.leaves(result.state)
    params = [np.asarray(x, np.float32).ravel().tolist() for x in jax.tree.leaves(ts.params)]
    replicated = [x for x in leaves if isinstance(x, jax.Array) and x.is_fully_replicated]
    agree = all(replicas_agree(x) for x in replicated)
    return {"updates": int(np.sum(ts.step)), "params": params, "replicas_agree": agree}


def on_four_devices() -> dict:
    """Each algorithm's tiny run (fp32) on 4 devices (`run_record`); the test compares it with the
    1-device run in its own process (`tiny_run`)."""
    runs = {name: run_record(tiny_run(name, devices=4)) for name in NAMES}
    return {"device_count": jax.device_count(), "algorithms": runs}


if __name__ == "__main__":
    assert sys.argv[1:] == ["devices"], sys.argv
    print("RESULT " + json.dumps(on_four_devices()))
