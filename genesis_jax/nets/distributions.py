"""Action distributions computed in float32: categorical (logits) and diagonal Gaussian."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_LOG_2PI = math.log(2.0 * math.pi)  # a Python float: importing this module must not start JAX


def noise(key, shape, action_dim: int, continuous: bool):
    """The randomness of `shape` action samples, drawn in one call: Gumbel noise for a
    categorical, standard normal noise for a Gaussian ([*shape, action_dim] float32).

    Drawing a whole rollout's noise before its loop replaces one random-number call per
    step by one per rollout; `sample_with` then turns noise into actions deterministically."""
    draw = jax.random.normal if continuous else jax.random.gumbel
    return draw(key, (*shape, action_dim), jnp.float32)


def sample_with(pi_params, action_noise):
    """Actions from pre-drawn `noise`: the Gumbel-max trick (what `jax.random.categorical`
    does) or mean + std * noise."""
    if len(pi_params) == 1:
        return jnp.argmax(pi_params[0].astype(jnp.float32) + action_noise, axis=-1)
    mean, log_std = pi_params
    return mean + jnp.exp(log_std) * action_noise


def sample(key, pi_params):
    """Actions for a batch of policy outputs, drawing fresh noise from `key`."""
    first = pi_params[0]
    return sample_with(pi_params, noise(key, first.shape[:-1], first.shape[-1], len(pi_params) == 2))


def mode(pi_params):
    """The most likely actions (a greedy policy's): the categorical's argmax, the Gaussian's mean."""
    first = pi_params[0].astype(jnp.float32)
    return jnp.argmax(first, axis=-1) if len(pi_params) == 1 else first


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
