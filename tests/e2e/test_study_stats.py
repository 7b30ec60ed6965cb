"""The study's paired statistics against independent computations on fixed data: the paired
bootstrap CI of a difference (a numpy reimplementation with the same draws, and scipy's
paired bootstrap), the CVaR (exact), the paired interval narrower than rliable's unpaired one
on correlated seeds, the rule that combines the statistics' verdicts, and the time to a
threshold."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from genesis_jax.cli.study import cells, report, stats

# 12 seeds of two precisions whose seed k shares a draw (correlated, as seed k of a study is).
_rng = np.random.default_rng(7)
SHARED = _rng.normal(0.8, 0.1, 12)
FP32 = SHARED + _rng.normal(0.0, 0.01, 12)
FP16 = SHARED - 0.01 + _rng.normal(0.0, 0.01, 12)


def cvar_by_hand(values, level):
    """The mean of the worst `level` share, the boundary value weighted by what is left."""
    ordered, k = sorted(values), level * len(values)
    whole = int(np.floor(k))
    return (sum(ordered[:whole]) + (k - whole) * (ordered[whole] if whole < len(values) else 0.0)) / k


def test_cvar_is_the_mean_of_the_worst_quarter_exactly():
    assert stats.cvar([5.0, 1.0, 3.0, 2.0, 8.0, 0.0, 7.0, 4.0]) == pytest.approx((0.0 + 1.0) / 2)  # 2 of 8
    assert stats.cvar([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == pytest.approx((1.0 + 0.5 * 2.0) / 1.5)  # 1.5 of 6
    for n in (5, 7, 12, 32):
        values = np.random.default_rng(n).normal(size=n)
        assert stats.cvar(values) == pytest.approx(cvar_by_hand(values, 0.25))
        assert stats.cvar(values, 1.0) == pytest.approx(values.mean())
    matrix = np.random.default_rng(0).normal(size=(3, 8))
    np.testing.assert_allclose(stats.cvar(matrix), [np.sort(r)[:2].mean() for r in matrix])


@pytest.mark.parametrize("name", stats.STATISTICS)
def test_the_paired_bootstrap_is_a_joint_resample_of_seed_indices(name):
    reps, seed = 1000, 3
    by_hand = {
        "IQM": lambda x: scipy.stats.trim_mean(x, 0.25),
        "Mean": np.mean,
        "CVaR": lambda x: cvar_by_hand(x, 0.25),
    }[name]
    # independently: the same draws (numpy's default_rng(seed).integers), one resample at a time
    draws = np.random.default_rng(seed).integers(0, len(FP32), size=(reps, len(FP32)))
    differences = [by_hand(FP16[k]) - by_hand(FP32[k]) for k in draws]
    low, high = np.percentile(differences, [2.5, 97.5])
    e = stats.paired(FP16, FP32, stats.FUNCS[name], stats.resample_indices(len(FP32), reps, seed))
    assert (e.point, e.low, e.high) == pytest.approx((by_hand(FP16) - by_hand(FP32), low, high))


def test_the_paired_bootstrap_agrees_with_scipys_paired_percentile_bootstrap():
    reps = 20_000
    e = stats.paired(FP16, FP32, stats.FUNCS["Mean"], stats.resample_indices(len(FP32), reps, 0))
    ci = scipy.stats.bootstrap(
        (FP16, FP32),
        lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        paired=True,
        vectorized=True,
        n_resamples=reps,
        method="percentile",
        random_state=np.random.default_rng(1),
    ).confidence_interval
    width = e.high - e.low
    assert abs(e.low - ci.low) < 0.05 * width and abs(e.high - ci.high) < 0.05 * width  # Monte Carlo error


def test_the_paired_interval_is_narrower_than_the_unpaired_one_on_correlated_seeds():
    scores = {"fp32": FP32[:, None], "fp16": FP16[:, None]}
    judged = stats.judge(scores, "fp32", reps=2000, seed=0)["fp16"][0]
    # the unpaired interval: rliable's, each precision's seeds resampled on their own
    func = lambda x, y: np.array([stats.metrics.aggregate_mean(x) - stats.metrics.aggregate_mean(y)])  # noqa: E731
    (unpaired,) = stats._estimates({"fp16": [scores["fp16"], scores["fp32"]]}, func, 2000, 0)["fp16"]
    paired = judged["Mean"][0]
    assert paired.point == pytest.approx(unpaired.point)
    assert (paired.high - paired.low) < 0.5 * (unpaired.high - unpaired.low)
    # the paired interval shows the small consistent deficit; the unpaired one cannot
    assert paired.high < 0 < unpaired.high


def test_equivalent_only_where_every_statistic_agrees():
    assert stats.combine(["equivalent"] * 3) == "equivalent"
    assert stats.combine(["equivalent", "equivalent", "not shown"]) == "not shown"
    assert stats.combine(["equivalent", "not shown", "worse"]) == "worse"
    assert stats.combine(["equivalent", "better", "better"]) == "better"
    assert stats.combine(["better", "not shown", "equivalent"]) == "not shown"
    assert stats.combine(["worse", "better", "equivalent"]) == "not shown"
    assert stats.combine(["did not learn"] * 3) == "did not learn"
    # a tail failure: 4 of 32 fp16 seeds collapse; the IQM leaves them out, the CVaR does not
    fp32 = np.linspace(0.9, 1.0, 32)
    fp16 = fp32.copy()
    fp16[[3, 11, 20, 27]] = 0.2
    judged = stats.judge({"fp32": fp32[:, None], "fp16": fp16[:, None]}, "fp32", reps=1000)
    verdicts = {name: v for name, (_, v) in judged["fp16"][0].items()}
    assert verdicts["IQM"] == "equivalent" and verdicts["CVaR"] == "worse"
    assert stats.equivalence(judged)["fp16"][0][1] == "worse"


def test_a_time_is_judged_lower_is_better():
    fp32 = np.linspace(0.40, 0.50, 10)[:, None]
    later = {"fp32": fp32, "fp16": fp32 + 0.2}  # fp16 reaches the threshold later on every seed
    judged = stats.judge(later, "fp32", reps=500, lower_is_better=True, learnt={"fp32": [True], "fp16": [True]})
    difference, verdict = judged["fp16"][0]["Mean"]
    assert verdict == "worse" and difference.point == pytest.approx(0.2) and difference.low > 0
    tail, _ = judged["fp16"][0]["CVaR"]  # the slowest quarter: the largest times
    assert tail.point == pytest.approx(0.2)


def test_time_to_threshold_is_the_first_window_that_reaches_it():
    # 4 rows, 2 seeds: seed 0 reaches 100 at the third row, seed 1 never
    rows = [
        {"step": 512 * (u + 1), "return_sum_per_seed": [r, 20.0], "episodes_per_seed": [1, 1]}
        for u, r in enumerate([10.0, 50.0, 120.0, 200.0])
    ]
    times, reached, budget = cells.threshold_times(rows, lambda curve: curve >= 100.0, points=4)
    assert times.tolist() == [1536.0, 2048.0] and reached.tolist() == [True, False] and budget == 2048
    levels = report.speed({"fp32": {"T": rows}}, ["T"], [0.0], [200.0], {"T": 0.5}, 2)
    assert levels["share"]["fp32"][:, 0].tolist() == [0.75, 1.0] and levels["reached"]["fp32"] == [1]
    assert levels["thresholds"] == [(0.5, 100.0)]
