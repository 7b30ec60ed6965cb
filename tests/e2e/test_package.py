"""The installed package stands alone: every module imports without torch being loaded."""

import pytest

from tests.support.processes import run_python

CHECK = """
import importlib, pkgutil, sys
import genesis_jax
names = [m.name for m in pkgutil.walk_packages(genesis_jax.__path__, "genesis_jax.")]
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(len(names), loaded)
"""


@pytest.mark.slow
def test_importing_every_module_of_the_package_never_imports_torch():
    out = run_python(["-c", CHECK], env={"JAX_PLATFORMS": "cpu", "PATH": ""}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    count, loaded = out.stdout.split(" ", 1)
    assert int(count) > 30 and loaded.strip() == "[]"
