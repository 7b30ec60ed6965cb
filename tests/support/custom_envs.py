"""A user's own gymnasium environments, registered as this module is imported (so
`tests.support.custom_envs:Probe-v0` names one from the command line): `Probe` has the spaces
it is given and records the actions it is sent, as a strict environment refuses any outside its
action space."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Probe(gym.Env):
    """Episodes of `length` steps of observations filled with `value` (0) and reward 1; no
    `render_mode` argument, as a minimal environment of one's own has none."""

    def __init__(self, observation_space=None, action_space=None, length: int = 5, value: float = 0.0):
        self.observation_space = observation_space or gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = action_space or gym.spaces.Discrete(2)
        self.length, self.t, self.actions, self.value = length, 0, [], value

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full(self.observation_space.shape, self.value, self.observation_space.dtype), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        self.actions.append(action)
        self.t += 1
        obs = np.full(self.observation_space.shape, self.value, self.observation_space.dtype)
        return obs, 1.0, self.t >= self.length, False, {}


IDS = {
    "Probe-v0": {},
    "ProbeFromOne-v0": {"action_space": gym.spaces.Discrete(3, start=1)},
    "ProbeBox-v0": {"action_space": gym.spaces.Box(-2.0, 2.0, (2,), np.float32)},  # contains() refuses float64
    "ProbeIntBox-v0": {"action_space": gym.spaces.Box(0, 4, (2,), np.int64)},
    "ProbeUnbounded-v0": {"action_space": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)},
    "ProbeEndless-v0": {"length": 2**62},  # no time limit either
    "ProbeChannelsFirst-v0": {"observation_space": gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)},  # FrameStack's
    "ProbeSmallImage-v0": {"observation_space": gym.spaces.Box(0, 255, (3, 3, 5), np.uint8)},  # 3 x 3, 5 channels
    # float images, each pixel 0.5: what a uint8 frame would read as 0
    "ProbeFloatImage-v0": {"observation_space": gym.spaces.Box(0.0, 1.0, (10, 10, 3), np.float32), "value": 0.5},
    "ProbeFloat64Image-v0": {"observation_space": gym.spaces.Box(0.0, 1.0, (10, 10, 3), np.float64), "value": 0.5},
    "ProbeFloatChannelsFirst-v0": {"observation_space": gym.spaces.Box(0.0, 1.0, (3, 84, 84), np.float32)},
}
for env_id, kwargs in IDS.items():
    if env_id not in gym.envs.registry:
        gym.register(env_id, entry_point=Probe, kwargs=kwargs)
