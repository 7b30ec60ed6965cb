"""The study reports what it ran and calls nothing equivalent that it cannot tell: a study
directory's cells are reused only at the settings they were trained with, the report's header
comes from the cells it read, no verdict comes from too few seeds or from runs that did not
learn, bad choices are refused before anything trains, and a stopped study says to run the
study again. Cells here are written by hand (a summary and metric rows, as a trainer writes
them), so nothing trains."""

from __future__ import annotations

import json
import pathlib
import signal

import numpy as np
import pytest

from genesis_jax.algos.base import StudyTask
from genesis_jax.cli import main
from genesis_jax.cli.study import cells, report, stats
from genesis_jax.run.signals import TrainingInterrupted

SEEDS, STEPS = 3, 2048


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def write_cell(out, precision, *, num_seeds=SEEDS, steps=STEPS, ran_steps=None, returns=None, rows=None, seed=0):
    """A finished CartPole-v1 cell as PPO leaves it: summary.json (its config included) and
    metrics.jsonl. `ran_steps`: the steps it ran (PPO runs whole rollouts: fewer than asked)."""
    path = out / "cells" / "CartPole-v1" / precision
    path.mkdir(parents=True)
    config = cells.cell_config("CartPole-v1", precision, num_seeds, seed, steps)  # as the study builds it
    returns = [200.0 + 10 * k for k in range(num_seeds)] if returns is None else returns
    summary = {
        "seeds": list(range(seed, seed + num_seeds)),
        "num_seeds": num_seeds,
        "total_steps": ran_steps or steps,
        "final_return": float(np.mean(returns)),
        "final_return_per_seed": returns,
        "device": "cpu:cpu x1",
        "wall_seconds": 2.0,
        "compile_seconds": 1.0,
        "total_updates": 64,
        "skipped_updates": 0,
        "loss_scale": 1.0,
        "loss_scale_per_seed": [1.0] * num_seeds,
        "halted_per_seed": [False] * num_seeds,
        "stopped": None,
        "config": json.loads(json.dumps(config.to_dict())),
    }
    (path / "summary.json").write_text(json.dumps(summary))
    ran = (ran_steps or steps) // 4
    rows = rows or [
        {"update": u, "step": ran * (u + 1), "return_sum_per_seed": returns, "episodes_per_seed": [1] * num_seeds}
        for u in range(4)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def study_argv(out, *extra) -> list[str]:
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--num-seeds", str(SEEDS)]
    return argv + ["--total-steps", str(STEPS), "--reps", "100", "--no-cost", "--no-progress", *extra]


def files(out) -> dict:
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("flags", "change"),
    [
        (["--num-seeds", "4"], "--num-seeds: 3 -> 4"),
        (["--total-steps", "4096"], "--total-steps: 2048 -> 4096"),
        (["--seed", "1"], "--seed: 0 -> 1"),
    ],
)
def test_a_study_at_other_settings_than_its_cells_is_refused(tmp_path, capsys, flags, change):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        write_cell(out, precision)
    before = files(out)
    assert main(study_argv(out, *flags)) == 2  # argparse keeps the last of a repeated flag
    line = one_line(capsys)
    assert line.startswith(f"genesis-jax: error: {out / 'cells' / 'CartPole-v1' / 'fp32'} was trained with ")
    assert change in line and "(and 1 more cell)" in line and "another --out" in line
    assert files(out) == before  # nothing trained, no report claiming the new settings


def test_a_cell_stopped_before_its_summary_is_judged_by_the_study_record(tmp_path, capsys):
    out = tmp_path / "study"
    write_cell(out, "fp32")
    config = cells.cell_config("CartPole-v1", "fp16", SEEDS, 0, STEPS)
    killed = out / "cells" / "CartPole-v1" / "fp16"
    (killed / "checkpoints" / "512").mkdir(parents=True)  # killed: a checkpoint, no summary.json
    cells.record_planned(out, killed, config)
    assert main(study_argv(out, "--precisions", "fp16,fp32", "--total-steps", "4096")) == 2
    line = one_line(capsys)
    assert f"{killed} was trained with" in line and "--total-steps: 2048 -> 4096" in line


@pytest.mark.slow
def test_the_header_says_what_the_cells_ran(tmp_path, capsys):
    # --total-steps 2000 is 3 whole PPO rollouts of 512 steps: the cells ran 1536 steps
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        write_cell(out, precision, steps=2000, ran_steps=1536)
    assert main(study_argv(out, "--total-steps", "2000")) == 0
    text = (out / "report.md").read_text()
    assert "3 seeds per cell (seeds 0 to 2;" in text
    assert "CartPole-v1: 1536 steps per seed (as the cells ran them)" in text and "2000 steps" not in text
    assert "Device: cpu:cpu x1." in text and "0 cells trained in this invocation (0 s), 2 kept from before." in text


def fp16_against_fp32(fp32, fp16) -> dict:
    """The study's analysis of one CartPole-v1 column of raw returns per precision."""
    raw = {"fp32": np.array([fp32], float).T, "fp16": np.array([fp16], float).T}
    return report.analyse(raw, ["CartPole-v1"], {"CartPole-v1": 22.0}, reps=200)


def verdict(analysis) -> str:
    return analysis["equivalence"]["fp16"][0][1]


@pytest.mark.slow
def test_no_verdict_from_runs_at_the_random_floor_or_from_too_few_seeds():
    # the case: 2 seeds, neither precision learned (normalised IQM 0.02)
    floor = fp16_against_fp32([31.5, 31.6], [31.5, 31.6])
    assert verdict(floor) == "did not learn"
    assert report._verdict_cell(floor, "fp16", 0).startswith("did not learn (fp16, fp32) (0.00 [")
    # fp32 learned, fp16 stayed at the floor: fp16 did not learn (not "worse")
    fp16_floor = fp16_against_fp32([480.0, 490, 470, 500, 495, 485], [30.0, 31, 29, 32, 30, 31])
    assert verdict(fp16_floor) == "did not learn"
    assert report._verdict_cell(fp16_floor, "fp16", 0).startswith("did not learn (fp16) (")
    # both learned alike, but 2 seeds give an interval with no width
    assert verdict(fp16_against_fp32([480.0, 490], [480.0, 490])) == "too few seeds"
    # enough seeds: the margin rule
    same = [480.0, 490, 470, 500, 495, 485]
    assert verdict(fp16_against_fp32(same, same)) == "equivalent"
    assert stats.MIN_SEEDS_FOR_VERDICT == 5 and stats.LEARNED_FROM == 0.1


def world_model_task(monkeypatch):
    """A task of an algorithm whose budget is epochs, not environment steps."""
    monkeypatch.setitem(
        cells.TASKS, "wm:synthetic", StudyTask({"data": "synthetic"}, 100, None, "-", algo="world-model")
    )


def test_one_budget_for_tasks_counted_in_steps_and_in_epochs_is_refused(tmp_path, capsys):
    # 262144 as CartPole's environment steps and as the world model's epochs: 146 h planned
    argv = ["study", "--out", str(tmp_path / "s"), "--tasks", "CartPole-v1,wm:synthetic", "--total-steps", "262144"]
    assert main([*argv, "--dry-run"]) == 2
    line = one_line(capsys)
    assert "total-steps 262144 for every task, but wm:synthetic counts its budget in epochs" in line
    assert main([*argv[:-1], "CartPole-v1=262144,wm:synthetic=2", "--dry-run"]) == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reps", "0"], "reps must be an integer of at least 100 (bootstrap replications per interval), got 0"),
        (["--reps", "-3"], "reps must be an integer of at least 100 (bootstrap replications per interval), got -3"),
        (["--reps", "10"], "reps must be an integer of at least 100"),
        (["--tasks", ""], "the study names no task; accepted: CartPole-v1"),
        (["--tasks", " , "], "the study names no task; accepted: CartPole-v1"),
        (["--tasks", "CartPole-v1,CartPole-v1"], "task 'CartPole-v1' is given twice; name each task once"),
        (["--precisions", "fp32,fp16,fp32"], "precision 'fp32' is given twice; name each precision once"),
        (["--tasks", "wm:synthetic"], "wm:synthetic trains world-model, whose budget is not environment steps"),
        (["--tasks", "CartPole-v1,wm:synthetic", "--total-steps", "CartPole-v1=512"], "whose budget is not"),
    ],
)
def test_bad_study_input_is_one_line_before_anything_trains(tmp_path, capsys, monkeypatch, flags, message):
    world_model_task(monkeypatch)
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--num-seeds", "2", "--total-steps", "512"]
    assert main([*argv, "--no-cost", "--no-progress", *flags]) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax: error: ") and message in line
    assert not out.exists()


def test_a_plan_with_too_few_reps_is_refused_before_its_pilot_trains(tmp_path, capsys):
    # the plan's study command would carry --reps 10, which the confirmatory study refuses
    out = tmp_path / "study"
    assert main(["study", "--plan", "--out", str(out), "--reps", "10", "--total-steps", "512", "--no-progress"]) == 2
    assert "reps must be an integer of at least 100" in one_line(capsys)
    assert not out.exists()


def test_a_task_given_two_budgets_is_refused(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--total-steps", "CartPole-v1=512,CartPole-v1=1024"]) == 2
    assert "'CartPole-v1' is given twice in 'CartPole-v1=512,CartPole-v1=1024'" in capsys.readouterr().err
    assert not out.exists()


def test_a_stopped_study_says_to_run_the_study_again(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    cell = out / "cells" / "CartPole-v1" / "fp32"

    def interrupted(*args, **kwargs):  # what a cell's Session raises on SIGINT
        raise TrainingInterrupted(
            f"SIGINT received: stopped after update 2 of 4; metrics and a checkpoint are in {cell}; "
            f"continue with --resume --out {cell}",
            signal.SIGINT,
        )

    monkeypatch.setattr(cells, "run_cell", interrupted)
    assert main(study_argv(out)) == 128 + signal.SIGINT
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--resume" not in line
    assert line.startswith("genesis-jax: SIGINT received: the study stopped in cell CartPole-v1 fp32;")
    assert f"to continue, run `genesis-jax study --out {out} " in line


def moved_default(path, field="lr", value=1e-3):
    """The cell at `path` as an older genesis-jax left it: one of its algorithm's settings
    (not a study flag) at a default that has changed since."""
    summary = json.loads((path / "summary.json").read_text())
    summary["config"][field] = value
    (path / "summary.json").write_text(json.dumps(summary))


def test_a_report_only_reads_cells_whose_algorithm_default_moved(tmp_path, capsys):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        moved_default(write_cell(out, precision))
    before = files(out)
    assert main(study_argv(out)) == 2  # a study that may train refuses them, as before
    assert "lr: 0.001 -> " in one_line(capsys)
    plan = {
        cells.cell_dir(out, "CartPole-v1", p): cells.cell_config("CartPole-v1", p, SEEDS, 0, STEPS)
        for p in ("fp32", "fp16")
    }
    moved = cells.check_report_cells(out, plan)  # a report reads them, and says where they differ
    assert set(moved) == set(plan) and all(c[0].startswith("lr: 0.001 -> ") for c in moved.values())
    assert main(study_argv(out, "--report-only", "--dry-run")) == 0
    assert "2 finished before (kept)" in capsys.readouterr().out
    assert files(out) == before


@pytest.mark.parametrize(
    ("setup", "flags", "message"),
    [
        ("fp32", [], "cells/CartPole-v1/fp16 has not finished: a report (--report-only) trains nothing"),
        (
            "both",
            ["--num-seeds", "4"],
            "was trained with other settings than this study asks for (--num-seeds: 3 -> 4)",
        ),
        ("both", ["--total-steps", "4096"], "(--total-steps: 2048 -> 4096)"),
        ("both", ["--precisions", "fp32,fp16-unscaled"], "cells/CartPole-v1/fp16-unscaled has not finished"),
    ],
)
def test_a_report_only_trains_nothing_and_checks_the_study_settings(tmp_path, capsys, setup, flags, message):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16") if setup == "both" else ("fp32",):
        write_cell(out, precision)
    before = files(out)
    assert main(study_argv(out, "--report-only", *flags)) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax: error: ") and message in line
    assert files(out) == before


def test_a_report_only_says_where_its_cells_differ_from_todays_settings(tmp_path):
    from genesis_jax.cli.study import report_only_lines

    out = tmp_path / "study"
    assert report_only_lines(out, {})[0].endswith("not against today's task settings, which they all match.")
    moved = {cells.cell_dir(out, "dqn:CartPole-v1", p): ["epsilon_steps: 250000 -> None"] for p in ("fp32", "fp16")}
    (line,) = report_only_lines(out, moved)
    assert line.startswith("Report only (`--report-only`): nothing trained;")
    assert line.endswith("cells/dqn:CartPole-v1/fp32, cells/dqn:CartPole-v1/fp16: epsilon_steps: 250000 -> None.")


@pytest.mark.slow
def test_a_report_only_writes_the_report_of_cells_whose_default_moved(tmp_path):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        moved_default(write_cell(out, precision))
    assert main(study_argv(out, "--report-only")) == 0
    text = (out / "report.md").read_text()
    assert "--report-only" in text.splitlines()[2] and "0 cells trained in this invocation" in text
    assert "Report only (`--report-only`): nothing trained;" in text and "lr: 0.001 -> " in text


def test_the_false_alarm_experiment_judges_alike_precisions_with_the_study_s_rule(tmp_path):
    """experiments/study_false_alarms.py, at smoke size: seeds identical across precisions (rho 1)
    give every difference 0, so never "worse" or "better"; its table has a row per setting."""
    import importlib.util

    path = pathlib.Path(__file__).parents[2] / "experiments" / "study_false_alarms.py"
    spec = importlib.util.spec_from_file_location("study_false_alarms", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.verdict_rates(8, 1.0, trials=3, reps=200, skewed=False) == {"worse": 0.0, "better": 0.0}
    out = tmp_path / "alarms.md"
    assert module.main(["--trials", "2", "--reps", "200", "--out", str(out)]) == 0
    assert [line.count("|") for line in out.read_text().splitlines() if line.startswith("| normal")] == [6] * 6
