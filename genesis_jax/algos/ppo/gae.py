"""Generalised advantage estimation over a [T, N] rollout, in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
