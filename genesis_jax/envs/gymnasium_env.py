"""gymnasium environments on the host, vectorised (gymnasium's Sync- or AsyncVectorEnv); Atari (ale-py)
games preprocessed as Stable-Baselines3 and CleanRL do; `io_callback_step` steps them from
inside a compiled (jit) loop."""

from __future__ import annotations

import functools
import math
import operator

import gymnasium as gym
import jax
import numpy as np
from jax.experimental import io_callback

from genesis_jax.envs.spec import EnvSpec


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


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for the learner; the game itself resets only when it is
    really over (SB3's `EpisodicLifeEnv`)."""

    lives, game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over, lives = terminated or truncated, self.env.unwrapped.ale.lives()
        terminated, self.lives = terminated or 0 < lives < self.lives, lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:  # a life was lost: carry on with a no-op step
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Presses FIRE after a reset, for games that wait for it (SB3's `FireResetEnv`)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def atari_preprocessing(env, frame_stack: int = 4):
    """No-op starts (up to 30), frame-skip 4 with max-pooling, 84x84 grayscale, episodic
    life, FIRE on reset, rewards clipped to [-1, 1], the last `frame_stack` frames stacked
    channels-last: uint8 observations of shape (84, 84, 4)."""
    env = EpisodicLife(gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84))
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    env = gym.wrappers.FrameStackObservation(gym.wrappers.ClipReward(env, -1.0, 1.0), frame_stack)
    space = env.observation_space
    channels_last = gym.spaces.Box(np.moveaxis(space.low, 0, -1), np.moveaxis(space.high, 0, -1), dtype=space.dtype)
    return gym.wrappers.TransformObservation(env, lambda obs: np.moveaxis(obs, 0, -1), channels_last)


def is_atari(env_id: str) -> bool:
    """Whether gymnasium's `env_id` is an Atari game (ale-py's: ALE/Pong-v5, PongNoFrameskip-v4, ...)."""
    return str(getattr(gym.envs.registry.get(env_id), "entry_point", "")).startswith("ale_py")


def make_env(env_id: str, action_repeat: int = 1, render_mode: str | None = None, episode_stats: bool = False):
    """One environment, as `GymnasiumVecEnv` makes each of its copies. Atari games start from
    the raw frames (frameskip 1, no sticky actions, as the NoFrameskip-v4 ids) and get
    `atari_preprocessing`, whose frame skip replaces `action_repeat`. `episode_stats`: a
    `RecordEpisodeStatistics` innermost, whose `info["episode"]` is the game's own return."""
    atari = is_atari(env_id)
    raw = {"frameskip": 1, "repeat_action_probability": 0.0} if atari else {}
    if render_mode is not None:  # gym.make passes even None on: an env without the argument would fail
        raw["render_mode"] = render_mode
    env = gym.make(env_id, **raw)
    if isinstance(space := env.action_space, gym.spaces.Discrete) and space.start != 0:
        # seen from 0, as the networks number their actions: action a is the environment's start + a (a
        # partial, not a lambda: the wrapper's spec records it, and a spec must pickle to reach a subprocess)
        shift = functools.partial(operator.add, space.start)
        env = gym.wrappers.TransformAction(env, shift, gym.spaces.Discrete(space.n))
    env = gym.wrappers.RecordEpisodeStatistics(env) if episode_stats else env
    if atari:
        return atari_preprocessing(env)
    return ActionRepeat(env, action_repeat) if action_repeat > 1 else env


def gymnasium_spec(env_id: str) -> EnvSpec:
    env = make_env(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(obs_space, gym.spaces.Box):
        raise ValueError(f"{env_id} has a {type(obs_space).__name__} observation space; only Box is supported")
    shape, pixels = tuple(obs_space.shape) or (1,), obs_space.dtype == np.uint8
    # Images stay images: uint8 pixels, or floats (kept float32: as uint8 they would be quantised, 0.5 read as 0).
    image = len(shape) == 3 and (pixels or np.issubdtype(obs_space.dtype, np.floating))
    shape = shape if image else (math.prod(shape),)
    if image and shape[0] <= 4 < min(shape[1:]):  # (4, 84, 84) read as 4 rows of 84 channels: silently
        low, high = (float(obs_space.low.min()), float(obs_space.high.max())) if not pixels else (0, 255)
        bounds = ", ".join(f"{b}" if np.isfinite(b) else f"{'-' * (b < 0)}np.inf" for b in (low, high))  # Python
        raise ValueError(
            f"{env_id}'s image observations {shape} look channels-first; the networks read (height, width, channels): "
            "move the channels last: gymnasium.wrappers.TransformObservation(env, lambda obs: np.moveaxis(obs, 0, -1), "
            f"gymnasium.spaces.Box({bounds}, {(*shape[1:], shape[0])}, np.{obs_space.dtype.name}))"
        )
    obs = dict(obs_dtype="uint8" if image and pixels else "float32")
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(env_id, "gymnasium", shape, int(act_space.n), False, **obs)
    if isinstance(act_space, gym.spaces.Box):
        low, high = (tuple(map(float, bound.reshape(-1))) for bound in (act_space.low, act_space.high))
        return EnvSpec(env_id, "gymnasium", shape, len(low), True, low, high, **obs)
    raise ValueError(f"{env_id} has a {type(act_space).__name__} action space; only Discrete and Box are supported")


def in_action_space(action, spec: EnvSpec, space, shape) -> np.ndarray:
    """Continuous `action` clipped to the bounds, as `shape` in `space`'s own dtype: the clip
    made float64, which `space.contains` refuses; an integer Box's rounded (3.99 is 4, not 3)."""
    clipped = np.clip(action, spec.action_low, spec.action_high)
    clipped = np.rint(clipped) if np.issubdtype(space.dtype, np.integer) else clipped
    return clipped.reshape(shape).astype(space.dtype)


def observation_dtype(spec: EnvSpec):
    """The dtype of `GymnasiumVecEnv`'s observations for `spec`: uint8 for pixel frames (Atari's
    (84, 84, 4)), float32 for everything else (float images included)."""
    return np.dtype(spec.obs_dtype)


class GymnasiumVecEnv:
    """`num_envs` gymnasium envs (sync: one process, async: one subprocess each).

    Autoreset is same-step, so `step` returns the next episode's first observation and,
    separately, the finished episode's last one (`final_obs`) for bootstrapping.
    Observations are [num_envs, *spec.obs_shape]: uint8 images stay uint8 (a quarter of
    the bytes to move), everything else is float32 (float images too).
    """

    def __init__(self, env_id: str, num_envs: int, vectorization: str = "sync", action_repeat: int = 1):
        self.spec, self.num_envs = gymnasium_spec(env_id), num_envs
        vector = gym.vector.SyncVectorEnv if vectorization == "sync" else gym.vector.AsyncVectorEnv
        copies = [functools.partial(make_env, env_id, action_repeat)] * num_envs
        self.envs = vector(copies, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.obs_dtype = observation_dtype(self.spec)

    def _shaped(self, obs):
        return np.asarray(obs, self.obs_dtype).reshape((-1, *self.spec.obs_shape))

    def reset(self, seed: int):
        return self._shaped(self.envs.reset(seed=seed)[0])

    def step(self, action):
        action = np.asarray(action)
        if self.spec.continuous:
            space = self.envs.single_action_space
            action = in_action_space(action, self.spec, space, (self.num_envs, *space.shape))
        obs, reward, terminated, truncated, info = self.envs.step(action)
        obs = self._shaped(obs)
        final_obs = obs.copy()
        for i in np.flatnonzero(info.get("_final_obs", [])):  # the finished episodes' last observations
            final_obs[i] = self._shaped(info["final_obs"][i])[0]
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool) & ~terminated
        return obs, np.asarray(reward, np.float32), terminated, truncated, final_obs

    def close(self):
        self.envs.close()


def io_callback_step(env: GymnasiumVecEnv):
    """`env.step` in `GymnaxVecEnv.step`'s form, `(keys, env_state, action) -> (obs, env_state,
    reward, terminated, truncated, final_obs)`, for a compiled loop: each call runs the host
    environments through `jax.experimental.io_callback(ordered=True)`, so steps happen once each
    and in order. `keys` are unused and `env_state` passes through unchanged (the host holds the
    state: it is not part of a checkpoint). Observations come back in `env.obs_dtype`.

    >>> import jax.numpy as jnp
    >>> env = GymnasiumVecEnv("CartPole-v1", num_envs=2)
    >>> obs = env.reset(seed=0)
    >>> obs, _, reward, terminated, truncated, final_obs = jax.jit(io_callback_step(env))(None, (), jnp.zeros(2, int))
    >>> obs.shape, obs.dtype, reward.tolist()
    ((2, 4), dtype('float32'), [1.0, 1.0])
    >>> env.close()
    """
    n, shape = env.num_envs, env.spec.obs_shape
    obs, flags = jax.ShapeDtypeStruct((n, *shape), env.obs_dtype), jax.ShapeDtypeStruct((n,), bool)
    shapes = (obs, jax.ShapeDtypeStruct((n,), np.float32), flags, flags, obs)

    def step(keys, env_state, action):  # `env.step` returns arrays of exactly these dtypes
        obs, reward, terminated, truncated, final_obs = io_callback(env.step, shapes, action, ordered=True)
        return obs, env_state, reward, terminated, truncated, final_obs

    return step
