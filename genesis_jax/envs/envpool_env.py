"""Atari through EnvPool (C++ threads), behind `GymnasiumVecEnv`'s interface: an optional,
faster host backend (`pip install -e ".[envpool]"`, `--env-backend envpool`)."""

from __future__ import annotations

import numpy as np

from genesis_jax.envs.spec import EnvSpec

# EnvPool's Atari preprocessing, set to the gymnasium path's (SB3 / CleanRL): no sticky
# actions, 30 no-op starts, frame-skip 4, 84x84 grayscale, 4 stacked frames, episodic life,
# FIRE on reset, clipped rewards.
ATARI_OPTIONS = dict(episodic_life=True, reward_clip=True, repeat_action_probability=0.0, noop_max=30, frame_skip=4)
ATARI_OPTIONS |= dict(img_height=84, img_width=84, stack_num=4, gray_scale=True, use_fire_reset=True)


def task_id(env_id: str) -> str:
    """EnvPool's name for an Atari id: `ALE/Breakout-v5` and `Breakout-v5` are `Breakout-v5`."""
    return env_id.removeprefix("ALE/")


def envpool_spec(env_id: str) -> EnvSpec:
    """`env_id`'s spaces (envpool is installed: `registry.require_packages` has checked)."""
    import envpool

    name = task_id(env_id)
    if name not in envpool.list_all_envs() or not name.endswith("-v5"):
        raise ValueError(f"envpool has no Atari game {env_id!r} (the backend takes ALE/<Game>-v5 ids)")
    spec = envpool.make_spec(name, **ATARI_OPTIONS)
    stack, height, width = spec.observation_space.shape
    return EnvSpec(env_id, "envpool", (height, width, stack), int(spec.action_space.n), False, obs_dtype="uint8")


def _channels_last(obs):
    return np.moveaxis(np.asarray(obs, np.uint8), 1, -1)


class EnvPoolVecEnv:
    """`num_envs` Atari games in EnvPool's threads, with `GymnasiumVecEnv`'s same-step
    autoreset: EnvPool resets a finished env on its next step (ignoring that step's action),
    so `step` takes that reset step at once for the finished envs alone, and returns their
    new episodes' first observations beside the finished ones' last (`final_obs`).
    Observations are uint8 [num_envs, 84, 84, 4] (EnvPool stacks frames first; moved last)."""

    def __init__(self, env_id: str, num_envs: int, seed: int = 0):
        import envpool

        self.spec, self.num_envs, self.obs_dtype = envpool_spec(env_id), num_envs, np.uint8
        self.envs = envpool.make(task_id(env_id), env_type="gymnasium", num_envs=num_envs, seed=seed, **ATARI_OPTIONS)

    def reset(self, seed: int):
        return _channels_last(self.envs.reset()[0])  # seeded at construction, as EnvPool is

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.envs.step(np.asarray(action, np.int32))
        obs = _channels_last(obs)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        final_obs = obs.copy()
        finished = np.flatnonzero(terminated | truncated)
        if finished.size:
            first_obs, _, _, _, info = self.envs.step(np.zeros(finished.size, np.int32), finished)
            obs[np.asarray(info["env_id"])] = _channels_last(first_obs)
        return obs, np.asarray(reward, np.float32), terminated, truncated, final_obs

    def close(self):
        self.envs.close()
