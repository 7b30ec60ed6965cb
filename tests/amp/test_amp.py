"""The composable pieces of `genesis_jax.amp`: scaled value_and_grad, the skip-non-finite
optax wrapper, gradient accumulation, schedules on skipped steps, per-module precision rules,
and the PureJaxRL-style example pair."""

import os
import pathlib
import runpy
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import DynamicLossScale, NoOpLossScale, amp
from genesis_jax.amp.optim import SkipNonFiniteState
from genesis_jax.amp.optim import find_skip_state as skip_state
from genesis_jax.nets import MLP, ActorCritic
from tests.support.processes import run_python

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPILE_ENV = (
    "XLA_FLAGS",
    "JAX_DISABLE_MOST_OPTIMIZATIONS",
    "JAX_COMPILATION_CACHE_DIR",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
)


def regression(seed=0, n=64):
    x = jax.random.normal(jax.random.PRNGKey(seed), (n, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    return x, y


def make_model(dtype):
    return MLP(features=(32, 32, 1), dtype=dtype)


def mse(model):
    def loss_fn(params, x, y):
        return jnp.mean((model.apply(params, x) - y) ** 2)

    return loss_fn


def skipping(params, scaler=None):
    """What applies the gradients, for `scaled_value_and_grad`: a scaler and a skipping optimizer's state."""
    return (scaler or DynamicLossScale(), amp.skip_nonfinite(optax.sgd(0.1)).init(params))


def run_pieces(optimizer, dtype=jnp.float16, steps=150, scaler=None, seed=0, **skip_kwargs):
    """Trains the regression with scaled_value_and_grad + skip_nonfinite; returns (losses, params, opt_state,
    scaler)."""
    model, (x, y) = make_model(dtype), regression(seed)
    params = model.init(jax.random.PRNGKey(seed + 1), x)
    tx = amp.skip_nonfinite(optimizer, **skip_kwargs)
    grad_fn = amp.scaled_value_and_grad(mse(model))

    @jax.jit
    def step(carry, _):
        params, opt_state, scaler = carry
        loss, grads, finite, _, scaler = grad_fn((scaler, opt_state), params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        return (optax.apply_updates(params, updates), opt_state, scaler), loss

    carry = (params, tx.init(params), scaler or DynamicLossScale())
    carry, losses = jax.lax.scan(step, carry, None, steps)
    return np.asarray(losses), *carry


SCHEDULE = optax.linear_schedule(3e-3, 1e-4, 150)


@pytest.mark.parametrize(
    "name, optimizer",
    [
        ("adam", optax.adam(3e-3)),
        ("adamw", optax.adamw(3e-3, weight_decay=1e-4)),
        ("sgd-momentum", optax.sgd(0.05, momentum=0.9)),
        ("chain-with-schedule", optax.chain(optax.add_decayed_weights(1e-5), optax.adam(SCHEDULE))),
    ],
)
def test_pieces_compose_with_optimizers_and_train_in_fp16(name, optimizer):
    losses, params, opt_state, scaler = run_pieces(optimizer)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.3 * losses[0], (name, losses[0], losses[-1])
    # GradScaler's rule: no growth within 150 steps, one halving per skip, and few skips.
    assert int(opt_state.skipped) <= 3 and float(scaler.loss_scale) == 2.0 ** (16 - int(opt_state.skipped))


@pytest.mark.slow
def test_in_fp32_without_a_scale_the_pieces_equal_plain_optax():
    model, (x, y) = make_model(jnp.float32), regression()
    params = model.init(jax.random.PRNGKey(1), x)
    ours, _, _, _ = run_pieces(optax.adam(3e-3), dtype=jnp.float32, steps=50, scaler=NoOpLossScale())
    tx, loss_fn = optax.adam(3e-3), mse(model)

    @jax.jit  # plain optax, one step jitted (op by op it took 10 s)
    def plain_step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state, plain = tx.init(params), []
    for _ in range(50):
        params, opt_state, loss = plain_step(params, opt_state)
        plain.append(float(loss))
    np.testing.assert_allclose(ours, plain, rtol=1e-5)


def nan_grads_like(tree):
    return jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), tree)


@pytest.mark.parametrize("optimizer", [optax.adam(1e-3), optax.sgd(0.1, momentum=0.9), optax.adamw(1e-3)])
def test_a_skip_leaves_params_and_optimizer_state_bit_identical(optimizer):
    _, params, opt_state, _ = run_pieces(optimizer, steps=5)
    params = jax.tree.map(lambda p: p.at[..., 0].set(-0.0), params)  # -0.0 must stay -0.0
    tx = amp.skip_nonfinite(optimizer)

    @jax.jit
    def skip(params, opt_state):
        grads = nan_grads_like(params)
        updates, new_state = tx.update(grads, opt_state, params, grads_finite=jnp.asarray(False))
        return optax.apply_updates(params, updates), new_state

    new_params, new_state = skip(params, opt_state)
    for a, b in zip(
        jax.tree.leaves((params, opt_state.inner_state)), jax.tree.leaves((new_params, new_state.inner_state))
    ):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    assert int(new_state.skipped) == int(opt_state.skipped) + 1
    assert int(new_state.consecutive_skips) == int(opt_state.consecutive_skips) + 1


def test_without_a_flag_the_wrapper_decides_from_the_gradients_and_never_applies_nonfinite_ones():
    params = {"w": jnp.ones(3)}
    tx = amp.skip_nonfinite(optax.sgd(0.1))
    state = tx.init(params)
    for _ in range(7):  # optax.apply_if_finite would apply the 6th in a row; this never does
        updates, state = tx.update(nan_grads_like(params), state, params)
        params = optax.apply_updates(params, updates)
    assert np.all(np.asarray(params["w"]) == 1.0) and int(state.consecutive_skips) == 7
    updates, state = tx.update({"w": jnp.ones(3)}, state, params)
    assert np.allclose(optax.apply_updates(params, updates)["w"], 0.9) and int(state.consecutive_skips) == 0


def test_clipping_uses_torchs_coefficient_on_the_unscaled_norm():
    grads = {"a": jnp.array([3.0, 4.0])}  # norm 5
    tx = amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=1.0)
    updates, _ = tx.update(grads, tx.init(grads), grads)
    np.testing.assert_allclose(updates["a"], -np.array([3.0, 4.0]) * (1.0 / (5.0 + 1e-6)), rtol=1e-6)


def test_scaled_value_and_grad_matches_jax_grad_and_backs_off_on_overflow():
    model, (x, y) = make_model(jnp.float32), regression()
    params = model.init(jax.random.PRNGKey(1), x)
    loss, grads, finite, _, scaler = amp.scaled_value_and_grad(mse(model))(skipping(params), params, x, y)
    ref_loss, ref_grads = jax.value_and_grad(mse(model))(params, x, y)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert bool(finite) and int(scaler.growth_tracker) == 1
    # float16 compute with a loss large enough that 2^16 x its gradient overflows float16
    half = make_model(jnp.float16)
    _, _, finite, _, scaler = amp.scaled_value_and_grad(mse(half))(skipping(params), params, x * 100.0, y * 100.0)
    assert not bool(finite) and float(scaler.loss_scale) == 2.0**15


def test_the_policy_casts_plain_functions_to_the_compute_dtype():
    seen = []

    def loss_fn(params, x):
        seen.append((params["w"].dtype, x.dtype))
        return jnp.sum((x @ params["w"]).astype(jnp.float32))

    params = {"w": jnp.ones((2, 2))}
    value, grads, _, _, _ = amp.scaled_value_and_grad(loss_fn, policy="fp16")(
        skipping(params), params, jnp.ones((3, 2))
    )
    assert seen == [(jnp.float16, jnp.float16)] * 2  # traced to read what it computes in, then differentiated
    assert grads["w"].dtype == jnp.float32 and value.dtype == jnp.float32


@pytest.mark.slow  # 12 s; vmap stays in the fast lane through test_own_loop's per-seed test
def test_pieces_work_under_vmap_over_seeds():
    """Two seeds in one vmapped step: one seed's batch overflows, the other's does not; each
    takes its own decision and keeps its own scaler."""
    model = make_model(jnp.float16)
    x, y = regression()
    params = jax.vmap(lambda k: model.init(k, x))(jax.random.split(jax.random.PRNGKey(0), 2))
    xs = jnp.stack([x, x * 1e5])  # beyond float16's range
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    grad_fn = amp.scaled_value_and_grad(mse(model))

    @jax.jit
    @jax.vmap
    def step(params, opt_state, scaler, x):
        loss, grads, finite, _, scaler = grad_fn((scaler, opt_state), params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        return optax.apply_updates(params, updates), opt_state, scaler, finite

    scalers = jax.vmap(lambda _: DynamicLossScale(init_scale=2.0**10))(jnp.arange(2))
    new_params, opt_state, scalers, finite = step(params, jax.vmap(tx.init)(params), scalers, xs)
    assert list(np.asarray(finite)) == [True, False]
    assert list(np.asarray(scalers.loss_scale)) == [2.0**10, 2.0**9]
    assert list(np.asarray(opt_state.skipped)) == [0, 1]
    kept = jax.tree.map(lambda a, b: bool(jnp.array_equal(a[1], b[1])), params, new_params)
    assert all(jax.tree.leaves(kept))


def test_accumulated_micro_batches_equal_one_big_batch_in_fp32():
    model, (x, y) = make_model(jnp.float32), regression(n=64)
    params = model.init(jax.random.PRNGKey(1), x)
    big = amp.scaled_value_and_grad(mse(model))(skipping(params, NoOpLossScale()), params, x, y)
    small = amp.scaled_value_and_grad(mse(model), accumulate=4)(skipping(params, NoOpLossScale()), params, x, y)
    np.testing.assert_allclose(small.value, big.value, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(small.grads), jax.tree.leaves(big.grads)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7 * float(jnp.abs(b).max()))


def test_a_nan_in_one_micro_batch_skips_exactly_one_optimizer_step():
    model, (x, y) = make_model(jnp.float16), regression(n=64)
    params = model.init(jax.random.PRNGKey(1), x)
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    grad_fn = jax.jit(amp.scaled_value_and_grad(mse(model), accumulate=4))
    opt_state, scaler, history = tx.init(params), DynamicLossScale(init_scale=2.0**10), []
    for step in range(3):
        batch_y = y.at[40].set(jnp.nan) if step == 1 else y  # row 40: the third of four micro-batches
        loss, grads, finite, _, scaler = grad_fn((scaler, opt_state), params, x, batch_y)
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        new_params = optax.apply_updates(params, updates)
        history.append((bool(finite), all(jax.tree.leaves(jax.tree.map(jnp.array_equal, params, new_params)))))
        params = new_params
    assert history == [(True, False), (False, True), (True, False)]
    assert int(opt_state.skipped) == 1 and float(scaler.loss_scale) == 2.0**9


def test_a_batch_that_does_not_split_into_micro_batches_is_refused():
    model, (x, y) = make_model(jnp.float32), regression(n=10)
    params = model.init(jax.random.PRNGKey(1), x)
    with pytest.raises(ValueError, match="does not split into 4 micro-batches"):
        amp.scaled_value_and_grad(mse(model), accumulate=4)(skipping(params, NoOpLossScale()), params, x, y)


@pytest.mark.parametrize("advance, lr_count", [(False, 1), (True, 2)])
def test_learning_rate_schedules_on_skipped_steps(advance, lr_count):
    """Default: a skip freezes the schedule (optax keeps the count in the kept state). With
    `advance_schedule_on_skip`, the schedule advances as PyTorch's scheduler.step() does, while
    Adam's own count (torch Adam's `step`) stays."""
    params = {"w": jnp.ones(3)}
    tx = amp.skip_nonfinite(optax.adam(optax.linear_schedule(1.0, 0.0, 10)), advance_schedule_on_skip=advance)
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(3)}, state, params)
    _, state = tx.update(nan_grads_like(params), state, params)
    adam_state, schedule_state = state.inner_state
    assert int(adam_state.count) == 1 and int(schedule_state.count) == lr_count


def test_a_skip_advances_adamw_s_weight_decay_schedule_too_and_no_schedule_inside_multisteps():
    """adamw(sched, weight_decay=sched): the decay's schedule stayed behind the learning
    rate's; inside optax.MultiSteps every skipped micro-batch advanced the schedule, which
    torch steps once per optimizer step."""
    params, sched = {"w": jnp.ones(3)}, optax.linear_schedule(1.0, 0.0, 10)
    counts = lambda state: [int(n.count) for n in jax.tree.leaves(state, is_leaf=has_count) if has_count(n)]  # noqa: E731
    for inner, expected in [
        (optax.adamw(sched, weight_decay=sched), [0, 1, 1]),  # Adam's own count, the decay's, the rate's
        (optax.MultiSteps(optax.sgd(sched), 2).gradient_transformation(), [0]),
    ]:
        tx = amp.skip_nonfinite(inner, advance_schedule_on_skip=True)
        _, state = tx.update(nan_grads_like(params), tx.init(params), params)
        assert int(state.skipped) == 1 and counts(state.inner_state) == expected


def has_count(node) -> bool:
    return hasattr(node, "_fields") and "count" in node._fields and "mini_step" not in node._fields


class Tower(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Dense(16, dtype=jnp.float16, name="hidden")(x)
        x = nn.LayerNorm(dtype=jnp.float16, name="norm")(x)
        return nn.Dense(3, dtype=jnp.float16, name="value_head")(x)


def intermediate_dtypes(module, params, x):
    _, state = module.apply(params, x, capture_intermediates=True)
    return {k: v["__call__"][0].dtype for k, v in state["intermediates"].items() if k != "__call__"}


def dot_dtypes(fn, *args) -> list:
    """The output dtypes of every matmul in fn's jaxpr, nested jaxprs included, in order."""

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                yield eqn.outvars[0].aval.dtype
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if hasattr(inner, "eqns"):
                    yield from walk(inner)

    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def test_precision_rules_run_the_marked_modules_in_float32():
    tower, x = Tower(), jnp.ones((2, 5))
    params = tower.init(jax.random.PRNGKey(0), x)
    assert intermediate_dtypes(tower, params, x) == {
        "hidden": jnp.float16,
        "norm": jnp.float16,
        "value_head": jnp.float16,
    }
    with amp.precision_rules():
        assert intermediate_dtypes(tower, params, x) == {
            "hidden": jnp.float16,
            "norm": jnp.float32,
            "value_head": jnp.float32,
        }
        # The arithmetic itself, not only a cast at the end: the head's matmul is a float32 dot.
        assert dot_dtypes(lambda p: tower.apply(p, x), params) == [jnp.float16, jnp.float32]
    assert dot_dtypes(lambda p: tower.apply(p, x), params) == [jnp.float16, jnp.float16]
    rules = [amp.PrecisionRule("hidden", jnp.bfloat16)]
    with amp.precision_rules(rules):
        assert intermediate_dtypes(tower, params, x)["hidden"] == jnp.bfloat16


@pytest.mark.slow
def test_genesis_networks_get_their_float32_heads_from_the_rules():
    net = ActorCritic(action_dim=3, network="resmlp", width=16, depth=1, dtype=jnp.float16)
    x = jnp.ones((2, 6))
    params = net.init(jax.random.PRNGKey(0), x)
    _, state = net.apply(params, x, capture_intermediates=True)
    inter = state["intermediates"]
    assert inter["actor_head"]["__call__"][0].dtype == jnp.float32
    assert inter["actor"]["block_0"]["norm"]["__call__"][0].dtype == jnp.float32
    assert inter["critic"]["final_norm"]["__call__"][0].dtype == jnp.float32
    # embed, expand, project in float16 per tower; each tower's head in float32
    assert dot_dtypes(lambda p: net.apply(p, x), params) == [jnp.float16] * 3 + [jnp.float32] + [jnp.float16] * 3 + [
        jnp.float32
    ]


def test_the_jitted_train_step_leaves_the_callers_arrays_usable():
    model, (x, y) = make_model(jnp.float16), regression()
    params = model.init(jax.random.PRNGKey(1), x)
    state = amp.TrainState.create(params=params, tx=optax.adam(1e-3), precision="fp16", max_grad_norm=1.0)
    step = jax.jit(lambda s, batch: amp.train_step(s, mse(model), *batch))
    before = state.params
    state, _ = step(state, (x, y))
    state, _ = step(state, (x, y))
    model.apply(params, x)  # the caller's params are still alive
    model.apply(before, x)  # and so is what state.params was before the steps
    assert amp.stats(state)["steps"] == 2


# One fresh Python for two tests (its start-up and JAX's import are most of each): first what
# importing genesis_jax.amp loads, then shard_map over 4 forced CPU devices.
FRESH_PROCESS = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    import pkgutil, sys
    import genesis_jax.amp
    loaded = sorted(m for m in sys.modules if m == "genesis_jax" or m.startswith("genesis_jax."))
    # after the snapshot: walk_packages imports every subpackage it lists
    everything = sorted(m.name for m in pkgutil.walk_packages(sys.modules["genesis_jax"].__path__, "genesis_jax."))
    print("IMPORTS " + repr((everything, loaded)), flush=True)

    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, PartitionSpec as P
    from genesis_jax import DynamicLossScale, amp
    from genesis_jax.nets import MLP
    model = MLP(features=(16, 1), dtype=jnp.float16)
    x = jax.random.normal(jax.random.PRNGKey(0), (32, 8)); y = jnp.sin(x).sum(-1, keepdims=True)
    params = model.init(jax.random.PRNGKey(1), x)
    loss_fn = lambda p, x, y: jnp.mean((model.apply(p, x) - y) ** 2)
    tx = amp.skip_nonfinite(optax.adam(1e-3))
    grad_fn = amp.scaled_value_and_grad(loss_fn, axis_name="data")
    mesh = Mesh(np.array(jax.devices()), ("data",))
    def step(params, opt_state, scaler, x, y):
        loss, grads, finite, _, scaler = grad_fn((scaler, opt_state), params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite)
        return optax.apply_updates(params, updates), opt_state, scaler, grads, finite[None]
    sharded = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P(), P(), P("data"), P("data")),
                                    out_specs=(P(), P(), P(), P(), P("data")), check_vma=False))
    scaler = DynamicLossScale(init_scale=2.0 ** 10)  # each shard's mean loss: 4x the whole batch's gradients
    out = sharded(params, tx.init(params), scaler, x, y)
    ref = amp.scaled_value_and_grad(loss_fn)((scaler, tx.init(params)), params, x, y)
    for a, b in zip(jax.tree.leaves(out[3]), jax.tree.leaves(ref.grads)):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=1e-4)  # float16 forward, 4 shards vs 1
    assert np.asarray(out[4]).tolist() == [True] * 4
    bad = y.at[9].set(jnp.inf)  # row 9 lives on the second device only
    new_params, opt_state, scaler, _, finite = sharded(params, tx.init(params), scaler, x, bad)
    assert np.asarray(finite).tolist() == [False] * 4
    assert float(scaler.loss_scale) == 2.0 ** 9 and int(opt_state.skipped) == 1
    assert all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new_params)))
    print("MESH ok")
""")


@pytest.fixture(scope="module")
def fresh_process():
    # The suite's compile settings (conftest.py) and its shared compilation cache, nothing else.
    compile_env = {k: v for k, v in os.environ.items() if k in COMPILE_ENV}
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", **compile_env}
    return run_python(["-c", FRESH_PROCESS], env=env, timeout=300)


@pytest.mark.slow  # a 4-device subprocess, shared with the import test below
def test_pieces_agree_across_a_mesh_axis_on_four_cpu_devices(fresh_process):
    """shard_map over 4 forced CPU devices: the averaged gradients equal the whole batch's, and
    an inf in one shard makes every replica skip and back off together."""
    out = fresh_process
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "MESH ok", out.stderr[-3000:]


@pytest.fixture(scope="module")
def examples():
    return {
        name: runpy.run_path(str(REPO / "examples" / f"{name}.py"))
        for name in ("purejaxrl_style_ppo", "purejaxrl_style_ppo_fp16")
    }


@pytest.mark.slow  # runs the example scripts' training: 6 s each, most of it compiling
@pytest.mark.parametrize("name", ["purejaxrl_style_ppo", "purejaxrl_style_ppo_fp16"])
def test_the_purejaxrl_style_examples_improve_the_return(examples, name):
    # 78 updates: the last 10 returned 5-7x the first 10 over seeds 0-5 of either example
    out = jax.jit(examples[name]["make_train"]({"TOTAL_TIMESTEPS": 40_000}))(jax.random.PRNGKey(0))
    returns = np.asarray(out["metrics"]["episode_return"])
    assert np.nanmean(returns[-10:]) > 2 * np.nanmean(returns[:10])
    if name.endswith("fp16"):
        # It reports a running count of skips and the scale, and they obey GradScaler's rule:
        # each skip halves the scale, each growth (at most one per 2000 clean steps) doubles it.
        skipped = np.concatenate([[0], np.asarray(out["metrics"]["skipped"])])
        log2_scale = np.log2(np.concatenate([[2.0**16], np.asarray(out["metrics"]["loss_scale"])]))
        growths = np.diff(log2_scale) + np.diff(skipped)
        assert np.all(np.diff(skipped) >= 0) and np.all(growths >= 0) and np.all(growths == np.round(growths))
        minibatch_steps = 16 * len(returns)
        assert growths.sum() <= (minibatch_steps - skipped[-1]) // 2000


def test_the_mixed_precision_example_differs_from_the_fp32_one_in_at_most_15_lines():
    import difflib

    fp32, fp16 = (
        (REPO / "examples" / f"{n}.py").read_text().splitlines()
        for n in ("purejaxrl_style_ppo", "purejaxrl_style_ppo_fp16")
    )
    changed = [
        line
        for line in difflib.unified_diff(fp32, fp16, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert len([line for line in changed if line.startswith("+")]) <= 15


def test_skip_state_finds_the_counts_inside_chain_and_inject_hyperparams():
    params, nan = {"w": jnp.ones(3)}, {"w": jnp.full(3, jnp.nan)}
    chained = optax.chain(optax.add_decayed_weights(1e-4), amp.skip_nonfinite(optax.adam(1e-3)))
    injected = optax.inject_hyperparams(lambda learning_rate: amp.skip_nonfinite(optax.adam(learning_rate)))(
        learning_rate=1e-3
    )
    nested = optax.chain(optax.identity(), injected)
    for tx in (chained, injected, nested):
        state = tx.init(params)
        assert isinstance(skip_state(state), SkipNonFiniteState)
        assert int(skip_state(state).skipped) == 0
        updates, state = tx.update(nan, state, params)
        assert np.asarray(optax.apply_updates(params, updates)["w"]).tolist() == [1.0, 1.0, 1.0]
        assert int(skip_state(state).skipped) == 1 and int(skip_state(state).consecutive_skips) == 1


@pytest.mark.parametrize(
    "tx", [optax.adam(1e-3), optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))], ids=["adam", "chain"]
)
def test_skip_state_without_skip_nonfinite_is_a_value_error(tx):
    with pytest.raises(ValueError, match="no skip_nonfinite state"):
        skip_state(tx.init({"w": jnp.ones(3)}))


def test_autocast_runs_a_function_without_dtypes_in_float16_and_returns_float32():
    seen = []

    def forward(params, x):  # no dtype anywhere: it computes in whatever it is given
        seen.append((params["w"].dtype, x.dtype))
        return jnp.tanh(x @ params["w"])

    params, x = {"w": jnp.full((3, 2), 0.1)}, jnp.ones((4, 3))
    apply = amp.autocast(forward, "fp16")
    out = apply(params, x)
    assert seen == [(jnp.float32, jnp.float32)]  # as torch.autocast's: the ops are cast, not what fn reads
    assert out.dtype == jnp.float32 and params["w"].dtype == jnp.float32
    assert dot_dtypes(apply, params, x) == [jnp.float16]  # the matmul itself runs in float16
    np.testing.assert_allclose(out, forward(params, x), rtol=4 * 2.0**-11)  # a few float16 roundings
    # a Flax module built without dtype= is cast the same way
    dense = nn.Dense(2)
    dense_params = dense.init(jax.random.PRNGKey(0), x)
    assert dot_dtypes(amp.autocast(dense.apply, "fp16"), dense_params, x) == [jnp.float16]
    assert amp.autocast(dense.apply, "fp16")(dense_params, x).dtype == jnp.float32


def test_autocast_leaves_what_fn_does_before_a_matmul_in_float32_as_torch_does():
    """Observations far from the origin, normalised inside the policy: cast to float16 on the
    way in (spacing 0.5 at 1000), they all normalised to 0, finite and silent."""

    def policy(p, obs):
        return ((obs - p["mean"]) / p["std"]) @ p["w"]

    obs = 1000.0 + 0.1 * jax.random.normal(jax.random.PRNGKey(0), (16, 1))
    p = {"mean": jnp.full((1,), 1000.0), "std": jnp.full((1,), 0.1), "w": jnp.ones((1, 2))}
    torch_rule = ((obs - p["mean"]) / p["std"]).astype(jnp.float16) @ p["w"].astype(jnp.float16)
    np.testing.assert_array_equal(amp.autocast(policy, "fp16")(p, obs), torch_rule.astype(jnp.float32))
    np.testing.assert_allclose(amp.autocast(policy, "fp16")(p, obs), policy(p, obs), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("square", [lambda h: h**2, jnp.square, lambda h: h * h], ids=["integer_pow", "square", "mul"])
def test_autocast_squares_a_half_matmul_s_output_in_float32(square):
    """torch.autocast runs pow in float32; an RMS norm of activations near 300 overflowed
    float16 (300^2 = 90000 > 65504) and gave zeros, finite and silent."""

    def rms_normed(w, x):
        h = x @ w
        return h / jnp.sqrt(jnp.mean(square(h), axis=-1, keepdims=True))

    w, x = jnp.full((4, 4), 3.0), jnp.full((2, 4), 25.0)  # h = 300
    np.testing.assert_allclose(amp.autocast(rms_normed, "fp16")(w, x), np.ones((2, 4)), rtol=1e-3)
    assert amp.autocast(lambda w, x: jnp.linalg.norm(x @ w), "fp16")(w, x) == pytest.approx(300 * 8**0.5, rel=1e-3)


def test_autocast_casts_inside_scan_while_cond_and_remat_bodies_and_their_gradients_flow():
    def fn(w, x, loop=True):
        h, ys = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), jnp.sum(c)), x, None, length=3)
        h = jax.checkpoint(lambda h: h @ w)(h)
        if loop:  # no reverse-mode gradient through a while loop
            h = jax.lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w)), (0, h))[1]
        return jax.lax.cond(jnp.sum(ys) > 0, lambda: jnp.sum(h @ w), lambda: -jnp.sum(h))

    w, x = jnp.full((4, 4), 0.1), jnp.ones((2, 4))
    half = amp.autocast(fn, "fp16")
    assert amp.dtype_report(half, w, x).dtypes("matmul") == {"float16": 4}  # scan, remat, while, cond
    np.testing.assert_allclose(half(w, x), fn(w, x), rtol=1e-2)
    grads = [jax.grad(lambda w: f(w, x, loop=False))(w) for f in (half, fn)]
    np.testing.assert_allclose(*grads, rtol=2e-2)


@pytest.mark.slow
def test_importing_genesis_jax_amp_loads_no_other_genesis_jax_module(fresh_process):
    out = fresh_process
    snapshots = [line for line in out.stdout.splitlines() if line.startswith("IMPORTS ")]
    assert snapshots, out.stderr[-3000:]  # printed once the imports and the walk succeeded
    everything, loaded = eval(snapshots[-1][len("IMPORTS ") :])
    amp_modules = {m for m in everything if m.startswith("genesis_jax.amp.")}
    assert len(everything) > 30 and {"genesis_jax.amp.state", "genesis_jax.amp.grads"} <= amp_modules
    others = sorted(set(everything) - amp_modules - {"genesis_jax.amp"})
    # the package itself (its lazy __init__) and the amp subpackage; none of the others
    assert not set(loaded) & set(others), sorted(set(loaded) & set(others))
    assert set(loaded) <= {"genesis_jax", "genesis_jax.amp", *amp_modules}, loaded


def test_a_float16_loss_is_warned_about_because_its_gradient_overflows():
    loss_fn = lambda params, x: jnp.mean(x @ params["w"])  # noqa: E731  (float16 mean)
    with pytest.warns(UserWarning, match="the loss is float16"):
        params = {"w": jnp.ones((2, 1))}
        out = amp.scaled_value_and_grad(loss_fn, policy="fp16")(skipping(params), params, jnp.ones((3, 2)))
    assert not bool(out.grads_finite)  # exactly what the warning predicts
