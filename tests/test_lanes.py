"""The suite's compile settings (conftest.py): most tests compile without most of XLA's
optimisations, a test marked run_bound with them, and the setting comes back after it."""

import os

import jax
import pytest

# The default, unless the caller chose: conftest.py sets it before JAX is imported.
SUITE_DEFAULT = os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == "1"


def test_a_test_compiles_as_the_suite_chose():
    assert jax.config.values["jax_disable_most_optimizations"] is SUITE_DEFAULT


@pytest.mark.run_bound
def test_a_run_bound_test_compiles_with_the_optimisations_in_this_process_and_its_children():
    assert jax.config.values["jax_disable_most_optimizations"] is False
    assert os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "0"


def test_the_setting_comes_back_after_a_run_bound_test():
    assert jax.config.values["jax_disable_most_optimizations"] is SUITE_DEFAULT
    assert (os.environ.get("JAX_DISABLE_MOST_OPTIMIZATIONS") == "1") is SUITE_DEFAULT
