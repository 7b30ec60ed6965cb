"""Bench rows of the off-policy algorithms: a time-budgeted row is sized in whole positions of
its own algorithm, and DQN's and SAC's runs give rows through the same template path."""

import pytest

from genesis_jax.algos import get_algorithm
from genesis_jax.algos.base import BenchWorkload
from genesis_jax.cli.bench import _run, _steps_for_seconds, workloads

TINY_DQN = {
    "steps_per_row": 100,
    "num_envs": 10,
    "train_frequency": 10,
    "target_update_interval": 100,
    "learning_starts": 0,
    "buffer_size": 200,
    "batch_size": 32,
    "eval_episodes": 0,  # a bench row's score is the training's final return: no greedy evaluation after it
}
TINY_SAC = {"num_envs": 8, "steps_per_row": 8, "batch_size": 8, "learning_starts": 8, "buffer_size": 256}
TINY_SAC |= {"eval_episodes": 0}  # as TINY_DQN's


@pytest.mark.slow  # a two-row probe run: about 10 s
def test_a_timed_dqn_row_is_a_whole_number_of_metrics_rows():
    # DQN's position is a metrics row (steps_per_row), not its replay batch: sizing by batch_size
    # gave 2 x 32 steps, which no DQN config accepts.
    total = _steps_for_seconds(get_algorithm("dqn"), TINY_DQN, "fp32", 0.5)
    assert total % TINY_DQN["steps_per_row"] == 0 and total >= 2 * TINY_DQN["steps_per_row"]
    get_algorithm("dqn").config_class(precision="fp32", **TINY_DQN, total_steps=total)  # a config it accepts


def test_the_full_bench_has_dqn_and_sac_rows_whose_configs_are_valid():
    full = {w.name: w for w in workloads(quick=False)}
    for name in ("dqn-cnn-minatar", "sac-resmlp-1024"):
        w = full[name]
        get_algorithm(w.kind).config_class(precision="fp16", seed=0, num_seeds=2 if w.vmap_seeds else 1, **w.settings)


@pytest.mark.slow  # a tiny two-seed run per algorithm: about 20 s
@pytest.mark.parametrize(
    "workload, steps",
    [
        (BenchWorkload("dqn-tiny", {**TINY_DQN, "total_steps": 300}, vmap_seeds=True, kind="dqn"), 300),
        (
            BenchWorkload("sac-tiny", {**TINY_SAC, "total_steps": 32, "hidden": (16, 16)}, vmap_seeds=True, kind="sac"),
            32,
        ),
    ],
)
def test_dqn_and_sac_give_one_bench_row_per_seed(workload, steps):
    rows = _run(workload, "fp16", seeds=[0, 1])
    assert len(rows) == 2 and all(r["total_steps"] == steps and r["steps_per_second"] > 0 for r in rows)
    assert all(r["skipped_updates"] >= 0 and r["stopped"] is None for r in rows)
    assert all(r["accuracy"] is not None for r in rows)
