"""Acting by argmax Q, written once for DQN and PQN: epsilon-greedy exploration (its fields, its
schedule, the action it picks) and `EpsilonGreedy`, the mixin that gives both algorithms their
Q-network, the fields their states share, the exploring step and the `act` hook.

Epsilon falls linearly from `epsilon_start` to `epsilon_end` over the first `epsilon_fraction`
of the run's environment steps (CleanRL's `exploration_fraction`), then stays there: a short
run explores and then exploits, as a long one does.

>>> from genesis_jax.algos.dqn import DQNConfig
>>> config = DQNConfig(total_steps=50_000)  # DQN: 1 -> 0.05 over the first half
>>> [round(float(config.epsilon(steps)), 3) for steps in (0, 12_500, 25_000, 50_000)]
[1.0, 0.525, 0.05, 0.05]
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from genesis_jax.amp import TrainState
from genesis_jax.envs.episodes import running_returns
from genesis_jax.nets.q_network import QNetwork
from genesis_jax.nets.torsos import check_network, default_network
from genesis_jax.run.config import INT32_STEPS, UNIT_INTERVAL


@dataclasses.dataclass(frozen=True)
class EpsilonGreedyFields:
    """Epsilon-greedy exploration in an environment with discrete actions, its schedule relative
    to the run's `total_steps` (a field group, composed with `ActingFields`)."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id with discrete actions (CartPole-v1, Breakout-MinAtar, ALE/Pong-v5, ...)."""
    epsilon_start: float = 1.0
    """Exploration's epsilon at the start."""
    epsilon_end: float = 0.05
    """Exploration's epsilon from epsilon-fraction of the run to its end."""
    epsilon_fraction: float = 0.5
    """The fraction of the run's environment steps (total-steps in whole rows) over which epsilon falls linearly."""

    FIELD_BOUNDS = {n: UNIT_INTERVAL for n in ("epsilon_start", "epsilon_end", "epsilon_fraction")}
    FIELD_BOUNDS |= {"total_steps": INT32_STEPS}  # QState.steps: past it, epsilon and learning-starts wrap

    @property
    def steps_run(self) -> int:
        """The environment steps (one seed's) the run takes: total-steps, less what does not fill a row."""
        return self.total_steps

    @property
    def epsilon_horizon(self) -> float:
        """Environment steps (one seed's) over which epsilon falls: epsilon-fraction of the steps
        that run (a total-steps rounded down to whole rows would leave epsilon short of its end), at least 1."""
        return max(1.0, self.epsilon_fraction * self.steps_run)

    @property
    def epsilon_follows_budget(self) -> bool:
        """Whether `epsilon_horizon` moves with total-steps (DQN's deprecated epsilon-steps fixes it)."""
        return True

    def budget_schedules(self) -> list[str]:  # what follows total-steps (`run.config.budget_schedules`)
        return ["epsilon's fall (epsilon-fraction of the steps that run)"] if self.epsilon_follows_budget else []

    def epsilon(self, steps):
        """Epsilon after `steps` environment steps (one seed's): linear, then flat at epsilon-end."""
        fall = jnp.minimum(steps / self.epsilon_horizon, 1.0)
        return (1.0 - fall) * self.epsilon_start + fall * self.epsilon_end  # exactly the start at 0, the end at 1


def epsilon_greedy(explore_key, random_key, q_values, epsilon):
    """Actions [batch] from Q-values [batch, actions]: each row's argmax, or with probability
    `epsilon` a uniformly random action (`explore_key` decides which rows, `random_key` draws them).

    >>> import jax, jax.numpy as jnp
    >>> q = jnp.array([[0.0, 1.0], [2.0, 0.0]])
    >>> epsilon_greedy(jax.random.PRNGKey(0), jax.random.PRNGKey(1), q, 0.0).tolist()
    [1, 0]
    """
    rows, actions = q_values.shape
    explore = jax.random.uniform(explore_key, (rows,)) < epsilon
    return jnp.where(explore, jax.random.randint(random_key, (rows,), 0, actions), jnp.argmax(q_values, -1))


class QState(struct.PyTreeNode):
    """The state of an algorithm that acts by argmax Q (PQN's whole state; DQN's adds its own)."""

    train_state: TrainState
    env_state: object
    obs: jax.Array
    episode_return: jax.Array  # each environment's running return
    steps: jax.Array  # environment steps so far
    rng: jax.Array


class EpsilonGreedy:
    """What DQN and PQN share as algorithms that act by argmax Q (a mixin, listed before
    `Algorithm`). It reads `config` (with `EpsilonGreedyFields`), a `QState` and the algorithm's
    `td_loss(q, target)`, its loss of the Q-values of the actions taken."""

    def setup_q(self, **net) -> None:
        """`spec` (a discrete-action environment, else refused naming SAC) and `net`, the
        `QNetwork` (`net`: its own settings) on the configured torso, in the compute dtype."""
        from genesis_jax.envs.in_loop import resolve_in_loop  # gymnax's import starts JAX's backends

        c = self.config
        self.spec = spec = resolve_in_loop(c, self.name, continuous=False, instead="sac")
        network = c.network or default_network(spec.obs_shape)
        check_network(network, spec.obs_shape)
        unused = [f for f in ("hidden", "activation") if hasattr(c, f) and getattr(c, f) != getattr(type(c), f)]
        # the torso alone feeds the Q head; a recorded run (`load`, a resume) is built as it ran
        if network != "mlp" and not net.get("layer_norm") and unused and not self.recorded:
            them, shape = ("them", "shape") if len(unused) > 1 else ("it", "shapes")
            size = " (256 wide, 2 blocks)" if network == "resmlp" else ""
            raise ValueError(
                f"{' and '.join(unused)} {shape} {self.name}'s mlp network only; its {network} torso{size} does not "
                f"use {them}: leave {them} out, or give network mlp"
            )
        dtype = c.train_precision().compute_dtype
        self.net = QNetwork(spec.action_dim, spec.obs_shape, network, c.hidden, dtype=dtype, **net)

    def q_fields(self, key, lr) -> dict:
        """The initial `QState`'s fields: the train state (Adam at `lr`), the environments reset
        (host ones from the seed), their running returns, the steps so far and the key."""
        net_key, env_key, rng = jax.random.split(key, 3)
        # One program: run eagerly (an init that resets host environments is), Flax's init compiles op by op.
        params = jax.jit(self.net.init)(net_key, jnp.zeros((1, *self.spec.obs_shape)))
        obs, env_state = self.env.reset(env_key)
        train_state = self.config.create_train_state(params, self.config.adam(lr))
        returns, steps = jnp.zeros(self.config.num_envs, jnp.float32), jnp.int32(0)
        return dict(train_state=train_state, env_state=env_state, obs=obs, episode_return=returns, steps=steps, rng=rng)

    def explore_step(self, s, key):
        """One epsilon-greedy vector step from `s.obs` at the epsilon of `s.steps`: the state
        after it, and ((obs, action, reward, terminated, truncated, final_obs), (episodes ended,
        their returns' sum))."""
        explore_key, random_key, env_key = jax.random.split(key, 3)
        q = self.net.apply(s.train_state.params, s.obs)
        action = epsilon_greedy(explore_key, random_key, q, self.config.epsilon(s.steps))
        obs, env_state, reward, terminated, truncated, final_obs = self.env.step(
            jax.random.split(env_key, self.config.num_envs), s.env_state, action
        )
        episode_return, ended = running_returns(s.episode_return, reward, terminated | truncated)
        transition = (s.obs, action, reward, terminated, truncated, final_obs)
        s = s.replace(env_state=env_state, obs=obs, episode_return=episode_return, steps=s.steps + self.config.num_envs)
        return s, (transition, ended)

    def loss_fn(self, params, batch):
        """(`td_loss(q, target)`, the mean Q) of Q(obs, action) [batch] of the actions taken, on the
        minibatch (obs, action, target): the `train_step` loss of both algorithms."""
        obs, action, target = batch
        q = jnp.take_along_axis(self.net.apply(params, obs), action[:, None], -1)[:, 0]
        return self.td_loss(q, target), jnp.mean(q)

    def act(self, s, greedy: bool = True):
        """`act(key, obs) -> actions`: argmax Q (greedy: as `eval_return` plays), or
        epsilon-greedy at the epsilon the run reached."""
        params, epsilon = s.train_state.params, self.config.epsilon(s.steps)

        def act(key, obs):
            q = self.net.apply(params, obs)
            return jnp.argmax(q, -1) if greedy else epsilon_greedy(*jax.random.split(key), q, epsilon)

        return act
