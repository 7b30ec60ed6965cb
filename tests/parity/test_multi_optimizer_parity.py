"""Several optimizers under one loss scaler, against PyTorch running: an actor and a critic
with their own optimizers and one `torch.amp.GradScaler` (`scaler.scale(loss).backward()` for
each loss, `scaler.step(actor_opt)`, `scaler.step(critic_opt)`, one `scaler.update()`), and the
same through states created with `shared_scaler=True`, one `amp.train_step` each and one
`amp.update_scaler` per iteration. Overflow is forced (the loss multiplied by inf) in the
critic alone, in both, in the actor alone; then three optimizers with `amp.testing.FaultInjection`
on one of them, then on all. Float32 on both sides: the parity of the scaler's semantics, not
of float16 kernels."""

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
from genesis_jax.amp.optim import find_skip_state as skip_state  # noqa: E402
from genesis_jax.nets import MLP  # noqa: E402
from tests.parity import harness as parity  # noqa: E402

# Every test here runs PyTorch beside JAX (torch's import alone takes seconds): the slow lane.
pytestmark = pytest.mark.slow

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
def jax_iteration(actor, critic, obs, actions, targets, actor_factor, critic_factor):
    # Both losses from this iteration's params, as both torch backward passes run before either step.
    new_actor, a = amp.train_step(actor, actor_loss, (obs, critic.params, actor_factor), has_aux=True)
    new_critic, c = amp.train_step(critic, critic_loss, (obs, actions, targets, critic_factor), has_aux=True)
    new_actor, new_critic = amp.update_scaler(new_actor, new_critic)
    return new_actor, new_critic, (a["grads_finite"], c["grads_finite"])


def jax_run(actor_params, critic_params, obs, actions, targets, critic_tx):
    scaler = amp.DynamicLossScale(init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    actor = amp.TrainState.create(
        params=actor_params, tx=optax.sgd(ACTOR_LR, momentum=MOMENTUM), scaler=scaler, shared_scaler=True
    )
    critic = amp.TrainState.create(params=critic_params, tx=critic_tx, scaler=scaler, shared_scaler=True)
    out = []
    for step in range(STEPS):
        actor_before, critic_before = jax.device_get((actor.params, critic.params))
        actor, critic, finite = jax_iteration(actor, critic, obs[step], actions[step], targets[step], *factors(step))
        scaler = actor.scaler
        assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(scaler), jax.tree.leaves(critic.scaler)))
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
@pytest.mark.parametrize("critic_optimizer", ["torch-style", "optax"])
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


# --- three optimizers, faults on one of them, then on all ------------------------------------

THREE_STEPS, THREE_INTERVAL = 20, 3
ONE_FAULTY = range(0, 12)  # iterations where the critic alone gets FaultInjection(nonfinite_rate=0.4)
ALL_FAULTY = (12, 13)  # iterations where every optimizer's gradients are poisoned
CRITIC_FAULTS = amp.testing.FaultInjection(nonfinite_rate=0.4, seed=3)
EVERY_STEP = amp.testing.FaultInjection(nonfinite_rate=1.0)
NAMES = ("critic", "actor", "alpha")
THREE_LR = {"critic": 1e-2, "actor": 0.05, "alpha": 0.1}


def three_problems(seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, 8, 3)).astype(np.float32)
    y = rng.normal(size=(3, 8)).astype(np.float32)
    w = (0.1 * rng.normal(size=(3, 3))).astype(np.float32)
    return x, y, w


def three_flags():
    """Per iteration, (critic, actor, alpha) poisoned: the faults train_step injects, read
    from the same FaultInjection by the critic's step (its step is the iteration here)."""
    flags = []
    for i in range(THREE_STEPS):
        critic_bad = (i in ONE_FAULTY and bool(CRITIC_FAULTS.is_nonfinite_step(i))) or i in ALL_FAULTY
        flags.append((critic_bad, i in ALL_FAULTY, i in ALL_FAULTY))
    return flags


def lsq(params, x, y):
    return jnp.mean((x @ params - y) ** 2)


@functools.cache
def three_iteration(faulty: tuple):
    """One jitted iteration: each optimizer's train_step (faults where `faulty` says), one update_scaler."""

    @jax.jit
    def iteration(states, x, y):
        stepped, finite = [], []
        for i, (state, bad) in enumerate(zip(states, faulty)):
            faults = (EVERY_STEP if len(set(faulty)) == 1 else CRITIC_FAULTS) if bad else None
            new, m = amp.train_step(state, lsq, x[i], y[i], faults=faults)
            stepped.append(new)
            finite.append(m["grads_finite"])
        return amp.update_scaler(*stepped), jnp.stack(finite)

    return iteration


def three_torch_run(x, y, w, flags):
    """torch: three parameter tensors, SGD / momentum SGD / Adam, one GradScaler, the loss of a
    poisoned optimizer multiplied by inf; per iteration the scale, the growth tracker and which stepped."""
    params = [torch.tensor(w[i], requires_grad=True) for i in range(3)]
    opts = [
        torch.optim.Adam([params[0]], lr=THREE_LR["critic"], eps=1e-8),
        torch.optim.SGD([params[1]], lr=THREE_LR["actor"], momentum=MOMENTUM),
        torch.optim.SGD([params[2]], lr=THREE_LR["alpha"]),
    ]
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=THREE_INTERVAL)
    out = []
    for bad in flags:
        before = [p.detach().clone() for p in params]
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        for i in range(3):
            loss = torch.mean((torch.from_numpy(x[i]) @ params[i] - torch.from_numpy(y[i])) ** 2)
            scaler.scale(loss * (float("inf") if bad[i] else 1.0)).backward()
        for opt in opts:
            scaler.step(opt)
        scaler.update()
        out.append(
            {
                "scale": scaler.get_scale(),
                "tracker": int(scaler._get_growth_tracker()),
                "stepped": tuple(not torch.equal(b, p.detach()) for b, p in zip(before, params)),
            }
        )
    return out


def test_three_optimizers_faults_on_one_then_all_follow_one_gradscaler():
    x, y, w = three_problems()
    flags = three_flags()
    assert 0 < sum(c for c, _, _ in flags[: len(ONE_FAULTY)]) < len(ONE_FAULTY)  # the seed hits some, not all
    theirs = three_torch_run(x, y, w, flags)
    txs = {
        "critic": parity.torch_style_adam(THREE_LR["critic"], eps=1e-8),
        "actor": optax.sgd(THREE_LR["actor"], momentum=MOMENTUM),
        "alpha": optax.sgd(THREE_LR["alpha"]),
    }
    scaler = amp.DynamicLossScale(init_scale=INIT_SCALE, growth_interval=THREE_INTERVAL)
    states = tuple(
        amp.TrainState.create(params=jnp.asarray(w[i]), tx=txs[name], scaler=scaler, shared_scaler=True)
        for i, name in enumerate(NAMES)
    )
    backoffs = 0
    for i, bad in enumerate(flags):
        before = jax.device_get([(s.params, skip_state(s.opt_state).inner_state) for s in states])
        states, finite = three_iteration(bad)(states, jnp.asarray(x), jnp.asarray(y))
        assert tuple(not bool(f) for f in finite) == bad, i
        after = jax.device_get([(s.params, skip_state(s.opt_state).inner_state) for s in states])
        for k, name in enumerate(NAMES):
            if bad[k]:  # skipped: params and optimizer state bit-identical
                for a, b in zip(jax.tree.leaves(before[k]), jax.tree.leaves(after[k]), strict=True):
                    assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (i, name)
            else:
                assert not np.array_equal(before[k][0], after[k][0]), (i, name)
        # torch stepped exactly the optimizers we stepped
        assert theirs[i]["stepped"] == tuple(not b for b in bad), i
        # one backoff per bad iteration, however many optimizers were bad
        backoffs += any(bad)
        scalers = [jax.device_get(s.scaler) for s in states]
        assert all(int(s.backoffs) == backoffs for s in scalers), i
        assert all(not bool(s.pending_backoff) for s in states), i
        # the scale and growth tracker are GradScaler's, in every state
        for s in scalers:
            assert (float(s.loss_scale), int(s.growth_tracker)) == (theirs[i]["scale"], theirs[i]["tracker"]), i
    scales = [INIT_SCALE] + [t["scale"] for t in theirs]
    assert any(b > a for a, b in zip(scales, scales[1:]))  # growth happened
    # and each all-faulty iteration backed off once, not once per optimizer
    for i in ALL_FAULTY:
        assert scales[i + 1] == scales[i] / 2
    counts = amp.stats(**dict(zip(NAMES, states)))
    skipped = {name: sum(b[k] for b in flags) for k, name in enumerate(NAMES)}
    assert counts["optimizers"] == {
        name: {
            "steps": THREE_STEPS,
            "skipped": skipped[name],
            "skip_rate": skipped[name] / THREE_STEPS,
            "halted": False,
        }
        for name in NAMES
    }
    assert counts["backoffs"] == backoffs == sum(any(b) for b in flags)
    assert counts["scale"] == theirs[-1]["scale"] and counts["precision"] == "fp32"
    assert skipped["actor"] == skipped["alpha"] == len(ALL_FAULTY) < skipped["critic"]
