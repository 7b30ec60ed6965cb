"""The package on its own surface: no module of genesis_jax uses a 0.2 name, argument or
argument order (all removed: `amp._REMOVED` names each one's replacement). Here a read of every
module's source (the names, however they are imported), an import of every module with
DeprecationWarning as an error, and a tiny train of every algorithm the same way."""

import ast
import importlib
import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import genesis_jax
from genesis_jax import amp

PACKAGE = Path(genesis_jax.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))
# Call keywords of 0.2: create(loss_scale=), apply_gradients(loss_scale=).
OLD_KEYWORDS = {("create", "loss_scale"), ("apply_gradients", "loss_scale")}


def uses_of_old_names(text: str) -> list[str]:
    """Each use of a 0.2 spelling in the source `text`, as 'line: what'."""
    tree, found = ast.parse(text), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("genesis_jax", "genesis_jax.amp"):
            for alias in node.names:
                if alias.name in amp._REMOVED:
                    found.append(f"{node.lineno}: imports {alias.name} from {node.module}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "amp" and node.attr in amp._REMOVED:
                found.append(f"{node.lineno}: amp.{node.attr}")
            if node.attr == "loss_scale" and node.value.id in ("state", "train_state", "ts"):
                found.append(f"{node.lineno}: {node.value.id}.loss_scale (TrainState.scaler)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            for keyword in node.keywords:
                if (node.func.attr, keyword.arg) in OLD_KEYWORDS:
                    found.append(f"{node.lineno}: {node.func.attr}({keyword.arg}=...)")
    return sorted(found, key=lambda use: int(use.split(":")[0]))


def test_no_module_of_the_package_uses_a_0_2_name():
    found = {p.relative_to(PACKAGE).as_posix(): uses_of_old_names(p.read_text()) for p in SOURCES}
    assert not {path: uses for path, uses in found.items() if uses}


def test_the_check_sees_each_kind_of_old_spelling():
    text = (
        "from genesis_jax import amp, get_policy\n"
        "from genesis_jax.amp import with_precision_rules\n"
        "from genesis_jax.amp.testing import FaultInjection\n"
        "from genesis_jax.amp.optim import SkipNonFiniteState\n"
        "amp.make_loss_scale('dynamic')\n"
        "amp.TrainState.create(params=1, tx=2, loss_scale=3)\n"
        "state.loss_scale\n"
    )
    assert [use.split(": ", 1)[1] for use in uses_of_old_names(text)] == [
        "imports get_policy from genesis_jax",
        "imports with_precision_rules from genesis_jax.amp",
        "amp.make_loss_scale",
        "create(loss_scale=...)",
        "state.loss_scale (TrainState.scaler)",
    ]


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
    assert "genesis_jax.amp.state" in names and "genesis_jax.algos.base" in names
    assert "genesis_jax.amp._deprecated" not in names
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
