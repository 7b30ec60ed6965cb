"""Environments: gymnax (pure JAX, vmapped) and gymnasium (host, vectorised)."""

from genesis_jax.envs.registry import EnvSpec, resolve_env

__all__ = ["EnvSpec", "resolve_env"]
