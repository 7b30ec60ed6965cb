"""`nets.Dense`: half-precision matmuls forward and backward, float32 bias and activation."""

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.nets import ActorCritic, Dense


def _init(dtype, in_dim=5, features=7, seed=0):
    layer = Dense(features, dtype=dtype, bias_init=nn.initializers.normal(1.0))
    x = jax.random.normal(jax.random.PRNGKey(seed), (9, in_dim), jnp.float32) * 3.0
    return layer, layer.init(jax.random.PRNGKey(seed + 1), x), x


def test_float32_equals_flax_dense_with_the_same_params():
    layer, params, x = _init(jnp.float32)
    reference = nn.Dense(7)
    loss = lambda module: lambda p: jnp.sum(jnp.tanh(module.apply(p, x)))  # noqa: E731
    np.testing.assert_allclose(layer.apply(params, x), reference.apply(params, x), rtol=1e-6, atol=1e-6)
    ours, theirs = jax.grad(loss(layer))(params), jax.grad(loss(reference))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), ours, theirs)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision_forward_against_numpy(dtype):
    layer, params, x = _init(dtype)
    kernel, bias = (np.asarray(params["params"][k]) for k in ("kernel", "bias"))
    half = lambda a: np.asarray(jnp.asarray(a, dtype), np.float64)  # noqa: E731  rounds to dtype
    # Operands rounded to dtype, exact product rounded to dtype, bias added in float32.
    expected = half(half(x) @ half(kernel)).astype(np.float32) + bias
    out = layer.apply(params, x)
    assert out.dtype == jnp.float32
    eps = float(jnp.finfo(dtype).eps)
    np.testing.assert_allclose(out, expected, rtol=0, atol=eps * (np.abs(expected - bias).max() + 1))


def _dot_dtypes(jaxpr):
    """(operand dtypes, result dtype) of every dot_general, sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(([str(v.aval.dtype) for v in eqn.invars], str(eqn.outvars[0].aval.dtype)))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _dot_dtypes(sub)
    return found


def test_every_hidden_matmul_of_the_actor_critic_gradient_is_float16_and_the_heads_float32():
    net = ActorCritic(action_dim=2, hidden=(16, 16), dtype=jnp.float16)
    obs = jnp.ones((8, 4), jnp.float32)
    params = net.init(jax.random.PRNGKey(0), obs)

    def loss(p):
        (logits,), value = net.apply(p, obs)
        return jnp.sum(logits) + jnp.sum(value)

    dots = _dot_dtypes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    # 2 hidden layers and a head per tower. Forward: 4 hidden + 2 head matmuls; backward: a
    # kernel gradient per layer (4 + 2) and an input gradient per layer but the first (2 + 2).
    half = [d for d in dots if d == (["float16", "float16"], "float16")]
    full = [d for d in dots if d == (["float32", "float32"], "float32")]
    assert len(half) == 4 + 4 + 2 and len(full) == 2 + 2 + 2 and len(dots) == 16


@pytest.mark.slow
def test_gradients_between_layers_are_float16_so_loss_scaling_still_matters():
    """A loss gradient of 1e-9 underflows float16 (smallest subnormal 6e-8): every hidden
    layer's kernel gradient is zero unless the loss is scaled (the float32 head's is not);
    float32 keeps them."""
    obs = jax.random.normal(jax.random.PRNGKey(1), (8, 4))

    def kernel_grads(dtype, scale):
        net = ActorCritic(action_dim=2, hidden=(16, 16), dtype=dtype)
        params = net.init(jax.random.PRNGKey(0), obs)
        grads = jax.grad(lambda p: scale * 1e-9 * jnp.sum(net.apply(p, obs)[0][0]))(params)
        return [
            g
            for path, g in jax.tree_util.tree_leaves_with_path(grads)
            if "kernel" in jax.tree_util.keystr(path)
            and "actor_" in jax.tree_util.keystr(path)
            and "head" not in jax.tree_util.keystr(path)
        ]

    assert all(not np.any(g) for g in kernel_grads(jnp.float16, 1.0))
    assert all(np.any(g) for g in kernel_grads(jnp.float16, 2.0**16))
    assert all(np.any(g) for g in kernel_grads(jnp.float32, 1.0))
