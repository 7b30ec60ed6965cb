"""PPO on the algorithm template, in the PureJaxRL style: rollout, GAE, epochs and minibatches
all under one jit, seeds under vmap and environments split over devices on gymnax; host
environments (gymnasium, EnvPool) step from inside the same compiled loop (`envs.in_loop`).

>>> from genesis_jax.algos.ppo import PPOConfig, train
>>> result = train(PPOConfig(env="CartPole-v1", precision="fp16", total_steps=20_000))  # doctest: +SKIP
>>> result.summary["final_return"]                                                   # doctest: +SKIP

A trained run's policy: `genesis_jax.load(run_dir)` (`algos.evaluate`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from genesis_jax.algos import base, onpolicy
from genesis_jax.algos.base import Algorithm, BenchWorkload, Presets
from genesis_jax.algos.ppo.config import PPOConfig
from genesis_jax.algos.ppo.loss import Minibatch, Transition, compute_gae, finish_rollout, mismatch_metrics, ppo_loss
from genesis_jax.amp import TrainState
from genesis_jax.envs.episodes import running_returns
from genesis_jax.nets import distributions
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.nets.torsos import check_network, default_network
from genesis_jax.run.parallel import constrain, sharded

_BIG = {"num_envs": 512, "num_steps": 128, "num_minibatches": 8, "total_steps": 2**21, "lr": 5e-4}
_GYMNASIUM, _RESMLP1024 = {"env": "CartPole-v1", "env_backend": "gymnasium"}, {"network": "resmlp", "width": 1024}
BENCH = (
    BenchWorkload("ppo-cartpole-gymnax", {"env": "CartPole-v1", "total_steps": 65_536, "lr": 1e-3}, True, True),
    BenchWorkload("ppo-cartpole-gymnasium", {**_GYMNASIUM, "total_steps": 4096}, True),
    BenchWorkload("ppo-cartpole-gymnax", {"env": "CartPole-v1", "total_steps": 500_000}, vmap_seeds=True),
    BenchWorkload("ppo-resmlp-1024", {"env": "CartPole-v1", **_RESMLP1024, "depth": 2, **_BIG}, vmap_seeds=True),
    BenchWorkload("ppo-cnn-minatar", {"env": "Breakout-MinAtar", "network": "cnn", **_BIG}, vmap_seeds=True),
    BenchWorkload("ppo-cartpole-gymnasium", _GYMNASIUM, seconds=10.0),
)

# PureJaxRL's MinAtar PPO settings (lr 5e-4, 128 steps, 4 epochs), with 16 envs and 4
# minibatches instead of 64 and 8: 4x the updates per step, for the budgets of a CPU study.
_MINATAR = {"num_envs": 16, "num_minibatches": 4, "lr": 5e-4}
STUDY = {"CartPole-v1": base.CARTPOLE, "Acrobot-v1": base.ACROBOT}
STUDY |= base.minatar_tasks("{game}-MinAtar", lambda game: {"env": f"{game}-MinAtar", **_MINATAR}, 1_000_000)
STUDY["CartPole-v1-resmlp1024"] = dataclasses.replace(base.CARTPOLE, settings={"env": "CartPole-v1", **_RESMLP1024})
# The long-horizon task: a discount of 0.999 (a horizon of 1000 steps, beyond CartPole's 500-step
# episodes), so the value targets grow to hundreds, where float16 keeps a quarter's steps and
# the scaled value loss overflows float16 first: rounding has the whole episode to compound.
STUDY["CartPole-v1-gamma999"] = dataclasses.replace(base.CARTPOLE, settings={"env": "CartPole-v1", "gamma": 0.999})


class RunnerState(struct.PyTreeNode):
    train_state: TrainState
    env_state: Any  # () for host environments: their state lives on the host
    obs: jax.Array
    episode_return: jax.Array  # running return of each env's current episode
    rng: jax.Array


def make_network(config: PPOConfig, spec, precision) -> ActorCritic:
    """The actor-critic for `spec`'s spaces in `precision`: `config.network`, else the default
    for the observation shape (`cnn` for images, `mlp` otherwise)."""
    network, c = config.network or default_network(spec.obs_shape), config
    torso = dict(network=network, obs_shape=spec.obs_shape, width=c.width, depth=c.depth)
    return ActorCritic(spec.action_dim, spec.continuous, c.hidden, c.activation, precision.compute_dtype, **torso)


# An update's scalar metrics, per minibatch step: they leave the loop as one float32 vector.
SCALARS = ("loss", "grad_norm", "grads_finite", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


class PPO(Algorithm):
    name, config_class = "ppo", PPOConfig
    metrics = {"episodes": "episodes per seed", "underflow": "mean"}  # and the opt-in underflow telemetry
    metrics |= {"loss": "nanmean", "grad_norm": "nanmean"}  # a seed whose every step was skipped: no value
    presets = Presets(tiny=onpolicy.TINY, bench=BENCH, study=STUDY)

    def setup(self) -> None:
        # Imported here: gymnax's import starts JAX's backends, which parsing `train ppo` must not.
        from genesis_jax.envs.in_loop import resolve_in_loop

        c = self.config
        # A bad id, an unsupported space or seeds a host environment cannot have: refused
        # here, before anything is written.
        self.spec = spec = resolve_in_loop(c, "ppo")
        check_network(c.network, spec.obs_shape)
        self.steps_per_row, self.mesh = c.batch_size, c.mesh()
        # A lone transition's advantage, normalised over its minibatch, is 0: the policy loss was 0, unsaid (a
        # recorded run loads as it ran).
        if c.minibatch_size == 1 and not self.recorded:
            raise ValueError(
                f"num-envs x num-steps = {c.batch_size} in {c.num_minibatches} minibatches is 1 transition each: "
                "PPO normalises advantages per minibatch, which makes a lone one 0, so the policy would not learn; "
                "give fewer num-minibatches"
            )
        self.rollout_net = make_network(c, spec, c.rollout_precision_resolved())
        self.loss_fn = self.loss_of(c.train_precision())
        # A bound on a rollout's truncations: one per environment per time limit's worth of steps.
        limit = spec.max_episode_steps
        self.truncation_bound = c.num_envs * -(-c.num_steps // limit) if limit else None

    def loss_of(self, precision):
        """PPO's loss (`ppo_loss`) on a minibatch, the network in `precision`; its aux keeps the
        learner's log-probabilities for the mismatch metric."""
        c, network = self.config, make_network(self.config, self.spec, precision)

        def loss_fn(params, batch: Minibatch):
            pi_params, values = network.apply(params, batch.obs)
            loss, aux = ppo_loss(pi_params, values, batch, c.clip_eps, c.vf_coef, c.ent_coef, c.clip_value)
            return loss, {**aux, "log_pi": distributions.log_prob(pi_params, batch.action)}

        return loss_fn

    def init(self, key) -> RunnerState:
        c = self.config
        state_key, env_key, run_key = jax.random.split(key, 3)
        net_key, _ = jax.random.split(state_key)  # (the second key once seeded a state field; kept for the same params)
        obs, env_state = self.env.reset(env_key)  # host environments restart from the seed
        network = make_network(c, self.spec, c.train_precision())
        params = jax.jit(network.init)(net_key, jnp.zeros((1, *self.spec.obs_shape)))  # one program: see algos/explore
        # Adam (eps 1e-5); the learning rate anneals linearly per update when asked. Clipping: the update step's.
        per_update = c.update_epochs * c.num_minibatches
        lr = (lambda count: c.lr * (1.0 - (count // per_update) / c.num_updates)) if c.anneal_lr else c.lr
        train_state = c.create_train_state(params, c.adam(lr, eps=1e-5))
        return RunnerState(train_state, env_state, obs, jnp.zeros((c.num_envs,), jnp.float32), run_key)

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
        """A rollout of `num_steps` vector steps, its truncated episodes' rewards bootstrapped
        from V(pre-reset observation), then the PPO update on it."""
        c, spec = self.config, self.spec
        # The rollout's randomness is drawn before its loop, in two calls rather than in
        # three per step: on small networks random-number generation is a large share of a step.
        rng, noise_key, env_key, update_key = jax.random.split(runner.rng, 4)
        shape = (c.num_steps, c.num_envs)
        noise = distributions.noise(noise_key, shape, spec.action_dim, spec.continuous)
        randomness = (noise, jax.random.split(env_key, shape))
        runner, (traj, (episodes, return_sums)) = jax.lax.scan(self.env_step, runner, randomness)
        value_of = lambda obs: self.rollout_net.apply(runner.train_state.params, obs, method=ActorCritic.value)
        traj = finish_rollout(traj, value_of, c.gamma, self.truncation_bound)
        train_state, metrics = self.learn(runner.train_state, traj, value_of(runner.obs), update_key)
        metrics |= {"episodes": episodes.sum(), "return_sum": return_sums.sum()}
        return runner.replace(train_state=train_state, rng=rng), metrics

    def learn(self, train_state: TrainState, traj: Transition, last_value, key):
        """GAE, the mismatch measurement, then update-epochs passes of num-minibatches shuffled
        minibatches of `train_step`."""
        c = self.config
        done = traj.terminated | traj.truncated
        advantages, targets = compute_gae(traj.reward, traj.value, done, last_value, c.gamma, c.gae_lambda)
        rollout = Minibatch(traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets)
        data = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), rollout)  # [T * N, ...]
        first = jax.tree.map(lambda x: x[: c.minibatch_size], data)
        underflow = self.underflow(self.loss_of, train_state, first)

        def step(state, batch):
            """One minibatch step; its scalar metrics leave the loop as one float32 vector (one
            write per step instead of one per metric: on small networks the loop is op-bound)."""
            state, m = self.train_step(state, self.loss_fn, batch)
            values = {**m, **m["aux"]}
            scalars = jnp.stack([jnp.asarray(values[k], jnp.float32) for k in SCALARS])
            return state, (scalars, m["aux"]["log_pi"], batch.log_prob)

        train_state, (scalars, log_pi, log_mu) = c.epochs(step, train_state, data, key)
        per_step = dict(zip(SCALARS, jnp.moveaxis(scalars, -1, 0)))
        finite = per_step.pop("grads_finite") > 0
        metrics = {k: jnp.mean(per_step.pop(k), where=finite) for k in ("loss", "grad_norm")}
        metrics |= {k: jnp.mean(v) for k, v in per_step.items()}
        # The mismatch on the update's first minibatch: the only one the learner evaluates
        # before any parameter change, so it costs no extra forward pass.
        return train_state, {**metrics, **mismatch_metrics(log_mu[0, 0], log_pi[0, 0]), **underflow}

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
        split, same = sharded(mesh), super().shardings(runner, mesh)  # same: every leaf replicated
        return same.replace(env_state=jax.tree.map(lambda _: split, runner.env_state), obs=split, episode_return=split)

    def summary(self, rows: list[dict], runner) -> dict:
        over_rows = lambda reduce, key: float(reduce([r[key] for r in rows])) if rows else float("nan")
        summary = {"rollout_precision": self.config.rollout_precision_resolved().name}
        summary |= {k: over_rows(np.mean, k) for k in ("mismatch_kl_v1", "mismatch_kl_v2")}
        return summary | {"mismatch_max_dp": over_rows(np.max, "mismatch_max_dp")}


ALGORITHM = PPO
train = PPO.train
