"""The study's statistics: normalised scores, per-task and aggregate interval estimates,
probability of improvement and performance profiles from rliable (Agarwal et al., 2021), and
the verdicts: per task and precision, paired differences X - fp32 of three statistics (`IQM`,
`Mean` and the lower tail `CVaR`), each with its own verdict, and "equivalent" only where all
three are (`combine`).

Paired: seed k of every precision starts from the same key, so the bootstrap of a
difference resamples seed indices, one draw for every precision at once (`paired`); rliable
resamples each precision on its own, which is valid but wastes the seeds' correlation.

A score matrix is `[runs, tasks]` (runs: seeds), one per precision, as rliable takes it.
Every function here is pure: numbers in, numbers out; the report draws and writes them.

>>> import numpy as np
>>> raw = np.array([[10.0, 2.0], [20.0, 4.0]])  # 2 seeds x 2 tasks
>>> normalise(raw, random=[0.0, 0.0], reference=[20.0, 4.0]).tolist()
[[0.5, 0.5], [1.0, 1.0]]
"""

from __future__ import annotations

import typing
import warnings

import numpy as np
import scipy.stats
from rliable import library as rly
from rliable import metrics

CONFIDENCE = 0.95
MARGIN = 0.05  # the equivalence margin, in normalised score (5% of reference - random)
# The fewest seeds per cell a verdict is given from. A percentile bootstrap of the IQM
# difference of n seeds against n seeds is too narrow below that: in our simulation (normal
# and bimodal scores, 1500 trials each) its 95% interval covers the true difference 66% of the
# time at 2 seeds, 80% at 3, 92-93% at 4 to 6, 95% at 8. How many seeds a verdict is likely to
# need is the plan's question (`study.plan.seeds_needed`), which never asks for fewer than this.
MIN_SEEDS_FOR_VERDICT = 5
# A precision whose IQM normalised score on a task is below this did not learn the task (0 is
# the random policy): it gets no verdict, since two unlearned runs are alike but say nothing.
LEARNED_FROM = 0.1
# The fewest bootstrap replications: each 2.5% tail of a 95% interval then holds a few
# resamples; with fewer (one, say) an interval can have no width at all.
MIN_REPS = 100
# The lower tail: the mean of the worst TAIL share of the seeds (CVaR at 25%), where a
# precision that fails on some seeds shows first (the IQM leaves that quarter out).
TAIL = 0.25
# The statistics a verdict needs to agree on, over a task's seeds (higher is better).
STATISTICS = ("IQM", "Mean", "CVaR")
# Learning speed: the first logged step at which a seed's return (its learning curve in
# `cells.SPEED_POINTS` windows) reaches THRESHOLD in normalised score; a plan fixes its own.
THRESHOLD = 0.5
# A seed "fails" where its final normalised score ends below FAIL_BELOW (the failure rate).
FAIL_BELOW = 0.5


class Estimate(typing.NamedTuple):
    """A point estimate and its confidence interval (stats.json holds it as [point, low, high])."""

    point: float
    low: float
    high: float


def normalise(raw, random, reference) -> np.ndarray:
    """Min-max normalised scores: 0 is a random policy's return, 1 the reference return
    (per task, the columns of `raw`)."""
    raw, random, reference = (np.asarray(x, np.float64) for x in (raw, random, reference))
    if np.any(reference == random):
        raise ValueError("a task's reference return equals its random return: it cannot normalise")
    return (raw - random) / (reference - random)


def cvar(scores, level: float = TAIL, axis: int = -1) -> np.ndarray:
    """The lower-tail conditional value at risk along `axis`: the mean of the worst `level`
    share of the values, a fractional weight on the boundary value where `level` x n is not
    whole (the empirical distribution's CVaR, Rockafellar & Uryasev 2000).

    >>> float(cvar([4.0, 1.0, 3.0, 2.0]))  # the worst 1 of 4
    1.0
    >>> float(cvar([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]))  # the worst 1.5 of 6: (1 + 0.5 x 2) / 1.5
    1.3333333333333333
    """
    values = np.moveaxis(np.sort(np.asarray(scores, np.float64), axis=axis), axis, -1)
    k = level * values.shape[-1]
    return np.sum(values * np.clip(k - np.arange(values.shape[-1]), 0.0, 1.0), axis=-1) / k


# Each statistic over the last axis (seeds), for `paired`'s resamples (the IQM: rliable's aggregate_iqm).
FUNCS = {"IQM": lambda x: scipy.stats.trim_mean(x, 0.25, axis=-1), "Mean": lambda x: np.mean(x, axis=-1), "CVaR": cvar}


def resample_indices(num_seeds: int, reps: int, seed: int = 0) -> np.ndarray:
    """[reps, num_seeds] seed indices drawn with replacement: one draw, shared by every
    precision and statistic of a task (the pairing)."""
    return np.random.default_rng(seed).integers(0, num_seeds, size=(reps, num_seeds))


def paired(x, y, func, indices: np.ndarray) -> Estimate:
    """func(x) - func(y) over paired seeds (x[k] and y[k] from seed k) with its percentile
    bootstrap CI: each resample takes the same seed indices from both (`resample_indices`)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape:
        raise ValueError(f"a paired difference needs the same seeds on both sides, got {len(x)} and {len(y)}")
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(func(x[indices]) - func(y[indices]), [tail, 100.0 - tail])
    return Estimate(float(func(x) - func(y)), float(low), float(high))


def combine(verdicts) -> str:
    """One verdict from the statistics' verdicts: "equivalent" only where every one is;
    "worse" where one is and none is "better" (a deficit on any statistic is a deficit);
    "better" only where every one that is not "equivalent" is "better"; else "not shown"."""
    verdicts = list(verdicts)
    if len(set(verdicts)) == 1:  # all alike ("did not learn", "too few seeds" included)
        return verdicts[0]
    if "worse" in verdicts and "better" not in verdicts:
        return "worse"
    return "better" if set(verdicts) <= {"equivalent", "better"} else "not shown"


def iqm(scores) -> float:
    """The interquartile mean over every entry (rliable's)."""
    return float(metrics.aggregate_iqm(np.asarray(scores)))


AGGREGATES = {"IQM": metrics.aggregate_iqm, "Mean": metrics.aggregate_mean, "Median": metrics.aggregate_median}
AGGREGATES["Optimality gap"] = metrics.aggregate_optimality_gap
# Each task's statistics over its seeds (the median over seeds: rliable's is over task means).
PER_TASK = {"Mean": metrics.aggregate_mean, "Median": np.median, "IQM": metrics.aggregate_iqm}
PER_TASK["CVaR"] = lambda x: cvar(x.ravel())


def _rliable(seed: int, function, *args, **options):
    """rliable's `function` at our confidence, reproducibly: rliable 1.2 draws its resamples
    from numpy's global generator (its random_state is not used), so that is seeded with
    `seed`, and the caller's state given back after."""
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # arch: random_state is deprecated
            return function(*args, confidence_interval_size=CONFIDENCE, **options)
    finally:
        np.random.set_state(saved)


def _estimates(score_dict, func, reps: int, seed: int) -> dict[str, list[Estimate]]:
    """rliable's stratified-bootstrap interval estimates, as one `Estimate` per output of `func`."""
    state = np.random.RandomState(seed)
    points, intervals = _rliable(seed, rly.get_interval_estimates, score_dict, func, reps=reps, random_state=state)
    return {key: [Estimate(*map(float, e)) for e in zip(points[key], *intervals[key])] for key in score_dict}


def per_task(scores: dict[str, np.ndarray], reps: int = 2000, seed: int = 0) -> dict[str, dict[str, list[Estimate]]]:
    """For each precision and each statistic (`PER_TASK`), one `Estimate` per task: rliable
    on one task's column at a time (a stratified bootstrap over seeds; the resamples do not
    depend on the statistic, so one bootstrap gives them all)."""
    func = lambda x: np.array([f(x) for f in PER_TASK.values()])
    num_tasks = next(iter(scores.values())).shape[1]
    columns = [_estimates({k: m[:, [task]] for k, m in scores.items()}, func, reps, seed) for task in range(num_tasks)]
    return {key: {name: [c[key][i] for c in columns] for i, name in enumerate(PER_TASK)} for key in scores}


def aggregate(scores: dict[str, np.ndarray], reps: int = 2000, seed: int = 0) -> dict[str, dict[str, Estimate]]:
    """IQM, mean, median and optimality gap over all tasks and seeds of each precision."""
    func = lambda x: np.array([f(x) for f in AGGREGATES.values()])
    return {key: dict(zip(AGGREGATES, values)) for key, values in _estimates(scores, func, reps, seed).items()}


def probability_of_improvement(scores: dict, baseline: str, reps: int = 2000, seed: int = 0) -> dict[str, Estimate]:
    """P(X > baseline) for every other precision X, averaged over tasks, with its CI
    (rliable's pairs: each matrix resampled independently)."""
    pairs = {key: [scores[key], scores[baseline]] for key in scores if key != baseline}
    func = lambda x, y: np.array([metrics.probability_of_improvement(x, y)])
    return {key: values[0] for key, values in _estimates(pairs, func, reps, seed).items()}


def verdict(difference: Estimate, margin: float = MARGIN) -> str:
    """ "equivalent" when the whole CI of the difference lies within +-margin; "worse" when
    it lies below 0 and is not within the margin; "better" above 0 likewise; else "not shown"."""
    if -margin <= difference.low and difference.high <= margin:
        return "equivalent"
    return "worse" if difference.high < 0 else "better" if difference.low > 0 else "not shown"


def learned(scores: dict[str, np.ndarray]) -> dict[str, list[bool]]:
    """Per precision and task: whether the IQM of its normalised scores reaches `LEARNED_FROM`
    (a NaN IQM, seeds without a finished episode, is not called unlearned: it is unknown)."""
    return {key: [not iqm(m[:, [task]]) < LEARNED_FROM for task in range(m.shape[1])] for key, m in scores.items()}


def judge(scores, baseline: str, reps=2000, seed=0, margin=MARGIN, learnt=None, lower_is_better=False) -> dict:
    """`scores`: {precision: [seeds, tasks]}. Per precision and task: {statistic: (the paired
    difference X - baseline with its CI, its verdict)} for each of `STATISTICS`, from one draw
    of seed indices per task shared by every precision (`paired`). The verdict is "did not
    learn" where either precision stayed at the random policy's floor (`learnt`, default
    `learned(scores)`), "too few seeds" below `MIN_SEEDS_FOR_VERDICT`, else `verdict`'s.
    `lower_is_better` (a time): the statistics are taken of the negated scores and the
    differences told back in the scores' units, so "worse" is a longer time and the tail is
    the slowest seeds."""
    num_seeds, num_tasks = scores[baseline].shape
    learnt = learned(scores) if learnt is None else learnt
    sign = -1.0 if lower_is_better else 1.0
    out = {key: [] for key in scores if key != baseline}
    for task in range(num_tasks):
        indices = resample_indices(num_seeds, reps, seed)
        for key in out:
            judged, few = {}, min(scores[key].shape[0], num_seeds) < MIN_SEEDS_FOR_VERDICT
            for name in STATISTICS:
                e = paired(sign * scores[key][:, task], sign * scores[baseline][:, task], FUNCS[name], indices)
                told = e if sign > 0 else Estimate(0.0 - e.point, 0.0 - e.high, 0.0 - e.low)
                said = "too few seeds" if few else verdict(e, margin)
                judged[name] = (told, said if learnt[key][task] and learnt[baseline][task] else "did not learn")
            out[key].append(judged)
    return out


def equivalence(judged: dict[str, list[dict[str, tuple[Estimate, str]]]]) -> dict[str, list[tuple[Estimate, str]]]:
    """Per precision and task: (the IQM difference, the verdict all statistics agree on:
    `combine`; "did not learn" and "too few seeds" as each statistic says them)."""
    combined = lambda task: (task["IQM"][0], combine(v for _, v in task.values()))
    return {key: [combined(task) for task in per_task] for key, per_task in judged.items()}


def failure_rate(scores: np.ndarray, below: float = FAIL_BELOW) -> tuple[int, int]:
    """(seeds whose normalised score ends below `below`, seeds with a score)."""
    finite = np.asarray(scores, np.float64)[np.isfinite(scores)]
    return int(np.sum(finite < below)), int(finite.size)


def performance_profiles(scores: dict[str, np.ndarray], taus, reps: int = 2000, seed: int = 0):
    """rliable's score distributions (the fraction of runs above each tau) with CIs."""
    return _rliable(seed, rly.create_performance_profile, scores, np.asarray(taus), reps=reps)


def curves(curve_scores: dict[str, np.ndarray], reps: int = 500, seed: int = 0) -> dict[str, list[Estimate]]:
    """The IQM over seeds at each point of a learning curve (`[runs, points]` per precision);
    a resample draws whole runs, so a run's points stay together (rliable's curve recipe)."""
    func = lambda x: np.array([metrics.aggregate_iqm(x[..., i]) for i in range(x.shape[-1])])
    return _estimates({key: np.asarray(c)[:, None, :] for key, c in curve_scores.items()}, func, reps, seed)
