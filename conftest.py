"""The lanes. The notebooks (run by nbmake) take over a minute even at their smoke size (below):
they belong to the slow lane, `-m slow`.
Tests marked `long` (benchmarks more than tests: the torture runs, a learning run whose result
the committed benchmarks hold) are skipped unless `pytest --long` or GENESIS_LONG_TESTS=1.

Here at the root, not in notebooks/: --doctest-modules imports every conftest.py under the
testpaths, and two directories without __init__.py (notebooks/, docs/) would both give the
module name `conftest`, which pytest refuses."""

import builtins
import contextlib
import importlib.metadata
import os
import shutil
import sys
import tempfile

import pytest

# nbmake's kernels inherit the environment: the notebooks run at their smoke size under the suite
# (notebooks/precision_tour.ipynb reads it; GENESIS_NOTEBOOK_SMOKE=0 runs them at full size).
os.environ.setdefault("GENESIS_NOTEBOOK_SMOKE", "1")

# Doctests that compile a network or a replay buffer (seconds each): the slow lane.
SLOW_DOCTESTS = frozenset(
    {"genesis_jax.nets.conv.Conv", "genesis_jax.nets.q_network.QNetwork", "genesis_jax.data.replay"}
)

LONG_SKIP_REASON = "a long run: pytest --long (or GENESIS_LONG_TESTS=1) runs it"


# The suite's programs are tiny and compiled once each, and compiling is most of the suite's
# time: flags that compile them faster with code about as fast. On 2 cores, one process:
# - LLVM's optimisation level 1 instead of XLA's default 3: the vmapped-seed tests of every
#   algorithm took 92 s instead of 111 s, a PPO learning run and the SAC tests 102 s instead
#   of 106 s (level 0: 71 s, but 147 s);
# - without XLA:CPU's (MLIR) fusion emitters: a tiny run of each algorithm at one precision
#   took 43-45 s instead of 58 s, a SAC and a PPO learning run 54 s instead of 55 s;
# - LLVM's module codegen in one part, not split in up to 32 for threads: the two workers keep
#   both cores busy already, and each split costs CPU: tests/algos/test_every_precision.py -k fp16
#   (-n 0, 4 runs against 4 of the default) took a median 0.92x the CPU time (0.96x the wall).
# Set in the environment: the xdist workers and every subprocess (CLI runs, launch's processes)
# compile the same way, so comparisons across processes hold.
FAST_COMPILE_FLAGS = {"--xla_backend_optimization_level": "1"}
# An XLA_FLAGS entry the installed XLA does not know aborts every process: the emitters' and the
# split's flags only where jaxlib surely has them (0.7 and later; the suite is measured on 0.10).
if tuple(int(part) for part in importlib.metadata.version("jaxlib").split(".")[:2]) >= (0, 7):
    FAST_COMPILE_FLAGS["--xla_cpu_use_fusion_emitters"] = "false"
    FAST_COMPILE_FLAGS["--xla_cpu_parallel_codegen_split_count"] = "1"
# Most of the suite's programs run a few updates: XLA without most of its optimisations (LLVM's
# level 0 and its expensive passes off: `jax_disable_most_optimizations`) compiles them faster
# and runs them about as fast. On 2 cores, one process: tests/algos/test_every_precision.py took
# 80 s instead of 106 s (CPU 84 s instead of 138 s). A test whose runs are long (a learning run,
# thousands of updates) is marked `run_bound`: it compiles with the optimisations at the level
# above (`tests.support.xla.optimized_compiles`), or SAC's Pendulum run takes 106 s instead of 37 s.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_flags] + [f"{flag}={value}" for flag, value in FAST_COMPILE_FLAGS.items() if flag not in _flags]
).strip()


def pytest_configure(config):
    """One JAX persistent compilation cache for the whole run, shared by the xdist workers
    (they inherit the environment) and the CLI subprocesses the tests start: a program compiled
    once (a resumed run's chunk, a killed run's restart, the same tiny config in two files) is
    loaded after that, not compiled again. A fresh directory each run, removed at the end:
    nothing compiled by an earlier run is reused. JAX_COMPILATION_CACHE_DIR already set: that one."""
    if hasattr(config, "workerinput") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # an xdist worker (it inherited the controller's), or the caller chose one
    cache = tempfile.mkdtemp(prefix="genesis-jax-test-cache-")
    config._jax_test_cache = cache
    os.environ["JAX_COMPILATION_CACHE_DIR"] = cache
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tests' programs compile fast
    if "jax" in sys.modules:  # imported already (a conftest of the arguments): too late for the variables
        import jax

        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def pytest_unconfigure(config):
    if getattr(config, "_jax_test_cache", None):
        shutil.rmtree(config._jax_test_cache, ignore_errors=True)


def pytest_runtest_teardown(item):
    """A doctest's displayhook leaves its last value in `builtins._`; a JAX array there (it
    claims to be Hashable but is not) breaks any later import that hashes the builtins, as
    tyro's first import does: the order of the files on a worker must not decide a test."""
    builtins.__dict__.pop("_", None)


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="also run the tests marked long (benchmark-sized runs; GENESIS_LONG_TESTS=1 does the same)",
    )


def long_tests_wanted(config) -> bool:
    return config.getoption("--long") or os.environ.get("GENESIS_LONG_TESTS") == "1"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    skip_long = None if long_tests_wanted(config) else pytest.mark.skip(reason=LONG_SKIP_REASON)
    for item in items:
        if item.path.suffix == ".ipynb" or item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)
        if skip_long and item.get_closest_marker("long"):
            item.add_marker(skip_long)


def _compiles_for(item):
    """XLA's optimisations on for a test marked run_bound, as set above for the rest. (Imported
    here: jax must not be imported before the variables above are set.)"""
    if item.get_closest_marker("run_bound") is None:
        return contextlib.nullcontext()
    from tests.support.xla import optimized_compiles

    return optimized_compiles()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):  # a module fixture a run-bound test sets up compiles optimised too
    with _compiles_for(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _compiles_for(item):
        yield
