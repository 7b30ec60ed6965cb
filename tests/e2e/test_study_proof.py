"""What the proof issue added to the study: the AUC as a second score with its own verdict,
the power plan (TOST seeds from a pilot's spread, and the report saying which plan it ran
under), fp32 judged against the random floor where it is its own reference, the GPU preset,
and a study that stops on SIGINT wherever it lands. Cells are written by hand
(tests/e2e/test_study_honesty.py's `write_cell`) unless a test is marked slow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import scipy.stats

from genesis_jax.cli import main
from genesis_jax.cli.study import PRESETS, cells, plan, report, stats
from tests.e2e.test_study_honesty import STEPS, one_line, study_argv, write_cell


def curve_rows(per_update_returns: list[list[float]]) -> list[dict]:
    """PPO-like rows: one finished episode per seed and update with the given returns."""
    return [
        {"update": u, "step": 512 * (u + 1), "return_sum_per_seed": r, "episodes_per_seed": [1] * len(r)}
        for u, r in enumerate(per_update_returns)
    ]


def test_auc_is_each_seeds_mean_return_over_the_runs_windows():
    # seed 0 climbs 0..300, seed 1 is flat at 100; 4 rows in 4 windows
    rows = curve_rows([[0.0, 100.0], [100.0, 100.0], [200.0, 100.0], [300.0, 100.0]])
    np.testing.assert_allclose(cells.auc_scores(rows, points=4), [150.0, 100.0])
    np.testing.assert_allclose(cells.auc_scores(rows, points=2), [150.0, 100.0])  # (50 + 250) / 2
    # a window where a seed finished no episode is left out of that seed's mean
    rows[0]["episodes_per_seed"] = [0, 1]
    np.testing.assert_allclose(cells.auc_scores(rows, points=4), [200.0, 100.0])


def test_seeds_needed_is_tost_with_the_normal_quantiles():
    z = scipy.stats.norm.ppf
    for sd in (0.01, 0.05, 0.1, 0.2):
        expected = 2 * (z(0.975) + z(0.9)) ** 2 * sd**2 / stats.MARGIN**2
        assert plan.seeds_needed(sd) == max(stats.MIN_SEEDS_FOR_VERDICT, int(np.ceil(expected - 1e-9)))
    # never below the study's own minimum for a verdict: the two rules agree
    assert plan.seeds_needed(0.0) == stats.MIN_SEEDS_FOR_VERDICT
    assert plan.seeds_needed(0.1) > plan.seeds_needed(0.05) > plan.seeds_needed(0.01)
    with pytest.raises(ValueError, match="not finite"):
        plan.seeds_needed(float("nan"))


def test_the_planned_seeds_give_the_promised_power_for_the_mean():
    """Simulated: two precisions with the same normal score distribution, at the planned seeds
    the 95% interval of the mean difference lies within the margin in at least ~80% of trials."""
    rng = np.random.default_rng(0)
    sd = 0.08
    n = plan.seeds_needed(sd)
    a, b = rng.normal(0.8, sd, (4000, n)), rng.normal(0.8, sd, (4000, n))
    diff = a.mean(1) - b.mean(1)
    half = 1.96 * np.sqrt(a.var(1, ddof=1) / n + b.var(1, ddof=1) / n)
    power = np.mean((diff - half >= -stats.MARGIN) & (diff + half <= stats.MARGIN))
    assert 0.77 <= power <= 0.9, power
    assert plan.pooled_sd([1.0, 2.0, 3.0], [2.0, 4.0]) == pytest.approx(np.sqrt((2.0 + 2.0) / 3))


@pytest.mark.slow
def test_the_plan_from_its_pilot_and_the_study_states_it_and_judges_both_scores(tmp_path, capsys):
    out = tmp_path / "study"
    rng = np.random.default_rng(1)
    pilot = {p: (400 + 40 * rng.standard_normal(8)).tolist() for p in ("fp32", "fp16")}
    for precision, returns in pilot.items():
        write_cell(out / "plan", precision, num_seeds=8, returns=returns)
    argv = ["study", "--plan", "--out", str(out), "--pilot-seeds", "8", "--precisions", "fp32,fp16"]
    assert main([*argv, "--total-steps", str(STEPS), "--no-progress"]) == 0  # the kept pilot cells: nothing trains
    printed = capsys.readouterr().out
    saved = json.loads((out / "plan.json").read_text())["tasks"]["CartPole-v1"]
    random = cells.random_floor("CartPole-v1")
    normalised = [(np.asarray(r) - random) / (500 - random) for r in pilot.values()]
    sd = np.sqrt((np.var(normalised[0], ddof=1) + np.var(normalised[1], ddof=1)) / 2)
    assert saved["sd_final"] == pytest.approx(sd)
    # the seeds: from the upper bound of the SD of the paired differences (tests/e2e/test_study_prereg.py)
    assert saved["seeds_final"] == plan.paired_seeds(normalised[1], normalised[0])[2]
    assert saved["seeds"] == max(saved["seeds_final"], saved["seeds_auc"])
    # its time: both pilot cells' 1 s of training per 8 seeds and 1 s of compilation, at the planned seeds
    assert saved["estimated_seconds"] == pytest.approx(2 * (1.0 + saved["seeds"] / 8))
    assert "| CartPole-v1 | 2048 steps | 8 |" in printed and f"--num-seeds {saved['seeds']}" in printed
    # a study's cells give the report's two scores, each with its own verdict (in an --out of its
    # own: one holding a plan runs only the plan's study, tests/e2e/test_study_prereg.py)
    out = tmp_path / "exploratory"
    ramp = [[20.0 + 120 * u + 3 * k for k in range(6)] for u in range(4)]  # learns over the run
    write_cell(out, "fp32", num_seeds=6, returns=ramp[-1], rows=curve_rows(ramp))
    # fp16: the same end, but at the end from the start (a higher AUC, the same final return)
    flat = [ramp[-1]] * 4
    write_cell(out, "fp16", num_seeds=6, returns=ramp[-1], rows=curve_rows(flat))
    assert main(study_argv(out, "--num-seeds", "6")) == 0
    text = (out / "report.md").read_text()
    final_row = next(line for line in text.splitlines() if line.startswith("| CartPole-v1 | final return |"))
    auc_row = next(line for line in text.splitlines() if line.startswith("| CartPole-v1 | AUC |"))
    assert "| equivalent (0.00 [" in final_row  # the same final returns
    # AUC difference by hand: fp16 is at ramp[-1] throughout, fp32's mean over the 4 updates
    fp32_auc = np.mean(ramp, axis=0)
    expected = (stats.iqm(np.array(ramp[-1])[:, None]) - stats.iqm(fp32_auc[:, None])) / (500 - 22.0)
    saved_stats = json.loads((out / "stats.json").read_text())
    difference = saved_stats["auc"]["equivalence"]["fp16"][0][0]
    assert difference[0] == pytest.approx(expected * (500 - 22.0) / (500 - random))
    assert "better" in auc_row


def test_fp32_as_its_own_reference_is_judged_against_the_random_floor():
    def analysed(fp32):
        raw = {"fp32": np.array([fp32], float).T, "fp16": np.array([fp32], float).T}
        return report.analyse(raw, ["Breakout-MinAtar"], {"Breakout-MinAtar": 0.4}, reps=200)

    at_floor = analysed([0.39, 0.41, 0.40, 0.42, 0.38, 0.40])  # fp32 no better than random
    assert at_floor["learned"]["fp32"] == [False]
    assert report._verdict_cell(at_floor, "fp16", 0).startswith("did not learn (fp32)")
    learnt = analysed([2.4, 2.5, 2.6, 2.5, 2.45, 2.55])
    assert learnt["learned"]["fp32"] == [True] and learnt["equivalence"]["fp16"][0][1] == "equivalent"


def test_every_task_of_the_gpu_preset_builds_at_its_budget_and_seeds(tmp_path, monkeypatch, capsys):
    from genesis_jax.cli import study

    chosen = PRESETS["gpu"]
    assert chosen["num_seeds"] == 32 and set(chosen["total_steps"]) == set(chosen["tasks"])
    budgets = cells.budgets(chosen["tasks"], chosen["total_steps"])
    built = study.plan_cells(tmp_path, chosen["tasks"], list(cells.PRECISIONS), 32, 0, budgets)
    assert len(built) == len(chosen["tasks"]) * 4
    assert {c.num_seeds for _, _, c in built.values()} == {32}
    # flags beside a preset override it: tasks and a budget
    seen = {}
    monkeypatch.setattr(study, "run_study", lambda out, **kw: seen.update(kw) or (tmp_path / "r.md"))
    argv = ["study", "--preset", "gpu", "--out", str(tmp_path), "--tasks", "CartPole-v1,Breakout-MinAtar"]
    assert main([*argv, "--total-steps", "CartPole-v1=1024"]) == 0
    assert seen["tasks"] == ["CartPole-v1", "Breakout-MinAtar"] and seen["num_seeds"] == 32
    assert seen["total_steps"] == {"CartPole-v1": 1024, "Breakout-MinAtar": 10_000_000}
    assert main(["study", "--preset", "cpu-someday", "--out", str(tmp_path)]) == 2
    assert "unknown preset 'cpu-someday'; accepted: gpu" in one_line(capsys)


def test_a_signal_while_the_statistics_run_stops_the_study(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        write_cell(out, precision)

    def floor_then_signal(task, seed=0):  # SIGINT lands while a program compiles for the statistics
        os.kill(os.getpid(), signal.SIGINT)
        return 22.0

    monkeypatch.setattr(cells, "random_floor", floor_then_signal)
    assert main(study_argv(out)) == 128 + signal.SIGINT
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("genesis-jax: SIGINT received: the study stopped while computing its statistics;")
    assert not (out / "report.md").exists()


def test_underflow_telemetry_is_refused_where_it_is_not_measured(capsys):
    assert main(["train", "dqn", "--underflow-telemetry", "--total-steps", "20000", "--quiet"]) == 2
    assert "underflow-telemetry is not measured by dqn; it is by ppo and world-model" in one_line(capsys)


@pytest.mark.slow  # a subprocess compiles PPO: a minute on 2 busy cores
def test_sigint_while_a_cell_compiles_stops_the_study_subprocess(tmp_path):
    out = tmp_path / "study"
    argv = [sys.executable, "-m", "genesis_jax.cli", "study", "--out", str(out), "--precisions", "fp32,fp16"]
    argv += ["--num-seeds", "2", "--total-steps", "200000", "--no-cost", "--no-progress"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stderr:  # the cell starts: its initial state and chunk compile next
        if line.startswith("study: CartPole-v1 fp32:"):
            break
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGINT, rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith("genesis-jax: SIGINT received: the study stopped in cell CartPole-v1 fp32;"), last
    assert not (out / "cells" / "CartPole-v1" / "fp16").exists()


@pytest.mark.slow  # trains a world model with the telemetry (its PPO run: the GPU preset's fp16 cell, shared)
def test_the_telemetry_reaches_the_rows_the_summary_and_a_plot(gpu_smoke_study, tmp_path):
    # PPO's run: the smoke study's fp16 cell, a PPO run at fp16 with the telemetry (a study
    # turns it on there); the world model's through `train`'s own flag.
    ppo, wm = gpu_smoke_study / "cells" / "CartPole-v1" / "fp16", tmp_path / "wm"
    base = ["--precision", "fp16", "--loss-scaling", "none", "--underflow-telemetry", "--quiet", "--no-progress"]
    assert (
        main(
            ["train", "world-model", *base, "--data", "synthetic-small", "--epochs", "2"]
            + ["--num-sequences", "64", "--sequence-length", "8", "--depth", "1", "--batch-size", "256"]
            + ["--num-seeds", "2", "--out", str(wm)]
        )
        == 0
    )
    for run, layer in ((ppo, "actor_0"), (wm, "enc_0")):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert rows and all(
            0.0 <= r[f"underflow/{layer}"] <= 1.0 and r[f"flushed/{layer}"] <= r[f"underflow/{layer}"] for r in rows
        )
        summary = json.loads((run / "summary.json").read_text())
        assert summary["underflow_mean"] == pytest.approx(np.mean([r["underflow"] for r in rows]))
        assert (run / "underflow.png").is_file()
    assert len(json.loads((wm / "summary.json").read_text())["eval_loss_per_seed"]) == 2


@pytest.fixture(scope="module")
def gpu_smoke_study(tmp_path_factory):
    """The GPU preset's study at a smoke size: 2 PPO cells (fp32, fp16) of CartPole-v1, 2 seeds,
    1024 steps: its --out."""
    out = tmp_path_factory.mktemp("gpu") / "gpu"
    argv = ["study", "--preset", "gpu", "--out", str(out), "--tasks", "CartPole-v1"]
    argv += ["--precisions", "fp32,fp16", "--num-seeds", "2", "--total-steps", "1024", "--reps", "100"]
    assert main([*argv, "--no-cost", "--no-progress"]) == 0
    return out


@pytest.mark.slow  # the gpu_smoke_study fixture compiles and trains 2 PPO cells at a smoke size
def test_the_gpu_preset_runs_at_a_smoke_size(gpu_smoke_study):
    """The preset's settings reach the cells and the report. Its wide res-MLP task is checked as
    the cell it would train, not run: on a CPU a float16 1024-wide cell of 2 updates took 110 s
    (float16 arithmetic is emulated there), which is the GPU's work."""
    out = gpu_smoke_study
    text = (out / "report.md").read_text()
    assert "--preset gpu" in text and "2 seeds per cell" in text and "CartPole-v1: 1024 steps" in text
    summary = json.loads((out / "cells" / "CartPole-v1" / "fp16" / "summary.json").read_text())
    assert summary["config"]["underflow_telemetry"] is True
    assert "| CartPole-v1 | fp16 |" in text.split("## Underflow")[1]
    budget = PRESETS["gpu"]["total_steps"]["CartPole-v1-resmlp1024"]
    wide = cells.cell_config("CartPole-v1-resmlp1024", "fp16", 32, 0, budget)
    assert (wide.network, wide.width, wide.underflow_telemetry, wide.total_steps) == ("resmlp", 1024, True, 500_000)
