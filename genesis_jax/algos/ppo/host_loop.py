"""PPO on host (gymnasium or EnvPool) environments: one jitted policy call for all envs per
step, then the same jitted update as the JAX-environment loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from genesis_jax.algos.ppo.config import PPOConfig
from genesis_jax.algos.ppo.core import finish_rollout, init_train_state, make_network, make_update_fn
from genesis_jax.algos.ppo.transition import Transition
from genesis_jax.amp.state import TrainState
from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv
from genesis_jax.envs.registry import resolve_backend
from genesis_jax.nets import distributions
from genesis_jax.nets.actor_critic import ActorCritic


class HostRunnerState(struct.PyTreeNode):
    train_state: TrainState
    rng: jax.Array


def make_host_env(config: PPOConfig):
    if resolve_backend(config.env, config.env_backend) == "envpool":
        from genesis_jax.envs.envpool_env import EnvPoolVecEnv

        return EnvPoolVecEnv(config.env, config.num_envs, config.seed)
    return GymnasiumVecEnv(config.env, config.num_envs, config.vectorization, config.action_repeat)


def make_host_ppo(config: PPOConfig, train_step):
    if config.num_seeds != 1:
        raise ValueError("num-seeds > 1 needs a JAX environment (env backend gymnax)")
    env = make_host_env(config)
    spec = env.spec
    rollout_net = make_network(config, spec, config.rollout_precision_resolved())

    @jax.jit
    def act(params, obs, action_noise):
        """One [num_envs, width] float32 array (a single transfer to the host): action
        (its float32 image for discrete ids), log-prob, value. The noise is drawn once per
        rollout (`draw_noise`), so this per-step call generates no random numbers."""
        pi_params, value = rollout_net.apply(params, obs)
        action = distributions.sample_with(pi_params, action_noise)
        columns = (
            action.reshape(config.num_envs, -1).astype(jnp.float32),
            distributions.log_prob(pi_params, action)[:, None],
            value[:, None],
        )
        return jnp.concatenate(columns, axis=1)

    action_width = spec.action_dim if spec.continuous else 1

    def draw_noise(key):
        """[num_steps, num_envs, action_dim] host array: the whole rollout's action noise."""
        return np.asarray(
            distributions.noise(key, (config.num_steps, config.num_envs), spec.action_dim, spec.continuous)
        )

    def unpack(packed):
        action = packed[:, :action_width]
        action = action if spec.continuous else action[:, 0].astype(np.int32)
        return action, packed[:, action_width], packed[:, action_width + 1]

    update = make_update_fn(config, spec, train_step)

    @jax.jit
    def learn(train_state, steps: Transition, last_obs, key):
        """Bootstraps truncations, then the PPO update: one compiled call per rollout."""
        value_of = lambda obs: rollout_net.apply(train_state.params, obs, method=ActorCritic.value)  # noqa: E731
        return update(train_state, finish_rollout(steps, value_of, config.gamma), value_of(last_obs), key)

    host = {"obs": None, "episode_return": np.zeros(config.num_envs, np.float32)}

    def init(key) -> HostRunnerState:
        state_key, run_key = jax.random.split(key)
        host["obs"] = env.reset(seed=config.seed)
        host["episode_return"][:] = 0.0
        return HostRunnerState(train_state=init_train_state(config, spec, state_key), rng=run_key)

    def one_update(runner: HostRunnerState):
        params = runner.train_state.params
        rng, noise_key, update_key = jax.random.split(runner.rng, 3)
        action_noise = draw_noise(noise_key)
        steps = []
        finished = []
        for t in range(config.num_steps):
            obs = host["obs"]
            action, log_mu, value = unpack(np.asarray(act(params, obs, action_noise[t])))
            next_obs, reward, terminated, truncated, final_obs = env.step(action)
            steps.append(Transition(obs, action, log_mu, value, reward, terminated, truncated, final_obs))
            host["episode_return"] += reward
            done = terminated | truncated
            finished.extend(host["episode_return"][done].tolist())
            host["episode_return"][done] = 0.0
            host["obs"] = next_obs
        stacked = jax.tree.map(lambda *column: np.stack(column), *steps)  # one [T, N, ...] array per field
        train_state, metrics = learn(runner.train_state, stacked, host["obs"], update_key)
        metrics["episodes"] = len(finished)
        metrics["return_sum"] = float(np.sum(finished))
        return runner.replace(train_state=train_state, rng=rng), metrics

    def warmup(runner: HostRunnerState):
        """Compiles the policy call and the learner on dummy data (no env is stepped)."""
        params = runner.train_state.params
        action, log_mu, value = unpack(np.asarray(act(params, host["obs"], draw_noise(runner.rng)[0])))
        flags = np.zeros(config.num_envs, bool)
        sample = Transition(host["obs"], action, log_mu, value, value, flags, flags, host["obs"])
        steps = jax.tree.map(lambda x: np.stack([x] * config.num_steps), sample)
        jax.block_until_ready(learn(runner.train_state, steps, host["obs"], runner.rng))

    def run_chunk(runner: HostRunnerState, num_updates: int):
        per_update = []
        for _ in range(num_updates):
            runner, metrics = one_update(runner)
            per_update.append(jax.device_get(metrics))
        stacked = {k: np.stack([np.asarray(m[k]) for m in per_update]) for k in per_update[0]}
        return runner, stacked

    return init, run_chunk, warmup, env
