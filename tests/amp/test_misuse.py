"""The misuse table: each mistake a user made with amp, written as they wrote it. Each either
works (params finite, the skip counted) or stops before any step with one sentence naming the
fix. (What mistake 3 would have computed, and Equinox under autocast, are read from the jaxpr:
tests/amp/test_inspect.py.)"""

import flax.linen as nn
import jax
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
    return all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_1_a_plain_nnx_optimizer_is_refused_before_any_step():
    model = HalfMLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)  # no skip_nonfinite
    with pytest.raises(TypeError, match="an amp.Optimizer .* a plain nnx.Optimizer would apply a non-finite step"):
        amp.scaled_value_and_grad(loss_fn)(optimizer, model, OVERFLOW)
    assert int(optimizer.step[...]) == 0 and params_finite(model)


def test_1_a_plain_optax_state_and_a_bare_scaler_are_refused_before_any_step():
    params = {"w": jnp.ones(3)}
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p["w"] * x))
    plain = optax.adam(1e-3).init(params)  # no skip_nonfinite: it would apply inf
    with pytest.raises(TypeError, match="amp.skip_nonfinite: a plain optax optimizer would apply a non-finite step"):
        grad_fn((amp.DynamicLossScale(), plain), params, jnp.full(3, jnp.inf))
    with pytest.raises(TypeError, match="got DynamicLossScale.*which does not show whether its optimizer skips"):
        grad_fn(amp.DynamicLossScale(), params, jnp.ones(3))  # 0.3's spelling, removed
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    opt_state = tx.init(params)
    _, grads, finite, norm, scaler = grad_fn((amp.DynamicLossScale(), opt_state), params, jnp.full(3, jnp.inf))
    updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
    params = optax.apply_updates(params, updates)
    assert np.isfinite(np.asarray(params["w"])).all() and amp.stats(opt_state)["skipped"] == 1
    assert float(scaler.loss_scale) == 2.0**15


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
        "halted": False,
        "scale": 2.0**7,
        "backoffs": 1,
        "precision": "fp16",
    }
    linen = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
    assert amp.stats(optimizer).keys() == amp.stats(linen).keys()  # the same fields in every style


class Dense2(nn.Module):  # a linen network with no dtype field: it computes in its params' float32
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.relu(nn.Dense(8)(x)))[..., 0]


class Typed(nn.Module):
    dtype: jnp.dtype | None = None

    @nn.compact
    def __call__(self, x):
        return nn.Dense(1, dtype=self.dtype)(x)[..., 0]


COMPUTES_NOTHING = (
    r"precision '(fp16|bf16)' computes nothing in (float16|bfloat16): loss_fn runs \d matmul.* in float32"
)


def linen_loss(apply_fn):
    return lambda params, x: jnp.mean(apply_fn(params, x).astype(jnp.float32) ** 2)


@pytest.mark.parametrize("module", [Dense2(), Typed(), Typed(jnp.float32)], ids=["no-field", "None", "float32"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_3_a_half_precision_step_whose_linen_module_computes_in_float32_is_refused_before_it_runs(module, precision):
    params = module.init(jax.random.PRNGKey(0), X)
    state = amp.TrainState.create(apply_fn=module.apply, params=params, tx=optax.adam(1e-3), precision=precision)
    for apply_fn in (module.apply, jax.jit(module.apply), None):  # the apply given, jitted, or none at all
        state = state.replace(apply_fn=apply_fn)
        with pytest.raises(ValueError, match=COMPUTES_NOTHING + r".*dtype=jnp\.\w+.*amp\.autocast\(network"):
            jax.jit(amp.train_step, static_argnums=1)(state, linen_loss(module.apply), X)
    assert int(state.step) == 0


def test_3_an_nnx_model_and_a_loss_under_policy_that_compute_in_float32_are_refused_before_any_step():
    class Float32MLP(HalfMLP):  # the layers without dtype=: float32 matmuls
        def __init__(self, rngs):
            self.hidden, self.out = nnx.Linear(3, 8, rngs=rngs), nnx.Linear(8, 1, rngs=rngs)

    model = Float32MLP(nnx.Rngs(0))
    optimizer = amp.Optimizer(model, optax.adam(1e-3), precision="fp16")
    with pytest.raises(ValueError, match=COMPUTES_NOTHING):
        amp.scaled_value_and_grad(loss_fn)(optimizer, model, X)
    assert int(optimizer.step[...]) == 0 and float(amp.stats(optimizer)["scale"]) == 2.0**16
    params = {"w": jnp.ones((3, 1))}
    casts_up = lambda p, x: jnp.mean(x.astype(jnp.float32) @ p["w"].astype(jnp.float32))  # noqa: E731
    pair = (amp.DynamicLossScale(), amp.skip_nonfinite(optax.sgd(0.1)).init(params))
    with pytest.raises(ValueError, match=COMPUTES_NOTHING):
        amp.scaled_value_and_grad(casts_up, policy="fp16")(pair, params, X)


@pytest.mark.filterwarnings("ignore:precision 'fp16-full' stores")
def test_3_what_computes_in_half_precision_or_in_float32_by_choice_is_accepted():
    ok = [
        (amp.autocast(Dense2(), "fp16"), "fp16"),  # the fix
        (Typed(jnp.float16), "fp16"),  # the other fix
        (Typed(jnp.bfloat16), "fp16"),  # half all the same
        (Dense2(), "fp32"),
        (Dense2(), None),
    ]
    for module, precision in ok:
        params = module.init(jax.random.PRNGKey(0), X)
        state = amp.TrainState.create(apply_fn=module.apply, params=params, tx=optax.adam(1e-3), precision=precision)
        state, _ = amp.train_step(state, linen_loss(module.apply), X)
        assert int(state.step) == 1
    params = Dense2().init(jax.random.PRNGKey(0), X)
    full = amp.TrainState.create(params=params, tx=optax.adam(1e-3, eps=1e-5), precision="fp16-full")  # float16 params
    with pytest.raises(ValueError, match=COMPUTES_NOTHING.replace("fp16|", "fp16-full|")):  # float32 x promotes
        amp.train_step(full, linen_loss(Dense2().apply), X)
    assert int(amp.train_step(full, linen_loss(Dense2().apply), X.astype(jnp.float16))[0].step) == 1
    temperature = amp.TrainState.create(params=jnp.float32(0.0), tx=optax.sgd(0.1), precision="fp16")
    assert int(amp.train_step(temperature, lambda a, h: -a * (h + 1.0), jnp.float32(-2.0))[0].step) == 1  # no matmul
    pair = (amp.DynamicLossScale(), amp.skip_nonfinite(optax.sgd(0.1)).init(params))
    assert amp.scaled_value_and_grad(linen_loss(Dense2().apply))(pair, params, X).grads_finite  # the loss decides


def test_4_a_whole_equinox_model_is_refused_with_the_partition_to_use():
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(3, 1, 8, 1, key=jax.random.PRNGKey(0))  # holds its activation functions
    params, static = eqx.partition(model, eqx.is_inexact_array)
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    grad_fn = amp.scaled_value_and_grad(lambda model, x: jnp.mean(jax.vmap(model)(x)))
    fix = r"eqx\.partition\(model, eqx\.is_inexact_array\)"  # inexact: an int array has no gradient
    with pytest.raises(TypeError, match=r"argument 0 holds .*not an array \(an Equinox module\?\).*" + fix):
        grad_fn((amp.DynamicLossScale(), tx.init(params)), model, X)
    partitioned = amp.scaled_value_and_grad(lambda params, x: jnp.mean(jax.vmap(eqx.combine(params, static))(x)))
    out = partitioned((amp.DynamicLossScale(), tx.init(params)), params, X)  # the fix the sentence names
    assert bool(out.grads_finite)


def test_5_stats_leaves_out_an_optimizer_that_is_none():
    make = lambda: amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")  # noqa: E731
    counts = amp.stats(critic=make(), actor=make(), alpha=None)  # CleanRL's --no-autotune
    assert set(counts["optimizers"]) == {"critic", "actor"}
    assert amp.stats(make(), None)["steps"] == 0


# -- found by trying more compositions as a user would ------------------------------------

PARAMS = {"critic": jnp.ones(3), "actor": jnp.ones(3)}
NAN_GRADS = {"critic": jnp.full(3, jnp.nan), "actor": jnp.full(3, jnp.nan)}
PART_ONLY = "amp.skip_nonfinite decides for a part of this optimizer only .*: wrap the whole optimizer"


class TwoGroups(nnx.Module):  # the NNX twin of PARAMS
    def __init__(self):
        self.critic, self.actor = nnx.Param(jnp.ones(3)), nnx.Param(jnp.ones(3))


def by_group(params):  # multi_transform's labels, from a function: each leaf its top-level name
    return jax.tree_util.tree_map_with_path(lambda path, _: path[0].key, params)


@pytest.mark.parametrize(
    "make_tx",
    [
        # inside MultiSteps: given the mean of micro-batches its decision never saw (NaN params)
        lambda: optax.MultiSteps(amp.skip_nonfinite(optax.adam(1e-2)), 2).gradient_transformation(),
        # one group of multi_transform, labelled by a function: the other group steps on NaN
        lambda: optax.multi_transform(
            {"critic": amp.skip_nonfinite(optax.sgd(0.1)), "actor": optax.sgd(0.1)}, by_group
        ),
        # a transformation after it (AdamW's decay): it changes the params on a skipped step
        lambda: optax.chain(amp.skip_nonfinite(optax.sgd(0.1)), optax.add_decayed_weights(0.5)),
        # a stateful one before it: its state takes the non-finite gradients
        lambda: optax.chain(optax.scale_by_adam(), amp.skip_nonfinite(optax.sgd(0.1))),
    ],
    ids=["inside-multisteps", "one-group-of-multi-transform", "before-weight-decay", "after-adam's-moments"],
)
def test_a_skip_nonfinite_that_decides_for_part_of_the_optimizer_is_refused_in_every_style(make_tx):
    with pytest.raises(ValueError, match=PART_ONLY):
        amp.TrainState.create(params=PARAMS, tx=make_tx(), precision="fp16")
    with pytest.raises(ValueError, match=PART_ONLY):
        amp.Optimizer(TwoGroups(), make_tx(), wrt=nnx.Param)
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p["critic"] * x) + jnp.sum(p["actor"] * x))
    with pytest.raises(ValueError, match=PART_ONLY):  # a pytree loop of your own
        grad_fn((amp.DynamicLossScale(), make_tx().init(PARAMS)), PARAMS, jnp.ones(3))


@pytest.mark.parametrize(
    "tx",
    [
        amp.skip_nonfinite(optax.MultiSteps(optax.adam(1e-2), 2).gradient_transformation()),
        amp.skip_nonfinite(optax.chain(optax.sgd(0.1), optax.add_decayed_weights(0.5))),
        optax.chain(optax.clip_by_global_norm(1.0), amp.skip_nonfinite(optax.sgd(0.1))),
        optax.multi_transform({"critic": optax.sgd(0.1), "actor": optax.adam(1e-2)}, by_group),
    ],
    ids=["around-multisteps", "around-weight-decay", "after-stateless-clipping", "multi-transform-wrapped-whole"],
)
def test_the_same_compositions_with_skip_nonfinite_around_the_whole_skip_exactly(tx):
    state = amp.TrainState.create(params=PARAMS, tx=tx)  # no scaler: the step decides on the gradients
    state = state.apply_gradients(grads=NAN_GRADS)
    assert all(np.asarray(v).tolist() == [1.0] * 3 for v in state.params.values())  # unchanged, bit for bit
    assert int(state.skipped) == 1
    state = state.apply_gradients(grads={"critic": jnp.ones(3), "actor": jnp.ones(3)})
    assert int(state.skipped) == 1 and np.isfinite(np.asarray(state.params["critic"])).all()


def test_stats_of_a_dict_of_states_counts_each_and_independent_scalers_are_reported_each():
    make = lambda: amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")  # noqa: E731
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p * x))
    actor, critic = make(), make()
    for x in (jnp.full(2, jnp.inf), jnp.full(2, jnp.inf)):  # the critic overflows twice, on its own scaler
        _, grads, finite, norm, scaler = grad_fn(critic, critic.params, x)
        critic = critic.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler)
    counts = amp.stats({"actor": actor, "critic": critic})  # as update_scaler takes them
    assert {name: c["skipped"] for name, c in counts["optimizers"].items()} == {"actor": 0, "critic": 2}
    # not one scale for both: each its own, beside its counts
    assert "scale" not in counts
    assert counts["optimizers"]["critic"]["scale"] == 2.0**14 and counts["optimizers"]["critic"]["backoffs"] == 2
    assert counts["optimizers"]["actor"]["scale"] == 2.0**16 and counts["optimizers"]["actor"]["backoffs"] == 0
    assert amp.stats(actor=actor, critic=critic) == counts


def test_an_nnx_model_in_float16_under_float32_master_weights_is_refused_naming_param_dtype():
    model = nnx.Linear(3, 1, dtype=jnp.float16, param_dtype=jnp.float16, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"'fp16' stores params in float32, but the model's nnx.Param are float16"):
        amp.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param, precision="fp16")
    amp.Optimizer(model, optax.adam(1e-3, eps=1e-5), wrt=nnx.Param, precision="fp16-full")  # float16 params: its own


def test_callable_params_are_cast_to_float32_master_weights_as_any_pytree():
    params = jax.tree_util.Partial(lambda w, x: w * x, jnp.ones(3, jnp.float16))  # callable, as an eqx.Module is
    state = amp.TrainState.create(params=params, tx=optax.sgd(0.1), precision="fp16")
    assert [leaf.dtype for leaf in jax.tree.leaves(state.params)] == [jnp.float32]


def test_states_created_from_one_scaler_object_can_be_donated_together():
    scaler = amp.DynamicLossScale()  # one object for both, as from-pytorch.md's shared scaler
    make = lambda: amp.TrainState.create(  # noqa: E731
        params=jnp.ones(2), tx=optax.sgd(0.1), scaler=scaler, precision="fp16", shared_scaler=True
    )
    step = jax.jit(lambda a, c: (a.replace(step=a.step + 1), c), donate_argnums=(0, 1))
    a, c = step(make(), make())  # raised "Attempt to donate the same buffer twice" before
    assert int(a.step) == 1 and float(c.scaler.loss_scale) == 2.0**16


def test_an_optimizer_state_and_scaler_given_in_the_wrong_order_are_named_so():
    tx, params = amp.skip_nonfinite(optax.sgd(0.1)), jnp.ones(2)
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p * x))
    with pytest.raises(TypeError, match=r"\(scaler, opt_state\) in that order, got \(opt_state, scaler\)"):
        grad_fn((tx.init(params), amp.DynamicLossScale()), params, jnp.ones(2))


def test_a_checkpoint_restored_into_another_kind_of_scaler_is_refused_not_read_as_it():
    from flax import serialization

    fp16 = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")
    fp32 = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp32")
    for saved, template in ((fp16, fp32), (fp32, fp16)):  # read as a NoOp scale of 65536 / a KeyError before
        with pytest.raises(ValueError, match=r"cannot be restored from a saved scaler with fields .*: restore into"):
            serialization.from_bytes(template, serialization.to_bytes(saved))
    restored = serialization.from_bytes(fp16, serialization.to_bytes(fp16))
    assert float(restored.scaler.loss_scale) == 2.0**16


@pytest.mark.parametrize(
    ("loss_fn", "has_aux", "message"),
    [
        (lambda p, x: (jnp.sum(p * x), {"n": 1}), False, r"got tuple; with aux, return \(loss, aux\) and pass has_aux"),
        (lambda p, x: p * x, False, r"loss_fn must return one number, the loss \(a scalar\), got shape \(2,\)"),
        (
            lambda p, x: jnp.sum(p * x),
            True,
            r"with has_aux=True, loss_fn must return \(loss, aux\), got an array of shape \(\)",
        ),
    ],
    ids=["aux-without-has-aux", "a-vector-loss", "has-aux-without-aux"],
)
def test_a_loss_fn_that_does_not_return_what_has_aux_says_is_refused_in_a_sentence(loss_fn, has_aux, message):
    state = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16")
    with pytest.raises(TypeError, match=message):
        amp.train_step(state, loss_fn, jnp.ones(2), has_aux=has_aux)
    with pytest.raises(TypeError, match=message):
        amp.scaled_value_and_grad(loss_fn, has_aux=has_aux)(state, state.params, jnp.ones(2))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((jnp.ones((4, 2)), jnp.float32(0.5)), {}, r"accumulate=2 splits the leading axis .* one holds a scalar"),
        ((jnp.ones((4, 2)), jax.random.key(0)), {}, r"accumulate=2 splits the leading axis .* one holds a key"),
        ((), {"x": jnp.ones((4, 2)), "c": 0.5}, r"accumulate=2 splits loss_fn's positional arguments: pass the batch"),
    ],
    ids=["a-scalar", "a-typed-key", "the-batch-as-keywords"],
)
def test_accumulate_given_what_it_cannot_split_says_what_to_pass_instead(args, kwargs, message):
    def loss_fn(params, x, c=1.0, key=None):
        return jnp.mean((x.astype(jnp.float16) @ params.astype(jnp.float16)).astype(jnp.float32)) * c

    scaler = amp.DynamicLossScale(init_scale=2.0**8)  # the float16 backward of a ones batch overflows at 2^16
    state = amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16", scaler=scaler)
    with pytest.raises(ValueError, match=message):
        amp.scaled_value_and_grad(loss_fn, accumulate=2)(state, state.params, *args, **kwargs)
    if args:  # the same given as a keyword: split as it should be
        out = amp.scaled_value_and_grad(loss_fn, accumulate=2)(state, state.params, args[0])
        assert bool(out.grads_finite)


def pmean_after_the_norm(state, batches):
    """Two replicas (vmap with an axis name) of the Flax examples' data-parallel step: the loop
    averages the gradients itself, `lax.pmean` after `scaled_value_and_grad` took their norm."""
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p["w"] * x))

    def step(state, x):
        _, grads, finite, norm, scaler = grad_fn(state, state.params, x)
        grads = jax.lax.pmean(grads, "dp")
        return state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler)

    return jax.vmap(step, axis_name="dp")(jax.tree.map(lambda x: jnp.stack([x, x]), state), batches)


def test_a_decision_taken_before_a_pmean_the_loop_adds_skips_on_every_replica():
    """The data-parallel loop as Flax's examples write it: the decision of each replica's own
    gradients, then `lax.pmean` of them (instead of `axis_name=`). Replica 1's batch overflows:
    replica 0's decision said finite, but the averaged gradients hold an inf: skipped on both
    (once written into replica 0's params), and both scalers back off alike."""
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
    new = pmean_after_the_norm(state, jnp.stack([jnp.ones(3), jnp.full(3, jnp.inf)]))
    assert np.asarray(new.params["w"]).tolist() == [[1.0] * 3] * 2
    assert np.asarray(new.skipped).tolist() == [1, 1] and np.asarray(new.scaler.loss_scale).tolist() == [2.0**15] * 2


def test_another_optimizers_decision_cannot_apply_a_nan_gradient():
    """A copy-paste slip in an SAC-style loop: the actor's step given the critic's decision (and
    a pure loop's decision taken from the finite loss): the NaN gradient is still skipped."""
    critic, actor = (
        amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16") for _ in "ca"
    )
    grad_fn = amp.scaled_value_and_grad(lambda p, x: jnp.sum(p["w"] * x))
    _, _, critic_finite, critic_norm, _ = grad_fn(critic, critic.params, jnp.ones(3))
    _, grads, _, _, scaler = grad_fn(actor, actor.params, jnp.array([1.0, jnp.nan, 1.0]))
    actor = actor.apply_gradients(grads=grads, grads_finite=critic_finite, grad_norm=critic_norm, scaler=scaler)
    assert np.asarray(actor.params["w"]).tolist() == [1.0] * 3 and int(actor.skipped) == 1
    assert float(actor.scaler.loss_scale) == 2.0**15  # backed off: the step was skipped
    tx, params = amp.skip_nonfinite(optax.sgd(0.1)), {"w": jnp.ones(3)}
    updates, opt_state = tx.update({"w": jnp.array([1.0, jnp.inf, 1.0])}, tx.init(params), params, grads_finite=True)
    assert np.asarray(optax.apply_updates(params, updates)["w"]).tolist() == [1.0] * 3
    assert amp.stats(opt_state)["skipped"] == 1


def test_gradients_of_the_unscaled_loss_are_refused_by_an_optimizer_whose_scaler_scales():
    """`jax.grad` / `nnx.value_and_grad` in place of the scaled call: the loss was never scaled
    (float16 gradients flush to zero) while the scale would grow. Both styles refuse before any
    step; without a scaler (fp32, bf16) the step decides on the gradients itself, as before."""
    model = HalfMLP(nnx.Rngs(0))
    optimizer = amp.Optimizer(model, optax.sgd(0.1), precision="fp16")
    grads = nnx.grad(loss_fn)(model, X)
    with pytest.raises(ValueError, match="scales the loss, but the gradients came without grads_finite.*train_step"):
        optimizer.update(model, grads)
    assert int(optimizer.step[...]) == 0 and float(optimizer.scaler.get_value().loss_scale) == 2.0**16
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
    with pytest.raises(ValueError, match="DynamicLossScale scales the loss, but the gradients came without"):
        state.apply_gradients(grads={"w": jnp.ones(3)})
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="bf16")
    assert int(state.apply_gradients(grads={"w": jnp.full(3, jnp.nan)}).skipped) == 1


def test_a_pure_loops_guard_with_a_scale_floor_is_refused_without_the_scale_and_stats_report_a_halt():
    """A floor the guard cannot read never trips (a scale of 6e-14 once ran on unhalted):
    refused before any step, naming loss_scale=. Given it, the guard halts, and amp.stats says
    so: the updates after a halt are skipped uncounted, which the counts alone never showed."""
    params, nan = {"w": jnp.ones(2)}, {"w": jnp.full(2, jnp.nan)}
    tx = amp.skip_nonfinite(optax.sgd(0.1), guard=amp.DivergenceGuard(min_scale=1.0, max_consecutive_skips=None))
    opt_state, scaler = tx.init(params), amp.DynamicLossScale(init_scale=4.0)
    with pytest.raises(ValueError, match=r"min_scale \(1.0\) reads the loss scale.*pass loss_scale=scaler.loss_scale"):
        tx.update(nan, opt_state, params, grads_finite=jnp.asarray(False))
    for _ in range(3):  # 4 -> 2 -> 1 -> 0.5: the third skip goes below the floor
        scaler = scaler.adjust(jnp.asarray(False))
        _, opt_state = tx.update(nan, opt_state, params, grads_finite=jnp.asarray(False), loss_scale=scaler.loss_scale)
    assert amp.stats(opt_state) == {"skipped": 3, "halted": True}
    state = amp.TrainState.create(params=params, tx=optax.sgd(0.1), guard=amp.DivergenceGuard(max_consecutive_skips=1))
    for _ in range(2):
        state = state.apply_gradients(grads=nan)
    assert amp.stats(state)["halted"] and not amp.stats(amp.TrainState.create(params=params, tx=tx))["halted"]


UNSCALED_FLOAT16 = r"loss_fn runs 1 matmul\(s\) in float16, and nothing scales the loss \(precision '(fp32|bf16|none)'"


@pytest.mark.parametrize("precision", [None, "fp32", "bf16"])
def test_a_float16_network_with_nothing_scaling_the_loss_is_refused_before_any_step(precision):
    """GradScaler forgotten: a network built in float16 under a precision that scales nothing
    (none given, fp32, or bf16 with a float16 layer): its small gradients flushed to zero
    while the stats read fp32 and a scale of 1. Refused in every style, naming precision='fp16'."""
    module = Typed(jnp.float16)
    params = module.init(jax.random.PRNGKey(0), X)
    state = amp.TrainState.create(params=params, tx=optax.adam(1e-3), precision=precision)
    with pytest.raises(ValueError, match=UNSCALED_FLOAT16 + r".*precision='fp16'.*StaticLossScale\(1.0\)"):
        jax.jit(amp.train_step, static_argnums=1)(state, linen_loss(module.apply), X)
    model = HalfMLP(nnx.Rngs(0))
    with pytest.raises(ValueError, match="loss_fn runs 2 matmul"):
        amp.scaled_value_and_grad(loss_fn)(amp.Optimizer(model, optax.adam(1e-3), precision=precision), model, X)
    pair = (amp.NoOpLossScale(), amp.skip_nonfinite(optax.adam(1e-3)).init(params))
    with pytest.raises(ValueError, match=r"nothing scales the loss \(precision 'none'"):
        amp.scaled_value_and_grad(linen_loss(module.apply))(pair, params, X)


def test_float16_unscaled_on_purpose_or_with_no_gradient_through_it_is_accepted():
    """The study's fp16-unscaled (precision fp16, loss_scaling none) and a static scale of 1 declare
    it; a frozen float16 network behind stop_gradient (a teacher, a target) passes no gradient."""
    module = Typed(jnp.float16)
    params = module.init(jax.random.PRNGKey(0), X)
    teacher = lambda x: jax.lax.stop_gradient(module.apply(params, x)).astype(jnp.float32)  # noqa: E731
    student = amp.TrainState.create(params=Dense2().init(jax.random.PRNGKey(1), X), tx=optax.adam(1e-3))
    distill = lambda p, x: jnp.mean((Dense2().apply(p, x) - teacher(x)) ** 2)  # noqa: E731
    assert int(amp.train_step(student, distill, X)[0].step) == 1
    for options in ({"precision": amp.get_precision("fp16", "none")}, {"scaler": amp.StaticLossScale(1.0)}):
        state = amp.TrainState.create(params=params, tx=optax.adam(1e-3), **options)
        assert isinstance(state.scaler, (amp.NoOpLossScale, amp.StaticLossScale))
        assert int(amp.train_step(state, linen_loss(module.apply), X)[0].step) == 1


def test_a_loss_wrapped_in_autocast_reads_its_targets_in_float32_as_torch_s_does():
    """0.4's autocast cast every input, targets too: targets near 7e4 became inf in float16 and
    every step was skipped, with no word (it was refused then). Cast per op, a loss inside it
    computes as a loss under torch.autocast: the matmul in float16, the rest in float32."""
    predict = lambda p, x: x @ p["w"]  # noqa: E731
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16")
    net = amp.autocast(predict, "fp16")
    for loss in (
        amp.autocast(lambda p, x, y: jnp.mean((predict(p, x) - y) ** 2), "fp16"),  # the whole loss
        lambda p, x, y: jnp.mean((net(p, x) - y) ** 2),  # the network alone
    ):
        _, metrics = amp.train_step(state, loss, X, jnp.full(4, 7e4))
        assert float(metrics["loss"]) == pytest.approx((7e4 - 3.0) ** 2, rel=1e-6)  # no inf
        assert amp.dtype_report(loss, state.params, X, jnp.full(4, 7e4)).dtypes("matmul") == {"float16": 1}


@pytest.mark.filterwarnings("ignore:precision 'fp16-full' stores")
def test_an_optimizer_that_cannot_step_in_float16_is_refused_for_fp16_full_before_any_step():
    """Adam's default eps (1e-8) is 0 in float16 moments: a zero gradient's update 0 / (0 + 0)
    is NaN, so the strict checks skipped every step and the scale fell to 1e-38 (the CLI's own
    demo did, 500 of 500). Refused in both styles, naming eps; eps=1e-5 and plain SGD pass."""
    with pytest.raises(ValueError, match=r"zero gradient is not finite in float16.*optax.adam\(lr, eps=1e-5\)"):
        amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16-full")
    model = nnx.Linear(3, 1, dtype=jnp.float16, param_dtype=jnp.float16, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="zero gradient is not finite in float16"):
        amp.Optimizer(model, optax.adamw(1e-3), precision="fp16-full")
    with pytest.raises(ValueError, match="zero gradient is not finite in float16"):  # created under jit too
        jax.jit(lambda p: amp.TrainState.create(params=p, tx=optax.adam(1e-3), precision="fp16-full").params)(
            {"w": jnp.ones(3)}
        )
    plateau = optax.chain(optax.adam(1e-3, eps=1e-5), optax.contrib.reduce_on_plateau())  # its update takes value=
    amp.TrainState.create(params={"w": jnp.ones(3)}, tx=plateau, precision="fp16-full")
    for tx in (optax.adam(1e-3, eps=1e-5), optax.sgd(0.1)):
        scaler = amp.DynamicLossScale(init_scale=2.0**10)  # 2^16 itself is inf in float16: a first skip
        state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=tx, precision="fp16-full", scaler=scaler)
        state, _ = amp.train_step(
            state, lambda p, x: jnp.sum((p["w"] * x).astype(jnp.float32)), jnp.full(3, 0.5, jnp.float16)
        )
        assert int(state.step) == 1 and int(state.skipped) == 0


def test_wrong_objects_in_a_hand_written_step_are_named_in_a_sentence():
    """What a port gets wrong that optax or JAX would report from deep inside: the actor's
    gradients given to the critic, amp.stats called inside jit, an optax.MultiSteps object as
    tx, 0.2's state.loss_scale, and an autocast module bound or called as a submodule."""
    critic = amp.TrainState.create(params={"q": jnp.ones(3)}, tx=optax.sgd(0.1))
    with pytest.raises(
        ValueError, match=r"gradients' tree is not the params' \(\['pi'\] where the params have \['q'\]"
    ):
        critic.apply_gradients(grads={"pi": jnp.ones(3)})
    with pytest.raises(TypeError, match="amp.stats reads the counts on the host: call it outside jit"):
        jax.jit(lambda s: amp.stats(s)["skipped"])(critic)
    with pytest.raises(TypeError, match=r"tx is an optax.MultiSteps: give its tx.gradient_transformation\(\)"):
        amp.TrainState.create(params={"q": jnp.ones(3)}, tx=optax.MultiSteps(optax.sgd(0.1), 2))
    with pytest.raises(AttributeError, match="'loss_scale' \\(0.2's name, removed\\): use state.scaler"):
        critic.loss_scale  # noqa: B018
    assert not hasattr(critic, "nope") and hasattr(critic, "scaler")
    net = amp.autocast(nn.Dense(2), "fp16")
    variables = net.init(jax.random.PRNGKey(0), X)
    for misuse in (lambda: net.bind(variables)(X), lambda: net(variables, X)):
        with pytest.raises(TypeError, match=r"an autocast module runs through \.apply\(variables, \.\.\.\)"):
            misuse()
    assert net.apply(variables, X).dtype == jnp.float32


@pytest.mark.parametrize("style", ["train_state", "nnx"])
def test_a_pre_wrapped_optimizer_is_checked_for_fp16_full_as_a_bare_one_is(style):
    """`tx=amp.skip_nonfinite(optax.adam(1e-3))` under fp16-full passed where the bare
    optax.adam was refused: the first step wrote NaN params and counted no skip."""
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    with pytest.raises(ValueError, match=r"update of a zero gradient is not finite in float16 .* eps=1e-5"):
        if style == "nnx":
            amp.Optimizer(nnx.Linear(3, 1, param_dtype=jnp.float16, rngs=nnx.Rngs(0)), tx, wrt=nnx.Param,
                          precision="fp16-full")  # fmt: skip
        else:
            amp.TrainState.create(params={"w": jnp.ones(3)}, tx=tx, precision="fp16-full")


def test_float16_params_in_a_pure_loop_are_checked_strictly_by_default():
    """Params loaded in half into a pure-pytree loop: skip_nonfinite(adam) wrote Adam's NaN (eps
    1e-8 is 0 in float16) on the first step and counted it taken; the strict checks now skip it."""
    params = {"w": jnp.full((3,), 0.5, jnp.float16)}
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    updates, state = tx.update({"w": jnp.zeros(3, jnp.float16)}, tx.init(params), params)
    assert params_finite_tree(optax.apply_updates(params, updates)) and int(state.skipped) == 1
    loose = amp.skip_nonfinite(optax.adam(1e-3), strict=False)  # on purpose: as before
    updates, state = loose.update({"w": jnp.zeros(3, jnp.float16)}, loose.init(params), params)
    assert not params_finite_tree(optax.apply_updates(params, updates)) and int(state.skipped) == 0


def params_finite_tree(tree) -> bool:
    return all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(tree))


def test_the_clip_takes_the_norm_of_the_gradients_it_is_given_after_a_loops_pmean():
    """A data-parallel loop that averages the gradients itself (`lax.pmean` after taking them,
    not `axis_name=`) passed each replica's own norm: the replicas clipped by different
    factors and drifted apart."""
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16",
                                  max_grad_norm=1.0, scaler=amp.DynamicLossScale(init_scale=16.0))  # fmt: skip
    new = pmean_after_the_norm(state, jnp.stack([jnp.full(3, 0.1), jnp.full(3, 10.0)]))
    mean_grad = np.full(3, 5.05)  # clipped to norm 1: w - 0.1 * g / |g|
    np.testing.assert_allclose(new.params["w"], np.stack([1 - 0.1 * mean_grad / np.linalg.norm(mean_grad)] * 2),
                               rtol=1e-6)  # fmt: skip


def test_states_given_one_scaler_by_update_scaler_can_each_be_donated():
    """`update_scaler` gave every state the same scaler arrays: a jitted step with
    `donate_argnums` on one deleted the others' (`Buffer has been deleted or donated`)."""
    make = lambda: amp.TrainState.create(params={"w": jnp.ones((3, 1))}, tx=optax.adam(1e-3),  # noqa: E731
                                         precision="fp16", shared_scaler=True)  # fmt: skip
    net = amp.autocast(lambda p, x: x @ p["w"], "fp16")
    step = jax.jit(lambda s, x: amp.train_step(s, lambda p: jnp.mean(net(p, x) ** 2))[0], donate_argnums=0)
    critic, actor = make(), make()
    for _ in range(3):
        critic = step(critic, X)
        actor = step(actor, X)
        critic, actor = amp.update_scaler(critic, actor)
    assert int(critic.step) == int(actor.step) == 3
    assert float(actor.scaler.loss_scale) == float(critic.scaler.loss_scale) == 2.0**16 / 2**3  # 3 overflows


@pytest.mark.parametrize("saved, into", [("bf16", "static"), ("static", "bf16")])
def test_a_static_scale_and_no_scaling_are_not_restored_as_each_other(saved, into):
    """Both hold one field, `loss_scale`: a bf16 checkpoint restored into a state scaling by a
    static 1024 trained it unscaled, and the reverse reported a scale of 1024 for no scaling."""
    from flax import serialization

    make = {
        "bf16": lambda: amp.TrainState.create(params=jnp.ones(2), tx=optax.sgd(0.1), precision="bf16"),
        "static": lambda: amp.TrainState.create(
            params=jnp.ones(2), tx=optax.sgd(0.1), precision="fp16", scaler=amp.StaticLossScale(1024.0)
        ),  # fmt: skip
    }
    with pytest.raises(ValueError, match=r"scaling by (1024|1) cannot be restored from a saved scaler scaling by"):
        serialization.from_bytes(make[into](), serialization.to_bytes(make[saved]()))
    same = serialization.from_bytes(make[into](), serialization.to_bytes(make[into]()))
    assert float(same.scaler.loss_scale) == float(make[into]().scaler.loss_scale)


def test_the_wrapped_optimizers_state_is_named_where_a_loop_looks_for_it():
    tx = amp.skip_nonfinite(optax.inject_hyperparams(optax.adam)(learning_rate=1e-3))
    state = tx.init({"w": jnp.ones(2)})
    with pytest.raises(
        AttributeError, match=r"no attribute 'hyperparams': .* \.inner_state \(\.inner_state\.hyperparams\)"
    ):
        state.hyperparams  # noqa: B018
    assert float(state.inner_state.hyperparams["learning_rate"]) == pytest.approx(1e-3)


def test_an_optimizer_needing_the_loss_gets_it_through_apply_gradients_and_train_step_says_so():
    """optax.contrib.reduce_on_plateau's update needs `value=`: accepted by create, then no
    step could give it (optax's TypeError from deep inside)."""
    tx = optax.chain(optax.adam(1e-2), optax.contrib.reduce_on_plateau(patience=2))
    loss_fn = lambda p, x: jnp.mean((x @ p["w"]) ** 2)  # noqa: E731
    state = amp.TrainState.create(params={"w": jnp.ones((3, 1))}, tx=tx)
    with pytest.raises(
        TypeError, match=r"needs more than the gradients .*'value'.* state\.apply_gradients\(grads=\.\.\., value=loss"
    ):
        amp.train_step(state, loss_fn, X)
    loss, grads, finite, norm, scaler = amp.scaled_value_and_grad(loss_fn)(state, state.params, X)
    new = state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler, value=loss)
    assert int(new.step) == 1 and not np.array_equal(new.params["w"], state.params["w"])


def test_the_fp16_full_check_at_rest_gives_a_guard_the_scale_it_reads():
    """The check of an optimizer at rest ran its update without `loss_scale=`, which a guard
    with a scale floor refuses: every fp16-full run (the CLI's has a guard) failed to start."""
    tx = optax.adam(1e-3, eps=1e-4)
    state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=tx, precision="fp16-full", guard=amp.DivergenceGuard())
    assert state.params["w"].dtype == jnp.float16 and int(state.skipped) == 0
    with pytest.raises(ValueError, match="update of a zero gradient is not finite in float16"):
        amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16-full",
                              guard=amp.DivergenceGuard())  # fmt: skip
