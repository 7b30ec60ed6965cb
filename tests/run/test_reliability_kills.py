"""Crash safety: a PPO run killed with SIGKILL mid-save or stopped with SIGTERM and SIGINT in
a real subprocess resumes to the state and metrics of a run never interrupted (a SIGKILL
mid-run, for every algorithm: tests/algos/test_registry.py). The in-process reliability tests
(fault injection, the guard, bad input) are in test_reliability_faults.py."""

import json
import signal

import pytest

from genesis_jax.algos.ppo import train as train_ppo
from genesis_jax.cli import parse_train_args, train_config
from tests.support.files import committed_steps
from tests.support.helpers import tree_equal
from tests.support.processes import cpu_env, start_python, wait_until
from tests.support.small_run import ppo_argv

# --- crash safety: real processes, real signals ---------------------------------------------

# 64 rollouts of 4 x 128 steps, a checkpoint every 8: a signal sent at the first checkpoint
# finds the run with 56 rollouts to go (seconds), and each resume trains those in this process.
# The sizes and chunk of test_integrity_processes.py's LONG (the seed and the checkpoints shape
# no program): in one test run, the one program compiled once for both files.
KILL_ARGS = ppo_argv(32768, updates_per_chunk=8, checkpoint_every=4096, seed=7)
ROLLOUTS = 32768 // (4 * 128)

# Runs the CLI with Orbax's final rename of one step's save held back, so that the parent
# can kill the process while that save is in progress.
SLOW_SAVE = """
import asyncio, os, sys
from orbax.checkpoint._src.path import atomicity
original = atomicity.AtomicRenameTemporaryPath.finalize
async def held_finalize(self):
    if self._final_path.name == os.environ["HOLD_SAVE"]:
        open(os.environ["SAVE_MARKER"], "w").write("saving")
        await asyncio.sleep(120)
    return await original(self)
atomicity.AtomicRenameTemporaryPath.finalize = held_finalize
from genesis_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def straight_kill_run():
    config = train_config("ppo", parse_train_args("ppo", KILL_ARGS[2:])[0])
    straight = train_ppo(config, progress=False)
    assert straight.summary["iterations"] == ROLLOUTS
    return config, straight


def start(out, extra_env=None, script=None):
    """KILL_ARGS in a subprocess. It shares the test run's compilation cache (conftest.py) with the
    straight_kill_run fixture, which compiled the same chunk: no subprocess compiles it again."""
    code = ["-c", script] if script else ["-m", "genesis_jax.cli"]
    return start_python([*code, *KILL_ARGS, "--out", str(out)], cpu_env(**(extra_env or {})))


def resume_and_compare(out, straight):
    config, expected = straight
    resumed = train_ppo(config, out_dir=str(out), resume=True, progress=False)
    tree_equal(resumed.train_state.params, expected.train_state.params)
    tree_equal(resumed.train_state.opt_state, expected.train_state.opt_state)
    assert float(resumed.train_state.scaler.loss_scale) == float(expected.train_state.scaler.loss_scale)
    assert [r["loss"] for r in resumed.metrics] == [r["loss"] for r in expected.metrics]


@pytest.mark.slow  # kill-and-resume subprocess: 15 s
def test_sigkill_during_a_save_ignores_the_incomplete_checkpoint(tmp_path, straight_kill_run, caplog):
    out, marker = tmp_path / "run", tmp_path / "saving"
    proc = start(out, {"HOLD_SAVE": "16", "SAVE_MARKER": str(marker)}, SLOW_SAVE)
    wait_until(marker.exists, proc, timeout=180)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    leftovers = [p.name for p in (out / "checkpoints").iterdir() if ".orbax-checkpoint-tmp" in p.name]
    assert leftovers and committed_steps(out) == [8]
    with caplog.at_level("WARNING", logger="genesis_jax"):
        resume_and_compare(out, straight_kill_run)
    assert "incomplete checkpoint" in caplog.text


@pytest.mark.slow  # signal-and-resume subprocess: 14 s each
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_save_a_final_checkpoint_and_exit_cleanly(tmp_path, straight_kill_run, sig):
    out = tmp_path / "run"
    proc = start(out)
    wait_until(lambda: len(committed_steps(out)) >= 1, proc, timeout=180)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr
    assert f"{signal.Signals(sig).name} received" in stderr and "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"] == signal.Signals(sig).name
    assert committed_steps(out)[-1] == summary["iterations"] < ROLLOUTS
    resume_and_compare(out, straight_kill_run)
