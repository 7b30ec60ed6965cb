"""The package on its own surface: no module of genesis_jax uses a 0.2 name, argument or
argument order. 0.2's spellings live in one module, `amp/_deprecated.py`, which 0.4 deletes
whole with the lines that call it; here a read of every module's source (the names, however
they are imported), an import of every module with DeprecationWarning as an error, and a
tiny train of every algorithm the same way."""

import ast
import importlib
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import genesis_jax
from genesis_jax.amp import _deprecated

PACKAGE = Path(genesis_jax.__file__).parent
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "_deprecated.py")
# The lines 0.4 deletes with the shim module: its hooks, in these modules only.
HOOKS = {"amp/__init__.py", "amp/state.py"}
# Call keywords of 0.2: create(loss_scale=), apply_gradients(loss_scale=).
OLD_KEYWORDS = {("create", "loss_scale"), ("apply_gradients", "loss_scale")}


def uses_of_old_names(text: str, relative: str) -> list[str]:
    """Each use of a 0.2 spelling in the source `text` of the module at `relative` (to the
    package), as 'line: what'."""
    tree, found = ast.parse(text), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("genesis_jax"):
            module = node.module.removeprefix("genesis_jax").lstrip(".")
            for alias in node.names:
                if alias.name == "_deprecated" or module.endswith("_deprecated"):
                    if relative not in HOOKS:
                        found.append(f"{node.lineno}: imports amp._deprecated")
                elif alias.name in _deprecated.NAMES:
                    home = f"amp.{_deprecated.NAMES[alias.name][0]}"
                    if module != home:  # its 0.3 home (amp.testing.FaultInjection) is current
                        found.append(f"{node.lineno}: imports {alias.name} from genesis_jax.{module}")
                elif module == "" and alias.name in genesis_jax._DEPRECATED:
                    found.append(f"{node.lineno}: imports genesis_jax.{alias.name}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "amp" and node.attr in _deprecated.NAMES:
                found.append(f"{node.lineno}: amp.{node.attr}")
            if node.attr == "loss_scale" and node.value.id in ("state", "train_state", "ts"):
                found.append(f"{node.lineno}: {node.value.id}.loss_scale (TrainState.scaler)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            for keyword in node.keywords:
                if (node.func.attr, keyword.arg) in OLD_KEYWORDS:
                    found.append(f"{node.lineno}: {node.func.attr}({keyword.arg}=...)")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_module_of_the_package_uses_a_0_2_name():
    found = {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in SOURCES}
    found = {path: uses_of_old_names(text, path) for path, text in found.items()}
    assert not {path: uses for path, uses in found.items() if uses}


def test_the_check_sees_each_kind_of_old_spelling():
    text = (
        "from genesis_jax import amp\n"
        "from genesis_jax.amp.rules import with_precision_rules\n"
        "from genesis_jax.amp.guard import FaultInjection\n"
        "from genesis_jax.amp.testing import FaultInjection as fine\n"
        "from genesis_jax.amp import _deprecated\n"
        "amp.make_loss_scale('dynamic')\n"
        "amp.TrainState.create(params=1, tx=2, loss_scale=3)\n"
        "state.loss_scale\n"
    )
    assert [use.split(": ", 1)[1] for use in uses_of_old_names(text, "algos/old.py")] == [
        "imports with_precision_rules from genesis_jax.amp.rules",
        "imports FaultInjection from genesis_jax.amp.guard",
        "imports amp._deprecated",
        "amp.make_loss_scale",
        "create(loss_scale=...)",
        "state.loss_scale (TrainState.scaler)",
    ]
    assert uses_of_old_names("from genesis_jax.amp import _deprecated\n", "amp/state.py") == []


@pytest.mark.slow  # a fresh process imports all of genesis_jax: ~60 s on 2 shared cores
def test_every_module_imports_with_deprecation_warnings_as_errors():
    """In a fresh process: a module imported here already would not warn again."""
    script = (
        "import importlib, pkgutil, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "import genesis_jax\n"
        "for m in pkgutil.walk_packages(genesis_jax.__path__, 'genesis_jax.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_module_list_is_the_package():
    names = [m.name for m in pkgutil.walk_packages(genesis_jax.__path__, "genesis_jax.")]
    assert "genesis_jax.amp._deprecated" in names and "genesis_jax.algos.base" in names
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        importlib.import_module("genesis_jax.amp")


@pytest.mark.slow  # one tiny training per algorithm, each compiled
@pytest.mark.filterwarnings("error::DeprecationWarning")
@pytest.mark.parametrize("name", __import__("tests.support.registry", fromlist=["NAMES"]).NAMES)
def test_a_tiny_train_of_each_algorithm_uses_no_0_2_spelling(name):
    from genesis_jax.algos import get_algorithm
    from tests.support.registry import tiny_settings

    algorithm = get_algorithm(name)
    result = algorithm.train(algorithm.config_class(**tiny_settings(name, precision="fp16")), progress=False)
    assert result.summary["total_updates"] > 0
