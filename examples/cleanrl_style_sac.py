"""SAC on gymnasium Pendulum-v1 in CleanRL's JAX layout: Flax linen networks, a `TrainState` per
optimizer (the critics' holds its target params), three update functions each jitted on its
own, and a Python loop around them. `cleanrl_style_sac.py` trains in float32;
`cleanrl_style_sac_fp16.py` is the same file in float16, the three optimizers sharing one loss
scaler as PyTorch's `GradScaler` is shared: `diff` the two to see the change.

Usage: python examples/cleanrl_style_sac[_fp16].py [total_timesteps]
"""

import sys
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

GAMMA, TAU, BATCH_SIZE, LEARNING_STARTS, POLICY_FREQUENCY = 0.99, 0.005, 256, 1000, 2
Q_LR, POLICY_LR, ALPHA_LR, BUFFER_SIZE = 1e-3, 3e-4, 1e-3, 100_000


class QNetwork(nn.Module):
    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs, action], -1)
        x = nn.relu(nn.Dense(256)(x))
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(1)(x)[..., 0]


class Actor(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, obs):
        x = nn.relu(nn.Dense(256)(obs))
        x = nn.relu(nn.Dense(256)(x))
        mean, log_std = nn.Dense(self.action_dim)(x), nn.Dense(self.action_dim)(x)
        return mean, -5.0 + 3.5 * (jnp.tanh(log_std) + 1.0)  # log_std in [-5, 2]


class RLTrainState(TrainState):
    target_params: Any


env = gym.make("Pendulum-v1")
ACTION_SCALE = float(env.action_space.high[0])
TARGET_ENTROPY = -float(np.prod(env.action_space.shape))
qf = QNetwork()
actor = Actor(action_dim=int(np.prod(env.action_space.shape)))
twin_q = jax.vmap(lambda params, obs, action: qf.apply(params, obs, action), in_axes=(0, None, None))


@jax.jit
def sample_action(actor_params, obs, key):
    mean, log_std = actor.apply(actor_params, obs)
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    log_prob = -0.5 * ((u - mean) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * jnp.log(2 * jnp.pi)
    log_prob -= 2 * (jnp.log(2.0) - u - jax.nn.softplus(-2 * u))  # the tanh squash
    return jnp.tanh(u) * ACTION_SCALE, log_prob.sum(-1)


@jax.jit
def update_critic(qf_state, actor_state, alpha_state, obs, actions, rewards, next_obs, terminations, key):
    next_actions, next_log_prob = sample_action(actor_state.params, next_obs, key)
    next_q = twin_q(qf_state.target_params, next_obs, next_actions).min(0)
    next_q = next_q - jnp.exp(alpha_state.params["log_alpha"]) * next_log_prob
    target = rewards + (1.0 - terminations) * GAMMA * next_q

    def mse_loss(params):
        q = twin_q(params, obs, actions)
        return ((q - target) ** 2).mean(1).sum(), q.mean()

    (qf_loss, qf_mean), grads = jax.value_and_grad(mse_loss, has_aux=True)(qf_state.params)
    qf_state = qf_state.apply_gradients(grads=grads)
    qf_state = qf_state.replace(target_params=optax.incremental_update(qf_state.params, qf_state.target_params, TAU))
    return qf_state, qf_loss, qf_mean


@jax.jit
def update_actor(actor_state, qf_state, alpha_state, obs, key):
    def actor_loss(params):
        actions, log_prob = sample_action(params, obs, key)
        q = twin_q(qf_state.params, obs, actions).min(0)
        return (jnp.exp(alpha_state.params["log_alpha"]) * log_prob - q).mean(), log_prob.mean()

    (loss, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(actor_state.params)
    actor_state = actor_state.apply_gradients(grads=grads)
    return actor_state, loss, -log_prob


@jax.jit
def update_temperature(alpha_state, entropy):
    def alpha_loss(params):
        return params["log_alpha"] * (entropy - TARGET_ENTROPY)

    loss, grads = jax.value_and_grad(alpha_loss)(alpha_state.params)
    alpha_state = alpha_state.apply_gradients(grads=grads)
    return alpha_state, loss


def make_states(seed):
    obs, action = jnp.zeros((1, *env.observation_space.shape)), jnp.zeros((1, *env.action_space.shape))
    q_key, actor_key = jax.random.split(jax.random.PRNGKey(seed))
    qf_params = jax.vmap(qf.init, in_axes=(0, None, None))(jax.random.split(q_key, 2), obs, action)
    qf_state = RLTrainState.create(apply_fn=qf.apply, params=qf_params, target_params=qf_params,
                                   tx=optax.adam(Q_LR))
    actor_state = TrainState.create(apply_fn=actor.apply, params=actor.init(actor_key, obs),
                                    tx=optax.adam(POLICY_LR))
    alpha_state = TrainState.create(apply_fn=None, params={"log_alpha": jnp.float32(0.0)},
                                    tx=optax.adam(ALPHA_LR))
    return qf_state, actor_state, alpha_state


def train(total_timesteps, seed=0):
    """Returns (the episodes' returns, the final states)."""
    qf_state, actor_state, alpha_state = make_states(seed)
    key, rng = jax.random.PRNGKey(seed + 1), np.random.default_rng(seed)
    buffer = {
        k: np.zeros((BUFFER_SIZE, *shape), np.float32)
        for k, shape in (
            ("obs", env.observation_space.shape),
            ("actions", env.action_space.shape),
            ("rewards", ()),
            ("next_obs", env.observation_space.shape),
            ("terminations", ()),
        )
    }
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    episode_return, returns = 0.0, []
    for step in range(total_timesteps):
        key, act_key, critic_key, actor_key = jax.random.split(key, 4)
        if step < LEARNING_STARTS:
            action = env.action_space.sample()
        else:
            action = np.asarray(sample_action(actor_state.params, jnp.asarray(obs)[None], act_key)[0][0])
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for name, value in zip(buffer, (obs, action, reward, next_obs, terminated)):
            buffer[name][step % BUFFER_SIZE] = value
        obs, episode_return = next_obs, episode_return + float(reward)
        if terminated or truncated:
            obs, _ = env.reset()
            returns.append(episode_return)
            episode_return = 0.0
        if step >= LEARNING_STARTS:
            idx = rng.integers(0, min(step + 1, BUFFER_SIZE), BATCH_SIZE)
            batch = [jnp.asarray(buffer[name][idx]) for name in buffer]
            qf_state, qf_loss, qf_mean = update_critic(qf_state, actor_state, alpha_state, *batch, critic_key)
            if step % POLICY_FREQUENCY == 0:
                actor_state, actor_loss, entropy = update_actor(actor_state, qf_state, alpha_state, batch[0], actor_key)
                alpha_state, alpha_loss = update_temperature(alpha_state, entropy)
    return returns, (qf_state, actor_state, alpha_state)


if __name__ == "__main__":
    total = int(float(sys.argv[1])) if len(sys.argv) > 1 else 15_000
    returns, states = train(total)
    print(
        f"episodes {len(returns)}  return over the first 5: {np.mean(returns[:5]):.1f}, "
        f"over the last 5: {np.mean(returns[-5:]):.1f}"
    )
