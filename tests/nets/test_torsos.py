"""The actor-critic torsos: shapes and dtypes in every precision, what runs in float32,
and the CPU convolution path against XLA's native convolution.

Each case compiles its work as one program (jax.jit), or only traces it (jax.eval_shape,
jax.make_jaxpr) where shapes and dtypes are all it reads: run op by op, a network's few hundred
operations would each be compiled on their own, several times the cost."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.nets import ActorCritic
from genesis_jax.nets.conv import conv2d
from genesis_jax.nets.torsos import ResidualBlock, check_network, default_network, make_torso

TORSOS = {"mlp": (7,), "resmlp": (7,), "cnn": (10, 10, 4), "impala": (24, 24, 3)}
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def _dots(jaxpr):
    """(operand dtypes, result dtype, result shape) of every matmul and convolution."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
            found.append(
                ([str(v.aval.dtype) for v in eqn.invars], str(eqn.outvars[0].aval.dtype), eqn.outvars[0].aval.shape)
            )
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _dots(sub)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("network", list(TORSOS))
def test_outputs_are_float32_with_any_batch_shape(network, dtype):
    obs_shape = TORSOS[network]
    net = ActorCritic(
        action_dim=3,
        network=network,
        obs_shape=obs_shape,
        dtype=dtype,
        width=16,
        depth=2,
        hidden=(16, 16),
        continuous=True,
    )
    obs = jax.random.uniform(jax.random.PRNGKey(0), (2, 5, *obs_shape))
    params = net.init(jax.random.PRNGKey(1), obs)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))  # master params
    (mean, log_std), value = net.apply(params, obs)
    assert mean.shape == log_std.shape == (2, 5, 3) and value.shape == (2, 5)
    assert mean.dtype == log_std.dtype == value.dtype == jnp.float32
    # The policy and value methods give what the joint call gives (one shared pass or two).
    np.testing.assert_array_equal(net.apply(params, obs, method=ActorCritic.value), value)
    np.testing.assert_array_equal(net.apply(params, obs, method=ActorCritic.policy)[0], mean)


@pytest.mark.parametrize("dtype", (jnp.bfloat16, jnp.float16), ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("network", list(TORSOS))
def test_torso_products_in_half_precision_heads_in_float32(network, dtype):
    """Every matmul / convolution of the torso takes and gives `dtype`; the two heads (the
    matmuls with 3 logits and 1 value out) take and give float32."""
    obs_shape = TORSOS[network]
    net = ActorCritic(action_dim=3, network=network, obs_shape=obs_shape, dtype=dtype, width=16, depth=1, hidden=(16,))
    obs = jnp.ones((4, *obs_shape))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), obs)  # shapes and dtypes: all a trace needs
    dots = _dots(jax.make_jaxpr(lambda p: net.apply(p, obs))(params).jaxpr)
    name = jnp.dtype(dtype).name
    heads = [d for d in dots if d[2][-1] in (1, 3)]
    torso = [d for d in dots if d[2][-1] not in (1, 3)]
    assert len(heads) == 2 and all(ops == ["float32", "float32"] and out == "float32" for ops, out, _ in heads)
    # Patch extraction (CPU convolutions) runs on the compute-dtype input too.
    assert torso and all(set(ops) == {name} and out == name for ops, out, _ in torso)


@pytest.mark.parametrize("dtype", (jnp.bfloat16, jnp.float16), ids=lambda d: jnp.dtype(d).name)
def test_layer_norms_and_residual_stream_are_float32(dtype):
    torso = make_torso("resmlp", (7,), width=16, depth=2, dtype=dtype)
    x = jnp.ones((4, 7))
    params = jax.eval_shape(torso.init, jax.random.PRNGKey(0), x)

    def outputs_of(kind):
        capture = lambda module, _: isinstance(module, kind)  # noqa: E731
        _, state = jax.eval_shape(lambda p: torso.apply(p, x, capture_intermediates=capture), params)
        return jax.tree.leaves(state["intermediates"])

    norms, blocks = outputs_of(nn.LayerNorm), outputs_of(ResidualBlock)
    assert len(norms) == 3 and all(v.dtype == jnp.float32 for v in norms)  # two blocks' and the final norm
    assert len(blocks) == 2 and all(v.dtype == jnp.float32 for v in blocks)
    out = jax.eval_shape(torso.apply, params, x)
    assert out.dtype == jnp.float32


@pytest.mark.slow
@pytest.mark.parametrize("stride,padding", [(1, "VALID"), (2, "SAME"), (4, "VALID")])
def test_cpu_patch_convolution_equals_the_native_one(stride, padding):
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 20, 20, 4))
    kernel = jax.random.normal(jax.random.PRNGKey(1), (5, 5, 4, 8))

    @jax.jit
    def outputs_and_grads(x, kernel):  # both paths, forward and backward, in one program
        def out(k, as_patches):
            return conv2d(x, k, stride, padding, as_patches=as_patches)

        grad = lambda p: jax.grad(lambda k: jnp.sum(jnp.tanh(out(k, p))))(kernel)  # noqa: E731
        return out(kernel, True), out(kernel, False), grad(True), grad(False)

    patches, native, grad_patches, grad_native = outputs_and_grads(x, kernel)
    np.testing.assert_allclose(patches, native, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_patches, grad_native, rtol=1e-4, atol=1e-4)


def test_default_network_follows_the_observation_shape():
    assert default_network((84, 84, 4)) == "cnn" and default_network((4,)) == "mlp"
    with pytest.raises(ValueError, match="image observations"):
        make_torso("impala", (4,))
    with pytest.raises(ValueError, match="unknown network 'transformer'"):
        make_torso("transformer", (4,))


def test_an_image_smaller_than_the_cnns_kernel_is_no_cnns_input():
    # (2, 3, 50) went to the 3 x 3 CNN by default: convolved to nothing, the net saw none of its input
    assert default_network((2, 3, 50)) == "mlp" and default_network((3, 3, 5)) == "cnn"
    with pytest.raises(ValueError, match=r"^network 'cnn' needs images of at least 3 x 3, got shape \(2, 3, 50\)$"):
        check_network("cnn", (2, 3, 50))
    check_network("cnn", (3, 3, 5))  # one 3 x 3 window: taken


@pytest.mark.parametrize("dtype", (jnp.bfloat16, jnp.float16), ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("network", ["cnn", "impala"])
def test_convolution_bias_gradients_sum_in_float32(network, dtype):
    """A convolution's output stays in `dtype`, but its bias is added in float32: the bias
    gradient, a sum over batch and positions, accumulates in float32 (in `dtype` it was)."""
    from genesis_jax.amp import dtype_report

    obs_shape = TORSOS[network]
    net = ActorCritic(action_dim=3, network=network, obs_shape=obs_shape, dtype=dtype, width=16, depth=1)
    obs = jnp.ones((4, *obs_shape))
    params = jax.eval_shape(net.init, jax.random.PRNGKey(0), obs)
    loss = lambda p: jnp.sum(net.apply(p, obs)[1])  # noqa: E731
    report = dtype_report(jax.grad(loss), params)
    assert report.dtypes("conv") or report.dtypes("matmul").get(jnp.dtype(dtype).name)  # it does compute in dtype
    half = [op for op in report.ops if op.kind == "reduction" and jnp.dtype(op.inputs[0]).itemsize < 4]
    assert not half, half
