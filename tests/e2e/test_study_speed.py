"""The time to threshold gives no verdict from times no seed reached (a seed that never
reaches the threshold counts as the budget: a lower bound), none "equivalent" from censored
times, none "equivalent" from a run timed too coarsely for the margin, and each cell's times
are told against its own budget. Rows are written by hand, so nothing trains."""

from __future__ import annotations

import numpy as np

from genesis_jax.cli.study import report

SEEDS, TASK, RANDOM = 5, "CartPole-v1", 22.0  # CartPole-v1's reference: 500; its threshold 0.5 is a return of 261


def rows(returns: np.ndarray, step: int = 512) -> list[dict]:
    """Metric rows of a cell from each row's return per seed ([rows, seeds])."""
    return [
        {"step": step * (u + 1), "return_sum_per_seed": list(map(float, r)), "episodes_per_seed": [1] * len(r)}
        for u, r in enumerate(returns)
    ]


def speed_of(fp32_rows, fp16_rows, final=200.0) -> dict:
    """The analysis's time-to-threshold part for one task; both precisions learned (final `final`)."""
    raw = {p: np.full((SEEDS, 1), final) + np.arange(SEEDS)[:, None] for p in ("fp32", "fp16")}
    rows_by = {"fp32": {TASK: fp32_rows}, "fp16": {TASK: fp16_rows}}
    return report.analyse(raw, [TASK], {TASK: RANDOM}, reps=200, auc=None, rows=rows_by)["speed"]


def verdict(part) -> str:
    return part["equivalence"]["fp16"][0][1]


def test_no_seed_reaching_the_threshold_is_not_reached_not_equivalent():
    # the red team's repro: both learned (final return 200: 0.37 normalised), no seed ever at 261
    below = rows(np.full((60, SEEDS), 200.0))
    part = speed_of(below, below)
    assert part["reached"] == {"fp32": [0], "fp16": [0]}
    assert verdict(part) == "not reached (0 of 5 / 0 of 5)"
    assert report._verdict_cell(part, "fp16", 0).startswith("not reached (0 of 5 / 0 of 5) (0.00 [")


def test_times_decided_by_censored_seeds_are_not_equivalent():
    # seed 0 of each reaches the threshold at row 6 of 60, the other 4 never: their times are the budget
    returns = np.full((60, SEEDS), 200.0)
    returns[5:, 0] = 400.0
    part = speed_of(rows(returns), rows(returns))
    assert part["reached"] == {"fp32": [1], "fp16": [1]}
    assert verdict(part) == "not shown (censored: 1 of 5 / 1 of 5 reached)"
    # fp32 reaches on every seed, fp16 never: a time known to be longer is still "worse"
    fp32 = np.full((60, SEEDS), 400.0)
    assert verdict(speed_of(rows(fp32), rows(returns * 0 + 200.0))) == "worse"


def test_a_time_timed_no_finer_than_the_margin_is_not_equivalent():
    # every seed of both reaches it at the first row: equal times, but 16 rows time them in 1/16 of the budget
    early = np.full((16, SEEDS), 400.0)
    part = speed_of(rows(early), rows(early))
    assert part["windows"] == {"fp32": [16], "fp16": [16]}
    assert verdict(part) == "not shown (timed in 16 rows: 1/16 of the budget, no finer than the margin)"
    early = np.full((60, SEEDS), 400.0)  # 50 windows: 1/50 of the budget, finer than the margin 0.05
    assert verdict(speed_of(rows(early), rows(early))) == "equivalent"


def test_each_cells_time_is_told_against_its_own_budget():
    early = np.full((60, SEEDS), 400.0)
    part = speed_of(rows(early, step=512), rows(early, step=256))  # fp16 ran 15360 steps, fp32 30720
    analysis = {"speed": part, "failures": {p: [(0, SEEDS)] for p in ("fp32", "fp16")}}
    analysis["per_task"] = part["per_task"]
    assert report._tail_and_speed(analysis, 0, TASK, "fp32")[4].endswith(" of 30720")
    assert report._tail_and_speed(analysis, 0, TASK, "fp16")[4].endswith(" of 15360")
