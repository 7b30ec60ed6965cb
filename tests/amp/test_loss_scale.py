import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax import DynamicLossScale, NoOpLossScale, StaticLossScale


def reference_update(scale, tracker, finite, growth=2.0, backoff=0.5, interval=2000):
    """PyTorch's _amp_update_scale_cpu_ written out in numpy float32."""
    scale = np.float32(scale)
    if not finite:
        return np.float32(scale * np.float32(backoff)), 0
    successful = tracker + 1
    if successful == interval:
        with np.errstate(over="ignore"):
            grown = np.float32(scale * np.float32(growth))
        return (grown if np.isfinite(grown) else scale), 0
    return scale, successful


def run(scaler, flags):
    adjust = jax.jit(lambda s, f: s.adjust(f))
    out = []
    for f in flags:
        scaler = adjust(scaler, jnp.asarray(f))
        out.append((float(scaler.loss_scale), int(scaler.growth_tracker)))
    return scaler, out


def test_defaults_match_gradscaler():
    s = DynamicLossScale()
    assert s.loss_scale.dtype == jnp.float32 and float(s.loss_scale) == 65536.0
    assert s.growth_tracker.dtype == jnp.int32 and int(s.growth_tracker) == 0
    assert float(s.growth_factor) == 2.0 and float(s.backoff_factor) == 0.5 and int(s.growth_interval) == 2000


def test_growth_exactly_at_2000th_finite_step():
    s, out = run(DynamicLossScale(), [True] * 2000)
    assert out[1998] == (65536.0, 1999)
    assert out[1999] == (131072.0, 0)


def test_backoff_resets_tracker():
    s, out = run(DynamicLossScale(), [True] * 1999 + [False] + [True] * 1999)
    assert out[1999] == (32768.0, 0)
    assert out[-1] == (32768.0, 1999)


def test_long_overflow_burst_keeps_halving_without_floor():
    s, out = run(DynamicLossScale(init_scale=1.0), [False] * 30)
    assert out[-1][0] == 2.0**-30
    s, out = run(DynamicLossScale(init_scale=1.0, min_scale=0.25), [False] * 30)
    assert out[-1][0] == 0.25


def test_scale_never_reaches_zero_or_a_denormal_and_recovers():
    """XLA's CPU backend flushes float32 denormals: halving 2^-126 gives 0 there, after
    which every step would be 0/0 and skipped. The scale stops at 2^-126 instead, on every
    backend, and grows back as usual."""
    tiny = 2.0**-126
    s, out = run(DynamicLossScale(init_scale=2.0**-124, growth_interval=3), [False] * 5 + [True] * 3)
    assert [v for v, _ in out] == [2.0**-125, tiny, tiny, tiny, tiny, tiny, tiny, 2.0**-125]
    # Above 2^-126, still GradScaler's rule step for step.
    scale, tracker = np.float32(2.0**-124), 0
    for flag, (got, got_tracker) in list(zip([False] * 2, out))[:2]:
        scale, tracker = reference_update(scale, tracker, flag, interval=3)
        assert (got, got_tracker) == (float(scale), tracker)
    with pytest.raises(ValueError, match="init_scale must be finite and >= 2\\^-126"):
        DynamicLossScale(init_scale=2.0**-127)


def test_no_growth_to_inf_near_float32_max():
    big = float(np.finfo(np.float32).max) / 1.5
    s, out = run(DynamicLossScale(init_scale=big, growth_interval=1), [True] * 3)
    assert all(v == (np.float32(big), 0) for v in out)


def test_random_sequence_against_reference():
    rng = np.random.default_rng(0)
    flags = rng.random(3000) > 0.02
    s, out = run(DynamicLossScale(init_scale=8.0, growth_interval=7, growth_factor=3.0, backoff_factor=0.25), flags)
    scale, tracker = np.float32(8.0), 0
    for f, got in zip(flags, out):
        scale, tracker = reference_update(scale, tracker, f, 3.0, 0.25, 7)
        assert got == (float(scale), tracker)


def test_pytree_keeps_configuration_through_jit_and_tree_map():
    s = DynamicLossScale(init_scale=4.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=5, min_scale=0.5)
    assert len(jax.tree.leaves(s)) == 7  # with 0.3's backoffs count
    back = jax.jit(lambda x: x)(s)
    doubled = jax.tree.map(lambda x: x, s)
    for t in (back, doubled):
        assert isinstance(t, DynamicLossScale)
        assert (float(t.growth_factor), float(t.backoff_factor), int(t.growth_interval), float(t.min_scale)) == (
            3.0,
            0.25,
            5,
            0.5,
        )


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"backoff_factor": 0.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"init_scale": float("inf")}, "init_scale"),
        ({"init_scale": -1.0}, "init_scale"),
        ({"min_scale": -1.0}, "min_scale"),
        ({"growth_factor": float("inf")}, "growth_factor"),
        ({"growth_factor": float("nan")}, "growth_factor"),
    ],
)
def test_validation(kwargs, word):
    with pytest.raises(ValueError, match=word):
        DynamicLossScale(**kwargs)


def test_scale_unscale_roundtrip_in_float32():
    s = DynamicLossScale(init_scale=1024.0)
    g = {"a": jnp.array([1.0, 2.0], jnp.float16)}
    scaled = s.scale(g)
    assert scaled["a"].dtype == jnp.float32
    np.testing.assert_array_equal(s.unscale(scaled)["a"], np.array([1.0, 2.0], np.float32))


def test_static_and_noop():
    st = StaticLossScale(128.0)
    assert float(st.adjust(jnp.asarray(False)).loss_scale) == 128.0
    assert float(st.scale(jnp.asarray(2.0))) == 256.0
    n = NoOpLossScale()
    assert float(n.adjust(False).loss_scale) == 1.0 and float(n.scale(jnp.asarray(3.0))) == 3.0
    with pytest.raises(ValueError):
        StaticLossScale(0.0)


SCALERS = [DynamicLossScale(), StaticLossScale(8.0), NoOpLossScale()]


@pytest.mark.parametrize("flag", [float("nan"), 0.5, 1.0, 0, "False", None, jnp.float32(0.0), np.int32(1)])
@pytest.mark.parametrize("scaler", SCALERS, ids=lambda s: type(s).__name__)
def test_adjust_takes_only_a_bool(scaler, flag):
    # A PyTorch user's found_inf=1.0 (overflow) once converted to True and grew the scale.
    with pytest.raises(TypeError, match="as a bool.*found_inf == 0"):
        scaler.adjust(flag)


def test_adjust_takes_every_kind_of_bool_also_traced():
    s = DynamicLossScale(init_scale=8.0)
    for finite, expected in ((True, 8.0), (np.bool_(False), 4.0), (jnp.array(False), 4.0)):
        assert float(s.adjust(finite).loss_scale) == expected
    assert float(jax.jit(lambda s, f: s.adjust(f))(s, jnp.array(False)).loss_scale) == 4.0


@pytest.mark.parametrize("scale", [2.0**126, 2.0**127, float(np.finfo(np.float32).max)])
def test_unscaling_by_a_scale_whose_reciprocal_is_denormal_still_gives_the_gradient(scale):
    # GradScaler grows to 2^127, where 1 / scale is denormal: flushed to 0 on XLA's CPU, every
    # gradient unscaled to 0 and counted finite, and training stalled unseen (found by test_fuzz.py).
    scaler, g = DynamicLossScale(init_scale=scale), jnp.array([0.5, -0.25, 1e-3], jnp.float32)  # finite once scaled
    np.testing.assert_allclose(jax.jit(lambda s, g: s.unscale(s.scale(g)))(scaler, g), g, rtol=1e-6)
