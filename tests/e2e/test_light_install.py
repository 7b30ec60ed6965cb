"""The core install (`pip install genesis-jax`, no extra) runs amp; every command then ends in
one line naming the rl extra, never a traceback (CI also runs one in its core-only venv)."""

import importlib.metadata
import re
import sys

import pytest

from genesis_jax import cli

COMMANDS = [
    ["train", "ppo", "--help"],
    ["train", "pqn", "--help"],
    ["train", "ppo", "--total-steps", "1024"],
    ["study", "--tasks", "ppo:CartPole-v1"],
    ["bench"],
    ["demo"],
    ["--help"],
]


def _rl_requirements() -> set[str]:
    """The rl extra's requirement names, from the installed package's metadata."""
    names = set()
    for requirement in importlib.metadata.requires("genesis-jax") or []:
        if re.search(r"""extra\s*==\s*["']rl["']""", requirement):
            names.add(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower())
    return names


def test_the_modules_checked_are_the_rl_extras_requirements():
    as_requirements = {name.replace(".", "-") for name in cli.RL_EXTRA_MODULES}  # orbax.checkpoint
    assert as_requirements == _rl_requirements()


@pytest.mark.parametrize("module", cli.RL_EXTRA_MODULES)
@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_command_without_the_rl_extra_ends_in_one_line_naming_it(module, argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec answers None
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"genesis-jax: error: the command line needs the rl extra ({module} is not installed): "
        "pip install 'genesis-jax[rl]'\n"
    )


def test_nothing_is_missing_in_the_full_install():
    assert cli.missing_rl_extra() is None
