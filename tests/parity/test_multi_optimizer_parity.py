"""Several optimizers under one loss scaler, against PyTorch running: an actor and a critic
with their own optimizers and one `torch.amp.GradScaler` (`scaler.scale(loss).backward()` for
each loss, `scaler.step(actor_opt)`, `scaler.step(critic_opt)`, one `scaler.update()`), and the
same through `amp.shared_scale_step`, `amp.update_shared_scale` and `amp.share_scale`.
Overflow is forced (the loss multiplied by inf) in the critic alone, in both, in the actor
alone. Float32 on both sides: the parity of the scaler's semantics, not of float16 kernels."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

if os.environ.get("CI"):
    import torch  # in CI a missing torch is a failure, never a skip
else:
    torch = pytest.importorskip("torch", reason="parity tests need torch (pip install -e '.[test]')")

from genesis_jax import amp  # noqa: E402
from genesis_jax.nets import MLP  # noqa: E402
from tests.parity import harness as parity  # noqa: E402

OBS_DIM, ACTION_DIM, HIDDEN, BATCH = 4, 2, 16, 32
INIT_SCALE, GROWTH_INTERVAL = 2.0**10, 2
ACTOR_LR, MOMENTUM, CRITIC_LR = 0.05, 0.9, 1e-2
STEPS = 14
CRITIC_OVERFLOWS, BOTH_OVERFLOW, ACTOR_OVERFLOWS = (2, 5, 6), (9,), (12,)

ACTOR = MLP(features=(HIDDEN, ACTION_DIM))
CRITIC = MLP(features=(HIDDEN, 1))


def factors(step):
    """(actor's, critic's) loss factor: inf forces non-finite gradients on that optimizer."""
    actor_bad = step in BOTH_OVERFLOW + ACTOR_OVERFLOWS
    critic_bad = step in BOTH_OVERFLOW + CRITIC_OVERFLOWS
    return (np.float32(np.inf) if actor_bad else np.float32(1.0)), (
        np.float32(np.inf) if critic_bad else np.float32(1.0)
    )


def data(seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(STEPS, BATCH, OBS_DIM)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(STEPS, BATCH, ACTION_DIM)).astype(np.float32)
    targets = rng.normal(size=(STEPS, BATCH)).astype(np.float32)
    return obs, actions, targets


def init_params():
    ka, kc = jax.random.split(jax.random.PRNGKey(0))
    return ACTOR.init(ka, jnp.zeros((1, OBS_DIM))), CRITIC.init(kc, jnp.zeros((1, OBS_DIM + ACTION_DIM)))


def torch_run(actor_params, critic_params, obs, actions, targets):
    """Per step: the scale after update(), whether each optimizer stepped, both params."""
    actor = parity.torch_mlp((HIDDEN, ACTION_DIM), OBS_DIM)
    critic = parity.torch_mlp((HIDDEN, 1), OBS_DIM + ACTION_DIM)
    parity.mlp_params_to_torch(actor_params, actor)
    parity.mlp_params_to_torch(critic_params, critic)
    actor_opt = torch.optim.SGD(actor.parameters(), lr=ACTOR_LR, momentum=MOMENTUM)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=CRITIC_LR, eps=1e-8)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    out = []
    for step in range(STEPS):
        o, a, y = (torch.from_numpy(v[step]) for v in (obs, actions, targets))
        actor_factor, critic_factor = (float(f) for f in factors(step))
        before = [p.detach().clone() for p in (*actor.parameters(), *critic.parameters())]
        actor_opt.zero_grad(set_to_none=True)
        critic_opt.zero_grad(set_to_none=True)
        critic_loss = critic_factor * torch.mean((critic(torch.cat([o, a], -1))[..., 0] - y) ** 2)
        frozen = {name: p.detach() for name, p in critic.named_parameters()}  # no actor gradient into the critic
        q = torch.func.functional_call(critic, frozen, (torch.cat([o, torch.tanh(actor(o))], -1),))
        actor_loss = actor_factor * -torch.mean(q)
        scaler.scale(critic_loss).backward()
        scaler.scale(actor_loss).backward()
        scaler.step(actor_opt)
        scaler.step(critic_opt)
        scaler.update()
        after = [p.detach() for p in (*actor.parameters(), *critic.parameters())]
        moved = [not torch.equal(b, p) for b, p in zip(before, after)]
        n_actor = len(list(actor.parameters()))
        out.append(
            {
                "scale": scaler.get_scale(),
                "stepped": (all(moved[:n_actor]), all(moved[n_actor:])),
                "still": (not any(moved[:n_actor]), not any(moved[n_actor:])),
                "actor": parity.mlp_params_from_torch(actor),
                "critic": parity.mlp_params_from_torch(critic),
            }
        )
    return out


def critic_loss(params, batch):
    obs, actions, targets, factor = batch
    q = CRITIC.apply(params, jnp.concatenate([obs, actions], -1))[..., 0]
    return factor * jnp.mean((q - targets) ** 2), {}


def actor_loss(params, batch):
    obs, critic_params, factor = batch
    q = CRITIC.apply(critic_params, jnp.concatenate([obs, jnp.tanh(ACTOR.apply(params, obs))], -1))
    return factor * -jnp.mean(q), {}


@jax.jit
def jax_iteration(actor, critic, scaler, obs, actions, targets, actor_factor, critic_factor):
    # Both losses from this iteration's params, as both torch backward passes run before either step.
    new_actor, a = amp.shared_scale_step(actor, (obs, critic.params, actor_factor), actor_loss, scaler)
    new_critic, c = amp.shared_scale_step(critic, (obs, actions, targets, critic_factor), critic_loss, scaler)
    scaler = amp.update_shared_scale(scaler, [a["grads_finite"], c["grads_finite"]])
    new_actor, new_critic = amp.share_scale((new_actor, new_critic), scaler)
    return new_actor, new_critic, scaler, (a["grads_finite"], c["grads_finite"])


def jax_run(actor_params, critic_params, obs, actions, targets, critic_tx):
    scaler = amp.DynamicLossScale(init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    actor = amp.TrainState.create(params=actor_params, tx=optax.sgd(ACTOR_LR, momentum=MOMENTUM), loss_scale=scaler)
    critic = amp.TrainState.create(params=critic_params, tx=critic_tx, loss_scale=scaler)
    out = []
    for step in range(STEPS):
        actor_before, critic_before = jax.device_get((actor.params, critic.params))
        actor, critic, scaler, finite = jax_iteration(
            actor, critic, scaler, obs[step], actions[step], targets[step], *factors(step)
        )
        out.append(
            {
                "scale": float(scaler.loss_scale),
                "stepped": tuple(bool(f) for f in finite),
                "unchanged": (
                    all(
                        np.array_equal(x, y)
                        for x, y in zip(jax.tree.leaves(actor_before), jax.tree.leaves(actor.params))
                    ),
                    all(
                        np.array_equal(x, y)
                        for x, y in zip(jax.tree.leaves(critic_before), jax.tree.leaves(critic.params))
                    ),
                ),
                "actor": jax.device_get(actor.params),
                "critic": jax.device_get(critic.params),
            }
        )
    return out, actor, critic


# Max absolute parameter difference allowed at every step. torch-style Adam (parity.torch_style_adam)
# computes what torch.optim.Adam computes, so both sides differ by float32 summation order
# alone: measured 6e-8 at most over the 14 steps (a few float32 ulps of params of order 0.1
# to 1). optax.adam forms its bias corrections from float32 betas (see
# parity.torch_style_adam), a systematic ~6e-6 relative per early update: measured 6e-7.
# The scale sequence is compared exactly: it is powers of two on both sides.
PARAM_ATOL = {"torch-style": 1e-6, "optax": 5e-6}


@functools.cache
def runs(critic_optimizer):
    actor_params, critic_params = init_params()
    obs, actions, targets = data()
    if critic_optimizer == "torch-style":
        critic_tx = parity.torch_style_adam(CRITIC_LR, eps=1e-8)
    else:
        critic_tx = optax.adam(CRITIC_LR, eps=1e-8)
    theirs = torch_run(actor_params, critic_params, obs, actions, targets)
    ours, actor, critic = jax_run(actor_params, critic_params, obs, actions, targets, critic_tx)
    return theirs, ours, actor, critic


# torch-style Adam in the fast lane (about 5 s of CPU time: one compile, 14 steps each side);
# optax.adam, which differs only by its float32 bias corrections, in the slow lane.
@pytest.mark.parametrize("critic_optimizer", ["torch-style", pytest.param("optax", marks=pytest.mark.slow)])
def test_scale_sequence_and_params_match_one_gradscaler_step_by_step(critic_optimizer):
    theirs, ours, actor, critic = runs(critic_optimizer)
    atol = PARAM_ATOL[critic_optimizer]
    for step, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        assert o["scale"] == t["scale"], f"step {step}: scale {o['scale']} != torch's {t['scale']}"
        assert o["stepped"] == t["stepped"], f"step {step}: (actor, critic) stepped {o['stepped']} != {t['stepped']}"
        # A skipped optimizer changes nothing, on either side.
        assert o["unchanged"] == t["still"] == tuple(not s for s in t["stepped"]), step
        for name in ("actor", "critic"):
            abs_diff, _ = parity.max_diffs(o[name], t[name])
            assert abs_diff < atol, f"step {step}: {name} params differ by {abs_diff:.2e} (atol {atol:.0e})"
    # The schedule exercised what it claims: growth, and one backoff when both overflowed.
    scales = [INIT_SCALE] + [t["scale"] for t in theirs]
    assert max(scales) > INIT_SCALE
    (both,) = BOTH_OVERFLOW
    assert scales[both + 1] == scales[both] / 2
    assert int(actor.skipped) == len(BOTH_OVERFLOW + ACTOR_OVERFLOWS)
    assert int(critic.skipped) == len(BOTH_OVERFLOW + CRITIC_OVERFLOWS)
    assert [s["stepped"] for s in ours].count((True, True)) == STEPS - 5
