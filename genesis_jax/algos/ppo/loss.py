"""The PPO loss (CleanRL / PureJaxRL formulation); every term in float32."""

from __future__ import annotations

import jax.numpy as jnp

from genesis_jax.algos.ppo.transition import Minibatch
from genesis_jax.nets import distributions


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
