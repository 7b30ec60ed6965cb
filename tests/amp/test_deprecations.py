"""0.2's spellings are gone, and none fails silently: each removed name raises an
AttributeError naming what to write instead (`amp._REMOVED`), and each removed argument,
argument order or `amp.stats` key fails loudly where it is used."""

import re
import warnings

import jax.numpy as jnp
import optax
import pytest

import genesis_jax
from genesis_jax import amp


@pytest.mark.parametrize("name", sorted(amp._REMOVED))
def test_every_removed_name_raises_naming_its_replacement(name):
    with pytest.raises(AttributeError, match=f"no attribute '{name}' \\(0.2's name, removed\\): use ") as raised:
        getattr(amp, name)
    assert amp._REMOVED[name] in str(raised.value) and name not in amp.__all__
    assert not hasattr(amp, name)


def test_the_package_root_reports_its_removed_names_as_amp_does():
    for name in ("all_finite", "get_policy", "make_loss_scale", "resolve_precision_name"):  # 0.2's genesis_jax.<name>
        with pytest.raises(AttributeError, match=re.escape(f"use {amp._REMOVED[name]}")):
            getattr(genesis_jax, name)


def test_the_surface_is_at_most_20_names_and_none_warns():
    assert len(amp.__all__) <= 20 and not set(amp.__all__) & set(amp._REMOVED)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in amp.__all__:
            getattr(amp, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'$"):
        amp.nope  # noqa: B018


def a_state(**kwargs):
    return amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16", **kwargs)


def test_the_old_loss_scale_spellings_fail_loudly():
    state = a_state()
    with pytest.raises(AttributeError, match="loss_scale"):
        state.loss_scale  # noqa: B018  (now state.scaler)
    with pytest.raises(TypeError, match="loss_scale= is 0.2's spelling of the scaler, removed in 0.4: pass scaler="):
        a_state(loss_scale=amp.StaticLossScale(8.0))  # now scaler=
    with pytest.raises(TypeError, match="loss_scale= is 0.2's spelling of the scaler, removed in 0.4: pass scaler="):
        state.apply_gradients(grads={"w": jnp.ones(3)}, loss_scale=amp.StaticLossScale(4.0))  # now scaler=


def test_the_0_2_train_step_order_is_refused_naming_loss_fn():
    def loss_fn(params, batch):
        x, y = batch
        return jnp.mean((x @ params["w"].astype(x.dtype) - y) ** 2), {"n": x.shape[0]}

    batch = (jnp.ones((4, 3), jnp.float16), jnp.zeros(4))  # the matmul in float16, as fp16 computes
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        amp.train_step(a_state(), batch, loss_fn)  # now train_step(state, loss_fn, batch, has_aux=True)
    _, metrics = amp.train_step(a_state(), loss_fn, batch, has_aux=True)
    assert metrics["aux"] == {"n": 4}


def test_the_old_stats_keys_are_gone():
    state, _ = amp.train_step(a_state(), lambda p: jnp.sum(p["w"]))
    counts = amp.stats(state)
    assert type(counts) is dict and set(counts) == {
        "steps",
        "skipped",
        "skip_rate",
        "halted",
        "scale",
        "backoffs",
        "precision",
    }
    for old in ("training_steps", "overflow_steps", "overflow_rate", "current_scale"):
        with pytest.raises(KeyError):
            counts[old]
