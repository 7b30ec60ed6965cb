"""Action distributions computed in float32: categorical (logits) and diagonal Gaussian."""

from __future__ import annotations

import jax
import jax.numpy as jnp

_LOG_2PI = jnp.log(2.0 * jnp.pi)


def sample(key, pi_params):
    if len(pi_params) == 1:
        return jax.random.categorical(key, pi_params[0])
    mean, log_std = pi_params
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, jnp.float32)


def log_prob(pi_params, action):
    if len(pi_params) == 1:
        logp_all = jax.nn.log_softmax(pi_params[0].astype(jnp.float32))
        return jnp.take_along_axis(logp_all, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mean, log_std = pi_params
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)


def entropy(pi_params):
    if len(pi_params) == 1:
        logp_all = jax.nn.log_softmax(pi_params[0].astype(jnp.float32))
        return -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    _, log_std = pi_params
    return jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)


def action_probs(pi_params, action):
    """Probabilities compared by the mismatch metric: the whole categorical, or the
    density of the taken action for a Gaussian."""
    if len(pi_params) == 1:
        return jax.nn.softmax(pi_params[0].astype(jnp.float32))
    return jnp.exp(log_prob(pi_params, action))[..., None]
