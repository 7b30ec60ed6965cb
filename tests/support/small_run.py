"""A small PPO run through the CLI that the integrity tests copy, resume and break, and what
they read back from a run directory."""

import json
import pathlib
import shutil

from genesis_jax.cli import main

SMALL = ["train", "ppo", "--precision", "fp16", "--total-steps", "2048", "--no-progress"]


def train_small_run(root: pathlib.Path) -> pathlib.Path:
    """SMALL trained to the end in `root`/ppo (a module fixture's one run, which tests copy)."""
    run = root / "ppo"
    assert main(SMALL + ["--out", str(run)]) == 0
    return run


def copy_of(run: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(run, tmp_path / "copy"))


def metric_updates(run: pathlib.Path) -> list[int]:
    return [json.loads(line)["update"] for line in (run / "metrics.jsonl").read_text().splitlines()]
