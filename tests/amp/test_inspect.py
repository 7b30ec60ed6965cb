"""`amp.dtype_report` (what a traced step computes in) and `amp.autocast`'s per-operation rule:
matmuls and convolutions in half precision, exp/log/sums in float32, float32 outputs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import amp


def mlp(params, x):  # no dtype anywhere
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


def mlp_params(key=jax.random.PRNGKey(0)):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (4, 16)) / 2, "w2": jax.random.normal(k2, (16, 1)) / 4}


X = jax.random.normal(jax.random.PRNGKey(1), (8, 4))


class Dense2(nn.Module):  # a linen network with no dtype field
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(16)(x)))[..., 0]


def test_a_two_layer_mlp_under_autocast_has_two_float16_matmuls_and_a_float32_output():
    report = amp.dtype_report(amp.autocast(mlp, "fp16"), mlp_params(), X)
    assert report.dtypes("matmul") == {"float16": 2}
    assert [(op.op, op.inputs, op.output) for op in report.ops] == [
        ("dot_general", ("float16", "float16"), "float16")
    ] * 2
    assert report.outputs == ("float32",)
    plain = amp.dtype_report(mlp, mlp_params(), X)
    assert plain.dtypes("matmul") == {"float32": 2} and plain.outputs == ("float32",)


def test_the_loss_reduction_is_reported_in_float32_and_the_table_reads():
    def loss_fn(params, x, y):
        return jnp.mean((amp.autocast(mlp, "fp16")(params, x)[:, 0] - y) ** 2)

    report = amp.dtype_report(loss_fn, mlp_params(), X, jnp.zeros(8))
    assert report.dtypes("matmul") == {"float16": 2}
    assert report.dtypes("reduction") == {"float32": 1} and report.outputs == ("float32",)
    text = str(report)
    assert text.count("dot_general") == 2 and "reduce_sum" in text
    assert text.splitlines()[-1] == (  # the square, as torch.autocast's pow, in float32
        "matmul {'float16': 2}, exp/log {'float32': 1}, reduction {'float32': 1}; outputs {'float32': 1}"
    )


def test_a_convolution_is_reported_with_its_dtypes():
    conv, images = nn.Conv(4, (3, 3)), jnp.ones((2, 8, 8, 3))
    params = conv.init(jax.random.PRNGKey(0), images)
    assert amp.dtype_report(conv.apply, params, images).dtypes("conv") == {"float32": 1}
    report = amp.dtype_report(amp.autocast(conv, "fp16").apply, params, images)
    assert [(op.kind, op.op, op.inputs, op.output) for op in report.ops] == [
        ("conv", "conv_general_dilated", ("float16", "float16"), "float16")
    ]
    assert report.outputs == ("float32",)


@jax.custom_jvp
def softplus(x):
    return jnp.log1p(jnp.exp(x))


softplus.defjvp(lambda primals, tangents: (softplus(*primals), tangents[0] * jax.nn.sigmoid(*primals)))


def test_ops_inside_jit_scan_cond_while_remat_and_custom_jvp_are_found_with_where_they_sit():
    def fn(w, x):
        def body(carry, _):
            return jnp.tanh(carry @ w), None

        h, _ = jax.lax.scan(body, x, None, length=3)
        h = jax.jit(lambda h: softplus(h) @ w)(h)
        h = jax.checkpoint(lambda h: h @ w)(h)
        n = jax.lax.while_loop(lambda n: n < 3.0, lambda n: n + jnp.max(x), 0.0)
        return jax.lax.cond(n > 0, lambda: jnp.sum(h), lambda: jnp.max(h))

    report = amp.dtype_report(fn, jnp.ones((4, 4)), X)
    assert [(op.op, op.where) for op in report.ops] == [
        ("dot_general", "scan"),
        ("exp", "jit(<lambda>)/custom_jvp_call"),
        ("log1p", "jit(<lambda>)/custom_jvp_call"),
        ("dot_general", "jit(<lambda>)"),
        ("dot_general", "remat2"),
        ("reduce_max", "while"),
        ("reduce_max", "cond"),
        ("reduce_sum", "cond"),
    ]
    assert report.dtypes("matmul") == {"float32": 3} and report.dtypes("exp/log") == {"float32": 2}
    half = amp.dtype_report(amp.autocast(fn, "fp16"), jnp.ones((4, 4)), X)  # a jitted function's ops are cast too,
    assert half.dtypes("matmul") == {"float16": 3}  # and those of a scan's body and a remat's
    assert half.dtypes("exp/log") == {"float32": 2}  # a custom_jvp runs as traced (autocast's docstring says so):
    traced_in_half = amp.dtype_report(amp.autocast(fn, "fp16"), jnp.ones((4, 4), jnp.float16), X.astype(jnp.float16))
    assert traced_in_half.dtypes("exp/log") == {"float16": 2}  # not cast up to float32, as exp and log elsewhere are


def test_a_step_under_autocast_differentiates_in_float16_with_float32_gradients():
    report = amp.dtype_report(jax.grad(lambda p, x: jnp.sum(amp.autocast(mlp, "fp16")(p, x))), mlp_params(), X)
    assert report.dtypes("matmul") == {"float16": 5}  # 2 forward, 3 backward
    assert set(report.outputs) == {"float32"}


def test_mistake_3_a_dtype_less_linen_module_computes_in_float32_which_the_report_shows():
    """What `TrainState.create(apply_fn=net.apply, precision="fp16")` would have trained: every
    matmul of the step in float32, which the step refuses (tests/amp/test_misuse.py)."""
    net, y = Dense2(), jnp.zeros(8)
    params = net.init(jax.random.PRNGKey(0), X)

    def matmuls(apply_fn):
        state = amp.TrainState.create(params=params, tx=optax.adam(1e-3), precision="fp16")

        def loss_fn(params, x, y):
            return jnp.mean((apply_fn(params, x) - y) ** 2)

        return amp.dtype_report(amp.train_step, state, loss_fn, X, y).dtypes("matmul")

    assert amp.dtype_report(lambda p: net.apply(p, X), params).dtypes("matmul") == {"float32": 2}
    with pytest.raises(ValueError, match=r"precision 'fp16' computes nothing in float16: loss_fn runs 2 matmul"):
        matmuls(net.apply)  # what the user believed was float16
    assert matmuls(amp.autocast(net, "fp16").apply) == {"float16": 5}  # the fix the refusal names


def test_autocast_casts_per_operation_closed_over_weights_and_float32_islands():
    w = jnp.full((4, 3), 0.1)

    def fn(x):  # w is a constant of fn, not an argument; exp, log and the sum are precision-sensitive
        y = x @ w
        return jnp.log(jnp.sum(jnp.exp(y), axis=-1)) + y[:, 0] * 0.5

    report = amp.dtype_report(amp.autocast(fn, "fp16"), X)
    assert report.dtypes("matmul") == {"float16": 1}
    assert report.dtypes("exp/log") == {"float32": 2} and report.dtypes("reduction") == {"float32": 1}
    assert report.outputs == ("float32",)
    np.testing.assert_allclose(amp.autocast(fn, "fp16")(X), fn(X), rtol=2e-3, atol=2e-3)
    # an accumulation asked for explicitly stays: float16 operands, a float32 result
    wide = amp.dtype_report(
        amp.autocast(
            lambda x: jnp.dot(x.astype(jnp.float16), w.astype(jnp.float16), preferred_element_type=jnp.float32), "fp16"
        ),
        X,
    )
    assert [(op.inputs, op.output) for op in wide.ops] == [(("float16", "float16"), "float32")]


def test_gradients_through_autocast_match_float32_within_float16_tolerance():
    params = mlp_params()

    def loss(forward):
        return lambda p, x: jnp.mean(forward(p, x) ** 2)

    ref = jax.grad(loss(mlp))(params, X)
    got = jax.grad(loss(amp.autocast(mlp, "fp16")))(params, X)
    for name in ref:
        assert got[name].dtype == jnp.float32
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-2, atol=1e-3 * float(jnp.abs(ref[name]).max()))
    jitted = jax.jit(jax.vmap(amp.autocast(mlp, "fp16"), in_axes=(None, 0)))(params, X)  # jit and vmap compose
    assert jitted.dtype == jnp.float32 and jitted.shape == (8, 1)


def test_mistake_4_autocast_runs_an_equinox_module_in_float16_with_float32_out_and_grads():
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(4, 1, 16, 2, key=jax.random.PRNGKey(0))
    half = amp.autocast(model, "fp16")  # the whole module: no eqx.partition, no dtype field
    report = amp.dtype_report(jax.vmap(half), X)
    assert report.dtypes("matmul") == {"float16": 3} and report.outputs == ("float32",)
    np.testing.assert_allclose(jax.vmap(half)(X), jax.vmap(model)(X), rtol=1e-2, atol=1e-2)

    def loss(m, x):
        return jnp.mean(jax.vmap(m)(x) ** 2)

    ref, got = eqx.filter_grad(loss)(model, X), eqx.filter_grad(loss)(half, X)  # half is a pytree holding model
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert g.dtype == jnp.float32
        np.testing.assert_allclose(g, r, rtol=2e-2, atol=2e-3 * float(jnp.abs(r).max()))
    # the whole model as an argument, as a plain forward function takes it
    forward = amp.autocast(lambda m, x: jax.vmap(m)(x), "fp16")
    assert amp.dtype_report(forward, model, X).dtypes("matmul") == {"float16": 3}


def test_autocast_refuses_an_nnx_module_by_naming_the_fix():
    from flax import nnx

    with pytest.raises(TypeError, match="autocast takes no NNX module: give its layers dtype=jnp.float16"):
        amp.autocast(nnx.Linear(3, 2, rngs=nnx.Rngs(0)), "fp16")


def test_a_precision_rule_head_under_autocast_keeps_float32_outputs():
    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(1, name="value_head")(nn.LayerNorm()(nn.Dense(16)(x)))

    net = Net()
    params = net.init(jax.random.PRNGKey(0), X)
    with amp.precision_rules(amp.FLOAT32_RULES):
        report = amp.dtype_report(amp.autocast(net, "fp16").apply, params, X)
        out = amp.autocast(net, "fp16").apply(params, X)
    assert report.dtypes("matmul") == {"float16": 2}  # every matmul in half, as under torch.autocast
    assert set(report.dtypes("reduction")) == {"float32"} and out.dtype == jnp.float32
