"""Seeds trained together under vmap are independent runs: seed k of an N-seed run is the
1-seed run with --seed seed+k, each seed keeps its own scaler, skips and divergence guard,
and one seed's overflow never skips another seed's step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.base import SEED_AXIS
from genesis_jax.run.writers import scalars
from tests.algos.toy_algorithm import Toy, ToyConfig

# vmap batches the matmuls: XLA's CPU kernels then sum in another order than the unbatched
# program does, so seed k matches its 1-seed run to float32 rounding, not bit for bit (see
# docs/study.md). Bit-identity holds between runs of the same program (resume tests).
FLOAT32_ROUNDING = dict(rtol=1e-5, atol=1e-6)


def poison_seed(index: int, every: int):
    """A gradient hook that makes seed `index`'s gradients infinite on every `every`-th step."""

    def hook(grads, state):
        hit = (jax.lax.axis_index(SEED_AXIS) == index) & (state.step % every == 0)
        return jax.tree.map(lambda g: g + jnp.where(hit, jnp.inf, 0.0).astype(g.dtype), grads)

    return hook


@pytest.mark.slow
def test_seed_k_of_n_is_the_one_seed_run_with_seed_plus_k():
    multi = Toy.train(ToyConfig(total_steps=64, num_seeds=3, seed=5), progress=False)
    assert multi.summary["seeds"] == [5, 6, 7]
    for k in range(3):
        alone = Toy.train(ToyConfig(total_steps=64, seed=5 + k), progress=False)
        np.testing.assert_allclose(multi.train_state.params["w"][k], alone.train_state.params["w"], **FLOAT32_ROUNDING)
        assert multi.metrics[-1]["loss_scale_per_seed"][k] == alone.metrics[-1]["loss_scale"]


def test_an_overflow_in_one_seed_skips_that_seed_alone():
    config = ToyConfig(total_steps=32, num_seeds=3, seed=0, precision="fp16")
    clean = Toy.train(config, progress=False)
    hit = Toy.train(config, progress=False, grad_transform=poison_seed(1, every=4))
    assert hit.summary["skipped_updates_per_seed"] == [0, 8, 0]  # steps 0, 4, ..., 28 of seed 1
    assert hit.summary["loss_scale_per_seed"] == [65536.0, 65536.0 / 2**8, 65536.0]
    assert [r["skipped_per_seed"] for r in hit.metrics[:5]] == [[0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0]]
    for k in (0, 2):  # the other seeds trained as if nothing happened
        np.testing.assert_allclose(hit.train_state.params["w"][k], clean.train_state.params["w"][k], **FLOAT32_ROUNDING)
    assert not np.allclose(hit.train_state.params["w"][1], clean.train_state.params["w"][1])


@pytest.mark.slow
def test_seeded_fault_injection_differs_per_seed_and_is_counted_per_seed():
    config = ToyConfig(total_steps=48, num_seeds=3, seed=2, precision="fp16", inject_nonfinite=0.2)
    result = Toy.train(config, progress=False)
    expected = [config.fault_injection(2 + k).count_nonfinite(48) for k in range(3)]
    assert result.summary["skipped_updates_per_seed"] == expected
    assert result.summary["injected_nonfinite_per_seed"] == expected
    assert len(set(expected)) > 1  # each seed's own fault steps, not one pattern for all
    alone = Toy.train(ToyConfig(total_steps=48, seed=3, precision="fp16", inject_nonfinite=0.2), progress=False)
    assert alone.summary["skipped_updates"] == expected[1]


def test_a_halted_seed_freezes_while_the_others_train_on():
    config = ToyConfig(total_steps=32, num_seeds=2, precision="fp16", max_consecutive_skips=2)
    result = Toy.train(config, progress=False, grad_transform=poison_seed(0, every=1))
    assert result.summary["halted_per_seed"] == [True, False]
    assert result.summary["stopped"] is None and len(result.metrics) == 32  # the run went on
    assert result.summary["skipped_updates_per_seed"][1] == 0
    assert np.all(result.train_state.params["w"][0] == 0.0)  # seed 0 never took a step
    assert result.metrics[-1]["halted_per_seed"] == [True, False] and not result.metrics[-1]["halted"]


def test_per_seed_columns_become_per_seed_tags():
    tags = scalars(
        {"update": 1, "loss_scale_per_seed": [2.0, 4.0], "episode_return_per_seed": [None, 3.0]}, ("update",)
    )
    assert tags == {"loss_scale/seed_0": 2.0, "loss_scale/seed_1": 4.0, "episode_return/seed_1": 3.0}
