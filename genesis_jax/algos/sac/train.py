"""SAC on the algorithm template: twin critics with Polyak targets, a tanh-Gaussian actor and a
learned temperature; three optimizers under one loss scaler (`shared_scaler=True` states and
`amp.update_scaler`: the iteration's scale backs off once if any gradient was not finite);
replay in flashbax."""

from __future__ import annotations

import collections
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from genesis_jax.algos.base import GYMNAX_README, Algorithm, BenchWorkload, Presets, StudyTask
from genesis_jax.algos.sac.config import SACConfig
from genesis_jax.amp import TrainState, train_step, update_scaler
from genesis_jax.data.replay import empty_like, grow
from genesis_jax.envs.episodes import running_returns
from genesis_jax.envs.in_loop import resolve_in_loop
from genesis_jax.nets.sac import Net, TwinQ
from genesis_jax.run.checkpoint import CountsReplay
from genesis_jax.run.parallel import constrain

OPTIMIZERS = ("critic", "actor", "alpha")
COUNTS = ("updates", "episodes", "critic_skipped", "actor_skipped", "alpha_skipped")
LOSSES = ("critic_loss", "actor_loss", "alpha_loss", "alpha", "q_mean", "entropy")
# next_obs: the pre-reset observation where an episode ended; terminated, not truncated: a time limit bootstraps.
Transition = collections.namedtuple("Transition", "obs action reward next_obs terminated")


class SACState(struct.PyTreeNode, CountsReplay):
    critic: TrainState  # the twin Qs, one params tree
    actor: TrainState
    alpha: TrainState  # params: log(alpha)
    target: Any  # the target critics' params
    buffer: Any
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array
    rng: jax.Array
    iteration: jax.Array  # environment iterations done

    def replay_count(self) -> tuple[str, jax.Array, int]:
        """What `buffer` was given, for a restore's checks (run.checkpoint): an iteration adds each environment's
        transition (episode_return: one per environment)."""
        return "iteration", self.iteration, self.episode_return.shape[-1]


# SimBa's residual torso 1024 wide: where half precision can pay.
BENCH = (BenchWorkload("sac-resmlp-1024", {"network": "resmlp", "width": 1024, "depth": 2, "total_steps": 20_000}),)
# Its own defaults; and the same with 64-wide networks, the size a
# CPU study can train at 32 seeds (about 16x fewer FLOPs a step), for 10 000 steps: in a pilot
# of 8 fp32 seeds it was at -404 after 5000 steps and -182 on average from 5200 on.
STUDY = {
    f"sac:Pendulum-v1{suffix}": StudyTask({"env": "Pendulum-v1", **settings}, steps, -130.0, f"{GYMNAX_README}: R -130")
    for suffix, settings, steps in (("", {}, 20_000), ("-mlp64", {"hidden": (64, 64)}, 10_000))
}
# The generic tests' few-row run: a tiny network, no greedy evaluation.
TINY = dict(num_envs=8, steps_per_row=8, batch_size=8, learning_starts=8, total_steps=32, buffer_size=64)
TINY |= dict(hidden=(16,), eval_episodes=0)


def temperature_of(log_alpha):
    """alpha from its learned log, in float32: log(alpha) is a float16 parameter under fp16-full,
    whose exp flushes to 0 below 6e-8."""
    return jnp.exp(log_alpha.astype(jnp.float32))


class SAC(Algorithm):
    name, config_class, row_key = "sac", SACConfig, "row"  # a metrics row: `steps_per_row` environment steps
    metrics = {**{k: "sum" for k in COUNTS}, **{k: "nanmean" for k in LOSSES}, "episodes": "episodes per seed"}
    presets = Presets(tiny=TINY, bench=BENCH, study=STUDY)
    train_state_path = ("critic",)  # the template reads the scale there: the one all three share

    def setup(self) -> None:
        c = self.config
        spec = resolve_in_loop(c, "sac", continuous=True, instead="dqn or pqn")  # before anything is written
        if not spec.bounded_actions:  # tanh * inf: NaN actions
            raise ValueError(
                f"sac squashes its actions into the action bounds; {c.env} has infinite ones: make them finite"
            )
        if not all(lo < hi for lo, hi in zip(spec.action_low, spec.action_high)):  # log(high - low): -inf, NaN losses
            raise ValueError(
                f"sac needs each action's low below its high; {c.env} has {spec.action_low} to {spec.action_high}"
            )
        self.spec, self.steps_per_row = spec, c.steps_per_row
        dtype = c.train_precision().compute_dtype
        self.actor, self.critic = Net(c.torso, 2 * spec.action_dim, dtype), TwinQ(c.torso, 1, dtype)
        self.q = lambda params, obs, act: self.critic.apply(params, obs, act)[..., 0]  # [2, batch] float32
        self.low, self.high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
        self.target_entropy = -spec.action_dim if c.target_entropy is None else c.target_entropy
        obs, act, f32 = np.zeros(spec.obs_shape, np.float32), np.zeros(spec.action_dim, np.float32), np.float32
        self.replay = self.make_replay(Transition(obs, act, f32(0), obs, np.bool_(0)), c.buffer_capacity, c.batch_size)

    def init(self, key) -> SACState:
        c, spec = self.config, self.spec
        k_critic, k_actor, k_env, rng = jax.random.split(key, 4)
        obs, act = jnp.zeros((1, *spec.obs_shape)), jnp.zeros((1, spec.action_dim))
        critic_params = jax.jit(self.critic.init)(k_critic, obs, act)  # one program: see algos/explore
        env_obs, env_state = self.env.reset(k_env)  # host environments restart from the seed
        critic = c.create_train_state(critic_params, c.adam(c.critic_lr), shared_scaler=True)
        actor_params = jax.jit(self.actor.init)(k_actor, obs)
        actor = c.create_train_state(actor_params, c.adam(c.actor_lr), shared_scaler=True)
        alpha = c.create_train_state(jnp.log(jnp.float32(c.init_alpha)), c.adam(c.alpha_lr), shared_scaler=True)
        target = jax.tree.map(jnp.copy, critic.params)  # its own buffers (the state is donated), as stored
        zeros = jnp.zeros(c.num_envs)
        return SACState(critic, actor, alpha, target, self.replay.init(), env_state, env_obs, zeros, rng, jnp.int32(0))

    def from_checkpoint(self, state: SACState, meta: dict):
        """A shorter run's checkpoint holds a smaller buffer (the capacity follows total-steps up to
        buffer-size): read at its capacity, then grown to this run's, its transitions kept in order."""
        kept, capacity = self.config.saved_capacity(meta.get("config", {})), self.config.buffer_capacity
        if kept is None or kept >= capacity:  # a larger one: refused by `SACConfig.check_resume`, or its shapes
            return super().from_checkpoint(state, meta)
        target = state.replace(buffer=empty_like(state.buffer, kept))
        return target, lambda restored: restored.replace(buffer=grow(restored.buffer, capacity))

    def policy(self, params, obs, noise):
        """(action, float32 log-prob) of tanh(mean + std noise) in the bounds; log(1 - tanh(u)^2) stably."""
        mean, log_std = jnp.split(self.actor.apply(params, obs), 2, axis=-1)
        log_std = -5.0 + 3.5 * (jnp.tanh(log_std) + 1.0)  # in [-5, 2], as CleanRL and SBX
        u, scale = mean + jnp.exp(log_std) * noise, (self.high - self.low) / 2
        log_normal = -0.5 * jnp.square(noise) - log_std - 0.5 * math.log(2 * math.pi)
        correction = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u)) + jnp.log(scale)
        return jnp.tanh(u) * scale + (self.high + self.low) / 2, jnp.sum(log_normal - correction, axis=-1)

    def act(self, state: SACState, greedy: bool = True):
        """`act(key, obs) -> actions` of the actor: tanh(mean) in the bounds (greedy), or a sample."""
        params = state.actor.params

        def act(key, obs):
            shape = (obs.shape[0], self.spec.action_dim)
            noise = jnp.zeros(shape, jnp.float32) if greedy else jax.random.normal(key, shape)
            return self.policy(params, obs, noise)[0]

        return act

    def gradient_step(self, state: SACState, batch: Transition, key):
        """Critic, actor (on the critics as just updated, as CleanRL), temperature; one scaler."""
        c, alpha = self.config, temperature_of(state.alpha.params)
        next_noise, noise = jax.random.normal(key, (2, *batch.action.shape))
        next_action, next_logp = self.policy(state.actor.params, batch.next_obs, next_noise)
        next_q = jnp.min(self.q(state.target, batch.next_obs, next_action), axis=0)
        target = batch.reward + c.gamma * (1.0 - batch.terminated) * (next_q - alpha * next_logp)

        def critic_loss(params, b):
            q = self.q(params, b.obs, b.action)
            return jnp.sum(jnp.mean(jnp.square(q - target), axis=-1)), {"q_mean": jnp.mean(q)}

        def actor_loss(params, obs):
            action, logp = self.policy(params, obs, noise)
            return jnp.mean(alpha * logp - jnp.min(self.q(critic.params, obs, action), 0)), jnp.mean(logp)

        critic, cm = self.train_step(state.critic, critic_loss, batch)  # the faults and the hook: the critics' only
        actor, am = train_step(state.actor, actor_loss, batch.obs, has_aux=True)
        logp = jax.lax.stop_gradient(am["aux"])
        alpha_loss = lambda log_alpha: -temperature_of(log_alpha) * (logp + self.target_entropy)  # noqa: E731
        temperature, tm = train_step(state.alpha, alpha_loss)
        critic, actor, temperature = update_scaler(critic, actor, temperature)  # one backoff for the three
        # The skips as each state counted them (strict mode also skips finite gradients whose update is not).
        new_states = dict(zip(OPTIMIZERS, (critic, actor, temperature)))
        skips = {f"{n}_skipped": new_states[n].skipped - getattr(state, n).skipped for n in OPTIMIZERS}
        losses = (cm["loss"], am["loss"], tm["loss"], alpha, cm["aux"]["q_mean"], -logp)
        metrics = {**dict(zip(LOSSES, losses)), **skips, "updates": jnp.int32(1)}
        target_params = optax.incremental_update(critic.params, state.target, c.tau)
        return state.replace(critic=critic, actor=actor, alpha=temperature, target=target_params), metrics

    def env_iteration(self, state: SACState, _):
        """Each env steps (uniform actions before `learning_starts`); then a gradient step if due."""
        c, (rng, k_act, k_env, k_sample, k_step) = self.config, jax.random.split(state.rng, 5)
        shape = (c.num_envs, self.spec.action_dim)
        action, _ = self.policy(state.actor.params, state.obs, jax.random.normal(k_act, shape))
        uniform = jax.random.uniform(k_act, shape, minval=self.low, maxval=self.high)
        action = jnp.where(state.iteration * c.num_envs < c.learning_starts, uniform, action)
        step = self.env.step(jax.random.split(k_env, c.num_envs), state.env_state, action)
        obs, env_state, reward, terminated, truncated, final_obs = step
        episode_return, (episodes, return_sum) = running_returns(state.episode_return, reward, terminated | truncated)
        buffer = self.replay.add(state.buffer, Transition(state.obs, action, reward, final_obs, terminated))
        state = state.replace(env_state=env_state, obs=obs, episode_return=episode_return, rng=rng)
        state = state.replace(buffer=buffer, iteration=state.iteration + 1)

        def learn(s):
            return self.gradient_step(s, constrain(self.replay.sample(s.buffer, k_sample), c.mesh()), k_step)

        idle = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(learn, state)[1])
        due = state.iteration * c.num_envs >= c.learning_starts
        state, metrics = jax.lax.cond(due, learn, lambda s: (s, idle), state)
        return state, {**metrics, "episodes": episodes, "return_sum": return_sum}

    def update(self, state: SACState, data):
        """A metrics row: counts summed, losses averaged over the iterations that learned (then over seeds)."""
        state, m = jax.lax.scan(self.env_iteration, state, None, self.config.steps_per_row // self.config.num_envs)
        counts = {k: jnp.sum(m[k]) for k in COUNTS + ("return_sum",)}
        return state, counts | {k: jnp.mean(m[k], where=m["updates"] > 0) for k in LOSSES}

    def summary(self, rows: list[dict], state: SACState) -> dict:
        """Each optimizer's skips (the template's skipped_updates, total_updates and overflow_rate sum all three)."""
        skips = {f"{n}_skipped": int(np.sum(getattr(state, n).skipped)) for n in OPTIMIZERS}
        return {"gradient_iterations": int(np.sum(state.critic.step)), "buffer_bytes": self.buffer_bytes, **skips}


ALGORITHM = SAC
train = SAC.train
