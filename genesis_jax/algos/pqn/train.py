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

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from genesis_jax.algos.base import GYMNAX_README, Algorithm, BenchWorkload, StudyTask
from genesis_jax.algos.pqn.config import PQNConfig, PQNFields
from genesis_jax.amp import TrainState
from genesis_jax.amp.rules import with_precision_rules
from genesis_jax.envs.episodes import Episodes, episode_columns, final_return_summary, mean_over_seeds
from genesis_jax.envs.in_loop import in_loop_env, resolve_in_loop
from genesis_jax.nets.dense import Dense
from genesis_jax.nets.q_network import epsilon_greedy
from genesis_jax.nets.torsos import check_network, default_network, make_torso
from genesis_jax.run import plots
from genesis_jax.run.parallel import constrain

# purejaxql's MinAtar settings (its pqn_minatar.yaml), the CNN torso.
MINATAR = {"num_envs": 128, "num_steps": 32, "num_epochs": 2, "num_minibatches": 32, "lr": 5e-4, "lam": 0.65}
MINATAR |= {"reward_scale": 1.0, "epsilon_end": 0.05, "epsilon_fraction": 0.1}
EVAL_ENVS = 32  # greedy episodes at the end of a run (gymnax): the summary's eval_return
BENCH = (
    BenchWorkload("pqn-cartpole", {"env": "CartPole-v1", "total_steps": 65_536}, quick=True, vmap_seeds=True),
    BenchWorkload("pqn-cnn-minatar", {"env": "Breakout-MinAtar", "total_steps": 2_000_000, **MINATAR}, vmap_seeds=True),
)
STUDY = {
    "pqn:CartPole-v1": StudyTask({"env": "CartPole-v1"}, 500_000, 500.0, f"{GYMNAX_README}: R 500 (the maximum)"),
}


class QNetwork(nn.Module):
    """Q-values [batch, actions] in float32: an MLP with LayerNorm after each layer (PQN's
    stabiliser), or a torso of `nets.torsos` then one LayerNorm layer, and a float32 head."""

    action_dim: int
    obs_shape: Sequence[int]
    network: str = "mlp"
    hidden: Sequence[int] = (256, 256)
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @with_precision_rules  # the LayerNorms and the head in float32
    @nn.compact
    def __call__(self, obs):
        x = obs.astype(jnp.float32) if obs.dtype == jnp.bool_ else obs  # uint8 frames: the torso scales them
        widths = self.hidden
        if self.network == "mlp":
            x = x.reshape(x.shape[0], -1).astype(jnp.float32)
        else:
            torso = make_torso(self.network, self.obs_shape, dtype=self.dtype, param_dtype=self.param_dtype)
            x, widths = torso(x if len(self.obs_shape) == 3 else x.reshape(x.shape[0], -1)), self.hidden[-1:]
        for i, width in enumerate(widths):
            x = Dense(width, self.dtype, self.param_dtype, name=f"dense_{i}")(x)
            x = nn.relu(nn.LayerNorm(dtype=self.dtype, param_dtype=self.param_dtype, name=f"norm_{i}")(x))
        return Dense(self.action_dim, self.dtype, self.param_dtype, name="q_head")(x).astype(jnp.float32)


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


class PQN(Algorithm):
    name, fields, config_class, checkpoint_key = "pqn", PQNFields, PQNConfig, "step"
    score, plot_file, step_name = "final_return", "pqn.png", "step"
    tiny = dict(total_steps=256, num_envs=4, num_steps=16, num_epochs=1, num_minibatches=2, hidden=(16,))
    bench_workloads, study_tasks = BENCH, STUDY

    def setup(self) -> None:
        c, spec = self.config, resolve_in_loop(self.config, "pqn", continuous=False, instead="sac")
        network = c.network or default_network(spec.obs_shape)
        check_network(network, spec.obs_shape)
        precision = c.train_precision()
        self.net = QNetwork(spec.action_dim, spec.obs_shape, network, c.hidden, precision.compute_dtype)
        self.num_rows, self.steps_per_row, self.spec, self.last_return = c.num_updates, c.batch_size, spec, None
        self.env = in_loop_env(spec, c.num_envs, c.seed, c.vectorization, c.action_repeat)
        evaluable = spec.backend == "gymnax" and spec.max_episode_steps is not None
        self.eval_env = in_loop_env(spec, EVAL_ENVS, c.seed) if evaluable else None

    def init(self, key) -> PQNState:
        c = self.config
        net_key, env_key, rng = jax.random.split(key, 3)
        params = self.net.init(net_key, jnp.zeros((1, *self.spec.obs_shape)))
        grad_steps = c.num_updates * c.num_epochs * c.num_minibatches
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

    def epsilon(self, steps):
        c = self.config
        frac = jnp.minimum(steps / max(1.0, c.epsilon_fraction * c.total_steps), 1.0)
        return c.epsilon_start + frac * (c.epsilon_end - c.epsilon_start)

    def env_step(self, s: PQNState, key):
        """One epsilon-greedy vector step: its transition, and (episodes ended, their returns' sum)."""
        explore_key, random_key, env_key = jax.random.split(key, 3)
        n = self.config.num_envs
        q = self.net.apply(s.train_state.params, s.obs)
        action = epsilon_greedy(explore_key, random_key, q, self.epsilon(s.steps))
        obs, env_state, reward, terminated, truncated, final_obs = self.env.step(
            jax.random.split(env_key, n), s.env_state, action
        )
        episodes, ended = s.episodes.record(reward, terminated | truncated)
        transition = (s.obs, action, reward, terminated, truncated, final_obs)
        return s.replace(env_state=env_state, obs=obs, episodes=episodes, steps=s.steps + n), (transition, ended)

    def act(self, s: PQNState, greedy: bool = True):
        """`act(key, obs) -> actions`: argmax Q (greedy: `greedy_returns`'), or epsilon-greedy at
        the epsilon the run reached."""
        params, epsilon = s.train_state.params, self.epsilon(s.steps)

        def act(key, obs):
            q = self.net.apply(params, obs)
            return jnp.argmax(q, -1) if greedy else epsilon_greedy(*jax.random.split(key), q, epsilon)

        return act

    def loss_fn(self, params, batch):
        obs, action, target = batch
        q = jnp.take_along_axis(self.net.apply(params, obs), action[:, None], -1)[:, 0]
        return 0.5 * jnp.mean(jnp.square(q - target)), jnp.mean(q)

    def update(self, s: PQNState, data):
        c = self.config
        rng, rollout_key, shuffle_key = jax.random.split(s.rng, 3)
        skipped_before = s.train_state.skipped
        s, (transitions, (ended, return_sum)) = jax.lax.scan(
            self.env_step, s.replace(rng=rng), jax.random.split(rollout_key, c.num_steps)
        )
        obs, action, reward, terminated, truncated, final_obs = transitions  # [num_steps, num_envs, ...]
        batch_apply = jax.vmap(lambda o: self.net.apply(s.train_state.params, o))
        next_q = jnp.max(batch_apply(final_obs), -1)
        reward = reward * c.reward_scale
        targets = lambda_returns(reward, terminated, truncated, jax.lax.stop_gradient(next_q), c.gamma, c.lam)
        flat = jax.tree.map(lambda x: x.reshape(c.batch_size, *x.shape[2:]), (obs, action, targets))

        def epoch(ts, key):
            order = jax.random.permutation(key, c.batch_size)
            minibatches = jax.tree.map(lambda x: x[order].reshape(c.num_minibatches, -1, *x.shape[1:]), flat)

            def learn(ts, minibatch):
                ts, m = self.train_step(ts, constrain(minibatch, c.mesh()), self.loss_fn)
                return ts, (m["loss"], m["aux"])

            return jax.lax.scan(learn, ts, minibatches)

        ts, (loss, q) = jax.lax.scan(epoch, s.train_state, jax.random.split(shuffle_key, c.num_epochs))
        s = s.replace(train_state=ts)
        return s, {
            "loss": loss.mean(),
            "q": q.mean(),
            "episodes": ended.sum(),
            "return_sum": return_sum.sum(),
            "recent_return": s.episodes.recent_mean(),
            "epsilon": self.epsilon(s.steps),
            "loss_scale": ts.scaler.loss_scale,
            "skipped": ts.skipped - skipped_before,
            "halted": ts.halted,
        }

    def rows(self, chunk_metrics: dict, done: int) -> list[dict]:
        """One row per update: means over seeds (counts summed)."""
        m = {k: v.astype(float) for k, v in self.by_seed(chunk_metrics).items()}
        columns = {
            **episode_columns(m["episodes"], m["return_sum"]),
            "recent_return": mean_over_seeds(m["recent_return"]),
            **{k: m[k].mean(0).tolist() for k in ("loss", "q", "epsilon", "loss_scale")},
            "skipped": m["skipped"].sum(0).astype(int).tolist(),
            "halted": (m["halted"] > 0).any(0).tolist(),
        }
        return self.rows_of(done, columns)

    def greedy_returns(self, params, key):
        """The return of each of EVAL_ENVS fresh episodes under the greedy policy (epsilon 0),
        every one ended within the time limit."""
        env, reset_key, key = self.eval_env, *jax.random.split(key)
        obs, env_state = env.reset(reset_key)

        def step(carry, key):
            obs, env_state, total, running = carry
            action = jnp.argmax(self.net.apply(params, obs), -1)
            obs, env_state, reward, terminated, truncated, _ = env.step(
                jax.random.split(key, EVAL_ENVS), env_state, action
            )
            return (obs, env_state, total + jnp.where(running, reward, 0.0), running & ~(terminated | truncated)), None

        start = (obs, env_state, jnp.zeros(EVAL_ENVS, jnp.float32), jnp.ones(EVAL_ENVS, bool))
        (_, _, total, _), _ = jax.lax.scan(step, start, jax.random.split(key, self.spec.max_episode_steps))
        return total

    def summary(self, rows: list[dict], state: PQNState) -> dict:
        evaluation = {}
        if self.eval_env is not None:
            evaluate = jax.jit(self.greedy_returns if self.num_seeds == 1 else jax.vmap(self.greedy_returns))
            keys = self.seed_keys()  # seed k's evaluation is a 1-seed run's with seed + k
            returns = np.asarray(evaluate(state.train_state.params, keys))
            per_seed_eval = returns.reshape(self.num_seeds, EVAL_ENVS).mean(1).tolist()
            evaluation = {
                "eval_return": float(np.mean(per_seed_eval)),
                "eval_return_per_seed": per_seed_eval,
                "eval_return_is": f"the mean return of {EVAL_ENVS} greedy episodes (epsilon 0) after training",
            }
        return {
            "env": self.config.env,
            "env_backend": self.spec.backend,
            "num_seeds": self.num_seeds,
            "total_steps": rows[-1]["step"] if rows else 0,
            **final_return_summary(state.episodes.recent, self.num_seeds),
            **evaluation,
        }

    def postfix(self, row: dict) -> dict:
        self.last_return = row["recent_return"] if row["recent_return"] is not None else self.last_return
        return {"eps": f"{row['epsilon']:.2f}", **({"ret": f"{self.last_return:.1f}"} if self.last_return else {})}

    def plot(self, rows: list[dict], file) -> None:
        plots.plot_curves(rows, "step", ["recent_return"], file, title=self.title(), log_y=False, twin_keys=["loss"])

    def describe(self, s: dict) -> str:
        evaluated = f"eval_return={s['eval_return']:.1f} " if "eval_return" in s else ""
        return (
            f"PQN {s['env']} [{s['precision']}] final_return={s['final_return']:.1f} {evaluated}"
            f"steps/s={s['steps_per_second']:.0f} compile={s['compile_seconds']:.1f}s "
            f"skipped={s['skipped_updates']}/{s['total_updates']}"
        )


ALGORITHM = PQN
train = PQN.train
