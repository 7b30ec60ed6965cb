import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import DynamicLossScale, NoOpLossScale, TrainState, amp, stats, train_step
from genesis_jax.amp.optim import SkipNonFiniteState
from genesis_jax.amp.optim import find_skip_state as skip_state
from genesis_jax.amp.policy import get_precision
from tests.support.helpers import mlp_loss, regression_problem


def make_state(dtype=jnp.float16, scaler=None, precision="fp16", tx=None, max_grad_norm=1.0, guard=None):
    x, y = regression_problem()
    model, loss_fn = mlp_loss(dtype)
    params = model.init(jax.random.PRNGKey(1), x)
    state = TrainState.create(
        params=params,
        tx=tx or optax.adam(1e-3),
        scaler=scaler or DynamicLossScale(),
        precision=precision,
        max_grad_norm=max_grad_norm,
        guard=guard,
    )
    return state, loss_fn, (x, y)


def stepper(loss_fn, **options):
    """`train_step` of (state, batch), jitted, for a `loss_fn(params, batch) -> (loss, aux)`."""
    return jax.jit(lambda state, batch: train_step(state, loss_fn, batch, has_aux=True, **options))


def inner_opt_state(state):
    return skip_state(state.opt_state).inner_state


def inject_at(target_step, value):
    def transform(grads, state):
        bad = state.step == target_step
        return jax.tree.map(lambda g: jnp.where(bad, jnp.full_like(g, value), g), grads)

    return transform


@functools.cache
def injecting_stepper():
    """`stepper` writing `value` (an argument: one program for every value) into step 1's gradients."""
    _, loss_fn = mlp_loss(jnp.float16)
    return jax.jit(
        lambda state, batch, value: train_step(state, loss_fn, batch, has_aux=True, grad_transform=inject_at(1, value))
    )


@pytest.mark.slow
@pytest.mark.parametrize("value", [jnp.inf, jnp.nan, -jnp.inf])
def test_nonfinite_step_leaves_state_bit_identical(value):
    state, _, batch = make_state()
    update = functools.partial(injecting_stepper(), value=jnp.float32(value))
    state, _ = update(state, batch)
    before = jax.device_get((state.params, inner_opt_state(state)))
    after_state, metrics = update(state, batch)
    after = jax.device_get((after_state.params, inner_opt_state(after_state)))
    assert not bool(metrics["grads_finite"])
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), before, after)
    assert int(after_state.skipped) == 1 and int(after_state.step) == 2
    assert float(after_state.scaler.loss_scale) == float(state.scaler.loss_scale) / 2
    # the next finite step moves the params again
    final, metrics = update(after_state, batch)
    assert bool(metrics["grads_finite"])
    assert not np.array_equal(final.params["params"]["dense_0"]["kernel"], after[0]["params"]["dense_0"]["kernel"])


@pytest.mark.slow
def test_clipping_acts_on_unscaled_gradients():
    # With scale 2^10 a clip on the scaled gradients would shrink them 1024x more.
    s_plain, loss_fn, batch = make_state(jnp.float32, NoOpLossScale(), "fp32", tx=optax.sgd(1.0), max_grad_norm=0.1)
    s_scaled = s_plain.replace(scaler=DynamicLossScale(init_scale=2.0**10))
    step = jax.jit(lambda state: train_step(state, loss_fn, batch, has_aux=True))  # op by op it took 6 s
    out_plain, m_plain = step(s_plain)
    out_scaled, m_scaled = step(s_scaled)
    np.testing.assert_allclose(float(m_plain["grad_norm"]), float(m_scaled["grad_norm"]), rtol=1e-5)
    assert float(m_plain["grad_norm"]) > 0.1  # clipping was active
    delta = optax.tree.norm(jax.tree.map(lambda a, b: a - b, out_scaled.params, s_scaled.params))
    np.testing.assert_allclose(float(delta), 0.1, rtol=1e-4)


@pytest.mark.slow
def test_jitted_step_compiles_once():
    state, loss_fn, batch = make_state()
    traces = []

    def counting_loss(p, b):
        traces.append(1)
        return loss_fn(p, b)

    update = stepper(counting_loss)
    for _ in range(5):
        state, _ = update(state, batch)
    assert len(traces) == 2  # both at the first call: to read what it computes in, and to differentiate it
    assert update._cache_size() == 1


def test_stats_counts():
    state, loss_fn, batch = make_state(scaler=DynamicLossScale(init_scale=2.0**40))
    update = stepper(loss_fn)
    for _ in range(6):
        state, m = update(state, batch)
    s = stats(state)
    # 2^40 times a gradient overflows float16's 65504 until the scale has come down.
    assert s["steps"] == 6 and s["skipped"] >= 1
    assert s["skip_rate"] == s["skipped"] / 6
    assert s["scale"] == 2.0 ** (40 - s["skipped"]) and s["backoffs"] == s["skipped"]
    assert s["precision"] == "fp16"


def train_loss(precision, steps=300):
    x, y = regression_problem()
    prec = get_precision(precision)
    model, loss_fn = mlp_loss(prec.compute_dtype)
    params = model.init(jax.random.PRNGKey(1), x)
    state = TrainState.create(params=params, tx=optax.adam(3e-3), precision=prec, max_grad_norm=1.0)
    step = stepper(loss_fn)
    for _ in range(steps):
        state, _ = step(state, (x, y))
    final = float(loss_fn(jax.tree.map(lambda p: p.astype(jnp.float32), state.params), (x, y))[0])
    return final, stats(state)


@pytest.mark.slow
def test_fp16_training_reaches_fp32_loss():
    loss32, _ = train_loss("fp32")
    loss16, stats16 = train_loss("fp16")
    assert loss32 < 0.05  # it learned something
    assert abs(loss16 - loss32) / loss32 < 0.02
    assert stats16["steps"] == 300


@pytest.mark.slow
def test_fp16_full_keeps_dtypes_through_steps():
    with pytest.warns(UserWarning):
        prec = get_precision("fp16-full")
    x, y = regression_problem()
    model, loss_fn = mlp_loss(jnp.float16)
    params = model.init(jax.random.PRNGKey(1), x)
    state = TrainState.create(params=params, tx=optax.adam(1e-3, eps=1e-5), precision=prec, max_grad_norm=1.0)
    step = stepper(loss_fn)
    for _ in range(3):
        state, _ = step(state, (x, y))
    assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float16)}


# --- TrainState.create and apply_gradients ---------------------------------------------------


@pytest.mark.filterwarnings("ignore:fp16-full")
@pytest.mark.parametrize(
    ("precision", "strict", "skipped"),
    [("fp16-full", None, 1), ("fp32", None, 0), ("fp16", None, 0), ("fp32", True, 1), ("fp16-full", False, 0)],
)
def test_strict_mode_is_on_by_default_exactly_where_params_are_float16(precision, strict, skipped):
    """Finite gradients whose sgd step overflows the params (float16 above 65504, float32
    above 3.4e38): strict mode skips and counts it, default mode takes it."""
    lr = 1e4 if precision == "fp16-full" else 1e37  # finite in its dtype: the step, not the rate, overflows
    params = {"w": jnp.full(2, 60000.0)}
    state = TrainState.create(params=params, tx=optax.sgd(lr), precision=precision, strict=strict)
    grads = {"w": jnp.full(2, -100.0)}
    new = jax.jit(lambda s: s.apply_gradients(grads=grads, grads_finite=jnp.asarray(True)))(state)
    assert int(new.skipped) == skipped
    assert bool(np.all(np.isfinite(np.asarray(new.params["w"], np.float32)))) == bool(skipped)


def test_create_wraps_a_plain_optimizer_in_skip_nonfinite():
    params = {"w": jnp.ones(3)}
    state = TrainState.create(params=params, tx=optax.adam(1e-3))
    assert isinstance(state.opt_state, SkipNonFiniteState)
    assert skip_state(state.opt_state) is state.opt_state
    plain = optax.adam(1e-3).init(params)
    assert jax.tree.structure(state.opt_state.inner_state) == jax.tree.structure(plain)
    assert int(state.skipped) == 0 and int(state.skip_streak) == 0 and not bool(state.halted)
    # an already-wrapped optimizer is kept as it is: one SkipNonFiniteState, not two
    wrapped = TrainState.create(params=params, tx=amp.skip_nonfinite(optax.adam(1e-3), max_grad_norm=1.0))
    assert not isinstance(wrapped.opt_state.inner_state, SkipNonFiniteState)
    assert jax.tree.structure(wrapped.opt_state) == jax.tree.structure(state.opt_state)


@pytest.mark.parametrize(
    "option",
    [{"max_grad_norm": 1.0}, {"guard": amp.DivergenceGuard()}, {"advance_schedule_on_skip": True}, {"strict": False}],
)
def test_create_refuses_skip_options_for_an_already_wrapped_optimizer(option):
    with pytest.raises(ValueError, match="already wrapped in skip_nonfinite"):
        TrainState.create(params={"w": jnp.ones(3)}, tx=amp.skip_nonfinite(optax.adam(1e-3)), **option)


def test_apply_gradients_with_a_nonfinite_decision_changes_nothing_but_the_skip_count():
    state, loss_fn, batch = make_state()
    state, _ = stepper(loss_fn)(state, batch)  # non-zero Adam moments
    params = jax.tree.map(lambda p: p.at[..., 0].set(-0.0), state.params)  # -0.0 must stay -0.0
    state = state.replace(params=params)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, jnp.nan, jnp.float32), state.params)
    new = jax.jit(lambda s, g: s.apply_gradients(grads=g, grads_finite=jnp.asarray(False)))(state, grads)
    before = jax.tree.leaves((state.params, inner_opt_state(state)))
    after = jax.tree.leaves((new.params, inner_opt_state(new)))
    assert len(before) == len(after)
    for a, b in zip(before, after):
        assert np.asarray(a).dtype == np.asarray(b).dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(new.skipped) == int(state.skipped) + 1 and int(new.skip_streak) == int(state.skip_streak) + 1
    # no scaler passed: 0.3 adjusts the state's own by the decision (0.2 kept it as it was)
    assert float(new.scaler.loss_scale) == float(state.scaler.loss_scale) / 2
    assert int(new.scaler.backoffs) == int(state.scaler.backoffs) + 1 and int(new.scaler.growth_tracker) == 0


@pytest.mark.slow
def test_a_guard_trip_halts_the_state_for_good():
    """Three skips in a row trip a guard of two; afterwards step, params, the optimizer state,
    the scaler and the counts no longer change, clean gradients included."""
    state, loss_fn, batch = make_state(guard=amp.DivergenceGuard(max_consecutive_skips=2))
    clean = stepper(loss_fn)
    poisoned = stepper(loss_fn, grad_transform=lambda g, s: nan_like(g))
    for _ in range(3):
        state, _ = clean(state, batch)
    halted_at = None
    for i in range(3):
        state, metrics = poisoned(state, batch)
        if bool(metrics["halted"]) and halted_at is None:
            halted_at = i
    assert halted_at == 2 and bool(state.halted)
    assert int(state.step) == 6 and int(state.skipped) == 3 and int(state.skip_streak) == 3
    frozen = jax.device_get(state)
    for step in (clean, poisoned, clean):
        state, metrics = step(state, batch)
        assert bool(metrics["halted"])
    after = jax.device_get(state)
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(after)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(state.step) == 6 and int(state.skipped) == 3 and int(state.skip_streak) == 3
    assert float(state.scaler.loss_scale) == float(frozen.scaler.loss_scale)


def nan_like(tree):
    return jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), tree)


def test_create_finds_skip_nonfinite_inside_other_wrappers():
    """A `skip_nonfinite` inside `inject_hyperparams` is found: not wrapped twice, its guard fires."""
    inner = lambda learning_rate: amp.skip_nonfinite(  # noqa: E731
        optax.adam(learning_rate), guard=amp.DivergenceGuard(max_consecutive_skips=2)
    )
    tx = optax.inject_hyperparams(inner)(learning_rate=1e-3)
    with pytest.raises(ValueError, match="already wrapped"):
        amp.TrainState.create(params={"w": jnp.ones(3)}, tx=tx, max_grad_norm=1.0)
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=tx)
    for _ in range(5):
        state = state.apply_gradients(grads={"w": jnp.full(3, jnp.nan)})
    assert bool(state.halted) and int(state.skipped) == 3 and int(state.skip_streak) == 3


@pytest.mark.parametrize(("precision", "scaled"), [("fp32", False), ("bf16", False), ("fp16", True)])
def test_without_loss_scaling_the_step_never_reads_the_scale(precision, scaled):
    """fp32 and bf16 pay for no loss scaling: in the traced step the scaler's value feeds no
    operation (no scale multiply, no unscale, no scaler update, no select), it is passed
    through to the new state; fp16's dynamic scale feeds all of those."""
    state = TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision=precision, max_grad_norm=1.0)

    compute = get_precision(precision).compute_dtype

    def loss_fn(params, x):  # the matmul in the precision's compute dtype, the loss in float32
        return jnp.mean(jnp.square((x.astype(compute) @ params["w"].astype(compute)).astype(jnp.float32))), {}

    closed = jax.make_jaxpr(lambda s, x: train_step(s, loss_fn, x, has_aux=True))(state, jnp.ones((4, 3)))
    (position,) = [i for i, leaf in enumerate(jax.tree.leaves(state)) if leaf is state.scaler.loss_scale]
    scale_var = closed.jaxpr.invars[position]
    readers = [eqn.primitive.name for eqn in closed.jaxpr.eqns if any(v is scale_var for v in eqn.invars)]
    assert bool(readers) == scaled, readers


@pytest.mark.filterwarnings("ignore:fp16-full")
def test_fp16_full_takes_the_norm_in_float32_so_a_finite_step_is_never_lost():
    """Float16 gradients whose sum of squares (1e6) overflows float16 (65504) but whose
    every element is finite: the step is taken and clipped to the float32 norm, 1000."""
    state = TrainState.create(params={"w": jnp.zeros(4)}, tx=optax.sgd(1.0), precision="fp16-full", max_grad_norm=1.0)
    grads = {"w": jnp.full(4, 500.0, jnp.float16)}  # the norm is taken in the step: none is given
    new = jax.jit(lambda s: s.apply_gradients(grads=grads, grads_finite=jnp.asarray(True)))(state)
    assert int(new.skipped) == 0
    np.testing.assert_allclose(np.asarray(new.params["w"], np.float32), np.full(4, -0.5), rtol=1e-3)
