"""The notebooks (run by nbmake) take minutes: they belong to the slow lane, `-m slow`.

Here at the root, not in notebooks/: --doctest-modules imports every conftest.py under the
testpaths, and two directories without __init__.py (notebooks/, docs/) would both give the
module name `conftest`, which pytest refuses."""

import pytest


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
