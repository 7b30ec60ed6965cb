"""JAX's persistent compilation cache for the command line: a program compiled once (a run's
chunk, its init) is loaded by the next run of the same command instead of compiled again.

On by default, in the user cache folder (`$XDG_CACHE_HOME/genesis-jax/xla`, else
`~/.cache/genesis-jax/xla`); `JAX_COMPILATION_CACHE_DIR` names another folder. Off with
`--no-compile-cache` or `GENESIS_COMPILE_CACHE=0`. Deleting the folder is always safe.
"""

from __future__ import annotations

import os
import pathlib

OFF_VALUES = ("0", "off", "false", "no")


def cache_dir(environ=os.environ) -> pathlib.Path | None:
    """Where compiled programs are kept, or None when the cache is off."""
    if environ.get("GENESIS_COMPILE_CACHE", "").strip().lower() in OFF_VALUES:
        return None
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return pathlib.Path(environ["JAX_COMPILATION_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "genesis-jax" / "xla"


def enable_compile_cache(enabled: bool = True) -> pathlib.Path | None:
    """Turns the cache on where `cache_dir` says; returns the folder, or None when it stays off.
    A folder that cannot be made leaves it off, without a word: a cache only saves time."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    folder = cache_dir() if enabled else None
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # Every program: a run's init compiles in about a second, and loading it costs less.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # On or off as asked: a program calling the command may have set it otherwise.
    jax.config.update("jax_enable_compilation_cache", folder is not None)
    # JAX sets its cache up at a process's first compile: one made before (a program calling the
    # command) kept the cache it had, or none, whatever these options say now.
    compilation_cache.reset_cache()
    return folder
