"""Vectorised environments stepped from inside a compiled loop, whatever backend holds them:
gymnax environments inside the program, gymnasium ones on the host through `io_callback`
(their state lives on the host, so it is not checkpointed: they restart from the seed)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv, io_callback_step, is_atari
from genesis_jax.envs.gymnax_env import GymnaxVecEnv
from genesis_jax.envs.registry import resolve_env
from genesis_jax.envs.spec import EnvSpec


@dataclasses.dataclass(frozen=True)
class InLoopEnv:
    """`step(keys, env_state, action) -> (obs, env_state, reward, terminated, truncated,
    final_obs)` and `reset(key) -> (obs, env_state)`, both callable under jit; `host` is the
    gymnasium environments where they run on the host (None on gymnax)."""

    step: Callable
    reset: Callable
    host: GymnasiumVecEnv | None = None

    def close(self) -> None:
        if self.host is not None:
            self.host.close()


def in_loop_env(spec: EnvSpec, num_envs: int, seed: int, vectorization="sync", action_repeat=1) -> InLoopEnv:
    """`num_envs` copies of `spec`'s environment for a compiled loop; host ones (gymnasium,
    EnvPool) reset from `seed`."""
    if spec.backend == "gymnax":
        env = GymnaxVecEnv(spec.env_id, num_envs)
        return InLoopEnv(env.step, env.reset)
    if spec.backend == "envpool":
        from genesis_jax.envs.envpool_env import EnvPoolVecEnv  # an optional dependency

        host = EnvPoolVecEnv(spec.env_id, num_envs, seed)
    else:
        host = GymnasiumVecEnv(spec.env_id, num_envs, vectorization, action_repeat)
    return InLoopEnv(io_callback_step(host), lambda _key: (host.reset(seed=seed), ()), host)


def resolve_in_loop(config, algorithm: str, *, continuous: bool | None = None, instead: str = "") -> EnvSpec:
    """`config.env` resolved for `algorithm`, whose environments step inside its compiled loop:
    a ValueError, before anything is built, for the other kind of action space (naming the
    algorithm to use `instead`; `continuous` None: either kind) or for seeds and devices that
    host environments cannot have."""
    spec = resolve_env(config.env, config.env_backend)
    if continuous is not None and spec.continuous != continuous:
        want, have = ("continuous", "discrete") if continuous else ("discrete", "continuous")
        raise ValueError(f"{algorithm} needs {want} actions; {config.env} has {have} ones: use {instead}")
    if spec.backend != "gymnax" and (config.num_seeds > 1 or config.devices > 1):
        given = f"num-seeds {config.num_seeds}" if config.num_seeds > 1 else f"devices {config.devices}"
        raise ValueError(f"{given} needs a JAX environment (env backend gymnax); {config.env} runs on {spec.backend}")
    if spec.backend != "gymnasium" and (config.vectorization != "sync" or config.action_repeat != 1):
        raise ValueError(  # they would be ignored: say so rather than run without them
            f"vectorization and action-repeat act on gymnasium environments; {config.env} runs on {spec.backend}"
        )
    return spec


def refuse_unapplied_settings(spec: EnvSpec, config) -> None:
    """Refuses, for a new run, a setting its environment would not apply while the run records
    it: action-repeat for an Atari game, whose preprocessing skips 4 frames per action itself."""
    if spec.backend == "gymnasium" and config.action_repeat != 1 and is_atari(spec.env_id):
        raise ValueError(
            f"{config.env} skips 4 frames per action itself (its Atari preprocessing): leave action-repeat at 1"
        )
