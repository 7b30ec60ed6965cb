"""PPO on host (gymnasium) environments: one jitted policy call for all envs per step,
then the same jitted update as the JAX-environment loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.ppo import distributions
from genesis_jax.ppo.config import PPOConfig
from genesis_jax.ppo.core import init_train_state, make_network, make_update_fn
from genesis_jax.ppo.gae import bootstrap_truncated
from genesis_jax.update import TrainState


class HostRunnerState(struct.PyTreeNode):
    train_state: TrainState
    rng: jax.Array


def make_host_ppo(config: PPOConfig, grad_transform=None):
    if config.num_seeds != 1:
        raise ValueError("num-seeds > 1 needs a JAX environment (env backend gymnax)")
    env = GymnasiumVecEnv(config.env, config.num_envs, config.vectorization, config.action_repeat)
    spec = env.spec
    rollout_net = make_network(config, spec, config.rollout_precision_resolved())
    update = jax.jit(make_update_fn(config, spec, grad_transform))

    @jax.jit
    def act(params, obs, key):
        pi_params, value = rollout_net.apply(params, obs)
        action = distributions.sample(key, pi_params)
        return action, distributions.log_prob(pi_params, action), value, distributions.action_probs(pi_params, action)

    @jax.jit
    def values(params, obs):
        return rollout_net.apply(params, obs, method=ActorCritic.value)

    host = {"obs": None, "episode_return": np.zeros(config.num_envs, np.float32)}

    def init(key) -> HostRunnerState:
        state_key, run_key = jax.random.split(key)
        host["obs"] = env.reset(seed=config.seed)
        host["episode_return"][:] = 0.0
        return HostRunnerState(train_state=init_train_state(config, spec, state_key), rng=run_key)

    def one_update(runner: HostRunnerState):
        params = runner.train_state.params
        rng, update_key = jax.random.split(runner.rng)
        step_keys = np.asarray(jax.random.split(rng, config.num_steps + 1))
        columns = {k: [] for k in ("obs", "action", "log_prob", "value", "probs", "reward", "terminated", "truncated", "final_obs")}
        finished = []
        for t in range(config.num_steps):
            obs = host["obs"]
            action, log_mu, value, probs = jax.device_get(act(params, obs, step_keys[t]))
            next_obs, reward, terminated, truncated, final_obs = env.step(action)
            for k, v in zip(columns, (obs, action, log_mu, value, probs, reward, terminated, truncated, final_obs)):
                columns[k].append(v)
            host["episode_return"] += reward
            done = terminated | truncated
            finished.extend(host["episode_return"][done].tolist())
            host["episode_return"][done] = 0.0
            host["obs"] = next_obs
        traj = {k: jnp.asarray(np.stack(v)) for k, v in columns.items()}
        final_value = values(params, traj.pop("final_obs"))
        traj["done"] = jnp.logical_or(traj["terminated"], traj["truncated"])
        traj["reward"] = bootstrap_truncated(traj["reward"], traj.pop("truncated"), traj.pop("terminated"), final_value, config.gamma)
        last_value = values(params, host["obs"])
        train_state, metrics = update(runner.train_state, traj, last_value, update_key)
        metrics["episodes"] = len(finished)
        metrics["return_sum"] = float(np.sum(finished)) if finished else 0.0
        return runner.replace(train_state=train_state, rng=jnp.asarray(step_keys[-1])), metrics

    def warmup(runner: HostRunnerState):
        """Compiles the policy call and the update on dummy data (nothing is stepped)."""
        params = runner.train_state.params
        jax.block_until_ready(act(params, host["obs"], runner.rng))
        jax.block_until_ready(values(params, np.zeros((config.num_steps, config.num_envs, spec.obs_dim), np.float32)))
        jax.block_until_ready(values(params, host["obs"]))
        shapes = jax.eval_shape(act, params, host["obs"], runner.rng)
        traj = {
            "obs": jnp.zeros((config.num_steps, config.num_envs, spec.obs_dim), jnp.float32),
            "action": jnp.zeros((config.num_steps,) + shapes[0].shape, shapes[0].dtype),
            "log_prob": jnp.zeros((config.num_steps, config.num_envs), jnp.float32),
            "value": jnp.zeros((config.num_steps, config.num_envs), jnp.float32),
            "probs": jnp.zeros((config.num_steps,) + shapes[3].shape, jnp.float32),
            "reward": jnp.zeros((config.num_steps, config.num_envs), jnp.float32),
            "done": jnp.zeros((config.num_steps, config.num_envs), bool),
        }
        jax.block_until_ready(update(runner.train_state, traj, jnp.zeros(config.num_envs, jnp.float32), runner.rng))

    def run_chunk(runner: HostRunnerState, num_updates: int):
        per_update = []
        for _ in range(num_updates):
            runner, metrics = one_update(runner)
            per_update.append(jax.device_get(metrics))
        stacked = {k: np.stack([np.asarray(m[k]) for m in per_update]) for k in per_update[0]}
        return runner, stacked

    return init, run_chunk, warmup, env
