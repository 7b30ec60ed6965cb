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
from flax import struct

from genesis_jax.algos import base
from genesis_jax.algos.base import Algorithm, BenchWorkload, StudyTask
from genesis_jax.algos.dqn.config import DQNConfig, minatar
from genesis_jax.algos.explore import EpsilonGreedy
from genesis_jax.amp import TrainState
from genesis_jax.data.replay import available_memory_bytes, buffer_bytes, check_replay_sizes, make_replay
from genesis_jax.envs.episodes import RECENT, Episodes
from genesis_jax.envs.gymnasium_env import observation_dtype
from genesis_jax.envs.in_loop import resolve_in_loop
from genesis_jax.nets.q_network import QNetwork
from genesis_jax.nets.torsos import check_network, default_network
from genesis_jax.run.parallel import constrain


class DQNState(struct.PyTreeNode):
    train_state: TrainState
    target_params: dict
    buffer: object  # flashbax's buffer state
    env_state: object
    obs: jax.Array
    episode_return: jax.Array  # each environment's running return
    recent_returns: jax.Array  # [RECENT] the newest finished episodes' returns (NaN: none yet)
    episodes: jax.Array  # finished episodes so far
    steps: jax.Array  # environment steps so far
    rng: jax.Array

    def replay_count(self) -> tuple[str, jax.Array, int]:
        """What `buffer` was given, for a restore's checks (run.checkpoint): each step adds its transition."""
        return "steps", self.steps, 1


def td_targets(q_next_target, q_next_online, reward, terminated, gamma: float):
    """float32 r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a)); pass the
    target's Q as `q_next_online` for plain DQN's max."""
    next_q = jnp.take_along_axis(q_next_target, jnp.argmax(q_next_online, -1)[:, None], -1)[:, 0]
    return (reward + gamma * (1.0 - terminated) * next_q).astype(jnp.float32)


def td_loss(q, target, huber_delta: float | None):
    """float32 mean Huber loss (None: the squared error, as CleanRL's and PureJaxRL's DQN)."""
    error = q.astype(jnp.float32) - target
    return jnp.mean(jnp.square(error) if huber_delta is None else optax.huber_loss(error, delta=huber_delta))


def minatar_settings(game: str) -> dict:
    """`minatar`'s settings for `game`: the fields it sets apart from DQN's defaults, its budget left out."""
    defaults, chosen = DQNConfig().to_dict(), minatar(f"{game}-MinAtar").to_dict()
    return {k: v for k, v in chosen.items() if v != defaults[k] and k != "total_steps"}


BENCH = (
    BenchWorkload(  # MinAtar's settings, with the CNN
        "dqn-cnn-minatar",
        {**minatar_settings("Breakout"), "total_steps": 200_000},
        vmap_seeds=True,
    ),
)
STUDY = {
    "dqn:CartPole-v1": StudyTask({"env": "CartPole-v1"}, 500_000, 500.0, f"{base.GYMNAX_README}: R 500 (the maximum)"),
    "dqn:Acrobot-v1": StudyTask({"env": "Acrobot-v1"}, 500_000, -80.0, f"{base.GYMNAX_README}: R -80"),
    **{
        f"dqn:{game}-MinAtar": StudyTask(
            minatar_settings(game),
            5_000_000,
            None,
            base.NO_PUBLISHED_REFERENCE,
        )
        for game in base.MINATAR_GAMES
    },
}


class DQN(EpsilonGreedy, Algorithm):
    name, config_class, row_key, checkpoint_key = "dqn", DQNConfig, "row", "step"  # a row: steps_per_row env steps
    metrics = {"episodes": "episodes", "recent_return": "nanmean per seed", "loss": "nanmean", "q": "nanmean"}
    metrics |= {"updates": "sum", "buffer_size": "sum"}
    tiny = dict(
        total_steps=400,
        num_envs=2,
        train_frequency=2,
        steps_per_row=200,
        learning_starts=100,
        hidden=(16,),
        buffer_size=400,
        batch_size=16,
        target_update_interval=2,
    )
    bench_workloads, study_tasks = BENCH, STUDY

    def setup(self) -> None:
        c, spec = self.config, resolve_in_loop(self.config, "dqn", continuous=False, instead="sac")
        self.steps_per_row, self.spec = c.steps_per_row, spec
        precision, network = c.train_precision(), c.network or default_network(spec.obs_shape)
        check_network(network, spec.obs_shape)
        self.net = QNetwork(spec.action_dim, spec.obs_shape, network, c.hidden, c.activation, precision.compute_dtype)
        minatar = spec.backend == "gymnax" and len(spec.obs_shape) == 3  # gymnax's frames: MinAtar's 0/1, as bool
        obs = jnp.zeros(spec.obs_shape, bool if minatar else observation_dtype(spec))  # else Atari's uint8, or float32
        example = dict(obs=obs, action=jnp.int32(0), reward=jnp.float32(0), terminated=jnp.bool_(0), next_obs=obs)
        storage = precision.compute_dtype if c.replay_dtype == "compute" else jnp.float32
        self.replay = make_replay(example, c.buffer_size, c.batch_size, storage_dtype=storage)
        self.buffer_bytes = buffer_bytes(jax.eval_shape(self.replay.init)) * self.num_seeds
        check_replay_sizes(c.buffer_size, c.batch_size, self.buffer_bytes, available_memory_bytes())

    def init(self, key) -> DQNState:
        net_key, env_key, rng = jax.random.split(key, 3)
        params = self.net.init(net_key, jnp.zeros((1, *self.spec.obs_shape)))
        obs, env_state = self.env.reset(env_key)  # host environments restart from the seed
        train_state = self.config.create_train_state(params, self.config.adam(self.config.lr))
        return DQNState(
            train_state=train_state,
            target_params=jax.tree.map(jnp.copy, train_state.params),  # as stored: float16 in fp16-full
            buffer=self.replay.init(),
            env_state=env_state,
            obs=obs,
            episode_return=jnp.zeros(self.config.num_envs, jnp.float32),
            recent_returns=jnp.full(RECENT, jnp.nan, jnp.float32),
            episodes=jnp.int32(0),
            steps=jnp.int32(0),
            rng=rng,
        )

    def env_step(self, s: DQNState, key):
        """One epsilon-greedy vector step, its transitions added to the buffer."""
        action, (obs, env_state, reward, terminated, truncated, final_obs) = self.explore_step(s, key)
        transition = dict(obs=s.obs, action=action, reward=reward, terminated=terminated, next_obs=final_obs)
        # The bookkeeping of envs.episodes, on DQNState's own fields (the checkpoints' layout).
        episodes = Episodes(s.episode_return, s.recent_returns, s.episodes)
        episodes, ended = episodes.record(reward, terminated | truncated)
        s = s.replace(
            buffer=self.replay.add(s.buffer, transition),  # stored compactly: MinAtar's 0/1 floats as uint8
            env_state=env_state,
            obs=obs,
            episode_return=episodes.running,
            recent_returns=episodes.recent,
            episodes=episodes.count,
            steps=s.steps + self.config.num_envs,
        )
        return s, ended

    def loss_fn(self, params, batch):
        obs, action, target = batch
        q = jnp.take_along_axis(self.net.apply(params, obs), action[:, None], -1)[:, 0]
        return td_loss(q, target, self.config.huber_delta), jnp.mean(q)

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
        rng, key = jax.random.split(s.rng)
        skipped_before = s.train_state.skipped
        keys = jax.random.split(key, self.config.steps_per_row // self.config.train_frequency)
        s, (learned, loss, q, episodes, return_sum) = jax.lax.scan(self.iteration, s.replace(rng=rng), keys)
        count, ts = learned.sum(), s.train_state
        per_update = lambda x: jnp.where(count > 0, jnp.where(learned, x, 0.0).sum() / count, jnp.nan)  # noqa: E731
        return s, {
            "loss": per_update(loss),
            "q": per_update(q),
            "episodes": episodes.sum(),
            "return_sum": return_sum.sum(),
            "recent_return": jnp.nanmean(s.recent_returns),
            "epsilon": self.config.epsilon(s.steps),
            "updates": ts.step,
            "buffer_size": self.replay.size(s.buffer),
            "loss_scale": ts.scaler.loss_scale,
            "skipped": ts.skipped - skipped_before,
            "halted": ts.halted,
        }

    def summary(self, rows: list[dict], state: DQNState) -> dict:
        return {
            **self.returns_summary(state.recent_returns, state.train_state.params),
            "buffer_bytes": self.buffer_bytes,
            "buffer_dtypes": {k: str(leaf.stored) for k, leaf in self.replay.added.items()},
        }


ALGORITHM = DQN
train = DQN.train
