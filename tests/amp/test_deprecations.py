"""0.2's spellings still work until 0.4, each with one DeprecationWarning naming its 0.3
spelling: every name in `amp._deprecated.NAMES`, `TrainState.loss_scale`, `create(loss_scale=)`,
`apply_gradients(loss_scale=)`, the `train_step(state, batch, loss_fn)` form, `amp.stats`'
old keys, and 0.2's three functions for several optimizers (shared_scale_step,
update_shared_scale, share_scale), whose own behaviour is kept here."""

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import amp
from genesis_jax.amp import _deprecated

INF = float("inf")


def one_deprecation(fn):
    """fn() under a record of every warning: exactly one, a DeprecationWarning; its message and the result."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(deprecations) == 1, [str(w.message) for w in caught]
    return str(deprecations[0].message), result


@pytest.mark.parametrize("name", sorted(_deprecated.NAMES))
def test_every_0_2_name_still_works_and_warns_naming_its_new_spelling(name):
    module, attribute, new = _deprecated.NAMES[name]
    message, value = one_deprecation(lambda: getattr(amp, name))
    assert value is getattr(importlib.import_module(f"genesis_jax.amp.{module}"), attribute)
    assert f"amp.{name} is deprecated since genesis-jax 0.3" in message and new in message
    assert name not in amp.__all__


def test_the_surface_is_at_most_20_names_and_none_warns():
    assert len(amp.__all__) <= 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in amp.__all__:
            getattr(amp, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        amp.nope  # noqa: B018


def a_state(**kwargs):
    return amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16", **kwargs)


def test_the_old_loss_scale_property_is_the_scaler():
    state = a_state()
    message, scaler = one_deprecation(lambda: state.loss_scale)
    assert scaler is state.scaler and "TrainState.loss_scale" in message and "TrainState.scaler" in message


def test_create_and_apply_gradients_with_loss_scale_are_scaler():
    static = amp.StaticLossScale(8.0)
    message, state = one_deprecation(lambda: a_state(loss_scale=static))
    assert state.scaler is static and "create(loss_scale=...)" in message and "create(scaler=...)" in message
    grads = {"w": jnp.ones(3)}
    message, new = one_deprecation(lambda: state.apply_gradients(grads=grads, loss_scale=amp.StaticLossScale(4.0)))
    assert float(new.scaler.loss_scale) == 4.0 and "apply_gradients(scaler=...)" in message


def test_the_0_2_train_step_form_is_the_0_3_one_with_has_aux():
    def loss_fn(params, batch):
        x, y = batch
        return jnp.mean((x @ params["w"] - y) ** 2), {"n": x.shape[0]}

    batch = (jnp.ones((4, 3)), jnp.zeros(4))
    message, (old, old_metrics) = one_deprecation(lambda: amp.train_step(a_state(), batch, loss_fn))
    assert "train_step(state, batch, loss_fn)" in message and "has_aux=True" in message
    new, new_metrics = amp.train_step(a_state(), loss_fn, batch, has_aux=True)
    for a, b in zip(jax.tree.leaves((old, old_metrics)), jax.tree.leaves((new, new_metrics)), strict=True):
        np.testing.assert_array_equal(a, b)
    assert old_metrics["aux"] == {"n": 4}


def test_the_old_stats_keys_read_the_new_ones():
    state, _ = amp.train_step(a_state(), lambda p: jnp.sum(p["w"]))
    counts = amp.stats(state)
    for old, new in {
        "training_steps": "steps",
        "overflow_steps": "skipped",
        "overflow_rate": "skip_rate",
        "current_scale": "scale",
    }.items():
        assert old not in counts.keys()
        message, value = one_deprecation(lambda: counts[old])
        assert value == counts[new] and repr(old) in message and repr(new) in message
    with pytest.raises(KeyError):
        counts["nope"]


# --- 0.2's several-optimizer functions, kept as they were --------------------------------------


def linear_loss(params, batch):
    x, y, factor = batch
    return factor * jnp.mean((x @ params["w"] + params["b"] - y) ** 2), {"factor": factor}


def new_state(tx, seed):
    params = {"w": jnp.full((3, 1), 0.1 * (seed + 1)), "b": jnp.zeros(1)}
    return amp.TrainState.create(params=params, tx=tx, precision="fp16")


def assert_bit_identical(before, after):
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert np.array_equal(a, b)


def old(name):
    with pytest.warns(DeprecationWarning, match=f"amp.{name} is deprecated"):
        return getattr(amp, name)


def test_shared_scale_step_scales_by_the_given_scale_and_leaves_the_state_scaler_alone():
    shared_scale_step = old("shared_scale_step")

    def loss_fn(params, batch):
        return 1e34 * jnp.sum(params["w"]), {}

    state = amp.TrainState.create(params={"w": jnp.ones(2)}, tx=optax.sgd(1e-30), precision="fp16")
    own = jax.device_get(state.scaler)
    with pytest.warns(DeprecationWarning, match="shared_scaler=True"):
        stepped, metrics = shared_scale_step(state, None, loss_fn, amp.DynamicLossScale(init_scale=2.0**8))
    assert bool(metrics["grads_finite"]) and float(metrics["loss_scale"]) == 2.0**8
    assert int(stepped.skipped) == 0 and not np.array_equal(stepped.params["w"], state.params["w"])
    assert_bit_identical(own, stepped.scaler)
    with pytest.warns(DeprecationWarning):
        _, metrics = shared_scale_step(state, None, loss_fn, state.scaler)  # its own 2^16 overflows
    assert not bool(metrics["grads_finite"])


def test_the_three_old_functions_still_share_one_scale_as_update_scaler_does():
    shared_scale_step, update_shared_scale, share_scale = (
        old("shared_scale_step"),
        old("update_shared_scale"),
        old("share_scale"),
    )
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 1))
    scaler = amp.DynamicLossScale(init_scale=2.0**10)
    with pytest.warns(DeprecationWarning):
        actor, a = shared_scale_step(new_state(optax.sgd(0.05), 0), (x, y, 1.0), linear_loss, scaler)
        critic, c = shared_scale_step(new_state(optax.adam(1e-2), 1), (x, y, INF), linear_loss, scaler)
        scaler = update_shared_scale(scaler, [a["grads_finite"], c["grads_finite"]])
        actor, critic = share_scale((actor, critic), scaler)
    assert float(scaler.loss_scale) == 2.0**9 and (int(actor.skipped), int(critic.skipped)) == (0, 1)
    assert_bit_identical(actor.scaler, critic.scaler)


def test_share_scale_reaches_every_state_in_a_tree_and_keeps_other_leaves():
    share_scale = old("share_scale")
    states = {"critic": new_state(optax.adam(1e-3), 0), "actor": new_state(optax.sgd(0.1), 1), "tau": jnp.float32(5e-3)}
    scaler = amp.DynamicLossScale(init_scale=32.0).adjust(jnp.array(True))
    with pytest.warns(DeprecationWarning, match="update_scaler"):
        shared = share_scale(states, scaler)
    for name in ("critic", "actor"):
        assert_bit_identical(scaler, shared[name].scaler)
        assert_bit_identical(states[name].params, shared[name].params)
    assert shared["tau"] is states["tau"]
    assert amp.stats(shared["actor"])["scale"] == 32.0


def test_update_shared_scale_takes_any_tree_of_decisions():
    update_shared_scale = old("update_shared_scale")
    scaler = amp.DynamicLossScale(init_scale=8.0, growth_interval=1)
    three = {"critic": jnp.array(True), "actor": jnp.array(True), "temperature": np.bool_(False)}
    with pytest.warns(DeprecationWarning):
        assert float(update_shared_scale(scaler, three).loss_scale) == 4.0
        assert float(update_shared_scale(scaler, (True, True, True)).loss_scale) == 16.0
        generator = (flag for flag in (jnp.array(True), jnp.array(False)))  # once a raw TypeError
        assert float(update_shared_scale(scaler, generator).loss_scale) == 4.0


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda f, s: f["update_shared_scale"](s, []), ValueError, "got none"),
        (lambda f, s: f["update_shared_scale"](s, [jnp.array([True, False])]), ValueError, "scalar bools"),
        (lambda f, s: f["update_shared_scale"](s, [jnp.float32(1.0)]), ValueError, "dtype float32"),
        (lambda f, s: f["update_shared_scale"](s, ["False"]), ValueError, "got str"),
        (lambda f, s: f["update_shared_scale"](s, [0.0]), ValueError, "got float"),
        (lambda f, s: f["update_shared_scale"](2.0, [True]), TypeError, "loss_scale must be"),
        (lambda f, s: f["share_scale"]({"a": 1}, s), ValueError, "at least one amp.TrainState"),
        (lambda f, s: f["share_scale"](new_state(optax.sgd(0.1), 0), 1024.0), TypeError, "got 1024.0"),
        (
            lambda f, s: f["shared_scale_step"]({"w": 1}, None, linear_loss, s),
            TypeError,
            "state must be an amp.TrainState",
        ),
        (lambda f, s: f["shared_scale_step"](new_state(optax.sgd(0.1), 0), None, linear_loss, None), TypeError, "None"),
    ],
)
def test_the_old_functions_refuse_bad_input_naming_the_bad_value(call, error, words):
    functions = {name: old(name) for name in ("update_shared_scale", "share_scale", "shared_scale_step")}
    with pytest.warns(DeprecationWarning), pytest.raises(error, match=words):
        call(functions, amp.DynamicLossScale())
