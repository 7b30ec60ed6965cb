"""The misuse table: each mistake a user made with amp, written as they wrote it. Each either
works (params finite, the skip counted) or stops before any step with one sentence naming the
fix. (Mistake 3, a precision that changes nothing, and 4, Equinox, are read from the jaxpr:
tests/amp/test_inspect.py.)"""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from genesis_jax import amp


class HalfMLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(3, 8, dtype=jnp.float16, rngs=rngs)
        self.out = nnx.Linear(8, 1, dtype=jnp.float16, rngs=rngs)

    def __call__(self, x):
        return self.out(nnx.relu(self.hidden(x))).astype(jnp.float32)


def loss_fn(model, x):
    return jnp.mean(model(x) ** 2)


X, OVERFLOW = jnp.ones((4, 3)), jnp.full((4, 3), 1e4)  # 1e4: the float16 forward overflows


def params_finite(model) -> bool:
    return all(np.isfinite(np.asarray(v)).all() for v in __import__("jax").tree.leaves(nnx.state(model, nnx.Param)))


def test_1_a_plain_nnx_optimizer_is_refused_before_any_step():
    model = HalfMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)  # no skip_nonfinite
    with pytest.raises(TypeError, match="only as an amp.Optimizer .* a plain nnx.Optimizer would apply a non-finite"):
        amp.scaled_value_and_grad(loss_fn)(optimizer, model, OVERFLOW)
    assert int(optimizer.step[...]) == 0 and params_finite(model)


def test_2_and_6_the_nnx_scaler_is_stored_by_the_step_itself_in_one_optimizer():
    model = HalfMLP(nnx.Rngs(0))
    optimizer = amp.Optimizer(model, optax.adam(1e-3), precision="fp16", scaler=amp.DynamicLossScale(init_scale=2.0**8))

    @nnx.jit
    def step(model, optimizer, x):  # nothing written back by hand
        loss, grads, finite, norm, _ = amp.scaled_value_and_grad(loss_fn)(optimizer, model, x)
        optimizer.update(model, grads, grads_finite=finite, grad_norm=norm)
        return loss

    for x in (X, OVERFLOW, X):
        step(model, optimizer, x)
    assert params_finite(model)
    assert amp.stats(optimizer) == {
        "steps": 3,
        "skipped": 1,
        "skip_rate": 1 / 3,
        "scale": 2.0**7,
        "backoffs": 1,
        "precision": "fp16",
    }
    linen = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
    assert amp.stats(optimizer).keys() == amp.stats(linen).keys()  # the same fields in every style


def test_5_stats_leaves_out_an_optimizer_that_is_none():
    make = lambda: amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")  # noqa: E731
    counts = amp.stats(critic=make(), actor=make(), alpha=None)  # CleanRL's --no-autotune
    assert set(counts["optimizers"]) == {"critic", "actor"}
    assert amp.stats(make(), None)["steps"] == 0
