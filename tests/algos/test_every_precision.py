"""Every registered algorithm trains a few updates at every precision: fp16-full (float16
params and optimizer moments) included, its targets and Adam's eps included. fp32 and fp16 are
checked (`check_a_few_updates`) on runs tests/algos/test_registry.py trains anyway: its 1-seed
fp32 run and its fp16 run never interrupted (16 times the tiny budget), no program compiled twice."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.registry import NAMES, tiny_run

PRECISIONS = ("fp32", "bf16", "fp16", "fp16-full")
CHECKED_IN_REGISTRY = ("fp32", "fp16")  # tests/algos/test_registry.py calls check_a_few_updates on those
STORED = {"fp32": jnp.float32, "bf16": jnp.float32, "fp16": jnp.float32, "fp16-full": jnp.float16}
# SAC in fp16-full trains two seeds: its skips (three optimizers, the seeds apart) are counted per seed too.
TWO_SEEDS = {("sac", "fp16-full")}


def train_states(state) -> list:
    """The amp train states in an algorithm's state (SAC has three)."""
    is_train_state = lambda x: hasattr(x, "scaler")  # noqa: E731
    return [leaf for leaf in jax.tree.leaves(state, is_leaf=is_train_state) if is_train_state(leaf)]


@pytest.mark.slow  # 2 tiny trainings per algorithm (fp32's and fp16's: tests/algos/test_registry.py), each compiled
@pytest.mark.filterwarnings("ignore:precision 'fp16-full'")
@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p not in CHECKED_IN_REGISTRY])
@pytest.mark.parametrize("name", NAMES)
def test_a_few_updates_at_every_precision(name, precision):
    two_seeds = (name, precision) in TWO_SEEDS
    check_a_few_updates(name, precision, tiny_run(name, precision=precision, **({"num_seeds": 2} if two_seeds else {})))


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
