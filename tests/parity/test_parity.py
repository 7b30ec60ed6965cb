"""Parity with PyTorch AMP, against real PyTorch (the CPU build). Never skipped in CI."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

if os.environ.get("CI"):
    import torch  # in CI a missing torch is a failure, never a skip
else:
    torch = pytest.importorskip("torch", reason="parity tests need torch (pip install -e '.[test]')")

from genesis_jax.nets import MLP, ActorCritic  # noqa: E402
from genesis_jax.nets.world_model import WorldModel  # noqa: E402
from tests.parity import harness as parity  # noqa: E402

# Every test here runs PyTorch beside JAX (torch's import alone takes seconds): the slow lane.
pytestmark = pytest.mark.slow

torch.manual_seed(0)


def test_forward_passes_agree_in_fp32_both_ways():
    x = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    # MLP, Flax -> torch
    mlp = MLP(features=(64, 64, 1))
    params = mlp.init(jax.random.PRNGKey(0), x)
    seq = parity.torch_mlp((64, 64, 1), 8)
    parity.mlp_params_to_torch(params, seq)
    np.testing.assert_allclose(
        seq(torch.from_numpy(x)).detach().numpy(), np.asarray(mlp.apply(params, x)), rtol=1e-6, atol=1e-6
    )
    # MLP, torch -> Flax
    fresh = parity.torch_mlp((64, 64, 1), 8)
    back = parity.mlp_params_from_torch(fresh)
    np.testing.assert_allclose(
        np.asarray(mlp.apply(back, x)), fresh(torch.from_numpy(x)).detach().numpy(), rtol=1e-6, atol=1e-6
    )
    # actor-critic
    ac = ActorCritic(action_dim=3, hidden=(64, 64))
    ac_params = ac.init(jax.random.PRNGKey(1), x)
    tac = parity._TorchActorCritic(8, 3, (64, 64))
    tac.load_flax(ac_params)
    (logits,), value = ac.apply(ac_params, x)
    t_logits, t_value = tac(torch.from_numpy(x))
    np.testing.assert_allclose(t_logits.detach().numpy(), np.asarray(logits), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(t_value.detach().numpy(), np.asarray(value), rtol=1e-6, atol=1e-6)
    # world model
    wm_params = parity.init_world_model(obs_dim=8, action_dim=2, width=32, depth=2)
    wm = WorldModel(obs_dim=8, action_dim=2, width=32, depth=2)
    a = np.random.default_rng(1).uniform(-1, 1, size=(32, 2)).astype(np.float32)
    twm = parity._TorchWorldModel(8, 2, 32, 2)
    twm.load_flax(wm_params)
    for ours, theirs in zip(wm.apply(wm_params, x, a), twm(torch.from_numpy(x), torch.from_numpy(a))):
        np.testing.assert_allclose(theirs.detach().numpy(), np.asarray(ours), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"growth_interval": 7, "init_scale": 8.0},
        {"init_scale": float(np.finfo(np.float32).max) / 4, "growth_interval": 3},
    ],
    ids=["defaults", "small-interval", "near-float32-max"],
)
def test_scaler_identical_to_gradscaler_every_step(kwargs):
    flags = parity.overflow_sequence(10_000, seed=len(kwargs))
    assert (~flags).sum() > 50 and flags.sum() > 5000
    theirs = parity.torch_scaler_trajectory(flags, **kwargs)
    ours = parity.jax_scaler_trajectory(flags, **kwargs)
    np.testing.assert_array_equal(ours, theirs)


INJECT = (20, 21, 90, 150)


@pytest.fixture(scope="module")
def training_runs():
    x, y = parity.regression_data(200)
    params = MLP(features=(64, 64, 1)).init(jax.random.PRNGKey(0), x[0])
    runs = {}
    for precision in ("fp32", "fp16", "bf16"):
        runs[precision] = {
            "torch": parity.torch_amp_training(params, x, y, precision, INJECT),
            "optax": parity.jax_training(params, x, y, precision, INJECT),
            "torch-style": parity.jax_training(params, x, y, precision, INJECT, optimizer="torch-style"),
        }
    return runs


# Per-step loss (relative) and final-weight (absolute) tolerances, from measurements
# (fp32: 1.7e-5 / 1.4e-6 with optax.adam, 5e-7 / 1.8e-7 with torch-style Adam; fp16:
# 1.1e-3 / 8e-5; bf16: 6.3e-3 / 2e-3).
# fp32 with optax.adam: optax forms Adam's bias corrections from float32 betas, torch in
# float64 (see parity.torch_style_adam), a systematic 6e-6 per early step; with that
# removed the two agree to float32 rounding.
# fp16 / bf16: both sides round every matmul and activation to half precision, but at
# different places (XLA's CPU backend computes a fused half-precision op in float32 and
# rounds its result; PyTorch rounds after each op), so they differ by a few units of the
# half-precision epsilon (fp16 2^-11, bf16 2^-8) per step, compounded by 200 Adam steps.
TOLERANCES = {
    ("fp32", "torch-style"): (1e-5, 1e-6),
    ("fp32", "optax"): (3e-5, 5e-6),
    ("fp16", "optax"): (3e-3, 3e-4),
    ("fp16", "torch-style"): (3e-3, 3e-4),
    ("bf16", "optax"): (2e-2, 5e-3),
    ("bf16", "torch-style"): (2e-2, 5e-3),
}


@pytest.mark.parametrize("precision, optimizer", sorted(TOLERANCES))
def test_training_matches_torch_amp(training_runs, precision, optimizer):
    t_losses, t_skipped, t_params = training_runs[precision]["torch"]
    j_losses, j_skipped, j_params = training_runs[precision][optimizer]
    loss_rtol, param_atol = TOLERANCES[(precision, optimizer)]
    assert j_skipped == t_skipped
    assert set(INJECT) <= set(j_skipped)
    np.testing.assert_allclose(j_losses, t_losses, rtol=loss_rtol)
    abs_diff, _ = parity.max_diffs(j_params, t_params)
    assert abs_diff < param_atol
    assert j_losses[-1] < 0.5 * j_losses[0]  # it trained


def test_fp16_skips_include_real_overflows(training_runs):
    # Starting at 2^16 the first steps overflow float16 on both sides: the same extra steps.
    t_skipped = training_runs["fp16"]["torch"][1]
    assert len(t_skipped) > len(INJECT)
    assert training_runs["fp16"]["optax"][1] == t_skipped


def test_ppo_loss_and_grads_match_cleanrl_in_fp32():
    batch = parity.ppo_batch()
    params = ActorCritic(action_dim=2).init(jax.random.PRNGKey(3), jnp.zeros((1, 4)))
    t_loss, t_grads = parity.torch_ppo_loss_and_grads(params, batch)
    j_loss, j_grads = parity.jax_ppo_loss_and_grads(params, batch)
    np.testing.assert_allclose(j_loss, t_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-7), j_grads, t_grads)


def test_world_model_loss_and_grads_match_in_fp32():
    batch = parity.world_model_batch()
    params = parity.init_world_model(width=64, depth=2, seed=4)
    t_loss, t_grads = parity.torch_world_model_loss_and_grads(params, batch, 64, 2)
    j_loss, j_grads = parity.jax_world_model_loss_and_grads(params, batch, 64, 2)
    np.testing.assert_allclose(j_loss, t_loss, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, rtol=1e-4, atol=1e-6), j_grads, t_grads)
