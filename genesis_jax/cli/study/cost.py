"""What a study will cost, said before its first cell (and by `--dry-run` alone): its cells x
seeds x steps and an estimate of its wall time.

A cell runs its seeds under `vmap` in one compiled program, so its wall time is its
compilation, once, and its running, which on a CPU grows about in proportion to its seeds and
steps (on a GPU far less: small networks leave it idle). The estimate of a cell is

    compile seconds + seeds x the running seconds of one seed at its budget

taken, in this order, from: a cell that finished before (nothing: it is kept); this `--out`'s
pilot (`--plan`'s cells at the same budget, measured on this device: `plan.estimate_seconds`);
the task's figure in `COSTS`, measured on a 2-core x86-64 CPU and scaled in proportion to the
budget. It is an estimate (docs/study.md#cost says how rough): a busy machine takes longer and
a GPU far less, the time of a seed depends on the seeds of its cell (the figures' cells ran 1
to 64), the compile cache (on by default) saves most of a compilation done before, and the
short cells measured for `COSTS` were fp32 (float16 on a CPU is emulated: wide networks pay).
"""

from __future__ import annotations

import dataclasses
import pathlib
import textwrap

from genesis_jax.cli.study import cells, plan
from genesis_jax.cli.study.cells import TASKS
from genesis_jax.run.progress import count


@dataclasses.dataclass(frozen=True)
class SeedCost:
    """A task's measured cost: compiling one cell, and running one seed of it at `steps`."""

    compile_seconds: float  # per cell, the median of the cells measured
    seed_seconds: float  # (wall - compile) / seeds, the median of the cells measured
    steps: int  # the budget they ran per seed, in the task's unit (steps or epochs)
    source: str  # where the figure was measured


MACHINE = "a 2-core x86-64 CPU"
# Committed cells: the medians of their summary.json's compile_seconds and of (wall_seconds -
# compile_seconds) / seeds, over every precision (a cell stored twice counted once). Between
# cells of one task a seed's time differs up to 10x (the machine was shared at times).
# Short cells: fp32, 4 seeds, `cells.run_cell` without the compile cache, 2026-11-26, on an AMD
# EPYC's 2 cores shared with other jobs (the load average in each comment), scaled to the
# default budget in proportion. A check: a short CartPole-v1 cell (65 536 steps, load 3 to 4)
# gave 1.59 s a seed, 6.4 s at 262 144 steps against the committed cells' 6.6. But a short cell
# weighs its 4 checkpoints and first rows more: wm:synthetic-wide's (4 epochs) took 5x a seed
# of the same program in wm:small-loss's committed cells, so that task takes theirs.
SHORT = "a 4-seed fp32 cell on a shared machine"
CPU = "benchmarks/precision-study-cpu"
COSTS = {
    # 2.5 s a seed (the cells of 64 seeds) to 27 s; plan/ 2 cells of 8 seeds, cost/ 1 of 1
    "CartPole-v1": SeedCost(59.1, 6.60, 262_144, f"{CPU}{{,-cartpole64}}, 11 cells of 1 to 64 seeds"),
    "Acrobot-v1": SeedCost(59.8, 7.77, 262_144, f"{CPU}, 4 cells of 32 seeds"),
    # an earlier version of the trainer, the same settings
    "Breakout-MinAtar": SeedCost(118.8, 76.73, 65_536, "benchmarks/study-cpu, 4 cells of 8 seeds"),
    "SpaceInvaders-MinAtar": SeedCost(56.1, 21.28, 32_768, "benchmarks/study-cpu, 4 cells of 8 seeds"),
    "Asterix-MinAtar": SeedCost(104.0, 14.32, 32_768, SHORT),  # load 5.1 to 5.6
    "Freeway-MinAtar": SeedCost(84.5, 17.85, 32_768, SHORT),  # load 5.0 to 5.1
    "CartPole-v1-resmlp1024": SeedCost(46.7, 102.79, 2_048, SHORT),  # load 5.0 to 5.5
    "wm:synthetic": SeedCost(9.9, 5.04, 20, f"{CPU}-scaling, 6 cells of 8 and 32 seeds"),
    "wm:synthetic-small": SeedCost(32.0, 34.67, 20, f"{CPU}-wm, 4 cells of 8 seeds"),
    # the same network and data as wm:small-loss, whose loss weight alone differs: its cells' figure
    # (a short cell of 4 epochs, load 4.4 to 5.6: 66.1 s compiling, 8.94 s a seed, 44.7 s at 20)
    "wm:synthetic-wide": SeedCost(10.9, 8.47, 20, "wm:small-loss's cells (the same program, but its loss weight)"),
    "wm:small-loss": SeedCost(10.9, 8.47, 20, f"{CPU}-scaling, 6 cells of 8 and 32 seeds"),
    "dqn:CartPole-v1": SeedCost(16.1, 15.15, 300_000, f"{CPU}, 6 cells of 8 and 32 seeds"),
    "dqn:Acrobot-v1": SeedCost(49.5, 14.30, 100_000, SHORT),  # load 7.7 to 9.2
    "dqn:Breakout-MinAtar": SeedCost(26.2, 114.27, 100_000, SHORT),  # load 5.0 to 1.8
    "dqn:Asterix-MinAtar": SeedCost(19.5, 98.68, 100_000, SHORT),  # load 1.8 to 1.5
    "dqn:Freeway-MinAtar": SeedCost(24.1, 143.29, 100_000, SHORT),  # load 1.5 to 4.6
    "dqn:SpaceInvaders-MinAtar": SeedCost(26.2, 156.57, 100_000, SHORT),  # load 4.6 to 5.0
    "sac:Pendulum-v1": SeedCost(61.5, 196.17, 5_000, SHORT),  # load 8.4 to 9.2
    "sac:Pendulum-v1-mlp64": SeedCost(15.3, 11.41, 10_000, f"{CPU}-sac, 6 cells of 8 and 32 seeds"),
    "pqn:CartPole-v1": SeedCost(48.8, 9.59, 65_536, SHORT),  # load 6.7 to 7.7
    # 2026-11-27, with the compile cache off, as above; a quiet machine runs one seed of Breakout
    # at about 6,500 steps/s (benchmarks/pqn-learning-cpu), 7x these figures' rate
    "pqn:Breakout-MinAtar": SeedCost(58.9, 71.70, 65_536, SHORT),  # load 7.8 to 6.7
    "pqn:Asterix-MinAtar": SeedCost(147.9, 31.27, 65_536, SHORT),  # load 6.7 to 6.9
    "pqn:Freeway-MinAtar": SeedCost(94.2, 48.27, 65_536, SHORT),  # load 6.9 to 6.4
    "pqn:SpaceInvaders-MinAtar": SeedCost(48.9, 44.16, 65_536, SHORT),  # load 6.4 to 6.9
}
# the same program as CartPole-v1 (its discount alone differs): that task's figure
COSTS["CartPole-v1-gamma999"] = dataclasses.replace(
    COSTS["CartPole-v1"], source=f"{CPU}{{,-cartpole64}}, CartPole-v1's 11 cells"
)


# The report's statistics and plots after the cells (random floors, bootstrap intervals at
# --reps 2000, plots), timed by rerunning a study whose cells had all finished (2026-11-26).
STATISTICS_SECONDS = 45
STATISTICS_SOURCE = f"45 s a task: 53 s for 1 task, 129 s for 3, at --reps 2000 on {MACHINE}"


def seed_seconds(task: str, steps: int) -> float:
    """The running seconds of one seed of `task` at `steps` by its figure (in proportion)."""
    figure = COSTS[task]
    return figure.seed_seconds * steps / figure.steps


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def estimate(out: pathlib.Path, task: str, planned: list) -> tuple[str, float | None]:
    """What the cells `planned` ([(path, precision, config)], of one task) will train, with
    their estimated seconds: (a line, the seconds; None for a task with no figure to go by)."""
    field = TASKS[task].budget_field
    steps, seeds = getattr(planned[0][2], field), planned[0][2].num_seeds
    todo = [(p, c) for path, p, c in planned if cells.read_summary(path) is None]
    kept = f", {len(planned) - len(todo)} finished before (kept)" if len(todo) < len(planned) else ""
    what = f"{count(len(planned), 'cell')} x {count(seeds, 'seed')} x {steps} {field.replace('total_', '')}{kept}"
    if not todo:
        return what, 0.0
    # this --out's pilot cells of the task, where they ran these steps
    pilot = {p: cells.read_summary(cells.cell_dir(out / "plan", task, p)) for p in plan.PILOT_PRECISIONS}
    if all(s and s.get("config", {}).get(field) == steps for s in pilot.values()):
        seconds = sum(plan.estimate_seconds(pilot, c.num_seeds, [p]) for p, c in todo)
        device = ", ".join(sorted({s["device"] for s in pilot.values()}))
        return f"{what}: about {duration(seconds)} (from this --out's pilot, on {device})", seconds
    if task not in COSTS:  # a task registered outside the package, say: its cost was never measured
        return f"{what}: not estimated (no measured figure for {task}; --plan measures one here)", None
    figure, seed = COSTS[task], seed_seconds(task, steps)
    seconds = len(todo) * (figure.compile_seconds + seeds * seed)
    how = f"a cell {figure.compile_seconds:.0f} s compiling + {seeds} x {seed:.1f} s a seed, the task's 2-core figure"
    return f"{what}: about {duration(seconds)} ({how})", seconds


def estimate_lines(out: pathlib.Path, cell_plan: dict, cost_path=None, statistics: bool = False) -> list[str]:
    """What the study of `cell_plan` ({cell path: (task, precision, config)}) will train and
    an estimate of its wall time, as lines (the module docstring says from what); with
    `statistics`, the report's statistics and plots after the cells too."""
    study = {path: v for path, v in cell_plan.items() if path != cost_path}
    tasks = list(dict.fromkeys(t for t, _, _ in study.values()))
    precisions = list(dict.fromkeys(p for _, p, _ in study.values()))
    kinds = f"{count(len(tasks), 'task')} x {count(len(precisions), 'precision')} ({', '.join(precisions)})"
    parts = [(task, task, [(path, p, c) for path, (t, p, c) in study.items() if t == task]) for task in tasks]
    if cost_path is not None:
        task, p, config = cell_plan[cost_path]
        seeds = max(c.num_seeds for _, _, c in study.values())
        label = f"the cost run ({task} {p} again with 1 seed, for the report's {seeds} seeds against 1; --no-cost"
        parts.append((f"{label} skips it)", task, [(cost_path, p, config)]))
    estimates = [(label, *estimate(out, task, planned)) for label, task, planned in parts]
    if statistics:
        seconds = STATISTICS_SECONDS * len(tasks)
        estimates.append(("then the statistics and plots", f"about {duration(seconds)} ({STATISTICS_SOURCE})", seconds))
    known = duration(sum(seconds for *_, seconds in estimates if seconds is not None))
    besides = ", besides what is not estimated" if any(seconds is None for *_, seconds in estimates) else ""
    total = f"estimated wall time: about {known}{besides}. An estimate: each "
    total += "cell's compilation, then its seeds in proportion; a busy machine, float16 on a CPU or another device "
    total += "than the figures' changes it (docs/study.md#cost)"
    return [
        f"{count(len(study), 'cell')}: {kinds}",
        *(f"  {label}: {line}" for label, line, _ in estimates),
        total,
    ]


def task_rows() -> list[tuple[str, ...]]:
    """(task, algorithm, default budget, compiling a cell, a seed at that budget, measured
    from) of every task, from the registry and `COSTS`."""
    rows = []
    for task, spec in TASKS.items():
        unit, figure = spec.budget_field.replace("total_", ""), COSTS.get(task)
        cost = ("-", "-", "not measured (--plan measures it)")  # a task registered outside the package: no figure
        if figure is not None:
            seed = duration(seed_seconds(task, spec.total_steps))
            cost = (duration(figure.compile_seconds), seed, f"{figure.source}, at {figure.steps} {unit}")
        rows.append((task, spec.algo, f"{spec.total_steps} {unit}", *cost))
    return rows


def help_text(width: int = 100) -> str:
    """`study --help`'s list of the tasks with their default budgets and costs."""
    rows = [("task", "algorithm", "default budget", "compile", "a seed"), *(r[:5] for r in task_rows())]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    intro = (
        "Tasks (--tasks; default CartPole-v1), each with its default budget per seed (--total-steps sets another) "
        f"and its cost measured on {MACHINE}: compiling a cell, then running one seed at that budget. A cell of N "
        "seeds takes about compile + N x a seed; --dry-run estimates a study."
    )
    table = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([textwrap.fill(intro, width), "", *table])


def markdown_table() -> str:
    """docs/study.md's table of the tasks (tests/e2e/test_study_cost.py keeps it current)."""
    head = "| task | algorithm | default budget | compiling a cell | a seed at that budget | measured from |\n"
    return head + "| --- " * 6 + "|\n" + "\n".join(f"| `{r[0]}` | {' | '.join(r[1:])} |" for r in task_rows())
