"""`genesis-jax study`: does reduced precision learn as well as fp32? Tasks x precisions x
seeds at equal environment steps, every seed of a cell in one compiled program, statistics
from rliable, and a report with verdicts and pictures.

A command rather than a script: a study is long, so it resumes (finished cells are kept,
an interrupted cell continues from its checkpoint), it validates its choices before any run,
and users run it on their own budgets and devices with the same flags as `train`.

>>> from genesis_jax.study import run_study
>>> run_study("runs/study", tasks=["CartPole-v1"], num_seeds=8, total_steps=100_000)  # doctest: +SKIP
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

from genesis_jax.study import cells, report
from genesis_jax.study.cells import BASELINE, PRECISIONS, TASKS

__all__ = ["PRECISIONS", "TASKS", "run_study"]


def _log(message: str) -> None:
    print(f"study: {message}", file=sys.stderr, flush=True)


def measure_cost(out: pathlib.Path, task: str, num_seeds: int, seed: int, steps: int, progress: bool) -> list[str]:
    """The wall time of the study's N-seed fp32 cell of `task` against the same run with 1
    seed (run once, kept under cost/)."""
    single_dir = out / "cost"
    summary = cells.read_summary(cells.cell_dir(single_dir, task, BASELINE))
    if summary is None:
        summary = cells.run_cell(single_dir, task, BASELINE, 1, seed, steps, progress)
    multi = cells.read_summary(cells.cell_dir(out, task, BASELINE))
    ratio = multi["wall_seconds"] / summary["wall_seconds"]
    running = lambda s: s["wall_seconds"] - s["compile_seconds"]  # noqa: E731

    def row(seeds: int, s: dict) -> str:
        wall, compile_ = s["wall_seconds"], s["compile_seconds"]
        return f"| {seeds} | {wall:.1f} | {compile_:.1f} | {wall - compile_:.1f} | {3600 * seeds / wall:.0f} |"

    return [
        f"{task}, {BASELINE}, {steps} steps per seed, on {multi['device']}:",
        "",
        "| seeds | wall seconds | compile seconds | wall - compile | seeds per hour |",
        "|---|---|---|---|---|",
        row(1, summary),
        row(num_seeds, multi),
        "",
        f"{num_seeds} seeds take {ratio:.2f}x the wall time of 1 seed "
        f"({running(multi) / running(summary):.2f}x without compilation).",
    ]


def run_study(
    out_dir,
    tasks=("CartPole-v1",),
    precisions=tuple(PRECISIONS),
    num_seeds: int = 8,
    seed: int = 0,
    total_steps: int | dict[str, int] | None = None,
    reps: int = 2000,
    curve_points: int = 20,
    cost: bool = True,
    progress: bool = True,
    command: str | None = None,
) -> pathlib.Path:
    """Runs every task x precision cell not yet finished under `out_dir`, then writes
    report.md, stats.json and the plots there. Returns the report's path.

    Args:
        tasks: names of `TASKS`; precisions: names of `PRECISIONS` (fp32 among them).
        num_seeds: seeds per cell, trained together (seed, seed+1, ...).
        total_steps: environment steps per seed, the same for every precision: one number for
            every task, a {task: steps} mapping (tasks not in it: their own), or None (each task's own).
        reps: bootstrap replications of every confidence interval.
        cost: also run one fp32 seed of the first task, for the N-seeds-vs-1 cost.
    """
    tasks, precisions = list(tasks), list(precisions)
    cells.check_choices(tasks, precisions)
    if not isinstance(num_seeds, int) or num_seeds < 2:
        raise ValueError(f"a study needs at least 2 seeds per cell, got {num_seeds!r}")
    budgets = cells.budgets(tasks, total_steps)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict[str, dict]] = {}
    started = time.perf_counter()
    for task in tasks:
        summaries[task] = {}
        for precision in precisions:
            summary = cells.read_summary(cells.cell_dir(out, task, precision))
            if summary is None:
                _log(f"{task} {precision}: {num_seeds} seeds x {budgets[task]} steps")
                summary = cells.run_cell(out, task, precision, num_seeds, seed, budgets[task], progress)
            else:
                _log(f"{task} {precision}: finished before, kept")
            summaries[task][precision] = summary
    cost_lines = measure_cost(out, tasks[0], num_seeds, seed, budgets[tasks[0]], progress) if cost else ["not measured"]
    _log("statistics and plots")
    raw = {p: np.stack([cells.seed_scores(summaries[t][p], "final_return") for t in tasks], axis=1) for p in precisions}
    randoms = {task: cells.random_return(TASKS[task].settings["env"]) for task in tasks}
    analysis = report.analyse(raw, tasks, randoms, reps)
    curves = {
        task: {p: cells.learning_curve(cells.read_rows(cells.cell_dir(out, task, p)), curve_points) for p in precisions}
        for task in tasks
    }
    curve_files = report.plot_curves(curves, out, reps=min(reps, 500))
    plot_files = report.plot_summary(analysis, out)
    header = [
        f"Command: `{command or 'run_study(...)'}`",
        "",
        f"{num_seeds} seeds per cell (seeds {seed} to {seed + num_seeds - 1}; rerun seed k alone with --seed k), "
        f"{', '.join(f'{t}: {budgets[t]} steps' for t in tasks)} per seed, every precision at the same steps. "
        f"Score: `final_return`, each seed's mean return over the episodes of its last 10% of updates. "
        f"Device: {next(iter(summaries[tasks[0]].values()))['device']}. "
        f"Cells run in {time.perf_counter() - started:.0f} s of this invocation.",
    ]
    return report.write_report(out, analysis, summaries, curve_files, plot_files, header, cost_lines)
