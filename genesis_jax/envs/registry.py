"""Which backend knows an environment id, and what its spaces look like."""

from __future__ import annotations

import contextlib
import difflib
import importlib

from genesis_jax.envs.spec import EnvSpec  # re-exported: `from genesis_jax.envs.registry import EnvSpec` still works

BACKENDS = ("gymnax", "gymnasium", "envpool")  # envpool: Atari only, and only when asked for
# The optional packages an env id's namespace or a backend needs: (module, pip name, genesis-jax extra).
ATARI_PACKAGES = (("ale_py", "ale-py", "atari"), ("cv2", "opencv-python-headless", "atari"))
ENVPOOL_PACKAGES = (("envpool", "envpool", "envpool"),)


def require_packages(env_id: str, backend: str | None) -> None:
    """One ImportError with its install hint (the CLI: exit 2) where `env_id` or `backend` needs
    an optional package that is not installed (before its id would be reported as unknown)."""
    atari = env_id.startswith("ALE/") and backend in (None, "gymnasium")
    for module, package, extra in ENVPOOL_PACKAGES if backend == "envpool" else ATARI_PACKAGES if atari else ():
        try:
            importlib.import_module(module)
        except ImportError:
            what = f"env backend {backend}" if backend == "envpool" else env_id
            raise ImportError(f"{what} needs {package}: pip install 'genesis-jax[{extra}]'") from None


def gymnax_ids() -> list[str]:
    from genesis_jax.envs.gymnax_env import import_gymnax

    return list(import_gymnax().registered_envs)


def gymnasium_ids() -> list[str]:
    """gymnasium's ids, Atari's (ALE/...) included where ale-py is installed."""
    import gymnasium

    with contextlib.suppress(ImportError):
        import ale_py

        gymnasium.register_envs(ale_py)
    return list(gymnasium.envs.registry.keys())


def resolve_backend(env_id: str, backend: str | None = None) -> str:
    """The backend that runs `env_id`: the asked one, else gymnax where it has the id, else gymnasium
    (which alone has `module:EnvId` ids)."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown env backend {backend!r}; accepted: {', '.join(BACKENDS)}")
    require_packages(env_id, backend)
    if backend == "envpool":
        return backend  # its spec names a missing game
    if ":" in env_id and backend in (None, "gymnasium"):
        return _registered_by_module(env_id)
    for name, ids in (("gymnax", gymnax_ids), ("gymnasium", gymnasium_ids)):
        if backend in (None, name) and env_id in ids():
            return name
    if backend is not None:
        raise ValueError(f"{backend} has no environment {env_id!r}{_close_matches(env_id, backend)}")
    raise ValueError(f"unknown environment id {env_id!r}{_close_matches(env_id)}")


def _registered_by_module(env_id: str) -> str:
    """gymnasium's `module:EnvId` (as `gymnasium.make` reads it: importing `module` registers
    EnvId), the way to name one's own environment on the command line: "gymnasium", or one line
    saying what is missing."""
    module, _, name = env_id.partition(":")
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ValueError(
            f"{env_id}: cannot import {module} to register {name} ({error}): install it, or put it on PYTHONPATH"
        ) from None
    if name not in gymnasium_ids():
        raise ValueError(f"{env_id}: importing {module} registers no environment {name!r} (gymnasium.register)")
    return "gymnasium"


def _close_matches(env_id: str, backend: str | None = None) -> str:
    pool = (gymnax_ids() if backend != "gymnasium" else []) + (gymnasium_ids() if backend != "gymnax" else [])
    matches = difflib.get_close_matches(env_id, list(dict.fromkeys(pool)), n=5, cutoff=0.5)
    where = "; see gymnax.registered_envs or gymnasium.envs.registry"
    return f"; did you mean {', '.join(matches)}?" if matches else where


def resolve_env(env_id: str, backend: str | None = None) -> EnvSpec:
    """`env_id`'s spaces, as the backend that runs it (`resolve_backend`) reports them:
    `gymnax_env.gymnax_spec`, `gymnasium_env.gymnasium_spec` or `envpool_env.envpool_spec`."""
    backend = resolve_backend(env_id, backend)
    return getattr(importlib.import_module(f"genesis_jax.envs.{backend}_env"), f"{backend}_spec")(env_id)
