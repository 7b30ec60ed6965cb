"""Checkpoints written before the train state moved its skip counts into the optimizer state
(format 1, genesis-jax 0.1.0) are refused with one line that names the version to use.

tests/data/ppo_run_format1 is a real run directory written by genesis-jax 0.1.0:
`train(PPOConfig(precision="fp16", total_steps=512, num_envs=4, num_steps=128, hidden=(8, 8)), out_dir=...)`.
"""

import shutil
from pathlib import Path

import pytest

from genesis_jax.cli import main
from genesis_jax.run.checkpoint import CHECKPOINT_FORMAT, CheckpointMismatchError, CheckpointStore
from tests.support.files import snapshot
from tests.support.small_run import ppo_argv

OLD_RUN = Path(__file__).resolve().parents[1] / "data" / "ppo_run_format1"
OLD_ARGS = ppo_argv(1024, num_envs=4, num_steps=128, hidden=(8, 8))  # the old run's sizes, a longer run


def test_format_1_is_refused_naming_the_version(tmp_path):
    with CheckpointStore(OLD_RUN / "checkpoints", async_save=False) as store:
        with pytest.raises(CheckpointMismatchError) as err:
            store.read_meta()
    message = str(err.value)
    assert "genesis-jax 0.1.0 in checkpoint format 1" in message
    assert f"reads formats 2, {CHECKPOINT_FORMAT}:" in message and "pip install genesis-jax==0.1.0" in message


def test_resume_of_a_format_1_run_exits_2_in_one_line_and_keeps_the_files(tmp_path, capsys):
    run = tmp_path / "old"
    shutil.copytree(OLD_RUN, run)
    before = snapshot(run)
    status = main([*OLD_ARGS, "--out", str(run), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "written by genesis-jax 0.1.0 in checkpoint format 1" in err[0]
    assert snapshot(run) == before  # nothing on disk changed


def test_new_checkpoints_carry_the_format(tmp_path):
    import jax.numpy as jnp

    with CheckpointStore(tmp_path / "c", async_save=False) as store:
        store.save(3, {"w": jnp.ones(2)}, {"kind": "toy"}, force=True)
        assert store.read_meta()["format"] == CHECKPOINT_FORMAT
