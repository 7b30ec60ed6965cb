"""PQN on the algorithm template (Gallici et al. 2024, "Simplifying Deep Temporal Difference
Learning"; purejaxql): Q-learning with no replay buffer and no target network. Many vectorised
environments decorrelate the data, LayerNorm keeps the bootstrapped targets stable, and the
targets are Q(lambda) returns over each update's rollout; then epochs of shuffled minibatches,
as PPO does. One template row is one update: num-envs x num-steps environment steps.

Where it departs from purejaxql: Adam rather than RAdam, and a time limit bootstraps from the
pre-reset observation instead of ending the return.

>>> from genesis_jax.algos.pqn import PQNConfig, train
>>> result = train(PQNConfig(precision="fp16"))  # doctest: +SKIP
>>> result.summary["final_return"]               # doctest: +SKIP
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct

from genesis_jax.algos.base import GYMNAX_README, Algorithm, BenchWorkload, StudyTask
from genesis_jax.algos.explore import EpsilonGreedy
from genesis_jax.algos.pqn.config import PQNConfig
from genesis_jax.amp import TrainState
from genesis_jax.envs.episodes import Episodes
from genesis_jax.envs.in_loop import resolve_in_loop
from genesis_jax.nets.q_network import QNetwork
from genesis_jax.nets.torsos import check_network, default_network
from genesis_jax.run.parallel import constrain

# purejaxql's MinAtar settings (its pqn_minatar.yaml), the CNN torso.
MINATAR = {"num_envs": 128, "num_steps": 32, "update_epochs": 2, "num_minibatches": 32, "lr": 5e-4, "gae_lambda": 0.65}
MINATAR |= {"reward_scale": 1.0, "epsilon_end": 0.05, "epsilon_fraction": 0.1}
BENCH = (
    BenchWorkload("pqn-cartpole", {"env": "CartPole-v1", "total_steps": 65_536}, quick=True, vmap_seeds=True),
    BenchWorkload("pqn-cnn-minatar", {"env": "Breakout-MinAtar", "total_steps": 2_000_000, **MINATAR}, vmap_seeds=True),
)
STUDY = {
    "pqn:CartPole-v1": StudyTask({"env": "CartPole-v1"}, 500_000, 500.0, f"{GYMNAX_README}: R 500 (the maximum)"),
}


class PQNState(struct.PyTreeNode):
    train_state: TrainState
    env_state: object
    obs: jax.Array
    episodes: Episodes
    steps: jax.Array  # environment steps so far
    rng: jax.Array


def lambda_returns(reward, terminated, truncated, next_q, gamma: float, lam: float):
    """float32 Q(lambda) targets [T, N], backwards over the rollout. `next_q`: max_a Q(s', a)
    at each step's next observation (the pre-reset one where an episode ended). A termination
    takes the reward alone, a time limit bootstraps from `next_q` alone, and elsewhere
    G_t = r_t + gamma ((1 - lam) next_q_t + lam G_{t+1}); the last step bootstraps fully."""

    def step(later, t):
        r, term, trunc, q = t
        ahead = jnp.where(term | trunc, q, later)  # an ended episode's next step belongs to another
        g = r + gamma * (1.0 - term) * (q + lam * (ahead - q))
        return g, g

    _, targets = jax.lax.scan(step, next_q[-1], (reward, terminated, truncated, next_q), reverse=True)
    return targets.astype(jnp.float32)


class PQN(EpsilonGreedy, Algorithm):
    name, config_class, checkpoint_key = "pqn", PQNConfig, "step"
    metrics = {"episodes": "episodes", "recent_return": "nanmean"}
    tiny = dict(total_steps=256, num_envs=4, num_steps=16, update_epochs=1, num_minibatches=2, hidden=(16,))
    bench_workloads, study_tasks = BENCH, STUDY

    def setup(self) -> None:
        c, spec = self.config, resolve_in_loop(self.config, "pqn", continuous=False, instead="sac")
        network = c.network or default_network(spec.obs_shape)
        check_network(network, spec.obs_shape)
        precision = c.train_precision()
        self.net = QNetwork(  # LayerNorm after each hidden layer: PQN's stabiliser
            spec.action_dim, spec.obs_shape, network, c.hidden, layer_norm=True, dtype=precision.compute_dtype
        )
        self.steps_per_row, self.spec = c.batch_size, spec

    def init(self, key) -> PQNState:
        c = self.config
        net_key, env_key, rng = jax.random.split(key, 3)
        params = self.net.init(net_key, jnp.zeros((1, *self.spec.obs_shape)))
        grad_steps = c.num_updates * c.update_epochs * c.num_minibatches
        lr = optax.linear_schedule(c.lr, 0.0, grad_steps) if c.anneal_lr else c.lr
        obs, env_state = self.env.reset(env_key)  # host environments restart from the seed
        return PQNState(
            train_state=c.create_train_state(params, c.adam(lr)),
            env_state=env_state,
            obs=obs,
            episodes=Episodes.create(c.num_envs),
            steps=jnp.int32(0),
            rng=rng,
        )

    def env_step(self, s: PQNState, key):
        """One epsilon-greedy vector step: its transition, and (episodes ended, their returns' sum)."""
        action, (obs, env_state, reward, terminated, truncated, final_obs) = self.explore_step(s, key)
        episodes, ended = s.episodes.record(reward, terminated | truncated)
        transition = (s.obs, action, reward, terminated, truncated, final_obs)
        s = s.replace(env_state=env_state, obs=obs, episodes=episodes, steps=s.steps + self.config.num_envs)
        return s, (transition, ended)

    def loss_fn(self, params, batch):
        obs, action, target = batch
        q = jnp.take_along_axis(self.net.apply(params, obs), action[:, None], -1)[:, 0]
        return 0.5 * jnp.mean(jnp.square(q - target)), jnp.mean(q)

    def targets(self, params, reward, terminated, truncated, final_obs):
        """The rollout's Q(lambda) targets [num_steps, num_envs]: the rewards scaled by
        reward-scale, bootstrapped from max_a Q(s', a) at each step's next observation (the
        pre-reset one where an episode ended), no gradient through them."""
        c = self.config
        next_q = jnp.max(jax.vmap(lambda o: self.net.apply(params, o))(final_obs), -1)
        reward = reward * c.reward_scale
        return lambda_returns(reward, terminated, truncated, jax.lax.stop_gradient(next_q), c.gamma, c.gae_lambda)

    def update(self, s: PQNState, data):
        c = self.config
        rng, rollout_key, shuffle_key = jax.random.split(s.rng, 3)
        skipped_before = s.train_state.skipped
        s, (transitions, (ended, return_sum)) = jax.lax.scan(
            self.env_step, s.replace(rng=rng), jax.random.split(rollout_key, c.num_steps)
        )
        obs, action, reward, terminated, truncated, final_obs = transitions  # [num_steps, num_envs, ...]
        targets = self.targets(s.train_state.params, reward, terminated, truncated, final_obs)
        flat = jax.tree.map(lambda x: x.reshape(c.batch_size, *x.shape[2:]), (obs, action, targets))

        def epoch(ts, key):
            order = jax.random.permutation(key, c.batch_size)
            minibatches = jax.tree.map(lambda x: x[order].reshape(c.num_minibatches, -1, *x.shape[1:]), flat)

            def learn(ts, minibatch):
                ts, m = self.train_step(ts, self.loss_fn, constrain(minibatch, c.mesh()))
                return ts, (m["loss"], m["aux"])

            return jax.lax.scan(learn, ts, minibatches)

        ts, (loss, q) = jax.lax.scan(epoch, s.train_state, jax.random.split(shuffle_key, c.update_epochs))
        s = s.replace(train_state=ts)
        return s, {
            "loss": loss.mean(),
            "q": q.mean(),
            "episodes": ended.sum(),
            "return_sum": return_sum.sum(),
            "recent_return": s.episodes.recent_mean(),
            "epsilon": c.epsilon(s.steps),
            "loss_scale": ts.scaler.loss_scale,
            "skipped": ts.skipped - skipped_before,
            "halted": ts.halted,
        }

    def summary(self, rows: list[dict], state: PQNState) -> dict:
        return self.returns_summary(state.episodes.recent, state.train_state.params)


ALGORITHM = PQN
train = PQN.train
