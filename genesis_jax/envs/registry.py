"""Which backend knows an environment id, and what its spaces look like."""

from __future__ import annotations

import difflib
import importlib

from genesis_jax.envs.spec import EnvSpec  # re-exported: `from genesis_jax.envs.registry import EnvSpec` still works

BACKENDS = ("gymnax", "gymnasium", "envpool")  # envpool: Atari only, and only when asked for

# Environment-id namespaces an optional package registers with gymnasium: namespace ->
# (the modules it needs, as (module, pip name)), the genesis-jax extra that installs them).
OPTIONAL_NAMESPACES = {"ALE": ((("ale_py", "ale-py"), ("cv2", "opencv-python-headless")), "atari")}
# Backends that are an optional package: backend -> ((module, pip name), extra).
OPTIONAL_BACKENDS = {"envpool": (("envpool", "envpool"), "envpool")}


def missing_dependency(what: str, package: str, extra: str) -> ImportError:
    """The one error for a missing optional package, with its install hint (the CLI: exit 4)."""
    return ImportError(f"{what} needs {package}: pip install 'genesis-jax[{extra}]'")


def _missing(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False


def require_packages(env_id: str, backend: str | None) -> None:
    """Raises `missing_dependency`'s ImportError where `env_id` or `backend` needs an optional
    package that is not installed (before its id would be reported as unknown)."""
    if backend in OPTIONAL_BACKENDS:
        (module, package), extra = OPTIONAL_BACKENDS[backend]
        if _missing(module):
            raise missing_dependency(f"env backend {backend}", package, extra)
        return
    namespace = env_id.split("/", 1)[0] if "/" in env_id else None
    if namespace in OPTIONAL_NAMESPACES and backend in (None, "gymnasium"):
        modules, extra = OPTIONAL_NAMESPACES[namespace]
        for module, package in modules:
            if _missing(module):
                raise missing_dependency(env_id, package, extra)


def gymnax_ids() -> list[str]:
    from genesis_jax.envs.gymnax_env import import_gymnax

    return list(import_gymnax().registered_envs)


def gymnasium_ids() -> list[str]:
    """gymnasium's ids, Atari's (ALE/...) included where ale-py is installed."""
    import gymnasium

    try:
        import ale_py

        gymnasium.register_envs(ale_py)
    except ImportError:
        pass
    return list(gymnasium.envs.registry.keys())


def resolve_backend(env_id: str, backend: str | None = None) -> str:
    """The backend that runs `env_id`: the asked one, else gymnax where it has the id."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown env backend {backend!r}; accepted: {', '.join(BACKENDS)}")
    require_packages(env_id, backend)
    if backend == "envpool":
        return backend  # its spec names a missing game
    known = {"gymnax": env_id in gymnax_ids(), "gymnasium": env_id in gymnasium_ids()}
    if backend is not None:
        if not known[backend]:
            raise ValueError(f"{backend} has no environment {env_id!r}{_close_matches(env_id, backend)}")
        return backend
    if known["gymnax"]:
        return "gymnax"
    if known["gymnasium"]:
        return "gymnasium"
    raise ValueError(f"unknown environment id {env_id!r}{_close_matches(env_id)}")


def _close_matches(env_id: str, backend: str | None = None) -> str:
    pool = (gymnax_ids() if backend != "gymnasium" else []) + (gymnasium_ids() if backend != "gymnax" else [])
    matches = difflib.get_close_matches(env_id, list(dict.fromkeys(pool)), n=5, cutoff=0.5)
    return (
        f"; did you mean {', '.join(matches)}?"
        if matches
        else "; see gymnax.registered_envs or gymnasium.envs.registry"
    )


def resolve_env(env_id: str, backend: str | None = None) -> EnvSpec:
    backend = resolve_backend(env_id, backend)
    if backend == "gymnax":
        from genesis_jax.envs.gymnax_env import gymnax_spec

        return gymnax_spec(env_id)
    if backend == "envpool":
        from genesis_jax.envs.envpool_env import envpool_spec

        return envpool_spec(env_id)
    from genesis_jax.envs.gymnasium_env import gymnasium_spec

    return gymnasium_spec(env_id)
