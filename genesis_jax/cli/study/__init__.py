"""`genesis-jax study`: does reduced precision learn as well as fp32? Tasks x precisions x
seeds at equal environment steps, every seed of a cell in one compiled program, statistics
from rliable, and a report with verdicts and pictures.

A command rather than a script: a study is long, so it resumes (finished cells are kept,
an interrupted cell continues from its checkpoint, both only at the settings they were
trained with), it validates its choices before any run, its report says what the cells ran,
and users run it on their own budgets and devices with the same flags as `train`.

>>> from genesis_jax.cli.study import run_study
>>> run_study("runs/study", tasks=["CartPole-v1"], num_seeds=8, total_steps=100_000)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import pathlib
import re
import signal
import sys
import time

import numpy as np

from genesis_jax.algos.base import MINATAR_GAMES
from genesis_jax.cli.study import cells, cluster, cost, plan, report, stats
from genesis_jax.cli.study.cells import BASELINE, PRECISIONS, TASKS
from genesis_jax.run.signals import StopSignals, TrainingInterrupted

__all__ = ["PRECISIONS", "PRESETS", "TASKS", "run_plan", "run_study"]

# Whole studies by name (`--preset`); flags given beside a preset override its values.
PRESETS = {
    # The full study, for a GPU: PPO on CartPole/Acrobot, the four MinAtar games and the wide
    # res-MLP, DQN on MinAtar, SAC on Pendulum, the world model in its own units and on a small
    # loss (where scaling matters); 32 seeds; PureJaxRL's budgets (5e5 steps for classic
    # control, 1e7 for MinAtar), SAC its own (CleanRL's Pendulum scale), the world model its 20 epochs.
    "gpu": {
        "tasks": [
            "CartPole-v1",
            "Acrobot-v1",
            "Breakout-MinAtar",
            "Asterix-MinAtar",
            "Freeway-MinAtar",
            "SpaceInvaders-MinAtar",
            "dqn:Breakout-MinAtar",
            "dqn:Asterix-MinAtar",
            "dqn:Freeway-MinAtar",
            "dqn:SpaceInvaders-MinAtar",
            "sac:Pendulum-v1",
            "CartPole-v1-resmlp1024",
            "wm:synthetic",
            "wm:small-loss",
        ],
        "num_seeds": 32,
        "total_steps": {
            "CartPole-v1": 500_000,
            "Acrobot-v1": 500_000,
            **{f"{game}-MinAtar": 10_000_000 for game in MINATAR_GAMES},
            **{f"dqn:{game}-MinAtar": 10_000_000 for game in MINATAR_GAMES},
            "sac:Pendulum-v1": 20_000,
            "CartPole-v1-resmlp1024": 500_000,
            "wm:synthetic": 20,
            "wm:small-loss": 20,
        },
    },
}


def preset(name: str) -> dict:
    """A copy of the preset `name`'s settings, or one line naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; accepted: {', '.join(PRESETS)}")
    chosen = PRESETS[name]
    return {**chosen, "tasks": list(chosen["tasks"]), "total_steps": dict(chosen["total_steps"])}


def _log(message: str) -> None:
    print(f"study: {message}", file=sys.stderr, flush=True)


def measure_cost(task: str, single: dict, multi: dict) -> list[str]:
    """The wall time of the study's N-seed fp32 cell of `task` (`multi`'s summary) against
    the same run with 1 seed (`single`'s, run once and kept under cost/)."""
    num_seeds, (steps, unit) = len(multi["seeds"]), cells.budget_of(multi)
    ratio = multi["wall_seconds"] / single["wall_seconds"]
    running = lambda s: s["wall_seconds"] - s["compile_seconds"]  # noqa: E731

    def row(seeds: int, s: dict) -> str:
        wall, compile_ = s["wall_seconds"], s["compile_seconds"]
        return f"| {seeds} | {wall:.1f} | {compile_:.1f} | {wall - compile_:.1f} | {3600 * seeds / wall:.0f} |"

    return [
        f"{task}, {BASELINE}, {steps} {unit} per seed, on {multi['device']}:",
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
        rerun = "rerun seed k alone with --seed k"
        if any("eval_loss" in s for s in cells_read):  # a world model's seeds share the first seed's data
            rerun += " (a world model's seed k trains on the first seed's data: rerun it with --num-seeds)"
        seed_text = f"{len(seeds)} seeds per cell (seeds {seeds[0]} to {seeds[-1]}; {rerun})"
    else:
        seed_text = f"seeds per cell differ: {', '.join(str(list(s)) for s in seed_lists)}"
    few = (
        f" Fewer than {stats.MIN_SEEDS_FOR_VERDICT} seeds per cell: too few for a verdict."
        if min(len(s) for s in seed_lists) < stats.MIN_SEEDS_FOR_VERDICT
        else ""
    )
    steps = ", ".join(
        f"{t}: {_span(cells.budget_of(s)[0] for s in by.values())} {cells.budget_of(next(iter(by.values())))[1]}"
        for t, by in summaries.items()
    )
    return [
        f"Command: `{command or 'run_study(...)'}`",
        "",
        f"{seed_text}, {steps} per seed (as the cells ran them).{few} "
        "Scores: the final return, each seed's mean return over the episodes of its last 10% of updates "
        "(a world model: log10 of its final eval loss), and the AUC, each seed's mean over the run's "
        f"{cells.AUC_POINTS} equal windows of the same. "
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
    """{cell directory: (task, precision, config)} for every task x precision cell, each config
    built and given every check `train` makes (`cells.check_cell`) before anything is written."""
    planned = {
        cells.cell_dir(out, t, p): (t, p, cells.cell_config(t, p, num_seeds, seed, budgets[t]))
        for t in tasks
        for p in precisions
    }
    for task, _, config in planned.values():
        cells.check_cell(task, config)
    return planned


def _check_stop(stop: StopSignals, out: pathlib.Path, where: str, command: str | None) -> None:
    """Raises the study's stop where a signal arrived outside a cell's run (while a cell's
    program compiled before its run began, or while the statistics were computed)."""
    if stop.received is not None:
        again = f"run `{command}` again" if command else "run the study again with the same arguments"
        raise TrainingInterrupted(
            f"{signal.Signals(stop.received).name} received: the study stopped {where}; "
            f"the finished cells are kept in {out}: to continue, {again}",
            stop.received,
        )


def train_cells(
    out: pathlib.Path,
    plan: dict,
    progress: bool,
    command: str | None,
    stop: StopSignals | None = None,
    executor=None,
    before_cell=None,
) -> tuple[dict, set]:
    """Trains every cell of `plan` that has not finished. Returns ({cell directory: summary},
    the directories trained now); a stop by a signal is told as the study's (`stopped_message`).
    `executor`: a submitit executor the cells run on as jobs (`cluster.run_jobs`), else here,
    one after another; `before_cell(path)`: called as a cell starts (a plan's record)."""
    stop = stop or StopSignals()
    summaries, trained, pending = {}, set(), {}
    for path, (task, precision, config) in plan.items():
        _check_stop(stop, out, f"before cell {task} {precision}", command)
        summaries[path] = cells.read_summary(path)
        if summaries[path] is not None:
            _log(f"{task} {precision}: finished before, kept")
            continue
        field = TASKS[task].budget_field
        budget = f"{config.num_seeds} seeds x {getattr(config, field)} {field.replace('total_', '')}"
        is_cost = path.relative_to(out).parts[0] == "cost"
        where = " (a job)" if executor is not None else ""
        cost_run = "the cost run (for the report: N seeds against 1): " if is_cost else ""
        _log(f"{cost_run}{task} {precision}: {budget}{where}")
        cells.record_planned(out, path, config)
        if before_cell is not None:
            before_cell(path)
        if executor is not None:
            pending[path] = (task, precision, config)
            continue
        try:
            summaries[path] = cells.run_cell(path, task, config, progress)
        except TrainingInterrupted as stopped:
            message = stopped_message(stopped, out, task, precision, command)
            raise TrainingInterrupted(message, stopped.signum, stopped.summary) from stopped
        trained.add(path)
    if pending:
        done = cluster.run_jobs(executor, pending, stopped=lambda: stop.received is not None)
        cancelled = f"while {len(pending)} cell jobs ran (cancelled; each resumes from its checkpoint)"
        _check_stop(stop, out, cancelled, command)
        summaries.update({path: cells.read_summary(path) or summary for path, summary in done.items()})
        trained |= set(pending)
    return summaries, trained


def task_scores(out: pathlib.Path, summaries: dict, tasks, precisions) -> tuple[dict, dict]:
    """({precision: final returns [seeds, tasks]}, {precision: AUCs [seeds, tasks]}) of cells."""
    final = {
        p: np.stack([cells.seed_scores(summaries[t][p], "final_return") for t in tasks], axis=1) for p in precisions
    }
    auc = {
        p: np.stack([cells.auc_scores(cells.read_rows(cells.cell_dir(out, t, p))) for t in tasks], axis=1)
        for p in precisions
    }
    return final, auc


PLAN_FILE = plan.PLAN_FILE
read_plan = plan.read


def plan_header(saved: dict | None, tasks, num_seeds: int, confirmed: str | None = None) -> list[str]:
    """The report's statement of the plan it ran under: "Confirmatory" with the plan's hash
    (`confirmed`), else "Exploratory" (with the hash of a plan in --out it did not run under)."""
    if confirmed is not None:
        status = (
            f"Confirmatory: run under plan `{confirmed}` (the first 12 hex digits of the sha256 of plan.json's "
            "canonical JSON), written before its cells (preregistered.json records each cell's plan): its seeds, "
            "budgets, margin, statistics and thresholds were fixed before any of its cells ran."
        )
    elif saved is None:
        status = "Exploratory: no plan (`--plan`) fixed this study before its cells ran."
    else:
        status = (
            f"Exploratory: a plan (`{plan.plan_hash(saved)}`) is in this --out, but the study was not run as "
            "its confirmatory study (`--confirmatory`)."
        )
    if saved is None:
        none = "Plan: none (`--plan` was not run in this --out): the seeds per cell were not chosen for power."
        return [status, "", none]
    asked = {t: saved["tasks"][t]["seeds"] for t in tasks if t in saved["tasks"]}
    short = [t for t, n in asked.items() if num_seeds < n]
    text = ", ".join(f"{t}: {n}" for t, n in asked.items()) or "none of these tasks"
    verdict = (
        f'this study ran {num_seeds}, fewer than planned for {", ".join(short)}: a "not shown" there may be '
        "for want of seeds"
        if short
        else f"this study ran {num_seeds}, as many or more"
    )
    return [
        status,
        "",
        f"Plan (`{saved['command']}`, a pilot of {saved['pilot_seeds']} seeds of fp32 and fp16 per task; "
        f"plan.md): seeds per cell for a +-{stats.MARGIN:g} equivalence verdict: {text}; {verdict}.",
    ]


def underflow_lines(out: pathlib.Path, tasks, precisions) -> list[str]:
    """The report's underflow section, from the cells that recorded the telemetry."""
    from genesis_jax.cli.study import telemetry_report

    return telemetry_report.section(out, tasks, precisions)


def report_only_lines(out: pathlib.Path, moved: dict[pathlib.Path, list[str]]) -> list[str]:
    """The report's statement that it read its cells without checking them against today's
    task settings (`--report-only`), and each setting in which they differ (as ran -> today's)."""
    text = (
        "Report only (`--report-only`): nothing trained; the cells were read as they ran, checked against "
        "this study's seeds, budgets, seed and precisions but not against today's task settings"
    )
    if not moved:
        return [text + ", which they all match."]
    by_change: dict[str, list[str]] = {}
    for path, changes in moved.items():
        by_change.setdefault("; ".join(changes), []).append(path.relative_to(out).as_posix())
    differ = " ".join(f"{', '.join(paths)}: {change}." for change, paths in by_change.items())
    return [f"{text}. Where they differ (as the cell ran -> what today's settings give): {differ}"]


def announce(out: pathlib.Path, cell_plan: dict, dry_run: bool, cost_path=None, statistics: bool = False) -> None:
    """Says what the study will train and an estimate of its time (`cost.estimate_lines`):
    on stdout for --dry-run, which then writes nothing, else on stderr before the first cell."""
    lines = cost.estimate_lines(out, cell_plan, cost_path, statistics)
    if dry_run:
        print("\n".join([*lines, "--dry-run: nothing trained, nothing written"]))
    else:
        for line in lines:
            _log(line)


def _setup(out_dir, tasks, precisions, num_seeds, reps, total_steps):
    tasks, precisions = list(tasks), list(precisions)
    cells.check_choices(tasks, precisions)
    check_numbers(num_seeds, reps)
    return tasks, precisions, cells.budgets(tasks, total_steps), pathlib.Path(out_dir)


def run_plan(
    out_dir,
    tasks=("CartPole-v1",),
    precisions=tuple(PRECISIONS),
    pilot_seeds: int = 8,
    seed: int = 0,
    total_steps: int | dict[str, int] | None = None,
    progress: bool = True,
    command: str | None = None,
    study_command: str | None = None,
    dry_run: bool = False,
    num_seeds: int | None = None,
    reps: int = 2000,
) -> pathlib.Path | None:
    """The study's power plan (`plan`): trains fp32 and fp16 cells of `pilot_seeds` seeds per
    task at the study's budgets under `out_dir`/plan, then writes plan.json and plan.md into
    `out_dir`: the pre-registration of the confirmatory study (`run_study(confirmatory=True)`),
    at the seeds the plan asks for or `num_seeds` if more, on fresh seeds after the pilot's.
    Returns plan.md's path (None with `dry_run`: the pilot's cells and estimate printed,
    nothing written). A plan that differs from one whose cells already started is refused."""
    if isinstance(pilot_seeds, bool) or not isinstance(pilot_seeds, int) or pilot_seeds < plan.MIN_PILOT_SEEDS:
        raise ValueError(f"a pilot needs at least {plan.MIN_PILOT_SEEDS} seeds per cell, got {pilot_seeds!r}")
    tasks, precisions, budgets, out = _setup(out_dir, tasks, precisions, pilot_seeds, stats.MIN_REPS, total_steps)
    pilot_out = out / "plan"
    cell_plan = plan_cells(pilot_out, tasks, plan.PILOT_PRECISIONS, pilot_seeds, seed, budgets)
    cells.check_kept_cells(pilot_out, {path: config for path, (_, _, config) in cell_plan.items()})
    announce(pilot_out, cell_plan, dry_run)
    if dry_run:
        return None
    pilot_out.mkdir(parents=True, exist_ok=True)
    with StopSignals() as stop:
        done, _ = train_cells(pilot_out, cell_plan, progress, command, stop)
        summaries = {t: {p: done[cells.cell_dir(pilot_out, t, p)] for p in plan.PILOT_PRECISIONS} for t in tasks}
        final, auc = task_scores(pilot_out, summaries, tasks, plan.PILOT_PRECISIONS)
        randoms = {task: cells.random_floor(task, seed) for task in tasks}
        known = {task: cells.reference_score(task, seed) for task in tasks}
        _check_stop(stop, out, "before its plan was written", command)
    random, reference = [randoms[t] for t in tasks], [r for r, _ in report.references(final, tasks, randoms, known)]
    normalised = {p: stats.normalise(m, random, reference) for p, m in final.items()}
    auc_normalised = {p: stats.normalise(m, random, reference) for p, m in auc.items()}
    refs = report.references(final, tasks, randoms, known)
    bounds = {
        t: (randoms[t], ref, source if known[t] is not None else f"the pilot's fp32 IQM ({pilot_seeds} seeds)")
        for t, (ref, source) in zip(tasks, refs)
    }
    steps = {t: "{} {}".format(*cells.budget_of(summaries[t][BASELINE])) for t in tasks}
    # the report's rule for "did not learn": the spread of such runs says nothing of runs that learn
    learnt = report.learned_flags(normalised, stats.per_task(final), tasks, random)
    plan.check_learned(tasks, normalised, learnt, steps, pilot_out)
    plans = {
        task: plan.task_plan(
            {p: m[:, i] for p, m in normalised.items()},
            {p: m[:, i] for p, m in auc_normalised.items()},
            summaries[task],
            precisions,
        )
        for i, task in enumerate(tasks)
    }
    device = ", ".join(sorted({s["device"] for by in summaries.values() for s in by.values()}))
    seeds = max([p["seeds"] for p in plans.values()] + [num_seeds or 0])
    settings = {
        "tasks": tasks,
        "precisions": precisions,
        "total_steps": budgets,
        "seed": seed + pilot_seeds,  # fresh seeds, after the pilot's
        "num_seeds": seeds,
        "reps": reps,
    }
    pilot = {"pilot_seeds": pilot_seeds, "pilot_seed_range": [seed, seed + pilot_seeds - 1]}
    saved = plan.plan_record(plans, pilot, command or "run_plan(...)", device, settings, bounds)
    digest, before = plan.plan_hash(saved), read_plan(out)
    if before is not None and plan.plan_hash(before) != digest and plan.read_record(out):
        raise ValueError(
            f"{out} holds plan {plan.plan_hash(before)}, under which cells have started: a plan is not changed "
            "after its study began; plan the new study in another --out"
        )
    study = re.sub(r" --(seed|num-seeds|reps) \S+", "", study_command or "genesis-jax study")
    study += f" --seed {seed + pilot_seeds} --num-seeds {seeds} --reps {reps} --confirmatory"
    needed = max(p["seeds"] for p in plans.values())
    floor = f" (--num-seeds {num_seeds}: more than the {needed} the pilot asks for)" if seeds > needed else ""
    lines = [
        "# Study plan",
        "",
        f"Command: `{command or 'run_plan(...)'}`",
        "",
        f"Plan `{digest}` (the first 12 hex digits of the sha256 of plan.json's canonical JSON: the confirmatory "
        "study's report quotes it).",
        "",
        *plan.plan_lines(plans, steps, device),
        "",
        f"The confirmatory study: {seeds} seeds per cell{floor}, "
        f"seeds {seed + pilot_seeds} to {seed + pilot_seeds + seeds - 1} (fresh: the pilot ran {seed} to "
        f"{seed + pilot_seeds - 1}), judged on the paired IQM, mean and CVaR{stats.TAIL:.0%} of each score, "
        f"equivalent only where all three are within +-{stats.MARGIN:g}; learning speed as the time to "
        f"{stats.THRESHOLD:g} normalised; seeds ending below {stats.FAIL_BELOW:g} counted as failures. "
        "Per task in raw units:",
        "",
        "| task | random | reference (source) | margin (raw) | threshold (raw) | failure below (raw) |",
        "|---|---|---|---|---|---|",
        *(
            f"| {t} | {v['random']:.4g} | {v['reference']:.4g} ({v['reference_source']}) | {v['margin_raw']:.4g} "
            f"| {v['threshold_raw']:.4g} | {v['fail_below_raw']:.4g} |"
            for t, v in saved["tasks"].items()
        ),
        "",
        f"To run it: `{study}`",
    ]
    (out / PLAN_FILE).write_text(json.dumps(saved, indent=1) + "\n")
    (out / "plan.md").write_text("\n".join(lines) + "\n")
    return out / "plan.md"


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
    dry_run: bool = False,
    confirmatory: bool = False,
    executor: str = "inline",
    executor_options: dict | None = None,
    report_only: bool = False,
) -> pathlib.Path | None:
    """Runs every task x precision cell not yet finished under `out_dir`, then writes
    report.md, stats.json and the plots there. Returns the report's path. Before the first
    cell it says what it will train and an estimate of the time (`cost`); with `dry_run` only
    that, on stdout, and it returns None having written nothing.

    Every choice is checked before anything trains, and so are the cells already in
    `out_dir`: one trained with other settings (seeds, steps) is refused, never reused.
    SIGINT / SIGTERM stop it (a cell saves its checkpoint first) wherever they arrive.

    Args:
        tasks: names of `TASKS`; precisions: names of `PRECISIONS` (fp32 among them), each once.
        num_seeds: seeds per cell, trained together (seed, seed+1, ...); verdicts need
            `stats.MIN_SEEDS_FOR_VERDICT`; `run_plan` says how many a verdict is likely to need.
        total_steps: environment steps per seed, the same for every precision: one number for
            every task, a {task: steps} mapping (tasks not in it: their own), or None (each task's own).
        reps: bootstrap replications of every confidence interval (at least `stats.MIN_REPS`).
        cost: the cost run: the first task's fp32 cell once more with 1 seed, for the report's
            wall time of N seeds against 1.
        confirmatory: run as the study the plan in `out_dir` fixed (`run_plan`), refused in one
            line where there is none, where it fixed other settings, or where a cell started
            before it or under another plan; the report quotes the plan's hash and normalises
            with the plan's random and reference scores and thresholds. Otherwise the report
            says the study is exploratory.
        executor: where the cells run: "inline" (here, one after another) or a submitit
            executor (`cluster.EXECUTORS`: "slurm", "submitit-local"), one job per cell, its
            logs in `out_dir`/submitit; `executor_options`: its parameters (`timeout_min`, ...).
        report_only: train nothing: every cell (the cost run's too, unless `cost` is False) must
            have finished at these study settings (seeds, budgets, seed, precisions); the
            algorithm's other settings are read as the cells ran them, not checked against
            today's (a default changed since), and the report lists where they differ
            (`cells.check_report_cells`). For re-judging committed cells under new statistics.
    """
    tasks, precisions, budgets, out = _setup(out_dir, tasks, precisions, num_seeds, reps, total_steps)
    cell_plan = plan_cells(out, tasks, precisions, num_seeds, seed, budgets)
    saved_plan, digest = read_plan(out), None
    if confirmatory:
        settings = {
            "tasks": tasks,
            "precisions": precisions,
            "total_steps": budgets,
            "seed": seed,
            "num_seeds": num_seeds,
            "reps": reps,
        }
        digest = plan.check_confirmatory(out, saved_plan, settings, list(cell_plan))
    cluster.check_executor(executor, executor_options or {})
    cost_path = cells.cell_dir(out / "cost", tasks[0], BASELINE)
    if cost:  # the first task's fp32 cell again, with 1 seed
        cell_plan.update(plan_cells(out / "cost", tasks[:1], [BASELINE], 1, seed, budgets))
    configs = {path: config for path, (_, _, config) in cell_plan.items()}
    moved = cells.check_report_cells(out, configs) if report_only else {}
    if not report_only:
        cells.check_kept_cells(out, configs)
    announce(out, cell_plan, dry_run, cost_path if cost else None, statistics=True)
    if dry_run:
        return None
    out.mkdir(parents=True, exist_ok=True)
    jobs = None if executor == "inline" else cluster.make_executor(executor, out / "submitit", executor_options or {})
    with StopSignals() as stop:  # a signal outside a cell's run (compiling, statistics) stops the study too
        started = time.perf_counter()
        record = None if digest is None else (lambda path: plan.record_cell(out, path, digest))
        done, trained = train_cells(out, cell_plan, progress, command, stop, jobs, record)
        seconds = time.perf_counter() - started
        summaries = {t: {p: done[cells.cell_dir(out, t, p)] for p in precisions} for t in tasks}
        cost_lines = (
            measure_cost(tasks[0], done[cost_path], summaries[tasks[0]][BASELINE]) if cost else ["not measured"]
        )
        _log("statistics and plots")
        raw, auc = task_scores(out, summaries, tasks, precisions)
        fixed = {}
        if confirmatory:  # the plan's normalisation and thresholds, and no cell under another plan
            digest = plan.check_confirmatory(out, read_plan(out), settings, [p for p in cell_plan if p != cost_path])
            fixed = {t: saved_plan["tasks"][t] for t in tasks}
        randoms = {t: fixed[t]["random"] if fixed else cells.random_floor(t, seed) for t in tasks}
        known = {t: fixed[t]["reference"] if fixed else cells.reference_score(t, seed) for t in tasks}
        sources = {t: f"{v['reference_source']}, fixed by plan {digest}" for t, v in fixed.items()}
        thresholds = {t: v["threshold"] for t, v in fixed.items()}
        _check_stop(stop, out, "while computing its statistics", command)
        rows = {p: {t: cells.read_rows(cells.cell_dir(out, t, p)) for t in tasks} for p in precisions}
        analysis = report.analyse(
            raw, tasks, randoms, reps, auc=auc, known=known, rows=rows, thresholds=thresholds, sources=sources
        )
        curves = {
            task: {
                p: cells.learning_curve(cells.read_rows(cells.cell_dir(out, task, p)), curve_points) for p in precisions
            }
            for task in tasks
        }
        curve_files = report.plot_curves(curves, out, reps=min(reps, 500))
        plot_files = report.plot_summary(analysis, out)
        planned = {t: v["seeds"] for t, v in saved_plan["tasks"].items()} if saved_plan else None
        lines = header(command, summaries, len(trained - {cost_path}), seconds)
        lines += ["", *plan_header(saved_plan, tasks, num_seeds, digest)]
        if report_only:
            lines += ["", *report_only_lines(out, moved)]
        underflow = underflow_lines(out, tasks, precisions)
        _check_stop(stop, out, "while computing its statistics", command)
        return report.write_report(
            out,
            analysis,
            summaries,
            curve_files,
            plot_files,
            lines,
            cost_lines,
            planned=planned,
            sections=(("Underflow (opt-in telemetry)", underflow),),
        )
