"""amp 0.3 in the loop styles it claims: a `TrainState` subclass with a required field (as
CleanRL and SBX subclass Flax's), and Flax NNX (`amp.Optimizer`, `scaled_value_and_grad` of the module)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx, serialization

from genesis_jax import amp
from genesis_jax.amp.optim import find_skip_state as skip_state


class RLTrainState(amp.TrainState):
    target_params: Any  # required: no default, after the parent's keyword-only fields


def loss_fn(params, x, y):  # the matmul in float16, as fp16 computes; the loss in float32
    prediction = x.astype(jnp.float16) @ params["w"].astype(jnp.float16)
    return jnp.mean((prediction.astype(jnp.float32) - y) ** 2)


def test_a_subclass_with_a_required_field_creates_steps_under_jit_and_round_trips():
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match="target_params"):
        RLTrainState.create(params=params, tx=optax.sgd(0.1))  # required means required
    state = RLTrainState.create(
        params=params, target_params={"w": jnp.zeros(3)}, tx=optax.adam(1e-2), precision="fp16", max_grad_norm=1.0
    )
    assert isinstance(state, RLTrainState) and type(state.scaler).__name__ == "DynamicLossScale"
    x, y = jnp.full((4, 3), 0.1), jnp.zeros(4)  # its float16 gradients below 65504 at the scale 2^16

    @jax.jit
    def step(state, x, y):
        state, metrics = amp.train_step(state, loss_fn, x, y)
        return state.replace(
            target_params=jax.tree.map(lambda t, p: 0.5 * t + 0.5 * p, state.target_params, state.params)
        ), metrics

    state, metrics = step(state, x, y)
    state, _ = step(state, x * jnp.inf, y)  # a skipped step keeps the subclass too
    assert isinstance(state, RLTrainState) and bool(metrics["grads_finite"])
    assert int(state.step) == 2 and int(state.skipped) == 1 and float(state.scaler.loss_scale) == 2.0**15
    assert not np.array_equal(state.params["w"], params["w"])
    np.testing.assert_allclose(
        state.target_params["w"], 0.5 * (0.5 * 0.0 + 0.5 * state.params["w"]) + 0.5 * state.params["w"]
    )

    blob = serialization.to_bytes(state)
    target = RLTrainState.create(
        params={"w": jnp.zeros(3)},
        target_params={"w": jnp.full(3, 7.0)},
        tx=optax.adam(1e-2),
        precision="fp16",
        max_grad_norm=1.0,
    )
    restored = serialization.from_bytes(target, blob)
    assert isinstance(restored, RLTrainState) and restored.precision == "fp16"
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        assert np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    restored, _ = step(restored, x, y)  # and trains on
    assert int(restored.step) == 3


class HalfMLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(3, 8, dtype=jnp.float16, rngs=rngs)
        self.out = nnx.Linear(8, 1, dtype=jnp.float16, rngs=rngs)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x)))[:, 0]


def nnx_loss(model, x, y):
    return jnp.mean((model(x).astype(jnp.float32) - y) ** 2)


def nnx_view(model, optimizer):
    """Params and the optimizer's own state (Adam's count and moments; not the skip counts) as bytes."""
    leaves = jax.tree.leaves((nnx.state(model, nnx.Param), skip_state(optimizer.opt_state).inner_state))
    return [(np.asarray(v).dtype, np.asarray(v).tobytes()) for v in leaves]


def test_an_nnx_loop_skips_a_nonfinite_step_bit_identically_and_stats_count_it():
    model = HalfMLP(nnx.Rngs(0))
    assert model.hidden.kernel[...].dtype == jnp.float32  # float32 master params, float16 compute
    scaler = amp.DynamicLossScale(init_scale=2.0**10)
    optimizer = amp.Optimizer(model, optax.adam(1e-2), precision="fp16", scaler=scaler, max_grad_norm=1.0)
    grad_fn = amp.scaled_value_and_grad(nnx_loss)

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads, finite, norm, _ = grad_fn(optimizer, model, x, y)  # the scale from the optimizer
        optimizer.update(model, grads, grads_finite=finite, grad_norm=norm)  # which stores the adjusted one
        return loss, finite

    x = jax.random.normal(jax.random.PRNGKey(1), (32, 3))
    y = jnp.sin(x).sum(-1)
    first, finite = step(model, optimizer, x, y)
    assert bool(finite)
    for _ in range(20):
        loss, finite = step(model, optimizer, x, y)
        assert bool(finite)
    assert float(loss) < float(first)

    before = nnx_view(model, optimizer)
    _, finite = step(model, optimizer, x.at[3, 1].set(jnp.inf), y)
    scaler = optimizer.scaler.get_value()
    assert not bool(finite) and float(scaler.loss_scale) == 2.0**9 and int(scaler.backoffs) == 1
    assert nnx_view(model, optimizer) == before  # params and optimizer state bit-identical
    counts = amp.stats(optimizer)
    assert counts == {
        "steps": 22,
        "skipped": 1,
        "skip_rate": 1 / 22,
        "halted": False,
        "scale": 2.0**9,
        "backoffs": 1,
        "precision": "fp16",
    }
    _, finite = step(model, optimizer, x, y)
    assert bool(finite) and nnx_view(model, optimizer) != before and amp.stats(optimizer)["steps"] == 23


class Weights(nnx.Module):
    def __init__(self, w):
        self.w = nnx.Param(w)


def every_style(params, grads, tx, **options):
    """One update of `params` by `grads`, given as finite (the step checks them itself, as cast to
    the params), in linen, NNX and a pure pytree loop: each style's (skipped, halted, scale after,
    new params). The pytree loop passes the backed-off scale, as `skip_nonfinite`'s guard reads it."""
    grads_finite = jnp.asarray(True)
    scaler = amp.DynamicLossScale(init_scale=2.0)
    linen = amp.TrainState.create(params=params, tx=tx, scaler=scaler, **options)
    linen = jax.jit(lambda s: s.apply_gradients(grads=grads, grads_finite=grads_finite))(linen)
    model = Weights(params["w"])
    optimizer = amp.Optimizer(model, tx, scaler=scaler, **options)
    optimizer.update(model, nnx.State({"w": nnx.Param(grads["w"])}), grads_finite=grads_finite)
    pytree = amp.skip_nonfinite(tx, **options)
    backed_off = scaler.adjust(jnp.asarray(False)).loss_scale
    updates, opt_state = pytree.update(
        grads, pytree.init(params), params, grads_finite=grads_finite, loss_scale=backed_off
    )
    states = [
        (linen.opt_state, linen.scaler, linen.params["w"]),
        (nnx.as_pure(optimizer.opt_state), optimizer.scaler.get_value(), model.w[...]),
        (opt_state, None, optax.apply_updates(params, updates)["w"]),
    ]
    return [
        (int(skip_state(s).skipped), bool(skip_state(s).halted), scaler and float(scaler.loss_scale), np.asarray(w))
        for s, scaler, w in states
    ]


def test_every_style_skips_a_step_whose_params_would_overflow_in_one_body():
    """Finite float32 gradients whose sgd step overflows: strict mode skips it in linen, NNX
    and a pure pytree loop alike; the guard of each sees the scale the skip leads to (the
    backed-off one, 1.0, below its floor 1.5) and halts, so the scaler is kept."""
    guard = amp.DivergenceGuard(min_scale=1.5, max_consecutive_skips=None)
    params = {"w": jnp.full(2, 1e38)}
    outcomes = every_style(params, {"w": jnp.full(2, -10.0)}, optax.sgd(1e38), strict=True, guard=guard)
    for skipped, halted, scale, w in outcomes:
        assert (skipped, halted, scale in (None, 2.0)) == (1, True, True) and np.array_equal(w, params["w"])


def test_every_style_decides_on_the_gradients_cast_to_float16_params():
    """Float32 gradients of 1e5, finite, but inf once cast to float16 params (fp16-full's):
    every style skips the step and backs off (NNX and the pytree loop once applied them
    uncast, and wrote inf into the params)."""
    params = {"w": jnp.ones(2, jnp.float16)}
    outcomes = every_style(params, {"w": jnp.full(2, 1e5)}, optax.sgd(1.0), strict=False)
    for skipped, halted, scale, w in outcomes:
        assert (skipped, halted, scale in (None, 1.0)) == (1, False, True) and np.array_equal(w, params["w"])


def test_a_halted_nnx_optimizer_counts_no_more_steps_as_a_halted_train_state():
    """The guard halts both styles on the second non-finite step in a row; every update after
    that is skipped uncounted, and neither `step` advances (NNX's once kept counting)."""
    guard = amp.DivergenceGuard(min_scale=None, max_consecutive_skips=1)
    params, nan = {"w": jnp.ones(2)}, {"w": jnp.full(2, jnp.nan)}
    linen = amp.TrainState.create(params=params, tx=optax.sgd(0.1), guard=guard)
    model = Weights(params["w"])
    optimizer = amp.Optimizer(model, optax.sgd(0.1), guard=guard)
    for _ in range(5):
        linen = linen.apply_gradients(grads=nan)
        optimizer.update(model, nnx.State({"w": nnx.Param(nan["w"])}))
    assert bool(linen.halted) and bool(skip_state(nnx.as_pure(optimizer.opt_state)).halted)
    assert int(linen.step) == int(optimizer.step[...]) == 2  # the two steps before the halt
    assert amp.stats(optimizer)["steps"] == amp.stats(linen)["steps"] == 2
    assert amp.stats(optimizer)["skipped"] == amp.stats(linen)["skipped"] == 2
    np.testing.assert_array_equal(model.w[...], params["w"])
