"""PPO on the algorithm template, in the PureJaxRL style: rollout, GAE, epochs and minibatches
all under one jit, seeds under vmap and environments split over devices on gymnax; host
environments (gymnasium, EnvPool) step from inside the same compiled loop (`envs.in_loop`).

>>> from genesis_jax.algos.ppo import PPOConfig, train
>>> result = train(PPOConfig(env="CartPole-v1", precision="fp16", total_steps=20_000))  # doctest: +SKIP
>>> result.summary["final_return"]                                                   # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from genesis_jax.algos import base
from genesis_jax.algos.base import Algorithm, BenchWorkload, StudyTask
from genesis_jax.algos.ppo.config import PPOConfig
from genesis_jax.algos.ppo.core import finish_rollout, init_train_state, make_network, make_update_fn, max_truncations
from genesis_jax.algos.ppo.loss import Transition
from genesis_jax.amp import TrainState
from genesis_jax.envs.episodes import running_returns
from genesis_jax.envs.registry import resolve_env
from genesis_jax.nets import distributions
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.nets.torsos import check_network
from genesis_jax.run.checkpoint import CheckpointStore
from genesis_jax.run.parallel import constrain, replicated, sharded

_BIG = {"num_envs": 512, "num_steps": 128, "num_minibatches": 8, "total_steps": 2**21, "lr": 5e-4}
BENCH = (
    BenchWorkload("ppo-cartpole-gymnax", {"env": "CartPole-v1", "total_steps": 65_536, "lr": 1e-3}, True, True),
    BenchWorkload(
        "ppo-cartpole-gymnasium", {"env": "CartPole-v1", "env_backend": "gymnasium", "total_steps": 4096}, True
    ),
    BenchWorkload("ppo-cartpole-gymnax", {"env": "CartPole-v1", "total_steps": 500_000}, vmap_seeds=True),
    BenchWorkload(
        "ppo-resmlp-1024",
        {"env": "CartPole-v1", "network": "resmlp", "width": 1024, "depth": 2, **_BIG},
        vmap_seeds=True,
    ),
    BenchWorkload("ppo-cnn-minatar", {"env": "Breakout-MinAtar", "network": "cnn", **_BIG}, vmap_seeds=True),
    BenchWorkload("ppo-cartpole-gymnasium", {"env": "CartPole-v1", "env_backend": "gymnasium"}, seconds=10.0),
)

# PureJaxRL's MinAtar PPO settings (lr 5e-4, 128 steps, 4 epochs), with 16 envs and 4
# minibatches instead of 64 and 8: 4x the updates per step, for the budgets of a CPU study.
_MINATAR, _NONE_PUBLISHED = {"num_envs": 16, "num_minibatches": 4, "lr": 5e-4}, base.NO_PUBLISHED_REFERENCE
_CARTPOLE = {"env": "CartPole-v1"}, 500_000, 500.0, f"{base.GYMNAX_README}: R 500 (the maximum)"
STUDY = {
    "CartPole-v1": StudyTask(*_CARTPOLE),
    "Acrobot-v1": StudyTask({"env": "Acrobot-v1"}, 500_000, -80.0, f"{base.GYMNAX_README}: R -80"),
    **{
        f"{game}-MinAtar": StudyTask({"env": f"{game}-MinAtar", **_MINATAR}, 1_000_000, None, _NONE_PUBLISHED)
        for game in base.MINATAR_GAMES
    },
    "CartPole-v1-resmlp1024": StudyTask({**_CARTPOLE[0], "network": "resmlp", "width": 1024}, *_CARTPOLE[1:]),
}


class RunnerState(struct.PyTreeNode):
    train_state: TrainState
    env_state: Any  # () for host environments: their state lives on the host
    obs: jax.Array
    episode_return: jax.Array  # running return of each env's current episode
    rng: jax.Array


class PPO(Algorithm):
    name, config_class, checkpoint_key = "ppo", PPOConfig, "step"
    metrics = {"episodes": "episodes per seed", "underflow": "mean"}  # and the opt-in underflow telemetry
    tiny = dict(total_steps=256, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=2, hidden=(16,))
    bench_workloads, study_tasks = BENCH, STUDY

    def setup(self) -> None:
        # Imported here: gymnax's import starts JAX's backends, which parsing `train ppo` must not.
        from genesis_jax.envs.in_loop import resolve_in_loop

        c = self.config
        # A bad id, an unsupported space or seeds a host environment cannot have: refused
        # here, before anything is written.
        self.spec = spec = resolve_in_loop(c, "ppo")
        check_network(c.network, spec.obs_shape)
        self.steps_per_row = c.batch_size
        self.rollout_net = make_network(c, spec, c.rollout_precision_resolved())
        self.learn = make_update_fn(c, spec, self.train_step)
        self.truncation_bound = max_truncations(c, spec)
        self.mesh = c.mesh()

    def init(self, key) -> RunnerState:
        state_key, env_key, run_key = jax.random.split(key, 3)
        obs, env_state = self.env.reset(env_key)  # host environments restart from the seed
        return RunnerState(
            train_state=init_train_state(self.config, self.spec, state_key),
            env_state=env_state,
            obs=obs,
            episode_return=jnp.zeros((self.config.num_envs,), jnp.float32),
            rng=run_key,
        )

    def env_step(self, runner: RunnerState, randomness):
        """One vector step with the rollout policy: the transition, and (episodes it ended,
        the sum of their returns)."""
        action_noise, env_keys = randomness
        pi_params, value = self.rollout_net.apply(runner.train_state.params, runner.obs)
        action = distributions.sample_with(pi_params, action_noise)
        log_mu = distributions.log_prob(pi_params, action)
        obs, env_state, reward, terminated, truncated, final_obs = self.env.step(env_keys, runner.env_state, action)
        transition = Transition(runner.obs, action, log_mu, value, reward, terminated, truncated, final_obs)
        episode_return, ended = running_returns(runner.episode_return, reward, terminated | truncated)
        env_state, obs, episode_return = constrain((env_state, obs, episode_return), self.mesh)
        runner = runner.replace(env_state=env_state, obs=obs, episode_return=episode_return)
        return runner, (transition, ended)

    def update(self, runner: RunnerState, data):
        """A rollout of `num_steps` vector steps, then the PPO update on it."""
        c, spec = self.config, self.spec
        # The rollout's randomness is drawn before its loop, in two calls rather than in
        # three per step: on small networks random-number generation is a large share of a step.
        rng, noise_key, env_key, update_key = jax.random.split(runner.rng, 4)
        steps_by_envs = (c.num_steps, c.num_envs)
        randomness = (
            distributions.noise(noise_key, steps_by_envs, spec.action_dim, spec.continuous),
            jax.random.split(env_key, steps_by_envs),
        )
        runner, (steps, (episodes, return_sums)) = jax.lax.scan(self.env_step, runner, randomness)
        value_of = lambda obs: self.rollout_net.apply(runner.train_state.params, obs, method=ActorCritic.value)  # noqa: E731
        traj = finish_rollout(steps, value_of, c.gamma, self.truncation_bound)
        train_state, metrics = self.learn(runner.train_state, traj, value_of(runner.obs), update_key)
        metrics["episodes"], metrics["return_sum"] = episodes.sum(), return_sums.sum()
        return runner.replace(train_state=train_state, rng=rng), metrics

    def act(self, runner: RunnerState, greedy: bool = True):
        """`act(key, obs) -> actions` of the trained policy, in the precision it acted in (the
        rollout's): the distribution's mode (greedy) or a sample, as in training."""
        params = runner.train_state.params

        def act(key, obs):
            pi_params = self.rollout_net.apply(params, obs, method=ActorCritic.policy)
            return distributions.mode(pi_params) if greedy else distributions.sample(key, pi_params)

        return act

    def shardings(self, runner, mesh):
        """The environments (their states, observations, returns) split over the mesh, the
        train state and the PRNG key replicated."""
        split, same = sharded(mesh), replicated(mesh)
        return runner.replace(
            train_state=jax.tree.map(lambda _: same, runner.train_state),
            env_state=jax.tree.map(lambda _: split, runner.env_state),
            obs=split,
            episode_return=split,
            rng=same,
        )

    def summary(self, rows: list[dict], runner) -> dict:
        def over_rows(reduce, key):
            return float(reduce([r[key] for r in rows])) if rows else float("nan")

        return {
            "rollout_precision": self.config.rollout_precision_resolved().name,
            **{k: over_rows(np.mean, k) for k in ("mismatch_kl_v1", "mismatch_kl_v2")},
            "mismatch_max_dp": over_rows(np.max, "mismatch_max_dp"),
        }


def load_policy(run_dir: str):
    """(act, env id, description) from a PPO run's newest checkpoint: `act(key, obs) ->
    action`, sampling from the trained policy in its training precision (the first seed's,
    of a multi-seed run). What other algorithms (the world model's data) act with."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(ckpt_dir):
        raise FileNotFoundError(f"no PPO checkpoints in {run_dir}")
    with CheckpointStore(ckpt_dir, async_save=False) as store:
        state, meta = store.restore_raw()
    if meta.get("kind") != "ppo":
        raise ValueError(f"{run_dir} holds a {meta.get('kind')!r} checkpoint, not a PPO one")
    config = PPOConfig(**{k: v for k, v in meta["config"].items() if k in PPOConfig.__dataclass_fields__})
    network = make_network(config, resolve_env(config.env, config.env_backend), config.train_precision())
    params = state["train_state"]["params"]
    if int(np.asarray(state["train_state"]["step"]).ndim) > 0:
        params = jax.tree.map(lambda x: x[0], params)

    @jax.jit
    def act(key, obs):
        return distributions.sample(key, network.apply(params, obs, method=ActorCritic.policy))

    return act, config.env, f"PPO checkpoint {run_dir} step {meta['step']}"


ALGORITHM = PPO
train = PPO.train
