"""Acting by argmax Q, written once for DQN and PQN: epsilon-greedy exploration (its fields, its
schedule, the action it picks), the greedy evaluation that gives the summary's `eval_return`,
and `EpsilonGreedy`, the mixin that gives both algorithms these.

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
import numpy as np

from genesis_jax.envs.episodes import final_return_summary
from genesis_jax.envs.in_loop import in_loop_env
from genesis_jax.run.config import UNIT_INTERVAL

EVAL_ENVS = 32  # greedy episodes at the end of a run (gymnax): the summary's eval_return


@dataclasses.dataclass(frozen=True)
class EpsilonGreedyFields:
    """Epsilon-greedy exploration, its schedule relative to the run's `total_steps` (a field
    group, composed with `RunFields`)."""

    epsilon_start: float = 1.0
    """Exploration's epsilon at the start."""
    epsilon_end: float = 0.05
    """Exploration's epsilon from epsilon-fraction of the run to its end."""
    epsilon_fraction: float = 0.5
    """The fraction of total-steps over which epsilon falls linearly from start to end."""

    FIELD_BOUNDS = {n: UNIT_INTERVAL for n in ("epsilon_start", "epsilon_end", "epsilon_fraction")}

    @property
    def epsilon_horizon(self) -> float:
        """Environment steps (one seed's) over which epsilon falls: epsilon-fraction of total-steps, at least 1."""
        return max(1.0, self.epsilon_fraction * self.total_steps)

    def epsilon(self, steps):
        """Epsilon after `steps` environment steps (one seed's): linear, then flat at epsilon-end."""
        fall = jnp.minimum(steps / self.epsilon_horizon, 1.0)
        return self.epsilon_start + fall * (self.epsilon_end - self.epsilon_start)


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


def q_policy(apply, params, epsilon):
    """`act(key, obs) -> actions` of the template's `act` hook: argmax Q where `epsilon` is None
    (greedy), else epsilon-greedy at `epsilon`. `apply(params, obs)` gives the Q-values."""

    def act(key, obs):
        q = apply(params, obs)
        return jnp.argmax(q, -1) if epsilon is None else epsilon_greedy(*jax.random.split(key), q, epsilon)

    return act


def eval_env(spec, seed: int):
    """The greedy evaluation's EVAL_ENVS environments: gymnax ones with a time limit (every
    episode ends under jit), else None (no evaluation)."""
    if spec.backend != "gymnax" or spec.max_episode_steps is None:
        return None
    return in_loop_env(spec, EVAL_ENVS, seed)


def greedy_returns(env, max_steps: int, apply, params, key):
    """The return of each of `env`'s fresh episodes under argmax Q (epsilon 0), every one
    played to its end within `max_steps` (the time limit): float32 [episodes]."""
    reset_key, key = jax.random.split(key)
    obs, env_state = env.reset(reset_key)
    episodes = obs.shape[0]

    def step(carry, key):
        obs, env_state, total, running = carry
        action = jnp.argmax(apply(params, obs), -1)
        obs, env_state, reward, terminated, truncated, _ = env.step(jax.random.split(key, episodes), env_state, action)
        return (obs, env_state, total + jnp.where(running, reward, 0.0), running & ~(terminated | truncated)), None

    start = (obs, env_state, jnp.zeros(episodes, jnp.float32), jnp.ones(episodes, bool))
    (_, _, total, _), _ = jax.lax.scan(step, start, jax.random.split(key, max_steps))
    return total


def greedy_evaluation(algo, params) -> dict:
    """The summary's `eval_return` (and per seed) of a Q-learning `algo` (its `net` and `spec`):
    the mean return of EVAL_ENVS greedy episodes after training, seed k's from the key of a
    1-seed run with seed + k. Empty where `eval_env` gives no environments."""
    env = eval_env(algo.spec, algo.config.seed)
    if env is None:
        return {}

    def returns(params, key):
        return greedy_returns(env, algo.spec.max_episode_steps, algo.net.apply, params, key)

    evaluate = jax.jit(returns if algo.num_seeds == 1 else jax.vmap(returns))
    per_seed = np.asarray(evaluate(params, algo.seed_keys())).reshape(algo.num_seeds, EVAL_ENVS).mean(1).tolist()
    return {
        "eval_return": float(np.mean(per_seed)),
        "eval_return_per_seed": per_seed,
        "eval_return_is": f"the mean return of {EVAL_ENVS} greedy episodes (epsilon 0) after training",
    }


class EpsilonGreedy:
    """What DQN and PQN share as algorithms that act by argmax Q (a mixin, listed before
    `Algorithm`): the exploring step, the `act` hook and the summary's returns (training and
    greedy). It reads `config` (with `EpsilonGreedyFields`), `net` (the Q-values), `env` and
    `spec`, and a state with `train_state`, `obs`, `env_state` and `steps`."""

    def explore_step(self, s, key):
        """One epsilon-greedy vector step from `s.obs` at the epsilon of `s.steps`: (the actions,
        `self.env.step`'s (obs, env_state, reward, terminated, truncated, final_obs))."""
        explore_key, random_key, env_key = jax.random.split(key, 3)
        q = self.net.apply(s.train_state.params, s.obs)
        action = epsilon_greedy(explore_key, random_key, q, self.config.epsilon(s.steps))
        return action, self.env.step(jax.random.split(env_key, self.config.num_envs), s.env_state, action)

    def act(self, s, greedy: bool = True):
        """`act(key, obs) -> actions`: argmax Q (greedy: as `eval_return` plays), or
        epsilon-greedy at the epsilon the run reached."""
        return q_policy(self.net.apply, s.train_state.params, None if greedy else self.config.epsilon(s.steps))

    def returns_summary(self, recent, params) -> dict:
        """The summary's returns: `final_return` (the last finished training episodes, `recent`
        [seeds, RECENT]) and `eval_return` (greedy, after training)."""
        return {**final_return_summary(recent, self.num_seeds), **greedy_evaluation(self, params)}
