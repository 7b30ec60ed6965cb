"""An environment's spaces: what every backend reports and the networks are built from."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Spaces of an environment. Observations have shape `obs_shape` (default: a vector of
    `obs_dim`); images are (height, width, channels)."""

    env_id: str
    backend: str
    obs_dim: int
    action_dim: int  # number of actions (discrete) or action dimensions (continuous)
    continuous: bool
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    max_episode_steps: int | None = None  # the time limit, where known: bounds truncations
    obs_shape: tuple[int, ...] | None = None  # None: (obs_dim,)

    def __post_init__(self):
        if self.obs_shape is None:
            object.__setattr__(self, "obs_shape", (self.obs_dim,))
