"""PPO's learning math: the rollout's typed pytrees, truncations' bootstraps, generalised
advantage estimation, the clipped loss (CleanRL / PureJaxRL formulation) and the
rollout/learner mismatch, every term in float32.

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


def truncation_values(truncated, final_obs, value_fn, max_truncations: int | None = None):
    """[T, N] float32: V(pre-reset observation) where an episode was truncated, else 0.

    With `max_truncations` (a bound that holds for the env: num_envs x ceil(T / time
    limit)), only the truncated observations are evaluated, gathered into a fixed-size
    batch; the whole-rollout pass remains the fallback should the bound ever not hold.
    Without it, the whole-rollout pass runs when any episode was truncated."""
    zeros = jnp.zeros(truncated.shape, jnp.float32)
    count = jnp.sum(truncated)
    full = lambda: jnp.where(truncated, value_fn(final_obs), 0.0).astype(jnp.float32)  # noqa: E731
    if max_truncations is None:
        return jax.lax.cond(count > 0, full, lambda: zeros)
    flat_obs = final_obs.reshape((-1,) + final_obs.shape[2:])

    def gathered():
        index = jnp.nonzero(truncated.reshape(-1), size=max_truncations, fill_value=0)[0]
        values = jnp.where(jnp.arange(max_truncations) < count, value_fn(flat_obs[index]), 0.0)
        return zeros.reshape(-1).at[index].add(values.astype(jnp.float32)).reshape(truncated.shape)

    return jax.lax.cond(count > max_truncations, full, gathered)


def finish_rollout(traj: Transition, value_fn, gamma: float, max_truncations: int | None = None) -> Transition:
    """The rollout with truncated episodes' rewards bootstrapped from V(pre-reset observation)
    (`truncation_values`, `bootstrap_truncated`): what the update learns from."""
    final_value = truncation_values(traj.truncated, traj.final_obs, value_fn, max_truncations)
    return traj.replace(reward=bootstrap_truncated(traj.reward, traj.truncated, traj.terminated, final_value, gamma))


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


def mismatch_metrics(log_mu, log_pi) -> dict:
    """The Precision-RL training-inference mismatch between rollout (mu) and learner (pi),
    from both policies' log-probabilities of the taken actions (densities for continuous
    actions): KL estimators v1 and v2, the largest probability gap, the mean |ratio - 1|."""
    diff = log_mu - log_pi
    return {
        "mismatch_kl_v1": jnp.mean(diff),
        "mismatch_kl_v2": 0.5 * jnp.mean(jnp.square(diff)),
        "mismatch_max_dp": jnp.max(jnp.abs(jnp.exp(log_mu) - jnp.exp(log_pi))),
        "mismatch_ratio_dev": jnp.mean(jnp.abs(jnp.exp(log_pi - log_mu) - 1.0)),
    }
