"""The tests' `train ppo` command lines, one spelling for all, and a small PPO run through the
CLI that the integrity tests copy, resume and break."""

import pathlib
import shutil

from genesis_jax.cli import main
from tests.support.files import metric_rows


def ppo_argv(total_steps: int | None = None, *, precision: str | None = "fp16", no_progress: bool = True, **options):
    """`train ppo` with these options (`num_envs=4` gives `--num-envs 4`, a tuple gives several
    values): one command line for the many PPO runs of the suite. Runs of equal sizes compile one
    program, which the test run's shared compilation cache (conftest.py) then serves to the rest."""
    argv = ["train", "ppo"]
    argv += ["--precision", precision] if precision else []
    argv += ["--total-steps", str(total_steps)] if total_steps is not None else []
    for name, value in options.items():
        argv += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, tuple) else (value,))]
    return argv + (["--no-progress"] if no_progress else [])


SMALL = ppo_argv(2048)


def train_small_run(root: pathlib.Path) -> pathlib.Path:
    """SMALL trained to the end in `root`/ppo (a module fixture's one run, which tests copy)."""
    run = root / "ppo"
    assert main(SMALL + ["--out", str(run)]) == 0
    return run


def copy_of(run: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(run, tmp_path / "copy"))


def metric_updates(run: pathlib.Path) -> list[int]:
    return [r["update"] for r in metric_rows(run)]
