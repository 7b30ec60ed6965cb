"""Every public amp constructor and function refuses an argument that would break its promise,
with one sentence naming the bad value (issue: a NaN or negative max_grad_norm was accepted
and then made every update NaN, or climbed the gradient). Valid values of every accepted kind
(numpy scalars, 0-d arrays, traced values under jit) still work."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from genesis_jax import amp
from genesis_jax.amp.loss_scale import check_loss_scale_args
from genesis_jax.amp.optim import find_skip_state

NAN, INF = float("nan"), float("inf")
PARAMS = {"w": jnp.ones(2)}


def sgd():
    return optax.sgd(0.1)


def loss_fn(params, batch):
    return jnp.sum(params["w"] * batch), {}


def a_state():
    return amp.TrainState.create(params=PARAMS, tx=sgd())


def update_with(**kwargs):
    tx = amp.skip_nonfinite(sgd())
    return tx.update(PARAMS, tx.init(PARAMS), PARAMS, **kwargs)


BAD = [
    # The issue's examples: refused when the optimizer is built, before any update.
    (
        "max_grad_norm nan",
        lambda: amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=NAN),
        ValueError,
        "max_grad_norm",
        "nan",
    ),
    (
        "max_grad_norm -1",
        lambda: amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=-1.0),
        ValueError,
        "max_grad_norm",
        "-1.0",
    ),
    # skip_nonfinite, its update, amp.Optimizer
    ("max_grad_norm inf", lambda: amp.skip_nonfinite(sgd(), max_grad_norm=INF), ValueError, "max_grad_norm", "inf"),
    ("max_grad_norm 0", lambda: amp.skip_nonfinite(sgd(), max_grad_norm=0), ValueError, "max_grad_norm", "0"),
    (
        "max_grad_norm float32 0",
        lambda: amp.skip_nonfinite(sgd(), max_grad_norm=1e-50),
        ValueError,
        "max_grad_norm",
        "1e-50",
    ),
    (
        "max_grad_norm float32 inf",
        lambda: amp.skip_nonfinite(sgd(), max_grad_norm=1e39),
        ValueError,
        "max_grad_norm",
        "1e+39",
    ),
    ("max_grad_norm str", lambda: amp.skip_nonfinite(sgd(), max_grad_norm="1.0"), TypeError, "max_grad_norm", "'1.0'"),
    ("max_grad_norm bool", lambda: amp.skip_nonfinite(sgd(), max_grad_norm=True), TypeError, "max_grad_norm", "True"),
    ("inner not optax", lambda: amp.skip_nonfinite("adam"), TypeError, "GradientTransformation", "'adam'"),
    (
        "advance not bool",
        lambda: amp.skip_nonfinite(sgd(), advance_schedule_on_skip="yes"),
        TypeError,
        "advance_schedule_on_skip",
        "'yes'",
    ),
    ("guard not a guard", lambda: amp.skip_nonfinite(sgd(), guard=3), TypeError, "guard", "3"),
    ("grads_finite float", lambda: update_with(grads_finite=jnp.float32(NAN)), TypeError, "grads_finite", "nan"),
    (
        "grads_finite vector",
        lambda: update_with(grads_finite=jnp.array([True, False])),
        TypeError,
        "grads_finite",
        "True",
    ),
    ("update loss_scale str", lambda: update_with(loss_scale="big"), TypeError, "loss_scale", "'big'"),
    (
        "Optimizer tx not optax",
        lambda: amp.Optimizer(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), "sgd"),
        TypeError,
        "GradientTransformation",
        "'sgd'",
    ),
    ("grads_finite python float", lambda: update_with(grads_finite=1.0), TypeError, "grads_finite", "1.0"),
    ("skip state of a plain state", lambda: find_skip_state(sgd().init(PARAMS)), ValueError, "skip_nonfinite", ""),
    # TrainState.create and train_step
    (
        "create max_grad_norm nan",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), max_grad_norm=NAN),
        ValueError,
        "max_grad_norm",
        "nan",
    ),
    (
        "create max_grad_norm -1",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), max_grad_norm=-1.0),
        ValueError,
        "max_grad_norm",
        "-1.0",
    ),
    ("create tx not optax", lambda: amp.TrainState.create(params=PARAMS, tx="adam"), TypeError, "tx", "'adam'"),
    (
        "create scale a number",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), scaler=1024.0),
        TypeError,
        "scaler must be",
        "1024.0",
    ),
    (
        "create precision int",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), precision=16),
        TypeError,
        "precision",
        "16",
    ),
    (
        "create precision unknown",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), precision="fp8"),
        ValueError,
        "precision",
        "'fp8'",
    ),
    ("create guard", lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), guard=1), TypeError, "guard", "1"),
    ("create apply_fn", lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), apply_fn=3), TypeError, "apply_fn", "3"),
    (
        "create advance",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), advance_schedule_on_skip=1),
        TypeError,
        "advance_schedule_on_skip",
        "1",
    ),
    ("train_step loss_fn", lambda: amp.train_step(a_state(), "loss", jnp.ones(2)), TypeError, "loss_fn", "'loss'"),
    (
        "train_step faults",
        lambda: amp.train_step(a_state(), loss_fn, jnp.ones(2), has_aux=True, faults=0.5),
        TypeError,
        "faults",
        "0.5",
    ),
    (
        "train_step grad_transform",
        lambda: amp.train_step(a_state(), loss_fn, jnp.ones(2), has_aux=True, grad_transform=1),
        TypeError,
        "grad_transform",
        "1",
    ),
    (
        "train_step state",
        lambda: amp.train_step({"params": PARAMS}, loss_fn, jnp.ones(2), has_aux=True),
        TypeError,
        "TrainState",
        "dict",
    ),
    # the loss scalers
    ("init_scale 0", lambda: amp.DynamicLossScale(init_scale=0.0), ValueError, "init_scale", "0.0"),
    ("init_scale -1", lambda: amp.DynamicLossScale(init_scale=-1.0), ValueError, "init_scale", "-1.0"),
    ("init_scale nan", lambda: amp.DynamicLossScale(init_scale=NAN), ValueError, "init_scale", "nan"),
    ("init_scale inf", lambda: amp.DynamicLossScale(init_scale=INF), ValueError, "init_scale", "inf"),
    ("init_scale float32 inf", lambda: amp.DynamicLossScale(init_scale=1e39), ValueError, "init_scale", "1e+39"),
    ("init_scale denormal", lambda: amp.DynamicLossScale(init_scale=1e-45), ValueError, "init_scale", "1e-45"),
    ("init_scale bool", lambda: amp.DynamicLossScale(init_scale=True), TypeError, "init_scale", "True"),
    ("init_scale str", lambda: amp.DynamicLossScale(init_scale="1024"), TypeError, "init_scale", "'1024'"),
    ("init_scale vector", lambda: amp.DynamicLossScale(init_scale=np.ones(2)), TypeError, "init_scale", "array"),
    ("growth_factor 1", lambda: amp.DynamicLossScale(growth_factor=1.0), ValueError, "growth_factor", "1.0"),
    (
        "growth_factor float32 1",
        lambda: amp.DynamicLossScale(growth_factor=1 + 1e-9),
        ValueError,
        "growth_factor",
        "1.000000001",
    ),
    ("growth_factor nan", lambda: amp.DynamicLossScale(growth_factor=NAN), ValueError, "growth_factor", "nan"),
    ("growth_factor inf", lambda: amp.DynamicLossScale(growth_factor=INF), ValueError, "growth_factor", "inf"),
    ("backoff 0", lambda: amp.DynamicLossScale(backoff_factor=0.0), ValueError, "backoff_factor", "0.0"),
    ("backoff 1", lambda: amp.DynamicLossScale(backoff_factor=1.0), ValueError, "backoff_factor", "1.0"),
    (
        "backoff float32 1",
        lambda: amp.DynamicLossScale(backoff_factor=1 - 1e-9),
        ValueError,
        "backoff_factor",
        "0.999999999",
    ),
    ("backoff nan", lambda: amp.DynamicLossScale(backoff_factor=NAN), ValueError, "backoff_factor", "nan"),
    ("growth_interval 0", lambda: amp.DynamicLossScale(growth_interval=0), ValueError, "growth_interval", "0"),
    ("growth_interval 2.5", lambda: amp.DynamicLossScale(growth_interval=2.5), ValueError, "growth_interval", "2.5"),
    (
        "growth_interval int32",
        lambda: amp.DynamicLossScale(growth_interval=2**31),
        ValueError,
        "growth_interval",
        "2147483648",
    ),
    ("growth_interval bool", lambda: amp.DynamicLossScale(growth_interval=True), ValueError, "growth_interval", "True"),
    ("min_scale 0", lambda: amp.DynamicLossScale(min_scale=0.0), ValueError, "min_scale", "0.0"),
    ("min_scale nan", lambda: amp.DynamicLossScale(min_scale=NAN), ValueError, "min_scale", "nan"),
    (
        "min_scale above init",
        lambda: amp.DynamicLossScale(init_scale=2.0, min_scale=4.0),
        ValueError,
        "min_scale",
        "4.0",
    ),
    ("static 0", lambda: amp.StaticLossScale(0.0), ValueError, "loss_scale", "0.0"),
    ("static nan", lambda: amp.StaticLossScale(NAN), ValueError, "loss_scale", "nan"),
    ("static denormal", lambda: amp.StaticLossScale(1e-45), ValueError, "loss_scale", "1e-45"),
    ("scaler dynamic nan", lambda: amp.get_precision("fp16").scaler(init_scale=NAN), ValueError, "init_scale", "nan"),
    (
        "scaler static -1",
        lambda: amp.get_precision("fp16", loss_scaling="static").scaler(init_scale=-1.0),
        ValueError,
        "init_scale",
        "-1.0",
    ),
    ("scaler none interval", lambda: amp.get_precision("fp32").scaler(growth_interval=0), ValueError, "growth", "0"),
    ("scaling unknown kind", lambda: check_loss_scale_args("adaptive"), ValueError, "loss scaling", "'adaptive'"),
    # the gradient side
    ("value_and_grad loss_fn", lambda: amp.scaled_value_and_grad(3), TypeError, "loss_fn", "3"),
    (
        "value_and_grad accumulate 0",
        lambda: amp.scaled_value_and_grad(jnp.sum, accumulate=0),
        ValueError,
        "accumulate",
        "0",
    ),
    (
        "value_and_grad accumulate 2.5",
        lambda: amp.scaled_value_and_grad(jnp.sum, accumulate=2.5),
        ValueError,
        "accumulate",
        "2.5",
    ),
    (  # a number of micro-batches shapes the program: a traced one was taken as unchecked
        "value_and_grad accumulate traced",
        lambda: jax.jit(lambda k: amp.scaled_value_and_grad(jnp.sum, accumulate=k) and k)(2),
        ValueError,
        "accumulate",
        "Tracer",
    ),
    (
        "value_and_grad has_aux",
        lambda: amp.scaled_value_and_grad(jnp.sum, has_aux="yes"),
        TypeError,
        "has_aux",
        "'yes'",
    ),
    (
        "value_and_grad axis_name",
        lambda: amp.scaled_value_and_grad(jnp.sum, axis_name=["i"]),
        TypeError,
        "axis_name",
        "['i']",
    ),
    (
        "value_and_grad grad_transform",
        lambda: amp.scaled_value_and_grad(jnp.sum, grad_transform=1),
        TypeError,
        "grad_transform",
        "1",
    ),
    ("value_and_grad policy", lambda: amp.scaled_value_and_grad(jnp.sum, policy=16), TypeError, "policy", "16"),
    (
        "value_and_grad a bare number",
        lambda: amp.scaled_value_and_grad(jnp.sum)(1024.0, jnp.ones(2)),
        TypeError,
        "takes the optimizer that applies the gradients",
        "1024.0",
    ),
    (
        "value_and_grad scaler number",
        lambda: amp.scaled_value_and_grad(jnp.sum)((1024.0, update_with()[1]), jnp.ones(2)),
        TypeError,
        "scaler must be",
        "1024.0",
    ),
    ("train_step loss_fn", lambda: amp.train_step(a_state(), None), TypeError, "loss_fn", "None"),
    ("autocast fn", lambda: amp.autocast(3, "fp16"), TypeError, "autocast", "3"),
    ("autocast no policy", lambda: amp.autocast(jnp.sum, None), ValueError, "policy", ""),
    # precisions
    ("get_precision unknown", lambda: amp.get_precision("fp8"), ValueError, "precision", "'fp8'"),
    (
        "get_precision scaling",
        lambda: amp.get_precision("fp16", loss_scaling="sometimes"),
        ValueError,
        "loss scaling",
        "'sometimes'",
    ),
    ("get_precision int", lambda: amp.get_precision(16), ValueError, "precision", "16"),
    ("autocast policy int", lambda: amp.autocast(jnp.sum, 16), TypeError, "policy", "16"),
    ("Precision policy", lambda: amp.Precision("fp16", "fp16", "dynamic"), TypeError, "policy", "'fp16'"),
    (
        "Precision scaling",
        lambda: amp.Precision("x", amp.get_precision("fp32").policy, "always"),
        ValueError,
        "loss scaling",
        "'always'",
    ),
    # float32 rules
    ("rule match", lambda: amp.PrecisionRule(3), TypeError, "rule", "3"),
    ("rule empty pattern", lambda: amp.PrecisionRule(""), TypeError, "rule", "''"),
    ("rule dtype", lambda: amp.PrecisionRule("*head", jnp.int32), TypeError, "dtype", "int32"),
    (
        "rules one rule",
        lambda: amp.precision_rules(amp.PrecisionRule(nn.Dense)),
        TypeError,
        "sequence",
        "PrecisionRule",
    ),
    ("rules strings", lambda: amp.precision_rules(["*head"]), TypeError, "PrecisionRule", "'*head'"),
    ("rules classes", lambda: amp.precision_rules([nn.Dense]), TypeError, "PrecisionRule", "Dense"),
    # the divergence guard and fault injection
    ("guard min_scale -1", lambda: amp.DivergenceGuard(min_scale=-1.0), ValueError, "guard-min-scale", "-1.0"),
    ("guard min_scale nan", lambda: amp.DivergenceGuard(min_scale=NAN), ValueError, "guard-min-scale", "nan"),
    ("guard min_scale inf", lambda: amp.DivergenceGuard(min_scale=INF), ValueError, "guard-min-scale", "inf"),
    ("guard min_scale str", lambda: amp.DivergenceGuard(min_scale="1"), ValueError, "guard-min-scale", "'1'"),
    ("guard skips 0", lambda: amp.DivergenceGuard(max_consecutive_skips=0), ValueError, "max-consecutive-skips", "0"),
    (
        "guard skips 1.5",
        lambda: amp.DivergenceGuard(max_consecutive_skips=1.5),
        ValueError,
        "max-consecutive-skips",
        "1.5",
    ),
    (
        "guard skips bool",
        lambda: amp.DivergenceGuard(max_consecutive_skips=True),
        ValueError,
        "max-consecutive-skips",
        "True",
    ),
    (
        "fault rate -0.1",
        lambda: amp.testing.FaultInjection(nonfinite_rate=-0.1),
        ValueError,
        "inject-nonfinite",
        "-0.1",
    ),
    ("fault rate 1.5", lambda: amp.testing.FaultInjection(nonfinite_rate=1.5), ValueError, "inject-nonfinite", "1.5"),
    ("fault rate nan", lambda: amp.testing.FaultInjection(nonfinite_rate=NAN), ValueError, "inject-nonfinite", "nan"),
    (
        "fault steps negative",
        lambda: amp.testing.FaultInjection(loss_spike_steps=(-1,)),
        ValueError,
        "inject-loss-spike",
        "-1",
    ),
    (
        "fault steps float",
        lambda: amp.testing.FaultInjection(loss_spike_steps=(1.5,)),
        ValueError,
        "inject-loss-spike",
        "1.5",
    ),
    (
        "fault steps not a sequence",
        lambda: amp.testing.FaultInjection(loss_spike_steps=3),
        ValueError,
        "inject-loss-spike",
        "3",
    ),
    (
        "fault factor 0",
        lambda: amp.testing.FaultInjection(loss_spike_factor=0.0),
        ValueError,
        "loss-spike factor",
        "0.0",
    ),
    (
        "fault factor inf",
        lambda: amp.testing.FaultInjection(loss_spike_factor=INF),
        ValueError,
        "loss-spike factor",
        "inf",
    ),
    ("fault seed", lambda: amp.testing.FaultInjection(seed=1.5), ValueError, "seed", "1.5"),
]


@pytest.mark.parametrize("build, error, subject, value", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_a_bad_argument_is_refused_in_one_sentence_naming_it(build, error, subject, value):
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    assert subject in message and value in message
    assert "\n" not in message


def test_the_issues_examples_never_reach_an_update():
    """A NaN or negative clipping norm is refused where the state is made: no optimizer state,
    no params, nothing to update (before, every update was NaN, or climbed the gradient)."""
    made = []
    for norm in (NAN, -1.0):
        with pytest.raises(
            ValueError, match=f"max_grad_norm must be finite and > 0 \\(None: no clipping\\), got {norm}"
        ):
            made.append(amp.TrainState.create(params=PARAMS, tx=optax.sgd(1.0), max_grad_norm=norm))
    assert made == []


GOOD = [
    (
        "numpy scalars",
        lambda: amp.DynamicLossScale(np.float32(8.0), np.float64(2.0), np.float32(0.5), np.int64(3), np.float32(1.0)),
    ),
    ("0-d arrays", lambda: amp.DynamicLossScale(init_scale=jnp.float32(8.0), growth_interval=jnp.int32(3))),
    ("smallest normal scale", lambda: amp.StaticLossScale(2.0**-126)),
    ("largest float32 scale", lambda: amp.DynamicLossScale(init_scale=float(np.finfo(np.float32).max))),
    ("integer scale", lambda: amp.StaticLossScale(1024)),
    ("min_scale equal to init", lambda: amp.DynamicLossScale(init_scale=2.0, min_scale=2.0)),
    ("max_grad_norm numpy", lambda: amp.skip_nonfinite(sgd(), max_grad_norm=np.float32(1.0))),
    ("max_grad_norm int", lambda: amp.skip_nonfinite(sgd(), max_grad_norm=1)),
    ("guard floor 0 and no limits", lambda: (amp.DivergenceGuard(min_scale=0), amp.DivergenceGuard(None, None))),
    ("fault steps as a list", lambda: amp.testing.FaultInjection(loss_spike_steps=[0, 2**31 - 1], seed=-1)),
    (
        "axis names",
        lambda: (
            amp.scaled_value_and_grad(jnp.sum, axis_name="i"),
            amp.scaled_value_and_grad(jnp.sum, axis_name=("i", "j")),
        ),
    ),
    (
        "rules by class and tuple",
        lambda: amp.precision_rules([amp.PrecisionRule(nn.Dense), amp.PrecisionRule((nn.LayerNorm,))]),
    ),
    ("bfloat16 rule", lambda: amp.PrecisionRule("*head", jnp.bfloat16)),
    (
        "create with a Precision",
        lambda: amp.TrainState.create(params=PARAMS, tx=sgd(), precision=amp.get_precision("bf16")),
    ),
]


@pytest.mark.parametrize("build", [case[1] for case in GOOD], ids=[case[0] for case in GOOD])
def test_valid_arguments_of_every_accepted_kind_still_work(build):
    build()


def test_spike_steps_given_as_a_list_are_kept_as_a_tuple():
    faults = amp.testing.FaultInjection(loss_spike_steps=[3, np.int64(5)])
    assert faults.loss_spike_steps == (3, 5) and all(type(s) is int for s in faults.loss_spike_steps)
    assert float(faults.spike_loss(jnp.float32(2.0), 5)) == 2.0 * 1e6


def test_a_scaler_built_under_jit_from_traced_values_works():
    """Traced values cannot be checked (and are not): the scaler builds and behaves."""

    @jax.jit
    def backed_off(init_scale, backoff_factor, min_scale):
        dynamic = amp.DynamicLossScale(init_scale=init_scale, backoff_factor=backoff_factor, min_scale=min_scale)
        static = amp.StaticLossScale(init_scale)
        return dynamic.adjust(jnp.asarray(False)).loss_scale, static.adjust(jnp.asarray(False)).loss_scale

    dynamic, static = backed_off(8.0, 0.25, 4.0)
    assert (float(dynamic), float(static)) == (4.0, 8.0)
    dynamic, _ = backed_off(8.0, 0.25, 1.0)
    assert float(dynamic) == 2.0


def test_a_concrete_bad_value_beside_a_traced_one_is_still_refused():
    with pytest.raises(ValueError, match="growth_interval must be an integer from 1 to 2\\^31-1, got 0"):
        jax.jit(lambda s: amp.DynamicLossScale(init_scale=s, growth_interval=0).loss_scale)(8.0)


def test_fault_injection_seeded_by_a_traced_seed_under_vmap_works():
    """The template seeds seed k's faults with seed + axis index: a tracer, left unchecked."""
    faults = amp.testing.FaultInjection(nonfinite_rate=0.5, seed=3)
    hits = jax.vmap(lambda k: dataclasses.replace(faults, seed=3 + k).is_nonfinite_step(7))(jnp.arange(4))
    expected = [bool(amp.testing.FaultInjection(nonfinite_rate=0.5, seed=3 + k).is_nonfinite_step(7)) for k in range(4)]
    assert [bool(h) for h in hits] == expected
