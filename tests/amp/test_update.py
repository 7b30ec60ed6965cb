import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import (
    DynamicLossScale,
    MixedPrecisionTrainer,
    NoOpLossScale,
    TrainState,
    mixed_precision_update,
    stats,
)
from genesis_jax.precision import get_precision
from tests.support.helpers import mlp_loss, regression_problem


def make_state(dtype=jnp.float16, scaler=None, precision="fp16"):
    x, y = regression_problem()
    model, loss_fn = mlp_loss(dtype)
    params = model.init(jax.random.PRNGKey(1), x)
    state = TrainState.create(params, optax.adam(1e-3), scaler or DynamicLossScale(), precision=precision)
    return state, loss_fn, (x, y)


def inject_at(target_step, value):
    def transform(grads, state):
        bad = state.step == target_step
        return jax.tree.map(lambda g: jnp.where(bad, jnp.full_like(g, value), g), grads)

    return transform


@pytest.mark.parametrize("value", [jnp.inf, jnp.nan, -jnp.inf])
def test_nonfinite_step_leaves_state_bit_identical(value):
    state, loss_fn, batch = make_state()
    update = jax.jit(functools.partial(mixed_precision_update, loss_fn=loss_fn, grad_transform=inject_at(1, value)))
    state, _ = update(state, batch)
    before = jax.device_get((state.params, state.opt_state))
    after_state, metrics = update(state, batch)
    after = jax.device_get((after_state.params, after_state.opt_state))
    assert not bool(metrics["grads_finite"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), before, after)
    assert int(after_state.skipped) == 1 and int(after_state.step) == 2
    assert float(after_state.loss_scale.loss_scale) == float(state.loss_scale.loss_scale) / 2
    # the next finite step moves the params again
    final, metrics = update(after_state, batch)
    assert bool(metrics["grads_finite"])
    assert not np.array_equal(final.params["params"]["dense_0"]["kernel"], after[0]["params"]["dense_0"]["kernel"])


def test_clipping_acts_on_unscaled_gradients():
    # With scale 2^10 a clip on the scaled gradients would shrink them 1024x more.
    state32, loss_fn, batch = make_state(jnp.float32, NoOpLossScale(), "fp32")
    tx = optax.sgd(1.0)
    s_plain = state32.replace(tx=tx, opt_state=tx.init(state32.params))
    s_scaled = s_plain.replace(loss_scale=DynamicLossScale(init_scale=2.0**10))
    out_plain, m_plain = mixed_precision_update(s_plain, batch, loss_fn, max_grad_norm=0.1)
    out_scaled, m_scaled = mixed_precision_update(s_scaled, batch, loss_fn, max_grad_norm=0.1)
    np.testing.assert_allclose(float(m_plain["grad_norm"]), float(m_scaled["grad_norm"]), rtol=1e-5)
    assert float(m_plain["grad_norm"]) > 0.1  # clipping was active
    delta = optax.tree.norm(jax.tree.map(lambda a, b: a - b, out_scaled.params, s_scaled.params))
    np.testing.assert_allclose(float(delta), 0.1, rtol=1e-4)


def test_jitted_step_compiles_once():
    state, loss_fn, batch = make_state()
    traces = []

    def counting_loss(p, b):
        traces.append(1)
        return loss_fn(p, b)

    update = jax.jit(functools.partial(mixed_precision_update, loss_fn=counting_loss))
    for _ in range(5):
        state, _ = update(state, batch)
    assert len(traces) == 1
    assert update._cache_size() == 1


def test_stats_counts():
    state, loss_fn, batch = make_state(scaler=DynamicLossScale(init_scale=2.0**40))
    update = jax.jit(functools.partial(mixed_precision_update, loss_fn=loss_fn))
    for _ in range(6):
        state, m = update(state, batch)
    s = stats(state)
    # 2^40 times a gradient overflows float16's 65504 until the scale has come down.
    assert s["training_steps"] == 6 and s["overflow_steps"] >= 1
    assert s["overflow_rate"] == s["overflow_steps"] / 6
    assert s["current_scale"] == 2.0 ** (40 - s["overflow_steps"])
    assert s["precision"] == "fp16"


def train_loss(precision, steps=300):
    x, y = regression_problem()
    prec = get_precision(precision)
    model, loss_fn = mlp_loss(prec.compute_dtype)
    params = model.init(jax.random.PRNGKey(1), x)
    trainer = MixedPrecisionTrainer(loss_fn, params, optax.adam(3e-3), prec, has_aux=True)
    for _ in range(steps):
        trainer.step((x, y))
    final = float(loss_fn(jax.tree.map(lambda p: p.astype(jnp.float32), trainer.params), (x, y))[0])
    return final, trainer.stats()


def test_fp16_training_reaches_fp32_loss():
    loss32, _ = train_loss("fp32")
    loss16, stats16 = train_loss("fp16")
    assert loss32 < 0.05  # it learned something
    assert abs(loss16 - loss32) / loss32 < 0.02
    assert stats16["training_steps"] == 300


def test_fp16_full_keeps_dtypes_through_steps():
    with pytest.warns(UserWarning):
        prec = get_precision("fp16-full")
    x, y = regression_problem()
    model, loss_fn = mlp_loss(jnp.float16)
    params = model.init(jax.random.PRNGKey(1), x)
    trainer = MixedPrecisionTrainer(loss_fn, params, optax.adam(1e-3), prec, has_aux=True)
    for _ in range(3):
        trainer.step((x, y))
    assert {leaf.dtype for leaf in jax.tree.leaves(trainer.params)} == {jnp.dtype(jnp.float16)}
