"""PQN as an algorithm: its Q(lambda) returns and the update's targets against an independent
numpy reference (the forward view, written as plain loops: n-step returns weighted by lambda),
with episode ends, time limits and the rollout's end; its loss; its Q-network (nets.QNetwork
with LayerNorm) against the one PQN had in its own module, so its checkpoints still load; and a
tiny run's schedule, counts and greedy evaluation."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.pqn import PQN, PQNConfig, train
from genesis_jax.algos.pqn.train import lambda_returns
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.q_network import QNetwork
from genesis_jax.nets.torsos import make_torso

TINY = dict(total_steps=512, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=2, hidden=(16,))


def reference_lambda_returns(reward, terminated, truncated, next_q, gamma, lam):
    """The forward view, step by step: G_t = (1 - lam) sum_{n<N} lam^(n-1) G_t^(n) + lam^(N-1) G_t^(N),
    the n-step returns G_t^(n) = r_t + ... + gamma^(n-1) r_(t+n-1) + gamma^n next_q_(t+n-1), cut
    where the episode ends: after a termination no bootstrap, at a time limit or at the rollout's
    last step the bootstrap from that step's next_q (N: the steps to that end)."""
    steps, envs = reward.shape
    out = np.zeros((steps, envs))
    for n_env in range(envs):
        for t in range(steps):
            n_step, rewards, horizon = [], 0.0, 0
            for k in range(t, steps):
                rewards += gamma ** (k - t) * reward[k, n_env]
                horizon += 1
                if terminated[k, n_env]:
                    n_step.append(rewards)  # no bootstrap: the episode ended
                    break
                n_step.append(rewards + gamma ** (k - t + 1) * next_q[k, n_env])
                if truncated[k, n_env]:
                    break
            total = sum((1 - lam) * lam ** (n - 1) * g for n, g in enumerate(n_step[:-1], start=1))
            out[t, n_env] = total + lam ** (horizon - 1) * n_step[-1]
    return out


def rollout(seed: int, steps: int = 12, envs: int = 5):
    rng = np.random.default_rng(seed)
    reward = rng.normal(size=(steps, envs)).astype(np.float32)
    next_q = rng.normal(size=(steps, envs)).astype(np.float32) * 5
    terminated = rng.random((steps, envs)) < 0.15
    truncated = rng.random((steps, envs)) < 0.1
    terminated[3, 0], truncated[3, 0] = True, True  # both at once: a termination
    terminated[-1, 1] = True  # an episode that ends on the rollout's last step
    truncated[-1, 2], terminated[-1, 2] = True, False
    terminated[:, 3], truncated[:, 3] = False, False  # one long episode, cut only by the rollout
    return reward, terminated, truncated, next_q


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("gamma", [0.0, 0.9, 0.99])
def test_lambda_returns_match_the_forward_view(lam, gamma):
    reward, terminated, truncated, next_q = rollout(seed=int(lam * 100 + gamma * 10))
    got = lambda_returns(jnp.asarray(reward), jnp.asarray(terminated), jnp.asarray(truncated), next_q, gamma, lam)
    assert got.dtype == jnp.float32 and got.shape == reward.shape
    expected = reference_lambda_returns(reward, terminated, truncated, next_q, gamma, lam)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_lambda_zero_is_one_step_td_and_lambda_one_the_return_to_each_end():
    reward, terminated, truncated, next_q = rollout(seed=7)
    args = jnp.asarray(reward), jnp.asarray(terminated), jnp.asarray(truncated), next_q
    one_step = reward + 0.9 * (1.0 - terminated) * next_q
    np.testing.assert_allclose(lambda_returns(*args, 0.9, 0.0), one_step, rtol=1e-5, atol=1e-6)
    # lambda 1 along the episode without an end: the discounted rewards, then next_q at the rollout's end.
    env = 3
    expected = [
        sum(0.9 ** (k - t) * reward[k, env] for k in range(t, 12)) + 0.9 ** (12 - t) * next_q[-1, env]
        for t in range(12)
    ]
    np.testing.assert_allclose(lambda_returns(*args, 0.9, 1.0)[:, env], expected, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_pqn():
    algo = PQN(PQNConfig(**TINY, gamma=0.9, gae_lambda=0.7, reward_scale=0.5))
    return algo, algo.init(jax.random.PRNGKey(0))


def test_the_updates_targets_scale_rewards_and_bootstrap_from_the_next_observations_max_q(tiny_pqn):
    algo, state = tiny_pqn
    rng = np.random.default_rng(1)
    steps, envs = 6, 4
    final_obs = rng.normal(size=(steps, envs, 4)).astype(np.float32)
    reward = rng.normal(size=(steps, envs)).astype(np.float32)
    terminated, truncated = rng.random((steps, envs)) < 0.2, rng.random((steps, envs)) < 0.2
    params = state.train_state.params
    got = jax.jit(algo.targets)(params, reward, terminated, truncated, final_obs)
    next_q = np.stack([np.asarray(algo.net.apply(params, o)).max(-1) for o in final_obs])
    expected = reference_lambda_returns(0.5 * reward, terminated, truncated, next_q, 0.9, 0.7)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_the_loss_is_half_the_mean_squared_error_of_the_taken_actions(tiny_pqn):
    algo, state = tiny_pqn
    rng = np.random.default_rng(2)
    obs, action = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 2, 8)
    target = rng.normal(size=8).astype(np.float32)
    params = state.train_state.params
    loss, mean_q = algo.loss_fn(params, (obs, action, target))
    q = np.asarray(algo.net.apply(params, obs))[np.arange(8), action]
    np.testing.assert_allclose(loss, 0.5 * np.mean((q - target) ** 2), rtol=1e-5)
    np.testing.assert_allclose(mean_q, q.mean(), rtol=1e-5)


class FormerPQNQNetwork(nn.Module):
    """PQN's own Q-network before it used nets.QNetwork (0.3), kept as the reference its
    checkpoints were written with (the precision rules aside: compared in float32)."""

    action_dim: int
    obs_shape: Sequence[int]
    network: str = "mlp"
    hidden: Sequence[int] = (256, 256)

    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32) if obs.dtype == jnp.bool_ else obs
        widths = self.hidden
        if self.network == "mlp":
            x = x.reshape(x.shape[0], -1).astype(jnp.float32)
        else:
            torso = make_torso(self.network, self.obs_shape)
            x, widths = torso(x if len(self.obs_shape) == 3 else x.reshape(x.shape[0], -1)), self.hidden[-1:]
        for i, width in enumerate(widths):
            x = Dense(width, name=f"dense_{i}")(x)
            x = nn.relu(nn.LayerNorm(name=f"norm_{i}")(x))
        return Dense(self.action_dim, name="q_head")(x).astype(jnp.float32)


@pytest.mark.parametrize("network, obs_shape", [("mlp", (4,)), ("cnn", (10, 10, 4))])
def test_pqns_q_network_keeps_the_parameters_and_outputs_its_checkpoints_hold(network, obs_shape):
    former = FormerPQNQNetwork(3, obs_shape, network, (32, 16))
    current = QNetwork(3, obs_shape, network, (32, 16), layer_norm=True)
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, *obs_shape))
    params = former.init(jax.random.PRNGKey(0), obs)
    new_params = current.init(jax.random.PRNGKey(0), obs)
    shapes = lambda tree: jax.tree_util.tree_map_with_path(lambda p, x: (jax.tree_util.keystr(p), x.shape), tree)  # noqa: E731
    assert shapes(new_params) == shapes(params)
    np.testing.assert_allclose(current.apply(params, obs), former.apply(params, obs), rtol=1e-6, atol=1e-6)


@pytest.mark.slow  # a tiny run compiles the whole loop and the greedy evaluation: ~10 s on 2 cores
def test_a_tiny_run_counts_its_steps_follows_the_schedule_and_evaluates_greedily():
    config = PQNConfig(**TINY)
    result = train(config, progress=False)
    rows, state = result.metrics, result.state
    assert len(rows) == config.num_updates == 8 and int(state.steps) == 8 * config.batch_size
    # 20% of 512 steps: epsilon reaches its end within the second update (64 steps each).
    expected = [1.0 + min(r["step"] / (0.2 * 512), 1.0) * (0.2 - 1.0) for r in rows]
    np.testing.assert_allclose([r["epsilon"] for r in rows], expected, rtol=1e-6)
    assert rows[-1]["epsilon"] == pytest.approx(config.epsilon_end)
    summary = result.summary
    assert len(summary["eval_return_per_seed"]) == 1 and 1 <= summary["eval_return"] <= 500
    assert int(state.train_state.step) == 8 * config.update_epochs * config.num_minibatches


@pytest.mark.slow  # two tiny runs: ~15 s on 2 cores
def test_a_rows_loss_and_q_are_the_means_of_the_steps_applied_as_ppos_and_dqns_are():
    # A row of skipped steps reported their loss (0.916) as PQN's, and their Q; PPO's loss and DQN's Q are null there.
    faults = dict(TINY, inject_nonfinite=1.0, max_consecutive_skips=None, guard_min_scale=None)
    rows = train(PQNConfig(**faults), progress=False).metrics
    steps = TINY["update_epochs"] * TINY["num_minibatches"]  # a row's optimizer steps
    assert all(r["skipped"] == steps for r in rows) and all(r["loss"] is None and r["q"] is None for r in rows)
    clean = train(PQNConfig(**TINY), progress=False).metrics
    assert all(r["skipped"] == 0 and np.isfinite(r["loss"]) and np.isfinite(r["q"]) for r in clean)


def test_the_first_spellings_still_work_for_a_release_and_resume_their_runs():
    from genesis_jax.algos.pqn import PQNConfig

    with pytest.warns(FutureWarning, match="num-epochs is deprecated"):
        config = PQNConfig(num_epochs=2, lam=0.5)
    assert (config.update_epochs, config.gae_lambda, config.num_epochs, config.lam) == (2, 0.5, None, None)
    config.check_resume({"num_epochs": 2, "lam": 0.5})  # a run recorded under the old names, same values
    with pytest.raises(ValueError, match="resume with --gae-lambda 0.65"):
        PQNConfig().check_resume({"num_epochs": 4, "lam": 0.65})


def test_a_first_spelling_given_with_todays_is_refused_not_one_dropped():
    # --gae-lambda 0.9 --lam 0.65 ran at 0.65, the 0.9 gone without a word
    from genesis_jax.algos.dqn import DQNConfig
    from genesis_jax.algos.pqn import PQNConfig

    with pytest.raises(ValueError, match=r"lam 0.65 and gae-lambda 0.9 \(given, or a preset's\) both set gae-lambda"):
        PQNConfig(lam=0.65, gae_lambda=0.9)
    with pytest.raises(ValueError, match="give steps-per-row alone"):
        DQNConfig(row_steps=1000, steps_per_row=2000)
    with pytest.warns(FutureWarning, match="lam is deprecated"):  # the same value twice, or today's at its default
        assert PQNConfig(lam=0.65, gae_lambda=0.65).gae_lambda == 0.65
