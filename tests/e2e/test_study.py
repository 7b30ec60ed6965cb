"""The precision study: its statistics are rliable's on the same score matrix, its verdicts
follow their rule, and the command resumes a study without redoing finished cells (and
refuses to reuse them at other settings: tests/e2e/test_study_honesty.py)."""

import json

import numpy as np
import pytest
import scipy.stats
from rliable import library as rly
from rliable import metrics

from genesis_jax.cli.study import stats
from tests.support.processes import cpu_env, run_python

# A fixed score matrix per precision: 6 seeds x 2 tasks (normalised scores).
SCORES = {
    "fp32": np.array([[0.9, 0.5], [1.0, 0.6], [0.8, 0.4], [0.95, 0.55], [0.85, 0.7], [1.0, 0.45]]),
    "fp16": np.array([[0.92, 0.5], [0.97, 0.62], [0.81, 0.41], [0.9, 0.5], [0.88, 0.66], [0.99, 0.47]]),
    "bf16": np.array([[0.5, 0.2], [0.6, 0.3], [0.4, 0.1], [0.55, 0.25], [0.45, 0.3], [0.6, 0.2]]),
}
REPS = 100  # bootstrap replications (the study's least): ours are checked against rliable's at the same count


def rliable_direct(score_dict, func, seed=0):
    """rliable called directly, as its README does (it resamples with numpy's global generator)."""
    np.random.seed(seed)
    return rly.get_interval_estimates(score_dict, func, reps=REPS, random_state=np.random.RandomState(seed))


def test_normalise_is_min_max_against_random_and_reference():
    raw = np.array([[20.0, -300.0], [500.0, -80.0]])
    out = stats.normalise(raw, random=[20.0, -500.0], reference=[500.0, -80.0])
    np.testing.assert_allclose(out, [[0.0, 200 / 420], [1.0, 1.0]])
    with pytest.raises(ValueError, match="reference return equals its random return"):
        stats.normalise(raw, random=[1.0, 1.0], reference=[1.0, 2.0])


def test_aggregates_agree_with_rliable_called_directly():
    ours = stats.aggregate(SCORES, reps=REPS, seed=0)
    func = lambda x: np.array(  # noqa: E731
        [
            metrics.aggregate_iqm(x),
            metrics.aggregate_mean(x),
            metrics.aggregate_median(x),
            metrics.aggregate_optimality_gap(x),
        ]
    )
    points, intervals = rliable_direct(SCORES, func)
    for precision in SCORES:
        got = ours[precision]
        np.testing.assert_allclose([e.point for e in got.values()], points[precision])
        np.testing.assert_allclose([e.low for e in got.values()], intervals[precision][0])
        np.testing.assert_allclose([e.high for e in got.values()], intervals[precision][1])
    # and the IQM is the 25%-trimmed mean of every entry (independently of rliable)
    assert ours["fp32"]["IQM"].point == pytest.approx(scipy.stats.trim_mean(SCORES["fp32"].ravel(), 0.25))


def test_per_task_estimates_are_rliable_on_each_column():
    ours = stats.per_task(SCORES, reps=REPS, seed=0)
    for task in range(2):
        column = {k: v[:, [task]] for k, v in SCORES.items()}
        points, intervals = rliable_direct(column, lambda x: np.array([metrics.aggregate_iqm(x)]))
        for precision in SCORES:
            e = ours[precision]["IQM"][task]
            assert (e.point, e.low, e.high) == pytest.approx(
                (points[precision][0], intervals[precision][0][0], intervals[precision][1][0])
            )
        assert ours["fp16"]["Mean"][task].point == pytest.approx(SCORES["fp16"][:, task].mean())
        assert ours["fp16"]["Median"][task].point == pytest.approx(np.median(SCORES["fp16"][:, task]))


@pytest.mark.slow
def test_probability_of_improvement_agrees_with_rliable():
    ours = stats.probability_of_improvement(SCORES, "fp32", reps=REPS, seed=0)
    pairs = {k: [SCORES[k], SCORES["fp32"]] for k in ("fp16", "bf16")}
    points, intervals = rliable_direct(pairs, lambda x, y: np.array([metrics.probability_of_improvement(x, y)]))
    for precision in pairs:
        e = ours[precision]
        assert (e.point, e.low, e.high) == pytest.approx(
            (points[precision][0], intervals[precision][0][0], intervals[precision][1][0])
        )
    assert ours["bf16"].point == 0.0  # every bf16 seed below every fp32 seed, on both tasks


def test_equivalence_verdicts_follow_the_margin_rule():
    verdicts = stats.equivalence(stats.judge(SCORES, "fp32", reps=REPS, seed=0))
    difference, verdict = verdicts["fp16"][0]
    expected = metrics.aggregate_iqm(SCORES["fp16"][:, [0]]) - metrics.aggregate_iqm(SCORES["fp32"][:, [0]])
    assert difference.point == pytest.approx(expected)
    assert [v for _, v in verdicts["bf16"]] == ["worse", "worse"]
    assert verdict == ("equivalent" if -0.05 <= difference.low and difference.high <= 0.05 else "not shown")
    Estimate = stats.Estimate
    assert stats.verdict(Estimate(0.0, -0.04, 0.049)) == "equivalent"
    assert stats.verdict(Estimate(0.0, -0.06, 0.01)) == "not shown"
    assert stats.verdict(Estimate(-0.1, -0.2, -0.01)) == "worse"
    assert stats.verdict(Estimate(0.1, 0.01, 0.2)) == "better"


def test_every_task_is_a_valid_config_of_its_algorithm():
    from genesis_jax.cli.study import PRECISIONS, TASKS, cells

    for name, task in TASKS.items():
        for precision in PRECISIONS:
            config = cells.cell_config(name, precision, 8, 0, task.total_steps)
            assert all(getattr(config, k) == v for k, v in task.settings.items()), name
            assert getattr(config, task.budget_field) == task.total_steps and config.num_seeds == 8


def test_learning_curves_are_per_seed_window_means():
    from genesis_jax.cli.study.cells import learning_curve

    rows = [
        {"step": 10 * (i + 1), "return_sum_per_seed": [float(i), 2.0 * i], "episodes_per_seed": [1, 2]}
        for i in range(4)
    ]
    steps, returns = learning_curve(rows, points=2)
    assert steps.tolist() == [20, 40]
    np.testing.assert_allclose(returns, [[0.5, 2.5], [0.5, 2.5]])  # seed 1: (0+2)/(2+2), (4+6)/(2+2)
    recent = [{"step": 5 * (i + 1), "recent_return_per_seed": [i, None]} for i in range(4)]
    steps, returns = learning_curve(recent, points=2)
    assert steps.tolist() == [10, 20] and returns[0].tolist() == [1.0, 3.0] and np.isnan(returns[1]).all()


def test_a_bad_choice_is_one_line_before_anything_runs(tmp_path, capsys):
    from genesis_jax.cli import main

    assert main(["study", "--out", str(tmp_path / "s"), "--tasks", "Pong-v0"]) == 2
    assert "unknown task 'Pong-v0'; accepted: CartPole-v1" in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path / "s"), "--precisions", "fp16,bf16"]) == 2
    assert "include it in the precisions" in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path / "s"), "--num-seeds", "1"]) == 2
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # about 60 s on 2 busy CPU cores: three cells compile and train
def test_the_study_command_reports_and_resumes_without_redoing_cells(tmp_path, capsys):
    from genesis_jax.cli import main

    out = tmp_path / "study"
    # 2000 steps are 3 whole PPO rollouts of 4 x 128 steps: the cells run 1536, and the report says so
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--num-seeds", "3", "--total-steps", "2000"]
    argv += ["--reps", "100", "--no-progress"]
    assert main(argv) == 0
    report = (out / "report.md").read_text()
    assert "| CartPole-v1 | fp16 |" in report and "3 seeds take" in report
    assert "3 seeds per cell (seeds 0 to 2;" in report and "CartPole-v1: 1536 steps per seed" in report
    for score in ("final return", "AUC"):  # a row per score, no verdict from 3 seeds
        row = f"| CartPole-v1 | {score} | "
        assert f"{row}too few seeds (" in report or f"{row}did not learn (" in report
    for name in ("aggregate.png", "improvement.png", "profiles.png", "curves_CartPole-v1.png", "stats.json"):
        assert (out / name).is_file()
    cell = out / "cells" / "CartPole-v1" / "fp16"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["num_seeds"] == 3 and summary["seeds"] == [0, 1, 2] and len(summary["final_return_per_seed"]) == 3
    before = {p: p.read_bytes() for p in (out / "cells").rglob("*.json*")}
    capsys.readouterr()
    assert main(argv) == 0  # again: every cell finished (the cost cell too), none runs
    assert capsys.readouterr().err.count("finished before, kept") == 3
    assert {p: p.read_bytes() for p in (out / "cells").rglob("*.json*")} == before
    # again with more seeds: refused in one line, not the old cells under a new header
    assert main([*argv, "--num-seeds", "4"]) == 2
    assert "--num-seeds: 3 -> 4" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in (out / "cells").rglob("*.json*")} == before


def test_importing_the_study_leaves_the_programs_matplotlib_backend():
    # The report's import switched the process to Agg: a notebook importing the study (its inline
    # backend) showed none of its own plots after. Only the command's own process picks Agg.
    code = "import matplotlib; import genesis_jax.cli.study; print(matplotlib.get_backend())"
    done = run_python(["-c", code], env=cpu_env(MPLBACKEND="svg"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "svg", done.stdout
