import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import CheckpointMismatchError, CheckpointStore, DynamicLossScale, NoOpLossScale, TrainState
from tests.support.helpers import mlp_loss, regression_problem


def make_state(hidden=(32, 32), scaler=None, precision="fp16", seed=1):
    x, _ = regression_problem()
    model, _ = mlp_loss(jnp.float16, hidden)
    params = model.init(jax.random.PRNGKey(seed), x)
    scaler = (
        scaler
        if scaler is not None
        else DynamicLossScale(
            init_scale=512.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=17, min_scale=2.0
        )
    )
    state = TrainState.create(params=params, tx=optax.adam(1e-3), loss_scale=scaler, precision=precision)
    # move every counter away from its default
    inner = jax.tree.map(
        lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x + 2, state.opt_state.inner_state
    )
    return state.replace(
        step=jnp.asarray(41, jnp.int32),
        loss_scale=state.loss_scale.adjust(jnp.asarray(True)),
        opt_state=state.opt_state._replace(
            inner_state=inner,
            skipped=jnp.asarray(3, jnp.int32),
            consecutive_skips=jnp.asarray(2, jnp.int32),
            halted=jnp.asarray(True),
        ),
    )


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_bit_exact(tmp_path):
    state = make_state()
    with CheckpointStore(tmp_path / "ck") as store:
        store.save(41, state, {"config": {"lr": 1e-3}})
    fresh = make_state(seed=5)
    fresh = fresh.replace(loss_scale=DynamicLossScale())
    with CheckpointStore(tmp_path / "ck") as store:
        restored, meta = store.restore(fresh)
    leaves_equal(restored, state)
    assert isinstance(restored.loss_scale, DynamicLossScale)
    assert float(restored.loss_scale.min_scale) == 2.0 and int(restored.loss_scale.growth_interval) == 17
    assert int(restored.loss_scale.growth_tracker) == 1
    assert meta["config"] == {"lr": 1e-3} and meta["precision"] == "fp16" and "jax" in meta["versions"]


def test_max_to_keep_and_latest(tmp_path):
    state = make_state()
    with CheckpointStore(tmp_path, max_to_keep=2) as store:
        for step in (1, 2, 3):
            store.save(step, state.replace(step=jnp.asarray(step, jnp.int32)))
        store.wait()
        assert store.all_steps() == [2, 3] and store.latest_step() == 3


def test_other_shape_is_named(tmp_path):
    with CheckpointStore(tmp_path) as store:
        store.save(1, make_state())
        with pytest.raises(
            CheckpointMismatchError,
            match=r"params/params/dense_0/kernel: checkpoint float32\[4,32\] vs run float32\[4,16\]",
        ):
            store.restore(make_state(hidden=(16, 32)))


def test_other_precision_is_named(tmp_path):
    with CheckpointStore(tmp_path) as store:
        store.save(1, make_state(precision="fp16"))
        with pytest.raises(CheckpointMismatchError, match="precision 'fp16'.*'bf16'"):
            store.restore(make_state(precision="bf16"))


def test_fp32_checkpoint_into_fp16_run_warns_and_starts_scaler_fresh(tmp_path, caplog):
    fp32 = make_state(scaler=NoOpLossScale(), precision="fp32")
    with CheckpointStore(tmp_path) as store:
        store.save(1, fp32)
        target = make_state(precision="fp16", seed=9).replace(loss_scale=DynamicLossScale())
        with caplog.at_level(logging.WARNING, logger="genesis_jax"):
            restored, _ = store.restore(target)
    assert "no loss-scaler state" in caplog.text
    leaves_equal(restored.params, fp32.params)
    assert float(restored.loss_scale.loss_scale) == 2.0**16 and int(restored.loss_scale.growth_tracker) == 0
    assert restored.precision == "fp16"


def test_empty_directory_is_a_clear_error(tmp_path):
    with CheckpointStore(tmp_path) as store:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            store.restore(make_state())
