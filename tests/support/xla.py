"""XLA's optimisations for what must run fast: the suite compiles without most of them
(conftest.py: its programs run a few updates), a test marked `run_bound` with them."""

import contextlib
import os

import jax


@contextlib.contextmanager
def optimized_compiles():
    """XLA's optimisations on for what compiles inside: in this process (JAX's flag) and in the
    processes it starts (the environment they inherit)."""
    known = "jax_disable_most_optimizations" in jax.config.values  # a JAX without it optimises anyway
    before_flag = jax.config.values.get("jax_disable_most_optimizations")
    before_env = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS")
    if known:
        jax.config.update("jax_disable_most_optimizations", False)
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "0"
    try:
        yield
    finally:
        if known:
            jax.config.update("jax_disable_most_optimizations", before_flag)
        if before_env is None:
            os.environ.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
        else:
            os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = before_env
