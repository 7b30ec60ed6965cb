"""The torture test: a PPO, a world-model, a DQN and a SAC run, each killed at random moments
(interpreter start, compilation, mid-chunk, mid-save) with SIGKILL, SIGTERM and SIGINT and
resumed each time, end exactly as the same command run once without a stop: the same metric
rows, every update once, the same bits in every leaf of the final checkpoint, the same summary,
nothing left over. The driver is tests/support/torture.py. Here each run is killed 12 times,
every moment with every signal once (a restart costs about 10 CPU seconds, most of it importing
and tracing): minutes each, a benchmark more than a test, so both are in the long lane (marked
long and slow; `pytest --long` runs them). Their full versions are experiments/torture.py, which
kills the same runs 25 times, or as often as asked, with other sizes and seeds; its results are
in benchmarks/torture-cpu.md. The driver's own tests at the end of this file stay in the fast lane."""

import itertools
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.base import MEASURED
from tests.support import torture
from tests.support.small_run import ppo_argv

KILLS = 12  # every moment x signal pair once
SEED = 0  # the kill schedule's seed: a failure replays with experiments/torture.py --kills 12 --seed 0

# 64 updates of 4 x 64 steps, a checkpoint every 2 updates (each chunk ends in a save).
PPO_ARGS = ppo_argv(16384, num_envs=4, num_steps=64, checkpoint_every=512, seed=3)
PPO_UPDATES = 64

WM_EPOCHS = 40


def world_model_args(data) -> list[str]:
    """40 epochs of a small world model on a collected CartPole dataset, a checkpoint each epoch."""
    return [
        "train",
        "world-model",
        "--data",
        str(data),
        "--precision",
        "fp16",
        "--epochs",
        str(WM_EPOCHS),
        "--batch-size",
        "256",
        "--width",
        "32",
        "--init-loss-scale",
        "1024",
        "--checkpoint-every",
        "1",
        "--seed",
        "3",
        "--no-progress",
    ]


def assert_survived(result: torture.Torture, total: int) -> None:
    report = "\n".join(torture.table(result))
    assert len(result.kills) == KILLS, f"the run finished after {len(result.kills)} kills:\n{report}"
    assert {k.moment for k in result.kills} == set(torture.MOMENTS), report
    assert {k.signal for k in result.kills} == {"SIGKILL", "SIGTERM", "SIGINT"}, report
    assert torture.verdict(result, total, MEASURED) == [], report


@pytest.mark.long
@pytest.mark.slow  # 14 processes, about 150 CPU seconds (36 the first, cold compile; about 9 each restart)
def test_ppo_killed_12_times_ends_as_the_uninterrupted_run(tmp_path):
    result = torture.torture(PPO_ARGS, tmp_path, KILLS, SEED)
    assert_survived(result, PPO_UPDATES)


@pytest.mark.long
@pytest.mark.slow  # 14 processes, about 100 CPU seconds (32 the first, cold compile; about 5 each restart)
def test_world_model_killed_12_times_ends_as_the_uninterrupted_run(tmp_path):
    from genesis_jax.data.trajectories import collect_dataset, save_dataset

    data = tmp_path / "cartpole.npz"
    save_dataset(collect_dataset("CartPole-v1", 64, 32, seed=0), str(data))
    result = torture.torture(world_model_args(data), tmp_path, KILLS, SEED)
    assert_survived(result, WM_EPOCHS)


def off_policy_args(algo: str, total_steps: int) -> list[str]:
    """A small DQN or SAC run, a checkpoint every 2 rows (each chunk ends in a save)."""
    sizes, row_steps = torture.OFF_POLICY[algo]
    every = ["--checkpoint-every", str(2 * row_steps)]
    return [
        "train",
        algo,
        "--total-steps",
        str(total_steps),
        *sizes,
        *every,
        "--precision",
        "fp16",
        "--seed",
        "3",
        "--no-progress",
    ]


@pytest.mark.long
@pytest.mark.slow  # 14 processes, about 110 CPU seconds (15 the first; about 7 each restart)
def test_dqn_killed_12_times_ends_as_the_uninterrupted_run(tmp_path):
    result = torture.torture(off_policy_args("dqn", 4000), tmp_path, KILLS, SEED)
    assert_survived(result, 20)  # rows of 200 steps: the replay buffer, in every checkpoint, comes back bit for bit


@pytest.mark.long
@pytest.mark.slow  # 14 processes, about 150 CPU seconds (26 the first; about 10 each restart)
def test_sac_killed_12_times_ends_as_the_uninterrupted_run(tmp_path):
    result = torture.torture(off_policy_args("sac", 320), tmp_path, KILLS, SEED)
    assert_survived(result, 40)  # rows of 8 steps; three optimizers under one scaler


# --- the driver itself (fast) ------------------------------------------------------------------


def test_a_schedule_is_its_seed_and_covers_every_moment_and_signal():
    plans = torture.schedule(25, SEED)
    assert plans == torture.schedule(25, SEED) and plans != torture.schedule(25, SEED + 1)
    pairs = [(p.moment, p.signum) for p in plans]
    # 25 kills over 4 moments x 3 signals: every pair twice, one pair a third time.
    counts = sorted(pairs.count(pair) for pair in itertools.product(torture.MOMENTS, torture.SIGNALS))
    assert counts == [2] * 11 + [3]
    assert all(0.0 <= p.fraction < 1.0 for p in plans)
    assert sorted((p.moment, p.signum) for p in torture.schedule(KILLS, SEED)) == sorted(
        itertools.product(torture.MOMENTS, torture.SIGNALS)
    )


def test_documented_exit_statuses():
    assert torture.expected_statuses(signal.SIGKILL, True) == {-9}
    assert torture.expected_statuses(signal.SIGTERM, True) == {143}
    assert torture.expected_statuses(signal.SIGINT, True) == {130}
    assert torture.expected_statuses(signal.SIGTERM, False) == {143, -15}  # before the run's handlers


def test_the_state_comparison_sees_one_flipped_bit(tmp_path):
    from genesis_jax.run.checkpoint import CheckpointStore

    state = {"w": jnp.arange(6, dtype=jnp.float32), "n": jnp.int32(3)}
    flipped = {**state, "w": state["w"].at[4].set(np.nextafter(np.float32(4), np.float32(5)))}
    for name, tree in (("a", state), ("b", state), ("c", flipped)):
        with CheckpointStore(tmp_path / name / "checkpoints", async_save=False) as store:
            store.save(2, tree, {"kind": "demo"}, force=True)
    assert torture.state_differences(tmp_path / "a", tmp_path / "b") == []
    problems = torture.state_differences(tmp_path / "a", tmp_path / "c")
    assert problems[0].startswith("digest:") and problems[1:] == ["leaf ['w'] differs"]
