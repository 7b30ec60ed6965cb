"""XLA's optimisations for what must run fast: the suite compiles without most of them
(conftest.py: its programs run a few updates), a test marked `run_bound` with them."""

import contextlib
import os
from unittest import mock

import jax

FLAG = "jax_disable_most_optimizations"


@contextlib.contextmanager
def optimized_compiles():
    """XLA's optimisations on for what compiles inside: in this process (JAX's flag) and in the
    processes it starts (the environment they inherit, restored after)."""
    before = jax.config.values.get(FLAG)  # None: a JAX without the flag, which optimises anyway
    with mock.patch.dict(os.environ, {FLAG.upper(): "0"}):
        if before is not None:
            jax.config.update(FLAG, False)
        try:
            yield
        finally:
            if before is not None:
                jax.config.update(FLAG, before)
