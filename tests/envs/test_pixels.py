"""Pixel environments: CNN PPO learns MinAtar Breakout (gymnax, whole loop under jit), and
Atari runs through gymnasium + ale-py with SB3 / CleanRL preprocessing."""

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.ppo import PPOConfig, train


def random_policy_return(env_id: str, num_envs: int = 64, steps: int = 2000) -> float:
    """Mean return of finished episodes under uniformly random actions, straight from gymnax."""
    env, params = gymnax.make(env_id)
    n = env.action_space(params).n
    reset = jax.vmap(env.reset, in_axes=(0, None))
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def one(carry, key):
        state, ret = carry
        k_act, k_env = jax.random.split(key)
        action = jax.random.randint(k_act, (num_envs,), 0, n)
        _, state, reward, terminated, truncated, _ = step(jax.random.split(k_env, num_envs), state, action, params)
        done = jnp.logical_or(terminated, truncated)
        ret = ret + reward
        return (state, jnp.where(done, 0.0, ret)), (jnp.where(done, ret, 0.0), done)

    _, state = reset(jax.random.split(jax.random.PRNGKey(0), num_envs), params)
    _, (returns, done) = jax.jit(
        lambda s: jax.lax.scan(one, (s, jnp.zeros(num_envs)), jax.random.split(jax.random.PRNGKey(1), steps))
    )(state)
    return float(returns.sum() / done.sum())


@pytest.mark.slow  # learns Breakout: 120 s
@pytest.mark.long  # a learning run (benchmarks/minatar-cnn-cpu)
@pytest.mark.run_bound
def test_cnn_ppo_on_minatar_breakout_beats_a_random_policy_in_fp16():
    random_return = random_policy_return("Breakout-MinAtar")
    config = PPOConfig(
        env="Breakout-MinAtar",
        precision="fp16",
        num_envs=64,
        num_minibatches=8,
        lr=5e-4,
        total_steps=64 * 128 * 12,
        seed=0,
    )
    result = train(config, progress=False)
    assert result.summary["train_step_bytes"] > 0
    # One 3x3 convolution over the 10x10x4 frames: the CNN was chosen from the observation shape.
    assert result.train_state.params["params"]["torso"]["conv_0"]["kernel"].shape == (3, 3, 4, 16)
    last = [r["episode_return"] for r in result.metrics[-3:]]
    assert np.mean(last) > 2 * random_return, (last, random_return)


ale_py = pytest.importorskip("ale_py", reason="Atari needs ale-py (pip install -e '.[atari]')")


def test_atari_preprocessing_matches_sb3():
    from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv, make_env

    env = make_env("ALE/Breakout-v5")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    lives_lost, rewards = 0, set()
    for _ in range(2000):  # random play until a life is lost with the game still on
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        rewards.add(float(reward))
        if terminated:
            lives_lost += 1
            if env.unwrapped.ale.lives() > 0:
                break
            env.reset()
    assert lives_lost >= 1 and env.unwrapped.ale.lives() > 0  # episodic life: a lost life ends the episode
    lives = env.unwrapped.ale.lives()
    env.reset()  # ... but not the game
    assert env.unwrapped.ale.lives() == lives
    assert rewards <= {-1.0, 0.0, 1.0}
    env.close()

    vec = GymnasiumVecEnv("ALE/Breakout-v5", 2)
    assert vec.spec.obs_shape == (84, 84, 4) and vec.spec.action_dim == 4
    obs = vec.reset(seed=0)
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    vec.close()


@pytest.mark.slow  # Atari PPO updates: 100 s
@pytest.mark.run_bound  # 84x84x4 frames through the Nature CNN
def test_atari_ppo_runs_a_few_updates_with_the_nature_cnn():
    config = PPOConfig(
        env="ALE/Breakout-v5",
        precision="fp16",
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        total_steps=2 * 32 * 3,
        seed=0,
    )
    result = train(config, progress=False)
    assert result.summary["env_backend"] == "gymnasium" and result.summary["iterations"] == 3
    assert result.summary["total_updates"] == 3 * config.update_epochs * config.num_minibatches
    assert np.isfinite(result.summary["mismatch_kl_v2"])
    torso = result.train_state.params["params"]["torso"]
    assert torso["conv_0"]["kernel"].shape == (8, 8, 4, 32) and torso["dense"]["kernel"].shape == (7 * 7 * 64, 512)


def test_envpool_backend_gives_the_gymnasium_paths_spaces_with_same_step_autoreset():
    """Runs where EnvPool is installed (`.[envpool]`, about 750 MB with its assets)."""
    pytest.importorskip("envpool", reason="the EnvPool backend needs pip install -e '.[envpool]'")
    from genesis_jax.envs.envpool_env import EnvPoolVecEnv
    from genesis_jax.envs.gymnasium_env import gymnasium_spec

    env = EnvPoolVecEnv("ALE/Breakout-v5", 3, seed=0)
    ours = gymnasium_spec("ALE/Breakout-v5")
    assert (env.spec.obs_shape, env.spec.action_dim) == (ours.obs_shape, ours.action_dim) == ((84, 84, 4), 4)
    obs = env.reset(seed=0)
    assert obs.shape == (3, 84, 84, 4) and obs.dtype == np.uint8
    rng = np.random.default_rng(0)
    for _ in range(500):
        obs, reward, terminated, truncated, final_obs = env.step(rng.integers(0, 4, 3))
        assert set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        done = terminated | truncated
        if done.any():
            break
    assert done.any()  # a life lost within 500 random steps
    # The finished env already shows its next episode: a fresh stack, unlike its last frames.
    i = int(np.flatnonzero(done)[0])
    assert not np.array_equal(obs[i], final_obs[i])
    assert np.array_equal(obs[~done], final_obs[~done])
    env.close()

    config = PPOConfig(
        env="ALE/Breakout-v5",
        env_backend="envpool",
        precision="fp16",
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        total_steps=2 * 32 * 2,
        seed=0,
    )
    result = train(config, progress=False)
    assert result.summary["env_backend"] == "envpool" and result.summary["iterations"] == 2
