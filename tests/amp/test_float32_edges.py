"""Numerics at float32's edges: the global norm where squares overflow or flush to zero (and
a single array above 2^126, whose reciprocal is a denormal), fp16-full's cast of float32
gradients to float16 params, `update_scaler`'s refusals, and clipping above a norm of ~1.8e19.

Every program is compiled once per dtype and tree structure and reused; the hypothesis
examples are derandomized, with no example database.
"""

import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genesis_jax import amp
from genesis_jax.amp.optim import global_norm

PROFILE = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
NONFINITE = (float("inf"), float("-inf"), float("nan"))
pytestmark = pytest.mark.filterwarnings("ignore:precision 'fp16-full'", "ignore:overflow encountered in cast")


def as_float64(tree) -> np.ndarray:
    return np.concatenate([np.asarray(leaf).astype(np.float64).ravel() for leaf in jax.tree.leaves(tree)])


def assert_bit_identical(before, after):
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        b, a = np.asarray(b), np.asarray(a)
        assert (b.dtype, b.shape, b.tobytes()) == (a.dtype, a.shape, a.tobytes())


# --- the global norm -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tree",
    [
        jnp.array([3e38, 1.0]),  # one array above 2^126: 1 / max is a denormal, flushed to 0
        {"w": jnp.array([-(2.0**127), 5.0, 0.0])},
        {"b": jnp.zeros(3), "w": jnp.full(2, 1e-30)},  # squares that flush to 0
    ],
    ids=["single-3e38", "single-2^127", "tiny"],
)
def test_the_norm_of_a_single_huge_array_or_of_tiny_gradients_is_not_zero(tree):
    """The fallback scales by an exact power of two: the norm is float64's, and clipping clips."""
    reference = float(np.sqrt(np.sum(np.square(as_float64(tree)))))
    constants = jax.jit(lambda: global_norm(tree))()  # the tree folded into the program
    beside_zeros = jax.jit(lambda t: global_norm((t, jnp.zeros(3))))(tree)  # a constant leaf beside it
    for norm, finite in (global_norm(tree), jax.jit(global_norm)(tree), constants, beside_zeros):
        assert bool(finite) and float(norm) == pytest.approx(reference, rel=1e-6, abs=0)
    tx = amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=1.0)
    updates, _ = jax.jit(tx.update)(tree, tx.init(tree), tree)
    clipped = float(np.sqrt(np.sum(np.square(as_float64(updates)))))
    assert clipped == pytest.approx(min(1.0, reference), rel=1e-5, abs=0)


TREES = {"single": ((7,),), "many": ((3,), (2, 2), (1,), (5,))}
DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
# A tree's float32 or bfloat16 elements come from one range: any float32 up to 3.4e38, squares that
# flush to 0 (below 2^-64), or squares that overflow (above 2^64). Subnormals are left out: XLA's
# CPU backend reads them as 0. Float16 elements are any float16, subnormals included (normal in float32).
RANGES = {
    "any": st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32, allow_subnormal=False),
    "tiny": st.floats(-(2.0**-64), 2.0**-64, width=32, allow_subnormal=False),
    "huge": st.builds(operator.mul, st.floats(2.0**64, FLOAT32_MAX, width=32), st.sampled_from([-1.0, 1.0])),
}
NORM = jax.jit(global_norm)  # one program per dtype and tree structure


@st.composite
def gradient_trees(draw):
    """Leaves of one structure and dtype, one element sometimes made inf or NaN."""
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    if dtype == "float16":
        elements = st.floats(allow_nan=False, allow_infinity=False, width=16)
    else:
        elements = RANGES[draw(st.sampled_from(sorted(RANGES)))]
    leaves = []
    for shape in TREES[draw(st.sampled_from(sorted(TREES)))]:
        values = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
        leaves.append(np.asarray(values, np.float32).reshape(shape))
    if draw(st.integers(0, 4)) == 0:
        leaf = draw(st.integers(0, len(leaves) - 1))
        leaves[leaf].flat[draw(st.integers(0, leaves[leaf].size - 1))] = draw(st.sampled_from(NONFINITE))
    return [jnp.asarray(leaf).astype(DTYPES[dtype]) for leaf in leaves]


@settings(max_examples=150, **PROFILE)
@given(gradient_trees())
def test_the_global_norm_is_float64s_wherever_that_is_finite_in_float32(leaves):
    """Single-array and many-array trees of float32, float16 and bfloat16 gradients up to
    3.4e38: the norm is within 1e-5 of the float64 reference wherever that is finite in
    float32, and the finite flag says exactly whether every element is."""
    norm, finite = NORM(leaves)
    values = as_float64(leaves)
    assert bool(finite) == bool(np.all(np.isfinite(values)))
    reference = np.sqrt(np.sum(np.square(values)))
    if bool(finite) and reference <= FLOAT32_MAX:
        np.testing.assert_allclose(float(norm), reference, rtol=1e-5, atol=0)


def test_clipping_above_a_norm_of_1_8e19_clips_to_max_norm_where_torch_zeroes():
    """torch 2.13's clip_grad_norm_ (CPU) takes this norm as inf and zeroes the gradients."""
    state = amp.TrainState.create(params={"w": jnp.zeros(2)}, tx=optax.sgd(1.0), max_grad_norm=1.0)
    new = jax.jit(lambda s, g: s.apply_gradients(grads=g))(state, {"w": jnp.array([3e19, 4e19])})
    np.testing.assert_allclose(np.asarray(new.params["w"]), [-0.6, -0.8], rtol=1e-6)


# --- fp16-full: float32 gradients cast to float16 params ------------------------------------


def fp16_full_state(init_scale, strict, lr=1.0):
    return amp.TrainState.create(
        params={"w": jnp.ones(2)},
        tx=optax.sgd(lr),
        precision="fp16-full",
        scaler=amp.DynamicLossScale(init_scale=init_scale, growth_interval=2),
        strict=strict,
    )


def linear_loss(params, x):
    return jnp.sum(params["w"].astype(jnp.float32) * x)


@pytest.mark.parametrize("strict", [False, None], ids=["default", "strict-by-default"])
def test_fp16_full_skips_and_backs_off_where_float32_gradients_overflow_the_cast(strict):
    """Below a scale of 1 the scaled float16 gradient (25 000) is finite, the unscaled float32
    one (1e5) too, and its cast to the float16 params is inf: skipped, and the scale backs off."""
    state = fp16_full_state(0.5, strict)
    step = jax.jit(amp.train_step, static_argnums=1)
    for i in range(1, 4):
        new, metrics = step(state, linear_loss, jnp.full(2, 1e5))
        assert bool(metrics["grads_finite"])  # finite in float32
        assert_bit_identical(state.params, new.params)
        assert int(new.skipped) == i and int(new.skip_streak) == i
        assert float(new.scaler.loss_scale) == 0.5 / 2**i and int(new.scaler.growth_tracker) == 0
        assert int(new.scaler.backoffs) == i
        state = new


@functools.lru_cache(maxsize=None)
def fp16_full_base(strict):
    """One state (its optimizer a static field) per mode, so each program compiles once."""
    return fp16_full_state(1.0, strict, lr=1e-3)


@functools.lru_cache(maxsize=None)
def fp16_full_step(strict):
    """apply_gradients from float32 gradients, with the decision and scaler train_step gives it."""

    def step(state, grads):
        norm, finite = global_norm(grads)
        scaler = state.scaler.adjust(finite)
        return state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler)

    return jax.jit(step)


@settings(max_examples=60, **PROFILE)
@given(
    strict=st.sampled_from([False, None]),
    init_scale=st.sampled_from([2.0**-3, 1.0, 2.0**10]),
    steps=st.lists(
        st.lists(st.one_of(st.floats(-2e5, 2e5, width=32), st.sampled_from(NONFINITE)), min_size=2, max_size=2),
        min_size=1,
        max_size=4,
    ),
)
def test_fp16_full_never_applies_a_nonfinite_update_and_backs_off_on_each_skip(strict, init_scale, steps):
    """fp16-full, default mode (strict off) and strict mode: a step whose applied update (sgd's
    -1e-3 * the gradients as cast to float16) is not finite leaves the params bit-identical and
    is counted; every skip backs the scale off x0.5 and resets the growth tracker."""
    state = fp16_full_base(strict).replace(scaler=amp.DynamicLossScale(init_scale=init_scale, growth_interval=2))
    step = fp16_full_step(strict)
    for values in steps:
        grads = {"w": jnp.asarray(values, jnp.float32)}
        with np.errstate(over="ignore", invalid="ignore"):
            applied = -np.float16(1e-3) * np.asarray(values, np.float32).astype(np.float16)
        new = step(state, grads)
        skip = not np.all(np.isfinite(applied))
        assert int(new.skipped) == int(state.skipped) + skip
        scale, tracker = float(state.scaler.loss_scale), int(state.scaler.growth_tracker)
        if skip:
            assert_bit_identical(state.params, new.params)
            assert (float(new.scaler.loss_scale), int(new.scaler.growth_tracker)) == (scale / 2, 0)
            assert int(new.scaler.backoffs) == int(state.scaler.backoffs) + 1
        else:
            np.testing.assert_array_equal(np.asarray(new.params["w"]), np.asarray(state.params["w"]) + applied)
            grown = tracker + 1 == 2
            assert float(new.scaler.loss_scale) == (2 * scale if grown else scale)
            assert int(new.scaler.backoffs) == int(state.scaler.backoffs)
        state = new


# --- update_scaler's refusals -----------------------------------------------------------------


def shared_states(*scalers):
    return [
        amp.TrainState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(0.1), scaler=s, shared_scaler=True)
        for s in scalers
    ]


def stepped(*states):
    return [amp.train_step(s, linear_loss, jnp.ones(2))[0] for s in states]


def test_update_scaler_refuses_states_holding_different_scalers():
    actor, critic = stepped(*shared_states(amp.DynamicLossScale(2.0**10), amp.DynamicLossScale(2.0**8)))
    with pytest.raises(ValueError, match="hold different ones .*loss_scale=256.0.*: create each with the same scaler="):
        amp.update_scaler(actor, critic)
    actor, critic = stepped(*shared_states(amp.DynamicLossScale(2.0**10), amp.StaticLossScale(2.0**10)))
    with pytest.raises(ValueError, match="hold different ones"):  # under jit the types are compared
        jax.jit(amp.update_scaler)(actor, critic)
    # equal scalers, not the same arrays (each state built its own): fine
    actor, critic = stepped(*shared_states(amp.DynamicLossScale(2.0**10), amp.DynamicLossScale(2.0**10)))
    actor, critic = amp.update_scaler(actor, critic)
    assert float(actor.scaler.loss_scale) == float(critic.scaler.loss_scale) == 2.0**10


def test_update_scaler_refuses_a_call_with_no_step_since_the_last():
    """torch's update() raises with no inf checks recorded; a second call would count a clean iteration."""
    scaler = amp.DynamicLossScale(2.0**10, growth_interval=1)
    fresh = shared_states(scaler, scaler)
    with pytest.raises(ValueError, match="no step since its last call"):
        amp.update_scaler(*fresh)  # nothing stepped since create
    actor, critic = amp.update_scaler(*stepped(*fresh))
    assert float(actor.scaler.loss_scale) == 2.0**11
    with pytest.raises(ValueError, match="no step since its last call"):
        amp.update_scaler(actor, critic)
    with pytest.raises(ValueError, match="no step since its last call"):  # within one traced function
        jax.jit(lambda a, c: amp.update_scaler(*amp.update_scaler(a, c)))(*stepped(actor, critic))
    actor, critic = amp.update_scaler(stepped(actor)[0], critic)  # one optimizer stepped: an iteration
    assert float(actor.scaler.loss_scale) == float(critic.scaler.loss_scale) == 2.0**12
