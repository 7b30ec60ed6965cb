"""The notebooks (run by nbmake) take minutes: they belong to the slow lane, `-m slow`."""

import pytest


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
