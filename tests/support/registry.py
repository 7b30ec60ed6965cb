"""Every registered algorithm at its own `tiny` size (`Presets.tiny`), as a config and as a
command line, for the generic tests, and its tiny run trained once per test process
(`tiny_run`); run as a module (`python -m tests.support.registry devices`, with 4 forced CPU
devices) it trains each on 4 devices and prints the results."""

from __future__ import annotations

import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.algos import REGISTRY, get_algorithm
from genesis_jax.run.parallel import replicas_agree

NAMES = sorted(REGISTRY)
# The precisions whose tiny runs tests/algos/test_registry.py trains anyway (the 1-seed fp32 run, the fp16
# run never interrupted) and checks with `check_a_few_updates`; tests/algos/test_every_precision.py, the rest.
CHECKED_IN_REGISTRY = ("fp32", "fp16")
STORED = {"fp32": jnp.float32, "bf16": jnp.float32, "fp16": jnp.float32, "fp16-full": jnp.float16}
# SAC in fp16-full trains two seeds: its skips (three optimizers, the seeds apart) are counted per seed too.
TWO_SEEDS = {("sac", "fp16-full")}


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


def train_states(state) -> list:
    """The amp train states in an algorithm's state (SAC has three)."""
    is_train_state = lambda x: hasattr(x, "scaler")  # noqa: E731
    return [leaf for leaf in jax.tree.leaves(state, is_leaf=is_train_state) if is_train_state(leaf)]


def check_a_few_updates(name, precision, result):
    """`result`, a run of `name` at `precision`, stores its params as the precision does, finite,
    took optimizer steps, and counts its skips one way in its summary, its rows and its states."""
    two_seeds = (name, precision) in TWO_SEEDS
    states = train_states(result.state)
    assert states, "no amp train state found"
    for ts in states:
        for leaf in jax.tree.leaves(ts.params):
            assert leaf.dtype == STORED[precision], (name, precision, leaf.dtype)
            assert np.isfinite(np.asarray(leaf, np.float32)).all()
        assert int(np.max(ts.step)) > 0  # it took optimizer steps, not only skips
    # One meaning of "skipped": every optimizer's skips, in the summary and added up over the rows.
    skipped = sum(int(np.sum(ts.skipped)) for ts in states)
    assert result.summary["skipped_updates"] == skipped == sum(row["skipped"] for row in result.metrics)
    assert result.summary["total_updates"] == sum(int(np.sum(ts.step)) for ts in states)
    if two_seeds:
        # Per seed, every optimizer's skips too: they once counted the critic's only, while the
        # total counted all three.
        per_seed = sum(np.asarray(ts.skipped) for ts in states)
        assert per_seed.shape == (2,) and result.summary["skipped_updates_per_seed"] == per_seed.tolist()
        assert sum(per_seed) == result.summary["skipped_updates"] > 0
