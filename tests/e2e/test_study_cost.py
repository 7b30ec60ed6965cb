"""A study says what it will cost before it runs: cells x seeds x steps and an estimate from
the pilot or the task's measured figure, `--dry-run` only that and writes nothing, and every
registered task is listed with its default budget and cost in `study --help` and
docs/study.md. Cells here are written by hand (tests/e2e/test_study_honesty.py's `write_cell`)
or their run is replaced, so nothing trains."""

from __future__ import annotations

import pathlib

import pytest

from genesis_jax.cli import main
from genesis_jax.cli.study import cells, cost, train_cells
from genesis_jax.cli.study.cells import TASKS
from genesis_jax.run.signals import TrainingInterrupted
from tests.e2e.test_study_honesty import STEPS, files, study_argv, write_cell

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "study.md"


def budget(task: str) -> str:
    spec = TASKS[task]
    return f"{spec.total_steps} {spec.budget_field.replace('total_', '')}"


def test_every_registered_task_has_a_measured_cost():
    assert set(cost.COSTS) == set(TASKS), "measure the new task's cost and add it to cost.COSTS"
    for task, figure in cost.COSTS.items():
        assert figure.compile_seconds > 0 and figure.seed_seconds > 0 and figure.steps > 0 and figure.source, task


def test_study_help_lists_every_task_with_its_default_budget_and_the_defaults(capsys):
    assert main(["study", "--help"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line for line in text.split("a seed\n", 1)[1].splitlines() if line.strip()}
    assert set(rows) == set(TASKS)
    for task, row in rows.items():
        assert f" {budget(task)} " in row, row
    for default in ("default fp32,bf16,fp16,fp16-unscaled", "default 8", "default 2000", "default CartPole-v1"):
        assert default in " ".join(text.split()), default


def test_docs_list_every_task_with_its_default_budget_and_cost():
    text = DOCS.read_text()
    assert cost.markdown_table() in text, (
        "docs/study.md's task table is stale: replace it with "
        "python -c 'from genesis_jax.cli.study import cost; print(cost.markdown_table())'"
    )
    for task in TASKS:
        assert f"| `{task}` | {TASKS[task].algo} | {budget(task)} |" in text


def test_dry_run_prints_cells_seeds_steps_and_an_estimate_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--tasks", "CartPole-v1,Acrobot-v1", "--num-seeds", "4"]
    assert main([*argv, "--total-steps", "CartPole-v1=4096", "--dry-run"]) == 0
    printed = capsys.readouterr()
    assert not out.exists() and "Traceback" not in printed.err
    lines = printed.out.splitlines()
    assert lines[0] == "8 cells: 2 tasks x 4 precisions (fp32, bf16, fp16, fp16-unscaled)"
    cartpole = cost.COSTS["CartPole-v1"]
    seed = cartpole.seed_seconds * 4096 / cartpole.steps
    each = cartpole.compile_seconds + 4 * seed
    assert lines[1] == (
        f"  CartPole-v1: 4 cells x 4 seeds x 4096 steps: about {cost.duration(4 * each)} "
        f"(a cell {cartpole.compile_seconds:.0f} s compiling + 4 x {seed:.1f} s a seed, the task's 2-core figure)"
    )
    assert lines[2].startswith(f"  Acrobot-v1: 4 cells x 4 seeds x {budget('Acrobot-v1')}: about ")
    assert lines[3].startswith(
        "  the cost run (CartPole-v1 fp32 again with 1 seed, for the report's 4 seeds against 1;"
    )
    assert "--no-cost skips it): 1 cell x 1 seed x 4096 steps: about " in lines[3]
    statistics = cost.duration(2 * cost.STATISTICS_SECONDS)
    assert lines[4] == f"  then the statistics and plots: about {statistics} ({cost.STATISTICS_SOURCE})"
    assert lines[5].startswith("estimated wall time: about ") and "An estimate" in lines[5]
    assert lines[-1] == "--dry-run: nothing trained, nothing written"


def test_a_task_with_no_measured_figure_is_listed_and_planned_unestimated(tmp_path, capsys, monkeypatch):
    # A task an algorithm registered outside the package brings (`Presets.study`) has no figure in
    # COSTS: `study --help` and the estimate once failed on it with a KeyError.
    monkeypatch.setitem(TASKS, "mine:CartPole-v1", TASKS["CartPole-v1"])
    assert main(["study", "--help"]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if "mine:" in line]
    assert row == ["mine:CartPole-v1", "ppo", "500000", "steps", "-", "-"]
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--tasks", "mine:CartPole-v1", "--precisions", "fp32,fp16", "--dry-run"]
    assert main([*argv, "--num-seeds", "2", "--total-steps", "4096", "--no-cost"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "  mine:CartPole-v1: 2 cells x 2 seeds x 4096 steps: not estimated "
        "(no measured figure for mine:CartPole-v1; --plan measures one here)"
    )
    assert lines[3].startswith(
        f"estimated wall time: about {cost.duration(cost.STATISTICS_SECONDS)}, besides what is not estimated."
    )


def test_the_estimate_counts_kept_cells_as_nothing_and_prefers_the_pilot(tmp_path, capsys):
    out = tmp_path / "study"
    write_cell(out, "fp32")  # finished before: kept
    for precision in ("fp32", "fp16"):  # a pilot at this budget: 1 s compiling, 1 s for its 3 seeds
        write_cell(out / "plan", precision)
    before = files(out)
    assert main(study_argv(out, "--dry-run")) == 0
    lines = capsys.readouterr().out.splitlines()
    # fp16 at 3 seeds, from its pilot cell: 1 s + 1 s x 3 / 3
    assert lines[1] == (
        "  CartPole-v1: 2 cells x 3 seeds x 2048 steps, 1 finished before (kept): about 2 s "
        "(from this --out's pilot, on cpu:cpu x1)"
    )
    assert lines[3].startswith(f"estimated wall time: about {cost.duration(2 + cost.STATISTICS_SECONDS)}.")
    assert files(out) == before
    write_cell(out, "fp16")  # nothing to train: the statistics alone
    assert main(study_argv(out, "--dry-run")) == 0
    total = capsys.readouterr().out.splitlines()[-2]
    assert total.startswith(f"estimated wall time: about {cost.duration(cost.STATISTICS_SECONDS)}.")
    # a pilot at another budget says nothing of this one: the task's figure
    other = tmp_path / "other"
    for precision in ("fp32", "fp16"):
        write_cell(other / "plan", precision)
    assert main(study_argv(other, "--dry-run", "--total-steps", str(2 * STEPS))) == 0
    assert "the task's 2-core figure" in capsys.readouterr().out


def test_a_study_says_its_estimate_before_its_first_cell(tmp_path, capsys, monkeypatch):
    def stopped(*args, **kwargs):  # the first cell stops at once: what was said before it is what counts
        raise TrainingInterrupted("SIGINT received", 2)

    monkeypatch.setattr(cells, "run_cell", stopped)
    assert main(study_argv(tmp_path / "study")) == 130
    err = capsys.readouterr().err.splitlines()
    first_cell = err.index("study: CartPole-v1 fp32: 3 seeds x 2048 steps")
    assert err[0] == "study: 2 cells: 1 task x 2 precisions (fp32, fp16)"
    assert err[first_cell - 1].startswith("study: estimated wall time: about ")


def test_the_cost_run_says_what_it_is(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    path = cells.cell_dir(out / "cost", "CartPole-v1", "fp32")
    config = cells.cell_config("CartPole-v1", "fp32", 1, 0, STEPS)
    monkeypatch.setattr(cells, "run_cell", lambda *args: {"seeds": [0]})
    out.mkdir()
    train_cells(out, {path: ("CartPole-v1", "fp32", config)}, False, None)
    line = capsys.readouterr().err.strip()
    assert line == "study: the cost run (for the report: N seeds against 1): CartPole-v1 fp32: 1 seed x 2048 steps"


@pytest.mark.parametrize("flags", [["--plan", "--pilot-seeds", "3"], []])
def test_a_dry_run_of_a_plan_or_a_refused_study_writes_nothing(tmp_path, capsys, flags):
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--total-steps", str(STEPS), "--dry-run"]
    if flags:
        assert main([*argv, *flags]) == 0
        printed = capsys.readouterr().out
        assert printed.startswith("2 cells: 1 task x 2 precisions (fp32, fp16)\n  CartPole-v1: 2 cells x 3 seeds x ")
    else:  # a refusal stays a refusal: one line, nothing written
        assert main([*argv, "--num-seeds", "1"]) == 2
        assert "at least 2 seeds" in capsys.readouterr().err
    assert not out.exists()
