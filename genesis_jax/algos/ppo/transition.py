"""The typed pytrees a PPO update passes along, in place of string-keyed dicts.

`Transition` is what a rollout records per step ([T, N, ...] once scanned or stacked; the
update takes it with truncated episodes' rewards bootstrapped), and `Minibatch` what the
loss sees (flattened over time and environments, with advantages and value targets). Both
are `flax.struct` dataclasses: they pass through `jit`, `scan` and `jax.tree.map` as their
arrays.
"""

from __future__ import annotations

from typing import Any

from flax import struct

Array = Any


@struct.dataclass
class Transition:
    obs: Array
    action: Array
    log_prob: Array  # the rollout policy's ("mu") log-probability of the action
    value: Array
    reward: Array
    terminated: Array
    truncated: Array
    final_obs: Array  # the observation before an automatic reset (for truncation bootstraps)


@struct.dataclass
class Minibatch:
    obs: Array
    action: Array
    log_prob: Array
    value: Array  # the rollout's value prediction (for value clipping)
    advantage: Array
    target: Array
