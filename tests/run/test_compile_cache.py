"""The command line's persistent compilation cache: where it lives, and that it is written
(or not) as the flag and the environment say."""

import os
import pathlib

import pytest

from genesis_jax.run.compile_cache import cache_dir
from tests.support.processes import run_python


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"HOME": "/home/u"}, "/home/u/.cache/genesis-jax/xla"),
        ({"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}, "/c/genesis-jax/xla"),
        ({"HOME": "/home/u", "JAX_COMPILATION_CACHE_DIR": "/j"}, "/j"),
        ({"HOME": "/home/u", "GENESIS_COMPILE_CACHE": "0"}, None),
        ({"HOME": "/home/u", "GENESIS_COMPILE_CACHE": "Off", "JAX_COMPILATION_CACHE_DIR": "/j"}, None),
    ],
)
def test_the_cache_folder_follows_the_environment(environ, expected, monkeypatch):
    monkeypatch.setenv("HOME", environ["HOME"])  # expanduser reads the process's own HOME
    folder = cache_dir(environ)
    assert (None if folder is None else str(folder)) == expected


DEMO = "from genesis_jax.cli import main; raise SystemExit(main(['demo', '--steps', '3']))"


def _demo(tmp_path: pathlib.Path, **env) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environ.update(XDG_CACHE_HOME=str(tmp_path), **env)
    done = run_python(["-c", DEMO], env=environ)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "genesis-jax" / "xla"
    return sorted(p.name for p in folder.glob("*-cache")) if folder.exists() else []


@pytest.mark.slow
def test_a_command_keeps_its_programs_in_the_user_cache_unless_turned_off(tmp_path):
    assert any(name.startswith("jit_") for name in _demo(tmp_path / "on"))
    assert _demo(tmp_path / "off", GENESIS_COMPILE_CACHE="0") == []


def test_the_train_flag_is_not_a_train_argument():
    from genesis_jax.cli import RunOptions

    assert "compile_cache" not in RunOptions(compile_cache=False).train_kwargs()
