"""gymnasium environments on the host, vectorised with `gymnasium.make_vec`."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from genesis_jax.envs.registry import EnvSpec


class ActionRepeat(gym.Wrapper):
    """Repeats each action `repeat` times, summing rewards, stopping at an episode's end."""

    def __init__(self, env, repeat: int):
        super().__init__(env)
        self.repeat = repeat

    def step(self, action):
        total = 0.0
        for _ in range(self.repeat):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def gymnasium_spec(env_id: str) -> EnvSpec:
    env = gym.make(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{env_id} has a {type(obs_space).__name__} observation space; only Box is supported")
    obs_dim = int(math.prod(obs_space.shape))
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(env_id, "gymnasium", obs_dim, int(act_space.n), False)
    if isinstance(act_space, gym.spaces.Box):
        low, high = act_space.low.reshape(-1), act_space.high.reshape(-1)
        return EnvSpec(env_id, "gymnasium", obs_dim, int(low.size), True, tuple(map(float, low)), tuple(map(float, high)))
    raise ValueError(f"{env_id} has a {type(act_space).__name__} action space; only Discrete and Box are supported")


class GymnasiumVecEnv:
    """`num_envs` gymnasium envs (sync: one process, async: one subprocess each).

    Autoreset is same-step, so `step` returns the next episode's first observation and,
    separately, the finished episode's last one (`final_obs`) for bootstrapping.
    """

    def __init__(self, env_id: str, num_envs: int, vectorization: str = "sync", action_repeat: int = 1):
        self.spec = gymnasium_spec(env_id)
        wrappers = [lambda env: ActionRepeat(env, action_repeat)] if action_repeat > 1 else None
        self.envs = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode=vectorization,
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
            wrappers=wrappers,
        )
        self.num_envs = num_envs

    def _flat(self, obs):
        return np.asarray(obs, np.float32).reshape(self.num_envs, -1)

    def reset(self, seed: int):
        obs, _ = self.envs.reset(seed=seed)
        return self._flat(obs)

    def step(self, action):
        action = np.asarray(action)
        if self.spec.continuous:
            action = np.clip(action, self.spec.action_low, self.spec.action_high).reshape(
                (self.num_envs, *self.envs.single_action_space.shape)
            )
        obs, reward, terminated, truncated, info = self.envs.step(action)
        obs = self._flat(obs)
        final_obs = obs.copy()
        if "_final_obs" in info:
            for i in np.flatnonzero(info["_final_obs"]):
                final_obs[i] = np.asarray(info["final_obs"][i], np.float32).reshape(-1)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        return obs, np.asarray(reward, np.float32), terminated, truncated, final_obs

    def close(self):
        self.envs.close()
