"""`genesis-jax study`: does reduced precision learn as well as fp32? Tasks x precisions x
seeds at equal environment steps, every seed of a cell in one compiled program, statistics
from rliable, and a report with verdicts and pictures.

A command rather than a script: a study is long, so it resumes (finished cells are kept,
an interrupted cell continues from its checkpoint, both only at the settings they were
trained with), it validates its choices before any run, its report says what the cells ran,
and users run it on their own budgets and devices with the same flags as `train`.

>>> from genesis_jax.study import run_study
>>> run_study("runs/study", tasks=["CartPole-v1"], num_seeds=8, total_steps=100_000)  # doctest: +SKIP
"""

from __future__ import annotations

import pathlib
import signal
import sys
import time

import numpy as np

from genesis_jax.run.signals import TrainingInterrupted
from genesis_jax.study import cells, report, stats
from genesis_jax.study.cells import BASELINE, PRECISIONS, TASKS

__all__ = ["PRECISIONS", "TASKS", "run_study"]


def _log(message: str) -> None:
    print(f"study: {message}", file=sys.stderr, flush=True)


def measure_cost(task: str, single: dict, multi: dict) -> list[str]:
    """The wall time of the study's N-seed fp32 cell of `task` (`multi`'s summary) against
    the same run with 1 seed (`single`'s, run once and kept under cost/)."""
    num_seeds, steps = len(multi["seeds"]), multi["total_steps"]
    ratio = multi["wall_seconds"] / single["wall_seconds"]
    running = lambda s: s["wall_seconds"] - s["compile_seconds"]  # noqa: E731

    def row(seeds: int, s: dict) -> str:
        wall, compile_ = s["wall_seconds"], s["compile_seconds"]
        return f"| {seeds} | {wall:.1f} | {compile_:.1f} | {wall - compile_:.1f} | {3600 * seeds / wall:.0f} |"

    return [
        f"{task}, {BASELINE}, {steps} steps per seed, on {multi['device']}:",
        "",
        "| seeds | wall seconds | compile seconds | wall - compile | seeds per hour |",
        "|---|---|---|---|---|",
        row(1, single),
        row(num_seeds, multi),
        "",
        f"{num_seeds} seeds take {ratio:.2f}x the wall time of 1 seed "
        f"({running(multi) / running(single):.2f}x without compilation).",
    ]


def check_numbers(num_seeds, reps) -> None:
    """One line for a seed count or a bootstrap size the statistics cannot use."""
    if isinstance(num_seeds, bool) or not isinstance(num_seeds, int) or num_seeds < 2:
        raise ValueError(f"a study needs at least 2 seeds per cell, got {num_seeds!r}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < stats.MIN_REPS:
        raise ValueError(
            f"reps must be an integer of at least {stats.MIN_REPS} (bootstrap replications per interval), got {reps!r}"
        )


def _span(values) -> str:
    values = sorted(set(values))
    return str(values[0]) if len(values) == 1 else f"{values[0]} to {values[-1]} (they differ)"


def header(command: str | None, summaries: dict[str, dict[str, dict]], trained: int, seconds: float) -> list[str]:
    """The report's opening, from the summaries of the cells it reads: the seeds, steps and
    devices they ran, not the ones asked for."""
    cells_read = [s for by_precision in summaries.values() for s in by_precision.values()]
    seed_lists = sorted({tuple(s["seeds"]) for s in cells_read})
    if len(seed_lists) == 1:
        seeds = seed_lists[0]
        seed_text = f"{len(seeds)} seeds per cell (seeds {seeds[0]} to {seeds[-1]}; rerun seed k alone with --seed k)"
    else:
        seed_text = f"seeds per cell differ: {', '.join(str(list(s)) for s in seed_lists)}"
    few = (
        f" Fewer than {stats.MIN_SEEDS_FOR_VERDICT} seeds per cell: too few for a verdict."
        if min(len(s) for s in seed_lists) < stats.MIN_SEEDS_FOR_VERDICT
        else ""
    )
    steps = ", ".join(f"{t}: {_span(s['total_steps'] for s in by.values())} steps" for t, by in summaries.items())
    return [
        f"Command: `{command or 'run_study(...)'}`",
        "",
        f"{seed_text}, {steps} per seed (as the cells ran them).{few} "
        f"Score: `final_return`, each seed's mean return over the episodes of its last 10% of updates. "
        f"Device: {', '.join(sorted({s['device'] for s in cells_read}))}. "
        f"{trained} cells trained in this invocation ({seconds:.0f} s), {len(cells_read) - trained} kept from before.",
    ]


def stopped_message(stop: TrainingInterrupted, out: pathlib.Path, task: str, precision: str, command: str | None):
    """A signal's stop, told as the study's: the study command continues it, not the cell's."""
    again = f"run `{command}` again" if command else "run the study again with the same arguments"
    return (
        f"{signal.Signals(stop.signum).name} received: the study stopped in cell {task} {precision}; "
        f"the finished cells are kept in {out} and this one resumes from its last checkpoint: to continue, {again}"
    )


def plan_cells(out: pathlib.Path, tasks, precisions, num_seeds: int, seed: int, budgets: dict[str, int]) -> dict:
    """{cell directory: (task, precision, config)} for every task x precision cell (every
    config built, so validated, before anything trains)."""
    return {
        cells.cell_dir(out, t, p): (t, p, cells.cell_config(t, p, num_seeds, seed, budgets[t]))
        for t in tasks
        for p in precisions
    }


def train_cells(out: pathlib.Path, plan: dict, progress: bool, command: str | None) -> tuple[dict, set]:
    """Trains every cell of `plan` that has not finished. Returns ({cell directory: summary},
    the directories trained now); a stop by a signal is told as the study's (`stopped_message`)."""
    summaries, trained = {}, set()
    for path, (task, precision, config) in plan.items():
        summaries[path] = cells.read_summary(path)
        if summaries[path] is not None:
            _log(f"{task} {precision}: finished before, kept")
            continue
        _log(f"{task} {precision}: {config.num_seeds} seeds x {config.total_steps} steps")
        cells.record_planned(out, path, config)
        try:
            summaries[path] = cells.run_cell(path, task, config, progress)
        except TrainingInterrupted as stop:
            message = stopped_message(stop, out, task, precision, command)
            raise TrainingInterrupted(message, stop.signum, stop.summary) from stop
        trained.add(path)
    return summaries, trained


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

    Every choice is checked before anything trains, and so are the cells already in
    `out_dir`: one trained with other settings (seeds, steps) is refused, never reused.

    Args:
        tasks: names of `TASKS`; precisions: names of `PRECISIONS` (fp32 among them), each once.
        num_seeds: seeds per cell, trained together (seed, seed+1, ...); verdicts need
            `stats.MIN_SEEDS_FOR_VERDICT`.
        total_steps: environment steps per seed, the same for every precision: one number for
            every task, a {task: steps} mapping (tasks not in it: their own), or None (each task's own).
        reps: bootstrap replications of every confidence interval (at least `stats.MIN_REPS`).
        cost: also run one fp32 seed of the first task, for the N-seeds-vs-1 cost.
    """
    tasks, precisions = list(tasks), list(precisions)
    cells.check_choices(tasks, precisions)
    check_numbers(num_seeds, reps)
    budgets = cells.budgets(tasks, total_steps)
    out = pathlib.Path(out_dir)
    plan = plan_cells(out, tasks, precisions, num_seeds, seed, budgets)
    cost_path = cells.cell_dir(out / "cost", tasks[0], BASELINE)
    if cost:  # the first task's fp32 cell again, with 1 seed
        plan[cost_path] = (tasks[0], BASELINE, cells.cell_config(tasks[0], BASELINE, 1, seed, budgets[tasks[0]]))
    cells.check_kept_cells(out, {path: config for path, (_, _, config) in plan.items()})
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    done, trained = train_cells(out, plan, progress, command)
    seconds = time.perf_counter() - started
    summaries = {t: {p: done[cells.cell_dir(out, t, p)] for p in precisions} for t in tasks}
    cost_lines = measure_cost(tasks[0], done[cost_path], summaries[tasks[0]][BASELINE]) if cost else ["not measured"]
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
    lines = header(command, summaries, len(trained - {cost_path}), seconds)
    return report.write_report(out, analysis, summaries, curve_files, plot_files, lines, cost_lines)
