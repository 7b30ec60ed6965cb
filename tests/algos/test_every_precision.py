"""Every registered algorithm trains a few updates at every precision: fp16-full (float16
params and optimizer moments) included, its targets and Adam's eps included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax import algos
from genesis_jax.algos import get_algorithm
from tests.algos.test_dqn import TINY as DQN_TINY
from tests.algos.test_sac import TINY as SAC_TINY

# A few updates of each registered algorithm (a new algorithm adds its own line): the
# algorithms' own test sizes, shorter still.
TINY = {
    "ppo": dict(total_steps=256, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=2, hidden=(16,)),
    "dqn": {
        **DQN_TINY,
        "total_steps": 400,
        "learning_starts": 100,
        "buffer_size": 400,
        "batch_size": 16,
        "target_update_interval": 2,  # every update: the target's cond runs on the online params
        "epsilon_steps": 200,
    },
    "sac": {**SAC_TINY, "total_steps": 32, "buffer_size": 64, "hidden": (16,)},
    "world-model": dict(epochs=1, num_sequences=32, sequence_length=8, batch_size=64, width=16, depth=1),
}
PRECISIONS = ("fp32", "bf16", "fp16", "fp16-full")
STORED = {"fp32": jnp.float32, "bf16": jnp.float32, "fp16": jnp.float32, "fp16-full": jnp.float16}


def test_every_registered_algorithm_has_a_tiny_config():
    assert set(TINY) == set(algos.REGISTRY)


def train_states(state) -> list:
    """The amp train states in an algorithm's state (SAC has three)."""
    is_train_state = lambda x: hasattr(x, "loss_scale")  # noqa: E731
    return [leaf for leaf in jax.tree.leaves(state, is_leaf=is_train_state) if is_train_state(leaf)]


@pytest.mark.slow  # 16 tiny trainings, each compiled: about 90 s
@pytest.mark.filterwarnings("ignore:precision 'fp16-full'")
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", sorted(TINY))
def test_a_few_updates_at_every_precision(name, precision):
    algorithm = get_algorithm(name)
    result = algorithm.train(algorithm.config_class(precision=precision, **TINY[name]), progress=False)
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


@pytest.mark.slow  # a two-seed SAC run in fp16-full: about 10 s
@pytest.mark.filterwarnings("ignore:precision 'fp16-full'")
def test_per_seed_skips_count_every_optimizer():
    # They once counted the critic's only, while the total counted all three.
    algorithm = get_algorithm("sac")
    config = algorithm.config_class(precision="fp16-full", num_seeds=2, **TINY["sac"])
    result = algorithm.train(config, progress=False)
    per_seed = sum(np.asarray(ts.skipped) for ts in train_states(result.state))
    assert result.summary["skipped_updates_per_seed"] == per_seed.tolist()
    assert sum(per_seed) == result.summary["skipped_updates"] > 0
