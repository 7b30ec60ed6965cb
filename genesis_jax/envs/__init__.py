"""Environments: gymnax (pure JAX, vmapped) and gymnasium (host, vectorised)."""

from genesis_jax.envs.registry import resolve_env
from genesis_jax.envs.spec import EnvSpec

__all__ = ["EnvSpec", "resolve_env"]
