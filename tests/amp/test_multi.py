"""Several optimizers under one loss scaler (`TrainState.create(shared_scaler=True)`,
`amp.train_step`, one `amp.update_scaler` per iteration): each optimizer skips on its own
gradients, the scale backs off once per iteration and grows only after iterations clean for
all, as with one torch GradScaler. (0.2's shared_scale_step, update_shared_scale and
share_scale: tests/amp/test_deprecations.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import amp
from genesis_jax.amp.optim import find_skip_state as skip_state

INF = float("inf")


def linear_loss(params, batch):
    """Least squares; `factor` (1 or inf) forces a non-finite loss and gradients."""
    x, y, factor = batch
    prediction = (x.astype(jnp.float16) @ params["w"].astype(jnp.float16)).astype(jnp.float32)  # fp16's matmul
    return factor * jnp.mean((prediction + params["b"] - y) ** 2), {"factor": factor}


def problem(seed):
    kx, kw = jax.random.split(jax.random.PRNGKey(seed))
    x = jax.random.normal(kx, (16, 3))
    y = x @ jax.random.normal(kw, (3, 1))
    return x, y


def new_state(tx, seed, scaler=None, shared=True):
    params = {"w": jnp.full((3, 1), 0.1 * (seed + 1)), "b": jnp.zeros(1)}
    return amp.TrainState.create(params=params, tx=tx, precision="fp16", scaler=scaler, shared_scaler=shared)


@jax.jit
def iteration(actor, critic, actor_factor, critic_factor):
    """torch: scale(loss).backward() for each, step(actor_opt), step(critic_opt), update()."""
    (xa, ya), (xc, yc) = problem(0), problem(1)
    actor, a = amp.train_step(actor, linear_loss, (xa, ya, actor_factor), has_aux=True)
    critic, c = amp.train_step(critic, linear_loss, (xc, yc, critic_factor), has_aux=True)
    actor, critic = amp.update_scaler(actor, critic)
    return actor, critic, a, c


def optimizer_view(state):
    """What a skipped step must leave bit-identical: params and the optimizer's own state."""
    return jax.device_get((state.params, skip_state(state.opt_state).inner_state))


def assert_bit_identical(before, after):
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        assert np.array_equal(a, b)


def torch_rule(schedule, init_scale, growth_interval):
    """GradScaler's (scale, growth tracker) after each iteration, one update() per iteration:
    back off x0.5 when any optimizer saw a non-finite gradient, else count and grow x2."""
    scale, tracker, out = init_scale, 0, []
    for flags in schedule:
        if all(flags):
            tracker += 1
            if tracker == growth_interval:
                scale, tracker = scale * 2.0, 0
        else:
            scale, tracker = scale * 0.5, 0
        out.append((scale, tracker))
    return out


@pytest.mark.slow
def test_critic_overflow_steps_the_actor_and_leaves_the_critic_bit_identical():
    lr = 0.05
    scaler = amp.DynamicLossScale(init_scale=2.0**10, growth_interval=3)
    actor, critic = new_state(optax.sgd(lr), 0, scaler), new_state(optax.adam(1e-2), 1, scaler)
    actor, critic, _, _ = iteration(actor, critic, 1.0, 1.0)  # Adam's moments now non-zero
    critic_before, actor_params, scaler = optimizer_view(critic), jax.device_get(actor.params), actor.scaler

    actor, critic, a, c = iteration(actor, critic, 1.0, INF)
    new_scaler = actor.scaler

    assert bool(a["grads_finite"]) and not bool(c["grads_finite"])
    assert_bit_identical(critic_before, optimizer_view(critic))
    # The actor took a plain SGD step on its unscaled gradients (an independent jax.grad).
    grads = jax.grad(lambda p: linear_loss(p, (*problem(0), 1.0))[0])(actor_params)
    expected = jax.tree.map(lambda p, g: p - lr * g, actor_params, grads)
    jax.tree.map(lambda e, p: np.testing.assert_allclose(p, e, rtol=1e-6, atol=1e-7), expected, actor.params)
    assert not np.array_equal(actor.params["w"], actor_params["w"])
    assert (int(actor.skipped), int(critic.skipped)) == (0, 1)
    assert (int(actor.step), int(critic.step)) == (2, 2)  # updates attempted, as train_step counts them
    assert float(new_scaler.loss_scale) == float(scaler.loss_scale) / 2 and int(new_scaler.growth_tracker) == 0
    # Each step used the iteration's scale; both states now carry the next one.
    assert float(a["loss_scale"]) == float(c["loss_scale"]) == float(scaler.loss_scale)
    for state in (actor, critic):
        assert float(state.scaler.loss_scale) == float(new_scaler.loss_scale)
        assert int(state.scaler.growth_tracker) == 0
        assert int(state.scaler.backoffs) == 1 and not bool(state.pending_backoff)


# (actor finite, critic finite) per iteration: the critic alone overflows, then both at once,
# then the actor alone; the critic overflows every other iteration while the actor stays clean,
# so that no growth_interval of 3 iterations is clean for both; then clean runs that grow.
SCHEDULE = [
    (True, True),
    (True, True),
    (True, True),  # 3 clean: grows
    (True, False),
    (False, False),  # both overflow: one backoff
    (True, True),
    (False, True),
    (True, True),
    (True, False),
    (True, True),
    (True, False),
    (True, True),
    (True, True),
    (True, True),  # grows
    (True, True),
]


@pytest.mark.parametrize("actor_tx", ["sgd", "adam"])
def test_scale_and_skip_counts_follow_one_gradscaler_over_an_overflow_schedule(actor_tx):
    growth_interval, init_scale = 3, 2.0**10
    scaler = amp.DynamicLossScale(init_scale=init_scale, growth_interval=growth_interval)
    actor = new_state(optax.sgd(0.05) if actor_tx == "sgd" else optax.adam(1e-2), 0, scaler)
    critic = new_state(optax.adam(1e-2), 1, scaler)
    expected = torch_rule(SCHEDULE, init_scale, growth_interval)
    for i, (actor_ok, critic_ok) in enumerate(SCHEDULE):
        before = {"actor": optimizer_view(actor), "critic": optimizer_view(critic)}
        scale_before = float(scaler.loss_scale)
        actor, critic, a, c = iteration(actor, critic, 1.0 if actor_ok else INF, 1.0 if critic_ok else INF)
        scaler = actor.scaler
        assert (bool(a["grads_finite"]), bool(c["grads_finite"])) == (actor_ok, critic_ok), i
        assert (float(scaler.loss_scale), int(scaler.growth_tracker)) == expected[i], i
        assert float(a["loss_scale"]) == float(c["loss_scale"]) == scale_before, i
        if not (actor_ok or critic_ok):
            assert float(scaler.loss_scale) == scale_before / 2, i  # once, not once per optimizer
        for name, state, ok in (("actor", actor, actor_ok), ("critic", critic, critic_ok)):
            after = optimizer_view(state)
            if ok:
                assert not np.array_equal(after[0]["w"], before[name][0]["w"]), (i, name)
            else:
                assert_bit_identical(before[name], after)
            assert float(state.scaler.loss_scale) == float(scaler.loss_scale), (i, name)
    assert int(actor.skipped) == sum(not a for a, _ in SCHEDULE) == 2
    assert int(critic.skipped) == sum(not c for _, c in SCHEDULE) == 4
    assert int(actor.step) == int(critic.step) == len(SCHEDULE)
    # The actor alone was clean for 5 iterations in a row (7..11), yet the scale did not grow there.
    scales = [s for s, _ in expected]
    assert scales[6:12] == sorted(scales[6:12], reverse=True)
    assert float(scaler.loss_scale) == init_scale / 8  # up x2 twice, down x0.5 five times (once for both)
    assert int(scaler.backoffs) == 5
    counts = amp.stats(actor=actor, critic=critic)
    assert counts["optimizers"]["actor"]["skipped"] == 2 and counts["optimizers"]["critic"]["skipped"] == 4
    assert counts["backoffs"] == 5 and counts["scale"] == init_scale / 8


def test_seeds_under_vmap_each_share_their_own_scale():
    scaler = amp.DynamicLossScale(2.0**10)
    actor, critic = new_state(optax.sgd(0.05), 0, scaler), new_state(optax.adam(1e-2), 1, scaler)
    seeds = jax.tree.map(lambda x: jnp.stack([x, x]), (actor, critic))
    actors, critics, _, _ = jax.vmap(iteration)(*seeds, jnp.ones(2), jnp.array([1.0, INF]))
    scalers = actors.scaler
    np.testing.assert_array_equal(scalers.loss_scale, [2.0**10, 2.0**9])  # only seed 1's critic overflowed
    np.testing.assert_array_equal(scalers.growth_tracker, [1, 0])
    np.testing.assert_array_equal(critics.skipped, [0, 1])
    np.testing.assert_array_equal(actors.skipped, [0, 0])
    np.testing.assert_array_equal(critics.scaler.loss_scale, scalers.loss_scale)
    np.testing.assert_array_equal(scalers.backoffs, [0, 1])
    assert_bit_identical(critic.params, jax.tree.map(lambda x: x[1], critics.params))


def test_one_optimizer_under_the_shared_api_is_train_step():
    """With one optimizer, shared_scaler=True + train_step + update_scaler is train_step alone."""
    x, y = problem(2)
    scaler = amp.DynamicLossScale(2.0**4, growth_interval=2)
    shared_state, alone = new_state(optax.adam(1e-2), 0, scaler), new_state(optax.adam(1e-2), 0, scaler, shared=False)
    factors = [1.0, 1.0, INF, 1.0, 1.0, 1.0, INF, INF, 1.0]

    @jax.jit
    def shared(state, factor):
        stepped, _ = amp.train_step(state, linear_loss, (x, y, factor), has_aux=True)
        return amp.update_scaler(stepped)

    single = jax.jit(lambda state, batch: amp.train_step(state, linear_loss, batch, has_aux=True))
    ours, theirs = shared_state, alone
    for factor in factors:
        ours = shared(ours, factor)
        theirs, _ = single(theirs, (x, y, factor))
        assert float(ours.scaler.loss_scale) == float(theirs.scaler.loss_scale)
        assert int(ours.scaler.growth_tracker) == int(theirs.scaler.growth_tracker)
        assert int(ours.scaler.backoffs) == int(theirs.scaler.backoffs)
        assert (int(ours.skipped), int(ours.step)) == (int(theirs.skipped), int(theirs.step))
        jax.tree.map(lambda o, t: np.testing.assert_allclose(o, t, rtol=1e-6, atol=1e-7), ours.params, theirs.params)
    assert int(ours.skipped) == 3


def test_a_shared_step_scales_by_the_state_scaler_and_leaves_it_alone():
    # The scaled gradients are scale * 1e34: finite float32 at a scale of 2^8 (2.6e36),
    # inf at 2^16 (6.6e38 is above float32's largest, 3.4e38).
    def loss_fn(params):
        return 1e34 * jnp.sum(params["w"])

    state = amp.TrainState.create(
        params={"w": jnp.ones(2)},
        tx=optax.sgd(1e-30),
        precision="fp16",
        scaler=amp.DynamicLossScale(init_scale=2.0**8),
        shared_scaler=True,
    )
    own = jax.device_get(state.scaler)
    stepped, metrics = amp.train_step(state, loss_fn)
    assert bool(metrics["grads_finite"]) and float(metrics["loss_scale"]) == 2.0**8
    assert int(stepped.skipped) == 0 and not np.array_equal(stepped.params["w"], state.params["w"])
    assert_bit_identical(own, stepped.scaler)  # not adjusted until update_scaler
    assert not bool(stepped.pending_backoff)
    big = state.replace(scaler=amp.DynamicLossScale())
    overflowed, metrics = amp.train_step(big, loss_fn)  # 2^16 overflows
    assert not bool(metrics["grads_finite"]) and bool(overflowed.pending_backoff)
    assert_bit_identical(jax.device_get(big.scaler), overflowed.scaler)
    after = amp.update_scaler(overflowed)
    assert float(after.scaler.loss_scale) == 2.0**15 and int(after.scaler.backoffs) == 1
    assert not bool(after.pending_backoff)


def test_update_scaler_reaches_every_state_in_a_tree_and_keeps_other_leaves():
    scaler = amp.DynamicLossScale(init_scale=32.0)
    critic, _ = amp.train_step(new_state(optax.adam(1e-3), 0, scaler), linear_loss, (*problem(0), 1.0), has_aux=True)
    states = {"critic": critic, "actor": new_state(optax.sgd(0.1), 1, scaler), "tau": jnp.float32(5e-3)}
    shared = amp.update_scaler(states)  # the actor did not step this iteration: fine, the critic did
    expected = scaler.adjust(jnp.array(True))
    for name in ("critic", "actor"):
        assert_bit_identical(expected, shared[name].scaler)
        assert_bit_identical(states[name].params, shared[name].params)
    assert shared["tau"] is states["tau"]
    assert amp.stats(shared["actor"])["scale"] == 32.0


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda: amp.update_scaler({"a": 1}), TypeError, "takes amp.TrainStates"),
        (lambda: amp.update_scaler(new_state(optax.sgd(0.1), 0, shared=False)), ValueError, "shared_scaler=True"),
        (lambda: amp.train_step({"w": 1}, linear_loss, None), TypeError, "state must be an amp.TrainState"),
        (lambda: amp.TrainState.create(params={}, tx=optax.sgd(0.1), shared_scaler=1), TypeError, "shared_scaler"),
    ],
)
def test_bad_input_names_the_bad_value(call, error, words):
    with pytest.raises(error, match=words):
        call()
