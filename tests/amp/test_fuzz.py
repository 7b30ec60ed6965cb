"""A bounded fuzz campaign (slow lane): long random step sequences of the several-optimizer
step (states with `shared_scaler=True`, `train_step` each, one `update_scaler`; each
optimizer wrapped in `skip_nonfinite`) and of `DynamicLossScale.adjust`, against a numpy GradScaler written here.

Per iteration, as torch does with one GradScaler and two optimizers: each optimizer's scaled
gradients are checked for inf/NaN and its step skipped when any is found; one `update()`
backs the scale off when any optimizer found one, else counts the iteration and grows the
scale after `growth_interval` clean ones. Derandomized hypothesis, no example database: every
run checks the same 2,400 iterations and 4,000 scaler updates.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genesis_jax import amp

pytestmark = pytest.mark.slow  # about 10 s: one compile per program, the sequences are data

PROFILE = dict(deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
STEPS = 200  # iterations per example (one scan: one compile for every example)
LEARNING_RATES = (0.125, 0.5)  # powers of two: lr * g is exact in float32, as in the reference
MOMENTUM = 0.5  # the second optimizer's (optax.sgd's trace: t = g + 0.5 t, update -lr t)


def linear_loss(params, g):
    """sum(params * g): its gradient is g, exactly; an inf or NaN in g makes it non-finite."""
    return jnp.sum(params * g), None


def fresh_states(scaler):
    params = jnp.linspace(-1.0, 1.0, 3, dtype=jnp.float32)
    txs = (optax.sgd(LEARNING_RATES[0]), optax.sgd(LEARNING_RATES[1], momentum=MOMENTUM))
    return tuple(
        amp.TrainState.create(params=params, tx=tx, scaler=scaler, max_grad_norm=None, shared_scaler=True) for tx in txs
    )


@jax.jit
def run(scaler, grads):
    """STEPS iterations; grads[t, i] is optimizer i's gradient at iteration t."""

    def iteration(states, g):
        stepped = [amp.train_step(s, linear_loss, gi, has_aux=True) for s, gi in zip(states, g)]
        flags = [m["grads_finite"] for _, m in stepped]
        states = amp.update_scaler(*(s for s, _ in stepped))
        return states, (states[0].scaler.loss_scale, jnp.stack(flags))

    states, trace = jax.lax.scan(iteration, fresh_states(scaler), grads)
    return states, states[0].scaler, trace


def gradscaler_update(scale, tracker, finite: bool, interval: int, floor: float = 0.0):
    """GradScaler's update() in numpy float32 (growth x2 unless it overflows, backoff x0.5),
    the backoff floored at max(floor, 2^-126) as the library's scaler is."""
    if not finite:
        return max(np.float32(scale / 2), np.float32(max(floor, 2.0**-126))), 0
    if tracker + 1 < interval:
        return scale, tracker + 1
    with np.errstate(over="ignore"):
        grown = np.float32(scale * 2)
    return (grown if np.isfinite(grown) else scale), 0


def gradscaler_reference(grads, init_scale, growth_interval):
    """numpy float32: per iteration the scales, each optimizer's found-inf, the final params,
    each optimizer's skip count and the scaler's final (scale, tracker)."""

    def flushed(x):  # XLA's CPU flushes float32 denormals to zero (torch's CPU would not)
        return np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0), x).astype(np.float32)

    params = [np.linspace(-1.0, 1.0, 3, dtype=np.float32) for _ in LEARNING_RATES]
    trace = np.zeros(3, np.float32)
    scale, tracker, skipped, scales, found = np.float32(init_scale), 0, [0, 0], [], []
    for g in grads:
        with np.errstate(over="ignore", invalid="ignore"):
            finite = [bool(np.isfinite(gi * scale).all()) for gi in g]  # torch checks the scaled gradients
        for i, ok in enumerate(finite):
            if not ok:
                skipped[i] += 1
                continue
            unscaled = flushed(flushed(g[i] * scale) * np.float32(1 / scale))  # g, exactly, unless it flushed
            if i == 0:
                params[0] = params[0] - np.float32(LEARNING_RATES[0]) * unscaled
            else:
                trace = unscaled + np.float32(MOMENTUM) * trace
                params[1] = params[1] - np.float32(LEARNING_RATES[1]) * trace
        scale, tracker = gradscaler_update(scale, tracker, all(finite), growth_interval)
        scales.append(scale)
        found.append(finite)
    return np.array(scales), np.array(found), params, skipped, (scale, tracker)


@st.composite
def gradient_sequences(draw):
    """STEPS iterations of two 3-vectors: moderate values, some huge enough to overflow once
    scaled, and chosen elements poisoned with inf, -inf or NaN."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    grads = rng.normal(size=(STEPS, 2, 3)).astype(np.float32) * np.float32(draw(st.sampled_from([1e-6, 1.0, 1e3])))
    poison_rate, huge_rate = draw(st.sampled_from([0.0, 0.01, 0.2, 0.6])), draw(st.sampled_from([0.0, 0.02]))
    poisoned = rng.random(grads.shape) < poison_rate
    grads[poisoned] = rng.choice(np.float32([np.inf, -np.inf, np.nan]), size=int(poisoned.sum()))
    grads[rng.random(grads.shape) < huge_rate] = np.float32(3e34)  # finite, but inf at a scale of 2^16
    return grads


@settings(max_examples=12, **PROFILE)
@given(
    grads=gradient_sequences(),
    init_scale=st.sampled_from([1.0, 2.0**10, 2.0**16, 2.0**100, 2.0**127]),
    growth_interval=st.integers(1, 40),
)
def test_several_optimizers_under_one_scaler_follow_gradscaler(grads, init_scale, growth_interval):
    scaler = amp.DynamicLossScale(init_scale=init_scale, growth_interval=growth_interval)
    states, scaler, (scales, found) = run(scaler, jnp.asarray(grads))
    want_scales, want_found, want_params, want_skipped, (scale, tracker) = gradscaler_reference(
        grads, init_scale, growth_interval
    )
    np.testing.assert_array_equal(np.asarray(found), want_found)  # each optimizer's decision, every iteration
    np.testing.assert_array_equal(np.asarray(scales), want_scales)  # the scale, exactly
    assert (float(scaler.loss_scale), int(scaler.growth_tracker)) == (float(scale), tracker)
    assert [int(s.skipped) for s in states] == want_skipped
    for state, want in zip(states, want_params):  # separately compiled: equal to rounding, not bits
        np.testing.assert_allclose(np.asarray(state.params), want, rtol=1e-5, atol=1e-6)


def reference_flags_adjust(flags, init_scale, interval, floor):
    scale, tracker, out = np.float32(init_scale), 0, []
    for finite in flags:
        scale, tracker = gradscaler_update(scale, tracker, finite, interval, floor)
        out.append((scale, tracker))
    return out


@jax.jit
def adjust_all(scaler, flags):
    def one(scaler, finite):
        scaler = scaler.adjust(finite)
        return scaler, (scaler.loss_scale, scaler.growth_tracker)

    return jax.lax.scan(one, scaler, flags)[1]


@settings(max_examples=8, **PROFILE)
@given(
    seed=st.integers(0, 2**32 - 1),
    clean_rate=st.sampled_from([0.5, 0.95, 0.999]),
    init_scale=st.sampled_from([2.0**-126, 1.0, 2.0**16, 2.0**127]),
    interval=st.integers(1, 50),
    floor=st.sampled_from([0.0, 2.0**-10, 1.0]),
)
def test_adjust_follows_gradscaler_over_long_sequences(seed, clean_rate, init_scale, interval, floor):
    flags = np.random.default_rng(seed).random(500) < clean_rate
    floor = min(floor, init_scale)
    scaler = amp.DynamicLossScale(init_scale=init_scale, growth_interval=interval, min_scale=floor or None)
    scales, trackers = adjust_all(scaler, jnp.asarray(flags))
    want = reference_flags_adjust(flags, init_scale, interval, floor)
    assert list(zip(np.asarray(scales).tolist(), np.asarray(trackers).tolist())) == [(float(s), t) for s, t in want]
