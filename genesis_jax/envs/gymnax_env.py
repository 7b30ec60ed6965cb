"""gymnax environments behind a small vmapped interface with float32 observations."""

from __future__ import annotations

import importlib.util
import math
import sys
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.envs.spec import EnvSpec

# gymnax imports every environment it has, and some of their modules import seaborn (with it
# scipy.stats) and matplotlib.pyplot for their renderers: about 2.5 s of every process's
# start, for rendering that training never does. Stand-ins import them on first use instead.
RENDER_ONLY_MODULES = ("seaborn", "matplotlib.pyplot")


class _ImportedOnFirstUse(types.ModuleType):
    """A module created from its spec but not yet run: its first lookup of an attribute it
    lacks runs the module's code in it (as `importlib.util.LazyLoader` does, which Python 3.11's
    `import` statement itself would trigger), after which it is that module, the same object."""

    _lock = threading.RLock()  # re-entered: running seaborn uses matplotlib.pyplot

    def __getattr__(self, attr):
        with _ImportedOnFirstUse._lock:
            if type(self) is _ImportedOnFirstUse:  # not run yet (by another thread, meanwhile)
                self.__class__ = types.ModuleType
                try:
                    self.__spec__.loader.exec_module(self)
                except BaseException:
                    sys.modules.pop(self.__name__, None)  # as a failed import leaves it
                    raise
        return getattr(self, attr)


def import_gymnax():
    """gymnax, imported without running `RENDER_ONLY_MODULES` until something uses them; when an
    environment is made, not when this module is imported: gymnax computes with JAX as it
    imports, which must come after a multi-process run joins the others."""
    for name in RENDER_ONLY_MODULES:
        if name in sys.modules or (spec := importlib.util.find_spec(name)) is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _ImportedOnFirstUse
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)  # as an import sets it
    import gymnax

    return gymnax


def gymnax_spec(env_id: str, made: tuple | None = None) -> EnvSpec:
    """`env_id`'s spec; `made`: its (env, params), where the caller has made it already."""
    env, params = made or import_gymnax().make(env_id)
    obs_shape, space = tuple(env.observation_space(params).shape) or (1,), env.action_space(params)
    limit = int(getattr(params, "max_steps_in_episode", None) or 0) or None
    if hasattr(space, "n"):
        return EnvSpec(env_id, "gymnax", obs_shape, int(space.n), False, max_episode_steps=limit)
    shape = tuple(space.shape) or (1,)
    bound = lambda b: tuple(np.broadcast_to(np.asarray(b, np.float32), shape).reshape(-1).tolist())  # noqa: E731
    return EnvSpec(env_id, "gymnax", obs_shape, math.prod(shape), True, bound(space.low), bound(space.high), limit)


class GymnaxVecEnv:
    """`num_envs` copies of a gymnax env, stepped together under `vmap`.

    `step(keys, state, action)` takes one key per env and returns (obs, state, reward,
    terminated, truncated, final_obs); it resets finished envs itself and `final_obs` is
    the observation before that reset.
    """

    def __init__(self, env_id: str, num_envs: int):
        self.env, self.params = made = import_gymnax().make(env_id)
        self.spec, self.num_envs = gymnax_spec(env_id, made), num_envs

    def _shaped(self, obs):
        """float32 [num_envs, *obs_shape] (MinAtar's boolean frames included)."""
        return obs.reshape((obs.shape[0], *self.spec.obs_shape)).astype(jnp.float32)

    def reset(self, key):
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(jax.random.split(key, self.num_envs), self.params)
        return self._shaped(obs), state

    def step(self, keys, state, action):
        if self.spec.continuous:
            action = jnp.clip(action, jnp.asarray(self.spec.action_low), jnp.asarray(self.spec.action_high))
            action = action.reshape((self.num_envs, *self.env.action_space(self.params).shape))
        step = jax.vmap(self.env.step, in_axes=(0, 0, 0, None))
        obs, state, reward, terminated, truncated, info = step(keys, state, action, self.params)
        done, final_obs = terminated.astype(bool), self._shaped(info["final_observation"])
        return self._shaped(obs), state, reward.astype(jnp.float32), done, jnp.logical_and(truncated, ~done), final_obs
