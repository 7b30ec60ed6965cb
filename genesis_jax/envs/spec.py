"""An environment's spaces: what every backend reports and the networks are built from."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Spaces of an environment: observations of shape `obs_shape` (a vector's, or an image's
    (height, width, channels)), `action_dim` actions (discrete) or action dimensions
    (continuous, within `action_low` and `action_high`). Observations arrive as `obs_dtype`:
    uint8 for pixel frames (kept a byte each: the CNN scales them), float32 otherwise."""

    env_id: str
    backend: str
    obs_shape: tuple[int, ...]
    action_dim: int
    continuous: bool
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    max_episode_steps: int | None = None  # the time limit, where known: bounds truncations
    obs_dtype: str = "float32"

    @property
    def bounded_actions(self) -> bool:
        """Whether continuous actions have finite bounds (what squashing into them or drawing
        uniformly within them needs: tanh or a uniform draw times an infinite width is NaN)."""
        return all(math.isfinite(b) for b in (*(self.action_low or ()), *(self.action_high or ())))
