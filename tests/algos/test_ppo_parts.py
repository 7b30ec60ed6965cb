"""GAE, the PPO loss and the mismatch metrics against direct numpy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.ppo.loss import Minibatch, bootstrap_truncated, compute_gae, mismatch_metrics, ppo_loss
from genesis_jax.nets import distributions


def test_gae_hand_computed_with_termination_and_truncation():
    # One env, 4 steps. Step 1 terminates (no bootstrap); step 2 is truncated, so its reward
    # absorbs gamma * V(final_obs) = 0.5 * 10, and the trace is cut after it.
    gamma, lam = 0.5, 0.5
    rewards = jnp.array([[1.0], [2.0], [3.0], [4.0]])
    values = jnp.array([[0.5], [1.0], [2.0], [1.5]])
    terminated = jnp.array([[False], [True], [False], [False]])
    truncated = jnp.array([[False], [False], [True], [False]])
    final_values = jnp.array([[99.0], [99.0], [10.0], [99.0]])
    last_value = jnp.array([3.0])
    r = bootstrap_truncated(rewards, truncated, terminated, final_values, gamma)
    np.testing.assert_allclose(r[:, 0], [1.0, 2.0, 8.0, 4.0])
    adv, ret = compute_gae(r, values, terminated | truncated, last_value, gamma, lam)
    # By hand, backwards:
    # t=3: delta = 4 + 0.5*3 - 1.5 = 4.0 ; A3 = 4.0
    # t=2: done -> delta = 8 - 2 = 6.0 ; A2 = 6.0
    # t=1: done -> delta = 2 - 1 = 1.0 ; A1 = 1.0
    # t=0: delta = 1 + 0.5*1.0 - 0.5 = 1.0 ; A0 = 1.0 + 0.25*1.0 = 1.25
    np.testing.assert_allclose(adv[:, 0], [1.25, 1.0, 6.0, 4.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [1.75, 2.0, 8.0, 5.5], rtol=1e-6)


def numpy_ppo_loss(logits, values, action, old_logp, old_value, adv, target, clip, vf, ent):
    logp_all = logits - logits.max(-1, keepdims=True)
    logp_all = logp_all - np.log(np.exp(logp_all).sum(-1, keepdims=True))
    logp = logp_all[np.arange(len(action)), action]
    ratio = np.exp(logp - old_logp)
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - clip, 1 + clip)).mean()
    vclip = old_value + np.clip(values - old_value, -clip, clip)
    vl = 0.5 * np.maximum((values - target) ** 2, (vclip - target) ** 2).mean()
    entropy = -(np.exp(logp_all) * logp_all).sum(-1).mean()
    return pg + vf * vl - ent * entropy


def test_ppo_loss_against_numpy():
    rng = np.random.default_rng(0)
    n, k = 64, 3
    logits = rng.normal(size=(n, k)).astype(np.float64)
    values = rng.normal(size=n)
    batch = {
        "obs": np.zeros((n, 1)),  # unused by the loss: the network already saw it
        "action": rng.integers(0, k, n),
        "log_prob": np.log(rng.uniform(0.2, 0.6, n)),
        "value": values + rng.normal(scale=0.5, size=n),
        "advantage": rng.normal(size=n),
        "target": rng.normal(size=n),
    }
    expected = numpy_ppo_loss(
        logits,
        values,
        batch["action"],
        batch["log_prob"],
        batch["value"],
        batch["advantage"],
        batch["target"],
        0.2,
        0.5,
        0.01,
    )
    got, aux = ppo_loss(
        (jnp.asarray(logits, jnp.float32),),
        jnp.asarray(values, jnp.float32),
        Minibatch(**{k: jnp.asarray(x, jnp.float32 if x.dtype.kind == "f" else jnp.int32) for k, x in batch.items()}),
        0.2,
        0.5,
        0.01,
    )
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    assert 0.0 <= float(aux["clip_fraction"]) <= 1.0


def test_gaussian_log_prob_and_entropy():
    mean = jnp.array([[0.5, -1.0]])
    log_std = jnp.array([[0.1, -0.3]])
    a = jnp.array([[0.0, 0.2]])
    std = np.exp(np.array([0.1, -0.3]))
    ref = np.sum(
        -0.5 * ((np.array([0.0, 0.2]) - np.array([0.5, -1.0])) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    )
    np.testing.assert_allclose(float(distributions.log_prob((mean, log_std), a)[0]), ref, rtol=1e-6)
    np.testing.assert_allclose(
        float(distributions.entropy((mean, log_std))[0]), np.sum(np.log(std) + 0.5 * (1 + np.log(2 * np.pi))), rtol=1e-6
    )


def test_mismatch_metrics_definitions():
    log_mu = jnp.log(jnp.array([0.5, 0.25]))
    log_pi = jnp.log(jnp.array([0.25, 0.25]))
    m = mismatch_metrics(log_mu, log_pi)
    np.testing.assert_allclose(float(m["mismatch_kl_v1"]), np.log(2) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(m["mismatch_kl_v2"]), 0.5 * np.log(2) ** 2 / 2, rtol=1e-6)
    np.testing.assert_allclose(float(m["mismatch_max_dp"]), 0.25, rtol=1e-6)
    np.testing.assert_allclose(float(m["mismatch_ratio_dev"]), 0.25, rtol=1e-6)


@pytest.mark.parametrize("bound", [None, 3, 8, 2])
def test_truncation_values_only_where_truncated_with_or_without_a_bound(bound):
    from genesis_jax.algos.ppo.loss import truncation_values

    final_obs = jax.random.normal(jax.random.PRNGKey(0), (16, 4, 3))
    truncated = jnp.zeros((16, 4), bool).at[(2, 9, 15), (0, 3, 1)].set(True)
    value_fn = lambda obs: 0.5 * obs.sum(-1)  # noqa: E731
    expected = np.where(np.asarray(truncated), 0.5 * np.asarray(final_obs).sum(-1), 0.0)
    # bound 2 < 3 truncations: the whole-rollout fallback must give the same values
    got = jax.jit(lambda t, o: truncation_values(t, o, value_fn, bound))(truncated, final_obs)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-7)
