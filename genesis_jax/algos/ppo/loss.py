"""PPO's learning math: the rollout's typed pytrees, generalised advantage estimation and the
clipped loss (CleanRL / PureJaxRL formulation), every term in float32.

`Transition` is what a rollout records per step ([T, N, ...] once scanned or stacked; the
update takes it with truncated episodes' rewards bootstrapped), and `Minibatch` what the
loss sees (flattened over time and environments, with advantages and value targets). Both
are `flax.struct` dataclasses: they pass through `jit`, `scan` and `jax.tree.map` as their
arrays.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from genesis_jax.nets import distributions

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


def bootstrap_truncated(rewards, truncated, terminated, final_values, gamma):
    """Folds the value of a truncated episode's last observation into its reward.

    A time-limit truncation is not a real end: the return continues, so
    r_t + gamma * V(s_{t+1}) is the honest target; a termination gets no bootstrap.
    """
    bootstrap = jnp.logical_and(truncated, jnp.logical_not(terminated))
    return rewards + gamma * final_values * bootstrap.astype(jnp.float32)


def compute_gae(rewards, values, dones, last_value, gamma: float, gae_lambda: float):
    """(advantages, returns). `dones[t]` cuts the trace after step t (terminated or truncated);
    `last_value` is V(s_T) for the step after the rollout."""
    rewards, values, last_value = (x.astype(jnp.float32) for x in (rewards, values, last_value))
    not_done = 1.0 - dones.astype(jnp.float32)

    def backward(carry, t):
        next_advantage, next_value = carry
        delta = rewards[t] + gamma * next_value * not_done[t] - values[t]
        advantage = delta + gamma * gae_lambda * not_done[t] * next_advantage
        return (advantage, values[t]), advantage

    steps = jnp.arange(rewards.shape[0])
    _, advantages = jax.lax.scan(backward, (jnp.zeros_like(last_value), last_value), steps, reverse=True, unroll=16)
    return advantages, advantages + values


def ppo_loss(
    pi_params, values, batch: Minibatch, clip_eps: float, vf_coef: float, ent_coef: float, clip_value: bool = True
):
    """(total loss, aux) from the network outputs on `batch`.

    Of `batch` the loss reads action, log_prob (the rollout's), value (old), advantage
    and target; `obs` went into `pi_params` and `values`. Advantages are normalised per minibatch.
    """
    log_pi = distributions.log_prob(pi_params, batch.action)
    log_ratio = log_pi - batch.log_prob
    ratio = jnp.exp(log_ratio)
    adv = batch.advantage
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)  # float32: the epsilon is representable
    pg_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)).mean()

    value_err = jnp.square(values - batch.target)
    if clip_value:
        clipped = batch.value + jnp.clip(values - batch.value, -clip_eps, clip_eps)
        value_err = jnp.maximum(value_err, jnp.square(clipped - batch.target))
    value_loss = 0.5 * value_err.mean()
    ent = distributions.entropy(pi_params).mean()
    total = pg_loss + vf_coef * value_loss - ent_coef * ent
    aux = {
        "policy_loss": pg_loss,
        "value_loss": value_loss,
        "entropy": ent,
        "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "clip_fraction": (jnp.abs(ratio - 1.0) > clip_eps).astype(jnp.float32).mean(),
    }
    return total, aux
