"""The underflow telemetry against an independent numpy computation: the fractions of a small
network's float32-non-zero gradient entries that its float16 backward (at a loss scale)
flushes to 0 or leaves below float16's smallest normal, counted per layer by hand."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.amp.telemetry import FLOAT16_SMALLEST_NORMAL, cast_to_half, underflow_fractions, underflow_metrics


class Net(nn.Module):
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(16, dtype=self.dtype, param_dtype=jnp.float32, name="hidden")(x))
        return nn.Dense(1, dtype=self.dtype, param_dtype=jnp.float32, name="out")(x).astype(jnp.float32)


def gradients(scale: float, weight: float = 1e-4):
    """(float32 backward, float16 backward of the loss times `scale`) of an MSE weighted by
    `weight` (a small loss, as a loss term's coefficient or small units make it)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (256, 8))
    y = jax.random.normal(jax.random.PRNGKey(1), (256, 1))
    params = Net().init(jax.random.PRNGKey(2), x)

    def loss(net, p):
        return weight * jnp.mean(jnp.square(net.apply(p, x) - y))

    reference = jax.grad(lambda p: loss(Net(), p))(params)
    half = jax.grad(lambda p: loss(Net(jnp.float16), p) * scale)(params)
    return reference, half


def numpy_fractions(reference, half) -> dict:
    """Per layer, by hand: entries non-zero in float32, and of those the share that is 0 and
    the share below 2^-14 in the float16 backward."""
    out = {}
    for layer in reference["params"]:
        ref = np.concatenate([np.ravel(np.asarray(v)) for v in reference["params"][layer].values()])
        hal = np.concatenate([np.ravel(np.asarray(v)) for v in half["params"][layer].values()])
        live = ref != 0
        out[layer] = (np.mean(hal[live] == 0), np.mean(np.abs(hal[live]) < 2.0**-14), live.sum())
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scale", [1.0, 2.0**8, 2.0**16])
def test_fractions_match_numpy_on_a_small_networks_float16_backward(scale):
    reference, half = gradients(scale)
    ours = underflow_fractions(reference, half)
    expected = numpy_fractions(reference, half)
    assert set(ours) == {"hidden", "out"}
    for layer, (flushed, below, nonzero) in expected.items():
        assert float(ours[layer]["flushed"]) == pytest.approx(flushed, abs=1e-7)
        assert float(ours[layer]["underflow"]) == pytest.approx(below, abs=1e-7)
        assert int(ours[layer]["nonzero"]) == nonzero
    metrics = underflow_metrics(reference, half)
    total = sum(n for _, _, n in expected.values())
    assert float(metrics["flushed"]) == pytest.approx(sum(f * n for f, _, n in expected.values()) / total, abs=1e-6)
    assert float(metrics["underflow/hidden"]) == pytest.approx(expected["hidden"][1], abs=1e-7)


@pytest.mark.slow
def test_without_scaling_the_small_loss_underflows_and_scaling_lifts_it():
    """The property the scaler exists for: at scale 1 a small loss's float16 gradients sit
    below the normal range (many flushed to 0); at 2^16 next to none do."""
    unscaled = underflow_metrics(*gradients(1.0))
    scaled = underflow_metrics(*gradients(2.0**16))
    assert float(unscaled["underflow"]) > 0.5 and float(unscaled["flushed"]) > 0.0
    assert float(scaled["underflow"]) < 0.05 and float(scaled["flushed"]) == 0.0


def test_cast_to_half_is_numpys_float16_rounding_and_counts_against_it():
    g = np.array([0.0, 1e-9, 3e-8, 2.9e-8, 1e-6, 7e-5, 1e-2, -1e-7], np.float32)
    for scale in (1.0, 1024.0):
        cast = np.asarray(cast_to_half({"layer": {"w": jnp.asarray(g)}}, scale)["layer"]["w"])
        np.testing.assert_array_equal(cast, (g * np.float32(scale)).astype(np.float16).astype(np.float32))
        out = underflow_fractions({"layer": {"w": g}}, {"layer": {"w": cast}})["layer"]
        live = g != 0
        assert float(out["flushed"]) == pytest.approx(np.mean(cast[live] == 0))
        assert float(out["underflow"]) == pytest.approx(np.mean(np.abs(cast[live]) < FLOAT16_SMALLEST_NORMAL))
    assert FLOAT16_SMALLEST_NORMAL == 2.0**-14


def test_a_layer_without_non_zero_entries_and_mismatched_trees():
    zero = {"a": {"w": jnp.zeros(3)}}
    assert float(underflow_fractions(zero, zero)["a"]["underflow"]) == 0.0
    with pytest.raises(ValueError, match="different layers"):
        underflow_fractions(zero, {"b": {"w": jnp.zeros(3)}})
