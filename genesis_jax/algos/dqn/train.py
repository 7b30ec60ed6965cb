"""DQN on the algorithm template: double DQN, a target network updated by copy or Polyak
averaging, linear epsilon-greedy exploration, a Huber or squared TD loss and a flashbax replay
buffer, the whole loop under jit (PureJaxRL's and CleanRL's DQN). gymnax environments step inside
it; gymnasium ones (ALE Atari) on the host through `io_callback`, restarted from the seed on resume.

One template row is `steps_per_row` environment steps, in iterations of `train_frequency` steps
(vector steps whose transitions enter the buffer), one gradient step once past `learning_starts` (its batch's rows
split over `devices`), a target update at multiples of `target_update_interval`. The buffer is checkpointed too.

>>> from genesis_jax.algos.dqn import DQNConfig, train
>>> result = train(DQNConfig(precision="fp16"))                     # doctest: +SKIP
>>> result.summary["final_return"], result.summary["buffer_bytes"]  # doctest: +SKIP
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from genesis_jax.algos import base
from genesis_jax.algos.base import Algorithm, BenchWorkload, Presets
from genesis_jax.algos.dqn.config import DQNConfig, minatar
from genesis_jax.algos.explore import EpsilonGreedy, QState
from genesis_jax.amp import TrainState
from genesis_jax.envs.gymnasium_env import observation_dtype
from genesis_jax.run.checkpoint import CountsReplay
from genesis_jax.run.parallel import constrain


class DQNState(QState, CountsReplay):
    target_params: dict
    buffer: object  # flashbax's buffer state

    def replay_count(self) -> tuple[str, jax.Array, int]:
        """What `buffer` was given, for a restore's checks (run.checkpoint): each step adds its transition."""
        return "steps", self.steps, 1


def td_targets(q_next_target, q_next_online, reward, terminated, gamma: float):
    """float32 r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)); pass the
    target's Q as `q_next_online` for plain DQN's max."""
    next_q = jnp.take_along_axis(q_next_target, jnp.argmax(q_next_online, -1)[:, None], -1)[:, 0]
    return (reward + gamma * (1.0 - terminated) * next_q).astype(jnp.float32)


def minatar_settings(game: str) -> dict:
    """`minatar`'s settings for `game`: the fields it sets apart from DQN's defaults, its budget left out."""
    defaults, chosen = DQNConfig().to_dict(), minatar(f"{game}-MinAtar").to_dict()
    return {k: v for k, v in chosen.items() if v != defaults[k] and k != "total_steps"}


# MinAtar's settings, with the CNN.
BENCH = (BenchWorkload("dqn-cnn-minatar", {**minatar_settings("Breakout"), "total_steps": 200_000}, vmap_seeds=True),)
STUDY = {"dqn:CartPole-v1": base.CARTPOLE, "dqn:Acrobot-v1": base.ACROBOT}
STUDY |= base.minatar_tasks("dqn:{game}-MinAtar", minatar_settings, 5_000_000)

# The generic tests' few-row run: a tiny network, no greedy evaluation (the generic tests' runs need none).
TINY = dict(total_steps=400, num_envs=2, train_frequency=2, steps_per_row=200, learning_starts=100, buffer_size=400)
TINY |= dict(batch_size=16, target_update_interval=2, hidden=(16,), eval_episodes=0)


class DQN(EpsilonGreedy, Algorithm):
    name, config_class, row_key = "dqn", DQNConfig, "row"  # a row: steps_per_row env steps
    metrics = {
        "episodes": "episodes per seed",
        "loss": "nanmean",
        "q": "nanmean",
        "updates": "sum",
        "buffer_size": "sum",
    }
    presets = Presets(tiny=TINY, bench=BENCH, study=STUDY)

    def setup(self) -> None:
        c = self.config
        if not self.recorded:
            c.refuse_unlearned()
        self.setup_q(activation=c.activation)
        self.steps_per_row, spec = c.steps_per_row, self.spec
        minatar = spec.backend == "gymnax" and len(spec.obs_shape) == 3  # gymnax's frames: MinAtar's 0/1, as bool
        obs = jnp.zeros(spec.obs_shape, bool if minatar else observation_dtype(spec))  # else uint8 pixels, or float32
        example = dict(obs=obs, action=jnp.int32(0), reward=jnp.float32(0), terminated=jnp.bool_(0), next_obs=obs)
        storage = c.train_precision().compute_dtype if c.replay_dtype == "compute" else jnp.float32
        self.replay = self.make_replay(example, c.buffer_size, c.batch_size, storage_dtype=storage)

    def init(self, key) -> DQNState:
        s = self.q_fields(key, self.config.lr)
        target = jax.tree.map(jnp.copy, s["train_state"].params)  # as stored: float16 in fp16-full
        return DQNState(**s, target_params=target, buffer=self.replay.init())

    def env_step(self, s: DQNState, key):
        """One epsilon-greedy vector step, its transitions added to the buffer (stored compactly:
        MinAtar's 0/1 floats as uint8)."""
        s, ((obs, action, reward, terminated, _, final_obs), ended) = self.explore_step(s, key)
        transition = dict(obs=obs, action=action, reward=reward, terminated=terminated, next_obs=final_obs)
        return s.replace(buffer=self.replay.add(s.buffer, transition)), ended

    def td_loss(self, q, target):
        """float32 mean Huber loss (huber-delta None: the squared error, as CleanRL's and PureJaxRL's DQN)."""
        error, delta = q.astype(jnp.float32) - target, self.config.huber_delta
        return jnp.mean(jnp.square(error) if delta is None else optax.huber_loss(error, delta=delta))

    def learn(self, train_state: TrainState, s: DQNState, key):
        """One gradient step, the TD target in float32 outside the gradient; `s` only read (not copied by cond)."""
        c, b = self.config, constrain(self.replay.sample(s.buffer, key), self.config.mesh())  # rows over devices
        q_next_target = self.net.apply(s.target_params, b["next_obs"])
        q_next_online = self.net.apply(train_state.params, b["next_obs"]) if c.double_q else q_next_target
        target = td_targets(q_next_target, q_next_online, b["reward"], b["terminated"], c.gamma)
        train_state, m = self.train_step(train_state, self.loss_fn, (b["obs"], b["action"], target))
        return train_state, (m["loss"], m["aux"], m["grads_finite"])

    def iteration(self, s: DQNState, key):
        """train_frequency environment steps, then maybe a gradient step and a target update."""
        c = self.config
        keys = jax.random.split(key, c.train_frequency // c.num_envs + 1)
        s, (episodes, return_sum) = jax.lax.scan(self.env_step, s, keys[1:])
        learning = (s.steps > c.learning_starts) & self.replay.can_sample(s.buffer)
        idle = (jnp.float32(0), jnp.float32(0), jnp.bool_(False))
        learn = lambda ts, key: self.learn(ts, s, key)  # noqa: E731
        ts, (loss, q, finite) = jax.lax.cond(learning, learn, lambda ts, _: (ts, idle), s.train_state, keys[0])
        s, online = s.replace(train_state=ts), ts.params
        mix = (lambda t: online) if c.tau == 1.0 else (lambda t: optax.incremental_update(online, t, c.tau))
        target = jax.lax.cond(s.steps % c.target_update_interval == 0, mix, lambda t: t, s.target_params)
        return s.replace(target_params=target), (learning & finite, loss, q, episodes.sum(), return_sum.sum())

    def update(self, s: DQNState, data):
        before, (rng, key) = s.train_state.step, jax.random.split(s.rng)
        keys = jax.random.split(key, self.config.steps_per_row // self.config.train_frequency)
        s, (learned, loss, q, episodes, return_sum) = jax.lax.scan(self.iteration, s.replace(rng=rng), keys)
        return s, {
            "loss": jnp.mean(loss, where=learned),  # NaN (null in metrics.jsonl) where no step learned
            "q": jnp.mean(q, where=learned),
            "epsilon": self.config.epsilon(s.steps),
            "episodes": episodes.sum(),
            "return_sum": return_sum.sum(),
            "updates": s.train_state.step - before,  # the row's, as SAC's
            "buffer_size": self.replay.size(s.buffer),
        }

    def summary(self, rows: list[dict], state: DQNState) -> dict:
        buffer_dtypes = {k: str(leaf.stored) for k, leaf in self.replay.added.items()}
        return {"buffer_bytes": self.buffer_bytes, "buffer_dtypes": buffer_dtypes}


ALGORITHM = DQN
train = DQN.train
