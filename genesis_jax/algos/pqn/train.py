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

from genesis_jax.algos import onpolicy
from genesis_jax.algos.base import CARTPOLE, Algorithm, BenchWorkload, Presets, minatar_tasks
from genesis_jax.algos.explore import EpsilonGreedy, QState
from genesis_jax.algos.pqn.config import PQNConfig
from genesis_jax.run.parallel import constrain

# purejaxql's MinAtar settings (its pqn_minatar.yaml), the CNN torso.
MINATAR = {"num_envs": 128, "num_steps": 32, "update_epochs": 2, "num_minibatches": 32, "lr": 5e-4, "gae_lambda": 0.65}
MINATAR |= {"reward_scale": 1.0, "epsilon_end": 0.05, "epsilon_fraction": 0.1}
BENCH = (
    BenchWorkload("pqn-cartpole", {"env": "CartPole-v1", "total_steps": 65_536}, quick=True, vmap_seeds=True),
    BenchWorkload("pqn-cnn-minatar", {"env": "Breakout-MinAtar", "total_steps": 2_000_000, **MINATAR}, vmap_seeds=True),
)
STUDY = {"pqn:CartPole-v1": CARTPOLE}
STUDY |= minatar_tasks("pqn:{game}-MinAtar", lambda game: {"env": f"{game}-MinAtar", **MINATAR}, 2_000_000)


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
    name, config_class = "pqn", PQNConfig
    metrics = {"episodes": "episodes per seed", "loss": "nanmean", "q": "nanmean"}
    presets = Presets(tiny=onpolicy.TINY, bench=BENCH, study=STUDY)

    def setup(self) -> None:
        self.setup_q(layer_norm=True)  # LayerNorm after each hidden layer: PQN's stabiliser
        self.steps_per_row = self.config.batch_size

    def init(self, key) -> QState:
        c = self.config
        grad_steps = c.num_updates * c.update_epochs * c.num_minibatches
        return QState(**self.q_fields(key, optax.linear_schedule(c.lr, 0.0, grad_steps) if c.anneal_lr else c.lr))

    def td_loss(self, q, target):
        return 0.5 * jnp.mean(jnp.square(q - target))

    def targets(self, params, reward, terminated, truncated, final_obs):
        """The rollout's Q(lambda) targets [num_steps, num_envs]: the rewards scaled by
        reward-scale, bootstrapped from max_a Q(s', a) at each step's next observation (the
        pre-reset one where an episode ended), no gradient through them."""
        c = self.config
        next_q = jnp.max(jax.vmap(lambda o: self.net.apply(params, o))(final_obs), -1)
        reward = reward * c.reward_scale
        return lambda_returns(reward, terminated, truncated, jax.lax.stop_gradient(next_q), c.gamma, c.gae_lambda)

    def update(self, s: QState, data):
        c = self.config
        rng, rollout_key, shuffle_key = jax.random.split(s.rng, 3)
        s, (transitions, (ended, return_sum)) = jax.lax.scan(
            self.explore_step, s.replace(rng=rng), jax.random.split(rollout_key, c.num_steps)
        )
        obs, action, reward, terminated, truncated, final_obs = transitions  # [num_steps, num_envs, ...]
        targets = self.targets(s.train_state.params, reward, terminated, truncated, final_obs)
        flat = jax.tree.map(lambda x: x.reshape(c.batch_size, *x.shape[2:]), (obs, action, targets))

        def learn(ts, minibatch):
            ts, m = self.train_step(ts, self.loss_fn, constrain(minibatch, c.mesh()))
            return ts, (m["loss"], m["aux"], m["grads_finite"])

        ts, (loss, q, finite) = c.epochs(learn, s.train_state, flat, shuffle_key)
        # The loss and Q of the steps applied, as PPO's and DQN's (a skipped step's loss made it skip).
        metrics = {"loss": jnp.mean(loss, where=finite), "q": jnp.mean(q, where=finite), "episodes": ended.sum()}
        metrics["return_sum"] = return_sum.sum()
        return s.replace(train_state=ts), {**metrics, "epsilon": c.epsilon(s.steps)}


ALGORITHM = PQN
train = PQN.train
