"""Property-based tests (hypothesis) of the amp pieces' promises, over generated optimizers,
precisions, loss-scale settings and step sequences with chosen non-finite steps:

- default mode: exactly the steps with a non-finite gradient are skipped, finite gradients
  too large to square in float32 included;
- strict mode: no non-finite value ever reaches the params or the optimizer state;
- a skipped step leaves the params and the optimizer state bit-identical;
- the loss scale stays finite, positive and at or above its floor;
- the skip count equals the number of non-finite steps, exactly.

Every program is compiled once per (optimizer, clipping, precision) and reused: the generated
values are data (scaler settings are pytree leaves, learning rates are injected hyperparameters),
so the bounded example counts keep this file in the fast lane. Examples are derandomized and no
example database is kept, so every run checks the same cases.
"""

import functools

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
SMALLEST_SCALE = 2.0**-126
SHAPES = {"w": (4,), "b": (2,)}
OPTIMIZERS = {
    "sgd": lambda: optax.sgd(0.1),
    "sgd_momentum": lambda: optax.sgd(0.1, momentum=0.9),
    "adam": lambda: optax.adam(1e-2),
}
NONFINITE = (float("inf"), float("-inf"), float("nan"))


def initial_params(dtype=jnp.float32):
    return {name: jnp.linspace(-1.0, 1.0, shape[0]).astype(dtype) for name, shape in SHAPES.items()}


def assert_bit_identical(before, after):
    """Same tree, and every leaf the same dtype, shape and bytes (-0.0 and NaN payloads included)."""
    assert jax.tree.structure(before) == jax.tree.structure(after)
    for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        b, a = np.asarray(b), np.asarray(a)
        assert (b.dtype, b.shape) == (a.dtype, a.shape)
        assert b.tobytes() == a.tobytes()


def assert_all_finite(tree):
    for leaf in jax.tree.leaves(tree):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64))), leaf


# Finite gradient values far from overflow for every optimizer here (squares stay below 2e30),
# tiny and subnormal ones included; a poisoned step puts one inf, -inf or NaN into one leaf.
finite_values = st.floats(min_value=-(2.0**50), max_value=2.0**50, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def gradient_steps(draw, max_steps=6):
    """[(grads, poisoned)]: each step's gradients, and whether it holds a non-finite value."""
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        grads = {
            name: np.array(draw(st.lists(finite_values, min_size=n, max_size=n)), np.float32)
            for name, (n,) in SHAPES.items()
        }
        poisoned = draw(st.booleans())
        if poisoned:
            leaf = draw(st.sampled_from(sorted(SHAPES)))
            grads[leaf][draw(st.integers(0, SHAPES[leaf][0] - 1))] = draw(st.sampled_from(NONFINITE))
        steps.append((grads, poisoned))
    return steps


@functools.lru_cache(maxsize=None)
def wrapped_step(optimizer: str, max_grad_norm, pass_decision: bool, strict: bool = False):
    """(tx, a jitted step (params, opt_state, grads) -> (params, opt_state)) for one configuration."""
    tx = amp.skip_nonfinite(OPTIMIZERS[optimizer](), max_grad_norm=max_grad_norm, strict=strict)

    @jax.jit
    def step(params, opt_state, grads):
        finite = global_norm(grads)[1] if pass_decision else None
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        return optax.apply_updates(params, updates), opt_state

    return tx, step


@pytest.mark.slow
@settings(max_examples=40, **PROFILE)
@given(
    # (optimizer, max_grad_norm, grads_finite passed or decided from the norm, strict): one program each
    config=st.sampled_from(
        [
            ("sgd", None, False, False),
            ("sgd_momentum", 0.5, True, False),
            ("adam", None, True, True),
            ("adam", 0.5, False, False),
            ("sgd", 0.5, False, True),
        ]
    ),
    steps=gradient_steps(),
)
def test_skip_nonfinite_skips_exactly_the_nonfinite_steps_and_keeps_everything_on_them(config, steps):
    tx, step = wrapped_step(*config)
    params = initial_params()
    opt_state = tx.init(params)
    for number, (grads, poisoned) in enumerate(steps, 1):
        new_params, new_state = step(params, opt_state, grads)
        assert_all_finite(new_params)
        skips = int(new_state.skipped) - int(opt_state.skipped)
        assert skips == int(poisoned)
        if poisoned:
            assert_bit_identical(params, new_params)
            assert_bit_identical(opt_state.inner_state, new_state.inner_state)
            assert int(new_state.consecutive_skips) == int(opt_state.consecutive_skips) + 1
        else:
            assert int(new_state.consecutive_skips) == 0
        params, opt_state = new_params, new_state
    assert int(opt_state.skipped) == sum(poisoned for _, poisoned in steps)


def reference_adjust(scale, tracker, finite, growth, backoff, interval, floor):
    """GradScaler's rule in numpy float32, with the scaler's floor max(min_scale, 2^-126)."""
    scale = np.float32(scale)
    if not finite:
        return max(np.float32(scale * np.float32(backoff)), np.float32(max(floor, SMALLEST_SCALE))), 0
    if tracker + 1 == interval:
        with np.errstate(over="ignore"):
            grown = np.float32(scale * np.float32(growth))
        return (grown if np.isfinite(grown) else scale), 0
    return scale, tracker + 1


@st.composite
def dynamic_scale_args(draw):
    init_scale = draw(st.sampled_from([SMALLEST_SCALE, 2.0**-20, 1.0, 2.0**8, 2.0**16, 2.0**24, FLOAT32_MAX / 2]))
    min_scale = draw(
        st.one_of(st.none(), st.sampled_from([SMALLEST_SCALE, 2.0**-10, 1.0]).filter(lambda m: m <= init_scale))
    )
    return {
        "init_scale": init_scale,
        "growth_factor": draw(st.sampled_from([1.5, 2.0, 4.0, 1e30])),
        "backoff_factor": draw(st.sampled_from([1e-30, 0.25, 0.5, 0.9])),
        "growth_interval": draw(st.integers(1, 3)),
        "min_scale": min_scale,
    }


@jax.jit
def adjust(scaler, finite):
    return scaler.adjust(finite)


@settings(max_examples=60, **PROFILE)
@given(args=dynamic_scale_args(), flags=st.lists(st.booleans(), min_size=1, max_size=40))
def test_the_dynamic_scale_follows_gradscaler_and_stays_finite_positive_and_above_its_floor(args, flags):
    scaler = amp.DynamicLossScale(**args)
    floor = max(args["min_scale"] or 0.0, SMALLEST_SCALE)
    scale, tracker = np.float32(args["init_scale"]), 0
    for finite in flags:
        scaler = adjust(scaler, jnp.asarray(finite))
        scale, tracker = reference_adjust(
            scale, tracker, finite, args["growth_factor"], args["backoff_factor"], args["growth_interval"], floor
        )
        got = np.asarray(scaler.loss_scale)
        assert got.dtype == np.float32 and np.isfinite(got) and got > 0 and got >= np.float32(floor)
        assert (float(got), int(scaler.growth_tracker)) == (float(scale), tracker)


@functools.lru_cache(maxsize=None)
def train_setup(precision: str, optimizer: str, max_grad_norm):
    """A template TrainState and its jitted train_step; each example swaps in its own scaler."""
    policy = amp.get_precision(precision).policy

    def loss_fn(params, x):
        # In the compute dtype, the loss summed in float32: d loss / d w = x.
        p, x = policy.cast_to_compute((params, x))
        return sum(jnp.sum((p[k] * x[k]).astype(jnp.float32)) for k in SHAPES), {}

    state = amp.TrainState.create(
        params=initial_params(), tx=OPTIMIZERS[optimizer](), precision=precision, max_grad_norm=max_grad_norm
    )
    return state, jax.jit(lambda state, x: amp.train_step(state, loss_fn, x, has_aux=True))


# Finite inputs small enough that no scale up to 2^24 overflows float32 or bfloat16 (float16 may).
small_values = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def input_steps(draw, max_steps=6):
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        x = {
            name: np.array(draw(st.lists(small_values, min_size=n, max_size=n)), np.float32)
            for name, (n,) in SHAPES.items()
        }
        poisoned = draw(st.booleans())
        if poisoned:
            x["w"][draw(st.integers(0, SHAPES["w"][0] - 1))] = draw(st.sampled_from(NONFINITE))
        steps.append((x, poisoned))
    return steps


@settings(max_examples=30, **PROFILE)
@given(
    # (precision, optimizer, max_grad_norm): every precision, optimizer and clipping, one program each
    config=st.sampled_from(
        [("fp32", "sgd", None), ("bf16", "adam", 1.0), ("fp16", "sgd", 1.0), ("fp16", "adam", None)]
    ),
    init_scale=st.sampled_from([1.0, 2.0**8, 2.0**16, 2.0**24]),
    growth_interval=st.integers(1, 3),
    min_scale=st.sampled_from([None, 2.0**-4, 1.0]),
    steps=input_steps(),
)
def test_train_step_in_every_precision_keeps_its_promises(config, init_scale, growth_interval, min_scale, steps):
    """amp.TrainState + amp.train_step with a dynamic scale: d loss / d w is the input, so a
    poisoned input is a non-finite step; in float16 a finite one may overflow too."""
    template, step = train_setup(*config)
    precision = config[0]
    scaler = amp.DynamicLossScale(init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale)
    state = template.replace(scaler=scaler)
    floor = max(min_scale or 0.0, SMALLEST_SCALE)
    nonfinite_steps, expected_scale, tracker = 0, np.float32(init_scale), 0
    for x, poisoned in steps:
        new, metrics = step(state, x)
        finite = bool(metrics["grads_finite"])
        if poisoned or precision != "fp16":  # float16 alone can overflow on these finite inputs
            assert finite == (not poisoned)
        nonfinite_steps += not finite
        assert int(new.skipped) == nonfinite_steps and int(new.step) == int(state.step) + 1
        assert_all_finite(new.params)
        if not finite:
            assert_bit_identical(state.params, new.params)
            assert_bit_identical(state.opt_state.inner_state, new.opt_state.inner_state)
        scale = np.asarray(new.scaler.loss_scale)
        assert np.isfinite(scale) and scale >= np.float32(floor) and scale > 0
        expected_scale, tracker = reference_adjust(expected_scale, tracker, finite, 2.0, 0.5, growth_interval, floor)
        assert float(scale) == float(expected_scale)
        state = new


@functools.lru_cache(maxsize=None)
def injected_sgd_step(strict: bool):
    """sgd with its learning rate in the state (one program for every rate), params given."""
    tx = amp.skip_nonfinite(optax.inject_hyperparams(optax.sgd)(learning_rate=1.0), strict=strict)

    @jax.jit
    def step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return tx, step


@settings(max_examples=40, **PROFILE)
@given(
    lr_exponent=st.integers(0, 30),
    grad_exponents=st.lists(st.integers(-10, 15), min_size=4, max_size=4),
    signs=st.lists(st.sampled_from([-1.0, 1.0]), min_size=4, max_size=4),
    params=st.lists(st.sampled_from([-3e38, -1.0, 0.0, 1.0, 3e38]), min_size=4, max_size=4),
)
def test_strict_mode_skips_a_finite_gradient_whose_step_would_overflow_the_params(
    lr_exponent, grad_exponents, signs, params
):
    """Strict mode. Finite gradients (their norm too), but lr * g or params - lr * g overflows
    float32: the step is skipped and counted, as a non-finite gradient is. The exponents leave
    a wide margin on both sides of float32's largest value, so the float64 reference decides."""
    tx, step = injected_sgd_step(strict=True)
    p = {"w": jnp.asarray(params, jnp.float32)}
    grads = {"w": jnp.asarray([s * 10.0**e for s, e in zip(signs, grad_exponents)], jnp.float32)}
    opt_state = tx.init(p)
    opt_state = opt_state._replace(
        inner_state=opt_state.inner_state._replace(hyperparams={"learning_rate": jnp.float32(10.0**lr_exponent)})
    )
    new_p, new_state = step(p, opt_state, grads)
    reference = np.asarray(params, np.float64) - 10.0**lr_exponent * np.asarray(grads["w"], np.float64)
    overflows = bool(np.any(np.abs(reference) > FLOAT32_MAX))
    assert int(new_state.skipped) == int(overflows)
    assert_all_finite(new_p)
    if overflows:
        assert_bit_identical(p, new_p)
        assert_bit_identical(opt_state.inner_state, new_state.inner_state)


@functools.lru_cache(maxsize=None)
def adam_with_decision_step():
    tx = amp.skip_nonfinite(optax.adam(1e-3), strict=True)

    @jax.jit
    def step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=jnp.asarray(True))
        return optax.apply_updates(params, updates), opt_state

    return tx, step


@settings(max_examples=30, **PROFILE)
@given(exponents=st.lists(st.one_of(st.integers(-30, 18), st.integers(20, 38)), min_size=4, max_size=4))
def test_strict_adam_never_takes_a_step_that_overflows_its_second_moment(exponents):
    """Strict mode. Gradients declared finite, but a square above float32's largest (|g| >=
    1e20) would put inf into Adam's second moment for good: that step is skipped, its state kept."""
    tx, step = adam_with_decision_step()
    params = initial_params()
    grads = {"w": jnp.asarray([10.0**e for e in exponents], jnp.float32), "b": jnp.ones(2, jnp.float32)}
    opt_state = tx.init(params)
    new_params, new_state = step(params, opt_state, grads)
    overflows = max(exponents) >= 20
    assert int(new_state.skipped) == int(overflows)
    assert_all_finite(new_params)
    assert_all_finite(new_state.inner_state)
    if overflows:
        assert_bit_identical(params, new_params)
        assert_bit_identical(opt_state.inner_state, new_state.inner_state)


@pytest.mark.slow
@settings(max_examples=40, **PROFILE)
@given(
    exponents=st.lists(st.integers(-40, 38), min_size=6, max_size=6),
    signs=st.lists(st.sampled_from([-1.0, 1.0]), min_size=6, max_size=6),
    poison=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.sampled_from(NONFINITE))),
)
def test_default_mode_skips_exactly_the_nonfinite_gradients_however_large_the_finite_ones(exponents, signs, poison):
    """Default mode decides from the global norm alone: finite gradients up to float32's
    largest (whose squares overflow the sum) are taken, clipped as the float64 reference
    norm says; one inf or NaN anywhere is a skip. sgd's step may overflow the params here:
    default mode does not look (that is strict mode's promise)."""
    tx, step = injected_sgd_step(strict=False)
    # A large clipping norm keeps the clip factor (max_norm / norm) a normal float32.
    clipped = amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=1e30)
    values = np.array([s * 10.0**e for s, e in zip(signs, exponents)], np.float32)
    if poison is not None:
        values[poison[0]] = poison[1]
    p = {"w": jnp.zeros(4, jnp.float32), "b": jnp.zeros(2, jnp.float32)}
    grads = {"w": jnp.asarray(values[:4]), "b": jnp.asarray(values[4:])}
    _, new_state = step(p, tx.init(p), grads)
    assert int(new_state.skipped) == int(poison is not None)
    updates, clip_state = jax.jit(clipped.update)(grads, clipped.init(p), p)
    assert int(clip_state.skipped) == int(poison is not None)
    if poison is None:
        reference = np.sqrt(np.sum(np.square(values.astype(np.float64))))
        expected = -values.astype(np.float64) * min(1.0, 1e30 / (reference + 1e-6))
        got = np.concatenate([np.asarray(updates["w"]), np.asarray(updates["b"])]).astype(np.float64)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-30)


def float32_of(value):
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


any_float = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-50, 1e-40, SMALLEST_SCALE, FLOAT32_MAX, 1e39, 1e300]),
)


def accepts(build) -> bool:
    try:
        build()
    except ValueError as err:
        assert "got" in str(err)  # one sentence naming the value
        return False
    return True


@settings(max_examples=60, **PROFILE)
@given(value=any_float)
def test_every_float_argument_is_accepted_exactly_where_its_promise_holds(value):
    """For any float, each argument is accepted iff the float32 it is stored as keeps the
    promise: scales finite and >= 2^-126, factors that grow (> 1) and back off (in (0, 1)),
    a clipping norm finite and > 0, a guard floor finite and >= 0, a rate in [0, 1]."""
    v32 = float32_of(value)
    assert accepts(lambda: amp.DynamicLossScale(init_scale=value)) == (np.isfinite(v32) and v32 >= SMALLEST_SCALE)
    assert accepts(lambda: amp.StaticLossScale(value)) == (np.isfinite(v32) and v32 >= SMALLEST_SCALE)
    assert accepts(lambda: amp.get_precision("fp32").scaler(init_scale=value)) == (
        np.isfinite(v32) and v32 >= SMALLEST_SCALE
    )
    assert accepts(lambda: amp.DynamicLossScale(growth_factor=value)) == (np.isfinite(v32) and v32 > 1)
    assert accepts(lambda: amp.DynamicLossScale(backoff_factor=value)) == (0 < v32 < 1)
    assert accepts(lambda: amp.DynamicLossScale(init_scale=1.0, min_scale=value)) == (0 < v32 <= 1.0)
    assert accepts(lambda: amp.skip_nonfinite(optax.sgd(0.1), max_grad_norm=value)) == (np.isfinite(v32) and v32 > 0)
    assert accepts(lambda: amp.DivergenceGuard(min_scale=value)) == (np.isfinite(v32) and v32 >= 0)
    assert accepts(lambda: amp.testing.FaultInjection(nonfinite_rate=value)) == (0 <= value <= 1)
    assert accepts(lambda: amp.testing.FaultInjection(loss_spike_factor=value)) == (np.isfinite(v32) and v32 > 0)


@settings(max_examples=40, **PROFILE)
@given(value=st.one_of(st.integers(-(2**40), 2**40), st.floats(-10.0, 10.0)))
def test_every_count_argument_is_accepted_exactly_where_it_is_a_positive_int32(value):
    is_int = isinstance(value, int)
    assert accepts(lambda: amp.DynamicLossScale(growth_interval=value)) == (is_int and 1 <= value < 2**31)
    assert accepts(lambda: amp.DivergenceGuard(max_consecutive_skips=value)) == (is_int and 1 <= value < 2**31)
    assert accepts(lambda: amp.scaled_value_and_grad(jnp.sum, accumulate=value)) == (is_int and value >= 1)
    assert accepts(lambda: amp.testing.FaultInjection(loss_spike_steps=(value,))) == (is_int and 0 <= value < 2**31)


def test_the_guard_trips_on_a_skip_only_never_on_a_finite_step():
    """A static scale below the guard's floor: finite steps train on; the first skip halts."""
    state = amp.TrainState.create(
        params=initial_params(),
        tx=optax.sgd(0.1),
        scaler=amp.StaticLossScale(2.0**-20),
        guard=amp.DivergenceGuard(),
    )
    for _ in range(3):
        state = state.apply_gradients(grads=initial_params(), grads_finite=jnp.asarray(True))
    assert not bool(state.halted) and int(state.skipped) == 0 and int(state.step) == 3
    before = state.params
    state = state.apply_gradients(grads=initial_params(), grads_finite=jnp.asarray(False))
    assert bool(state.halted) and int(state.skipped) == 1
    assert_bit_identical(before, state.params)
