"""PPO on gymnax environments: rollout, GAE, epochs and minibatches all under one jit.

`make_jax_ppo(config, train_step)` returns `init(key) -> RunnerState` and
`one_update(runner) -> (runner, metrics)`, pure functions in the PureJaxRL style; the
algorithm template scans `one_update` into compiled chunks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from genesis_jax.algos.ppo.config import PPOConfig
from genesis_jax.algos.ppo.core import finish_rollout, init_train_state, make_network, make_update_fn, max_truncations
from genesis_jax.algos.ppo.transition import Transition
from genesis_jax.amp.state import TrainState
from genesis_jax.envs.gymnax_env import GymnaxVecEnv
from genesis_jax.nets import distributions
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.run.parallel import constrain


class RunnerState(struct.PyTreeNode):
    train_state: TrainState
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array  # running return of each env's current episode
    rng: jax.Array


def make_jax_ppo(config: PPOConfig, train_step, mesh=None):
    env = GymnaxVecEnv(config.env, config.num_envs)
    spec = env.spec
    rollout_net = make_network(config, spec, config.rollout_precision_resolved())
    update = make_update_fn(config, spec, train_step)
    truncation_bound = max_truncations(config, spec)

    def init(key) -> RunnerState:
        state_key, env_key, run_key = jax.random.split(key, 3)
        obs, env_state = env.reset(env_key)
        return RunnerState(
            train_state=init_train_state(config, spec, state_key),
            env_state=env_state,
            obs=obs,
            episode_return=jnp.zeros((config.num_envs,), jnp.float32),
            rng=run_key,
        )

    def env_step(runner: RunnerState, randomness):
        action_noise, env_keys = randomness
        pi_params, value = rollout_net.apply(runner.train_state.params, runner.obs)
        action = distributions.sample_with(pi_params, action_noise)
        log_mu = distributions.log_prob(pi_params, action)
        obs, env_state, reward, terminated, truncated, final_obs = env.step(env_keys, runner.env_state, action)
        done = jnp.logical_or(terminated, truncated)
        episode_return = runner.episode_return + reward
        transition = Transition(
            obs=runner.obs,
            action=action,
            log_prob=log_mu,
            value=value,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=final_obs,
        )
        finished_return = jnp.where(done, episode_return, 0.0)
        env_state, obs, episode_return = constrain((env_state, obs, jnp.where(done, 0.0, episode_return)), mesh)
        runner = runner.replace(env_state=env_state, obs=obs, episode_return=episode_return)
        return runner, (transition, finished_return)

    def one_update(runner: RunnerState):
        # The rollout's randomness is drawn before its loop, in two calls rather than in
        # three per step: on small networks random-number generation is a large share of a step.
        rng, noise_key, env_key, update_key = jax.random.split(runner.rng, 4)
        steps_by_envs = (config.num_steps, config.num_envs)
        randomness = (
            distributions.noise(noise_key, steps_by_envs, spec.action_dim, spec.continuous),
            jax.random.split(env_key, steps_by_envs),
        )
        runner, (steps, finished_returns) = jax.lax.scan(env_step, runner, randomness)
        value_of = lambda obs: rollout_net.apply(runner.train_state.params, obs, method=ActorCritic.value)  # noqa: E731
        traj = finish_rollout(steps, value_of, config.gamma, truncation_bound)
        train_state, metrics = update(runner.train_state, traj, value_of(runner.obs), update_key)
        metrics["episodes"] = traj.done.sum()
        metrics["return_sum"] = finished_returns.sum()
        return runner.replace(train_state=train_state, rng=rng), metrics

    return init, one_update, spec
