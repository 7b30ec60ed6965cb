"""A training loop of one's own on `genesis_jax.amp`: the precision rules' warning for modules
no rule matches, `autocast` for networks without a dtype field, several seeds under `vmap`,
the PureJaxRL-style example pair's size (docs/own-loop.md's code blocks run through the docs runner)."""

import difflib
import runpy
import warnings
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import amp
from genesis_jax.amp.optim import find_skip_state as skip_state

REPO = Path(__file__).resolve().parents[2]


class AutoNamed(nn.Module):
    """PureJaxRL's style: every layer auto-named (Dense_0, Dense_1, ...)."""

    names: tuple = (None, None)

    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(8, dtype=jnp.float16, name=self.names[0])(x))
        return nn.Dense(2, dtype=jnp.float16, name=self.names[1])(x)


class DecoratedAutoNamed(AutoNamed):
    @amp.precision_rules()  # as a decorator: it names the method in its warning
    @nn.compact
    def __call__(self, x):
        x = nn.tanh(nn.Dense(8, dtype=jnp.float16)(x))
        return nn.Dense(2, dtype=jnp.float16)(x)


def _apply(net, x=None):
    x = jnp.ones((3, 4)) if x is None else x
    return net.apply(net.init(jax.random.PRNGKey(0), x), x)


def _rule_warnings(caught):
    return [w for w in caught if "precision_rules" in str(w.message)]


def test_precision_rules_warn_once_when_modules_ran_but_none_matched():
    net, x = AutoNamed(), jnp.ones((3, 4))
    params = net.init(jax.random.PRNGKey(0), x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with amp.precision_rules():
            out = net.apply(params, x)
    assert out.dtype == jnp.float16  # nothing matched: behaviour unchanged
    (warning,) = _rule_warnings(caught)  # two modules ran, one warning for the block
    message = str(warning.message)
    assert "'*head'" in message and "'*logits'" in message and "LayerNorm" in message
    assert 'name="actor_head"' in message and "PrecisionRule(nn.Dense)" in message
    assert warning.filename == __file__  # points at the `with` block


def test_the_decorated_method_warns_and_names_itself():
    with pytest.warns(UserWarning, match=r"precision_rules on DecoratedAutoNamed.__call__: .*none matched"):
        assert _apply(DecoratedAutoNamed()).dtype == jnp.float16


@pytest.mark.parametrize(
    "net, rules",
    [
        (AutoNamed(names=(None, "actor_head")), amp.FLOAT32_RULES),  # the head named
        (AutoNamed(), [amp.PrecisionRule(nn.Dense)]),  # matched by class
    ],
)
def test_precision_rules_stay_quiet_when_a_rule_matched(net, rules):
    x = jnp.ones((3, 4))
    params = net.init(jax.random.PRNGKey(0), x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with amp.precision_rules(rules):
            out = net.apply(params, x)
    assert out.dtype == jnp.float32 and not _rule_warnings(caught)


def test_precision_rules_stay_quiet_without_module_calls_or_on_an_error():
    net, x = AutoNamed(), jnp.ones((3, 4))
    params = net.init(jax.random.PRNGKey(0), x)
    apply = jax.jit(net.apply)
    apply(params, x)  # traced outside the block
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with amp.precision_rules():
            jnp.ones(3) * 2  # no module at all
        with amp.precision_rules():
            apply(params, x)  # cached: no trace, no module call
        with pytest.raises(ZeroDivisionError), amp.precision_rules():
            net.apply(params, x)
            1 / 0
    assert not _rule_warnings(caught)
    with pytest.warns(UserWarning, match="none matched"), amp.precision_rules():
        jax.jit(lambda p, x: net.apply(p, x))(params, x)  # a fresh trace inside the block: warned


@pytest.mark.slow
def test_genesis_networks_match_their_rules_without_a_warning():
    from genesis_jax.nets.actor_critic import ActorCritic

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for network in ("mlp", "resmlp"):
            _apply(ActorCritic(action_dim=3, network=network, width=8, depth=1, dtype=jnp.float16), jnp.ones((2, 6)))
    assert not _rule_warnings(caught)


def _dot_dtypes(fn, *args):
    return [e.outvars[0].aval.dtype for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if e.primitive.name == "dot_general"]


@pytest.mark.slow
def test_autocast_runs_a_dtype_less_network_in_float16_inside_an_own_loop():
    def mlp(params, x):
        return jnp.tanh(x @ params["w1"]) @ params["w2"]

    apply = amp.autocast(mlp, "fp16")
    loss_fn = lambda params, x, y: jnp.mean((apply(params, x)[:, 0] - y) ** 2)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w1": jax.random.normal(k1, (8, 32)) / 8**0.5, "w2": jax.random.normal(k2, (32, 1)) / 32}
    x = jax.random.normal(k3, (128, 8))
    y = jnp.sin(x).sum(-1)
    assert _dot_dtypes(apply, params, x) == [jnp.float16, jnp.float16]
    assert apply(params, x).dtype == jnp.float32

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-3))  # an existing chain, wrapped whole
    state = amp.TrainState.create(apply_fn=apply, params=params, tx=tx, precision="fp16")
    grad_fn = amp.scaled_value_and_grad(loss_fn)

    @jax.jit
    def step(state, x, y):
        loss, grads, finite, norm, scaler = grad_fn(state, state.params, x, y)
        return state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler), loss

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the loss stays float32: no float16-loss warning
        state, first = step(state, x, y)
        for _ in range(150):
            state, loss = step(state, x, y)
    assert float(loss) < 0.5 * float(first)
    assert state.params["w1"].dtype == jnp.float32  # float32 master weights
    s = amp.stats(state)
    assert s["steps"] == 151 and s["skipped"] == int(skip_state(state.opt_state).skipped)
    # Each skip halved the scale from 2^16; no growth in 151 steps.
    assert s["scale"] == 2.0 ** (16 - s["skipped"])

    # The alternative docs/own-loop.md warns against: policy= casts the whole loss to float16.
    with pytest.warns(UserWarning, match="the loss is float16"):
        amp.scaled_value_and_grad(lambda p, x, y: jnp.mean((mlp(p, x)[:, 0] - y) ** 2), policy="fp16")(
            state, params, x, y
        )


@pytest.fixture(scope="module")
def vmap_example():
    return runpy.run_path(str(REPO / "examples" / "vmap_seeds.py"))


@pytest.mark.slow
def test_under_vmap_each_seed_has_its_own_scaler_and_one_seeds_overflow_skips_no_other(vmap_example):
    run = vmap_example["run"]
    clean = run(num_seeds=4, steps=12, bad_seed=None)
    hit = run(num_seeds=4, steps=12, bad_seed=2, bad_step=5)
    assert np.all(hit["steps"] == 12)
    others = [0, 1, 3]
    # The overflowing seed: one skip more, its scale backed off once more (no growth in 12 steps).
    assert hit["skipped"][2] == clean["skipped"][2] + 1
    assert hit["loss_scale"][2] == clean["loss_scale"][2] / 2
    assert not np.array_equal(hit["params"]["w1"][2], clean["params"]["w1"][2])
    # Every other seed: the same skips, the same scale, bit for bit the same parameters.
    assert np.array_equal(hit["skipped"][others], clean["skipped"][others])
    assert np.array_equal(hit["loss_scale"][others], clean["loss_scale"][others])
    for name in ("w1", "w2"):
        assert np.array_equal(hit["params"][name][others], clean["params"][name][others])
    # The counts are per seed: the bad seed differs from the others.
    assert hit["skipped"][2] != hit["skipped"][0]


def _changed_lines(fp32: str, fp16: str) -> list[str]:
    """`diff fp32 fp16 | grep '^>'`: the lines added or changed in the fp16 file."""
    diff = difflib.unified_diff(fp32.splitlines(), fp16.splitlines(), lineterm="", n=0)
    return [line for line in diff if line.startswith("+") and not line.startswith("+++")]


def test_the_fp16_example_changes_at_most_12_lines_of_the_fp32_one():
    names = ("purejaxrl_style_ppo", "purejaxrl_style_ppo_fp16")
    fp32, fp16 = ((REPO / "examples" / f"{n}.py").read_text() for n in names)
    changed = _changed_lines(fp32, fp16)
    assert len(changed) <= 12, "\n".join(changed)
    # The drop-in: amp.TrainState's apply_gradients takes scaled_value_and_grad's outputs, no hand-built step.
    assert any(
        "state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=norm, scaler=scaler)" in c for c in changed
    )
    assert any("amp.TrainState" in c for c in changed)
    assert "tx.update(" not in fp16


@pytest.mark.slow  # the demo's training: 14-26 s
def test_the_demo_runs_on_the_train_state():
    from genesis_jax.cli.demo import run_demo

    out = run_demo(steps=20)
    assert set(out) == {"precision", "final_loss", "loss_scale", "skipped_steps", "training_steps"}
    assert out["precision"] == "fp16" and out["training_steps"] == 20
    assert out["loss_scale"] == 2.0 ** (16 - out["skipped_steps"])
    fp32 = run_demo("fp32", steps=5)
    assert fp32["loss_scale"] == 1.0 and fp32["skipped_steps"] == 0
