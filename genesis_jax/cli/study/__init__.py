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

import copy
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
from genesis_jax.run.progress import count
from genesis_jax.run.signals import StopSignals, TrainingInterrupted

__all__ = ["PRECISIONS", "PRESETS", "TASKS", "run_plan", "run_study"]

# The full study, for a GPU (`--preset gpu`), its tasks in this order: PPO on CartPole/Acrobot,
# the four MinAtar games and the wide res-MLP, DQN on MinAtar, SAC on Pendulum, the world model
# in its own units and on a small loss (where scaling matters); 32 seeds; PureJaxRL's budgets
# (5e5 steps for classic control, 1e7 for MinAtar), SAC its own (CleanRL's Pendulum scale), the
# world model its 20 epochs.
MINATAR = [f"{algo}{game}-MinAtar" for algo in ("", "dqn:") for game in MINATAR_GAMES]
GPU_STEPS = {"CartPole-v1": 500_000, "Acrobot-v1": 500_000, **dict.fromkeys(MINATAR, 10_000_000)}
GPU_STEPS |= {"sac:Pendulum-v1": 20_000, "CartPole-v1-resmlp1024": 500_000, "wm:synthetic": 20, "wm:small-loss": 20}
# Whole studies by name (`--preset`); flags given beside a preset override its values.
PRESETS = {"gpu": {"tasks": list(GPU_STEPS), "num_seeds": 32, "total_steps": GPU_STEPS}}


def preset(name: str) -> dict:
    """A copy of the preset `name`'s settings, or one line naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; accepted: {', '.join(PRESETS)}")
    return copy.deepcopy(PRESETS[name])


def _log(message: str) -> None:
    print(f"study: {message}", file=sys.stderr, flush=True)


def measure_cost(task: str, single: dict, multi: dict) -> list[str]:
    """The wall time of the study's N-seed fp32 cell of `task` (`multi`'s summary) against
    the same run with 1 seed (`single`'s, run once and kept under cost/)."""
    num_seeds, (steps, unit) = len(multi["seeds"]), cells.budget_of(multi)
    first = f"{task}, {BASELINE}, {steps} {unit} per seed, on {multi['device']}:"
    if resumed := [f"{n}-seed" for n, s in ((1, single), (num_seeds, multi)) if s.get("resumed_from")]:
        # its summary's times are the last session's alone (`resumed_from`: the rows run before it)
        return [
            f"{first} not measured: the {' and the '.join(resumed)} cell resumed after a stop, so its wall time "
            "is its last session's alone; delete it and run the study again to measure the cost"
        ]
    running = lambda s: s["wall_seconds"] - s["compile_seconds"]
    times = lambda s: (f"{s['wall_seconds']:.1f}", f"{s['compile_seconds']:.1f}", f"{running(s):.1f}")
    rows = [(n, *times(s), f"{3600 * n / s['wall_seconds']:.0f}") for n, s in ((1, single), (num_seeds, multi))]
    head = "seeds | wall seconds | compile seconds | wall - compile | seeds per hour"
    ratio = f"{multi['wall_seconds'] / single['wall_seconds']:.2f}x the wall time of 1 seed"
    text = f"{num_seeds} seeds take {ratio} ({running(multi) / running(single):.2f}x without compilation)."
    return [first, "", *report.table(head, rows), "", text]


def header(command: str | None, summaries: dict[str, dict[str, dict]], trained: int, seconds: float) -> list[str]:
    """The report's opening, from the summaries of the cells it reads: the seeds, steps and
    devices they ran, not the ones asked for."""
    cells_read = [s for by_precision in summaries.values() for s in by_precision.values()]
    seed_lists = sorted({tuple(s["seeds"]) for s in cells_read})
    seeds, rerun = seed_lists[0], "rerun seed k alone with --seed k"
    if any("eval_loss" in s for s in cells_read):  # a world model's seeds share the first seed's data
        rerun += " (a world model's seed k trains on the first seed's data: rerun it with --num-seeds)"
    seed_text = f"{count(len(seeds), 'seed')} per cell (seeds {seeds[0]} to {seeds[-1]}; {rerun})"
    if len(seed_lists) > 1:
        seed_text = f"seeds per cell differ: {', '.join(str(list(s)) for s in seed_lists)}"
    few = f" Fewer than {stats.MIN_SEEDS_FOR_VERDICT} seeds per cell: too few for a verdict."
    few = few if min(len(s) for s in seed_lists) < stats.MIN_SEEDS_FOR_VERDICT else ""
    budgets = {t: [cells.budget_of(s) for s in by.values()] for t, by in summaries.items()}
    span = lambda v: str(v[0]) if len(v) == 1 else f"{v[0]} to {v[-1]} (they differ)"
    steps = ", ".join(f"{t}: {span(sorted({n for n, _ in b}))} {b[0][1]}" for t, b in budgets.items())
    text = (
        f"{seed_text}, {steps} per seed (as the cells ran them).{few} Scores: the final return, each seed's mean "
        "return over the episodes of its last 10% of updates (a world model: log10 of its final eval loss), and the "
        f"AUC, each seed's mean over the run's {cells.AUC_POINTS} equal windows of the same. "
        f"Device: {', '.join(sorted({s['device'] for s in cells_read}))}. "
        f"{count(trained, 'cell')} trained in this invocation ({seconds:.0f} s), "
        f"{len(cells_read) - trained} kept from before."
    )
    return [f"Command: `{command or 'run_study(...)'}`", "", text]


def _interrupted(signum: int, out, where: str, command: str | None, this="", summary=None) -> TrainingInterrupted:
    """A signal's stop, told as the study's: the study command continues it, not the cell's."""
    again = f"run `{command}` again" if command else "run the study again with the same arguments"
    text = f"{signal.Signals(signum).name} received: the study stopped {where}; the finished cells are kept in {out}"
    return TrainingInterrupted(f"{text}{this}: to continue, {again}", signum, summary)


def _check_stop(stop: StopSignals, out: pathlib.Path, where: str, command: str | None) -> None:
    """Raises the study's stop where a signal arrived outside a cell's run (while a cell's
    program compiled before its run began, or while the statistics were computed)."""
    if stop.received is not None:
        raise _interrupted(stop.received, out, where, command)


def plan_cells(out: pathlib.Path, tasks, precisions, num_seeds: int, seed: int, budgets: dict[str, int]) -> dict:
    """{cell directory: (task, precision, config)} for every task x precision cell, each config
    built and given every check `train` makes (`cells.check_cell`) before anything is written."""
    config = lambda t, p: cells.cell_config(t, p, num_seeds, seed, budgets[t])
    planned = {cells.cell_dir(out, t, p): (t, p, config(t, p)) for t in tasks for p in precisions}
    for task, _, config in planned.values():
        cells.check_cell(task, config)
    return planned


def train_cells(out: pathlib.Path, plan: dict, progress: bool, command, stop=None, executor=None, before_cell=None):
    """Trains every cell of `plan` that has not finished. Returns ({cell directory: summary},
    the directories trained now); a stop by a signal is told as the study's.
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
        field, seeds = TASKS[task].budget_field, count(config.num_seeds, "seed")
        what = f"{task} {precision}: {seeds} x {getattr(config, field)} {field.replace('total_', '')}"
        cost_run = "the cost run (for the report: N seeds against 1): " if out / "cost" in path.parents else ""
        _log(f"{cost_run}{what}{' (a job)' if executor is not None else ''}")
        cells.record_planned(out, path, config)
        if before_cell is not None:
            before_cell(path)
        if executor is not None:
            pending[path] = (task, precision, config)
            continue
        try:
            summaries[path] = cells.run_cell(path, task, config, progress)
        except TrainingInterrupted as stopped:
            this, where = " and this one resumes from its last checkpoint", f"in cell {task} {precision}"
            raise _interrupted(stopped.signum, out, where, command, this, stopped.summary) from stopped
        trained.add(path)
    if pending:
        done = cluster.run_jobs(executor, pending, stopped=lambda: stop.received is not None)
        cancelled = f"while {len(pending)} cell jobs ran (cancelled; each resumes from its checkpoint)"
        _check_stop(stop, out, cancelled, command)
        summaries.update({path: cells.read_summary(path) or summary for path, summary in done.items()})
        trained |= set(pending)
    return summaries, trained


def plan_header(saved: dict | None, tasks, num_seeds: int, confirmed: str | None = None) -> list[str]:
    """The report's statement of the plan it ran under: "Confirmatory" with the plan's hash
    (`confirmed`), else "Exploratory" (with the hash of a plan in --out it did not run under:
    an exploratory study whose cells began there goes on, `plan.check_unplanned`)."""
    if saved is None:
        none = "Plan: none (`--plan` was not run in this --out): the seeds per cell were not chosen for power."
        return ["Exploratory: no plan (`--plan`) fixed this study before its cells ran.", "", none]
    status = (
        f"Exploratory: a plan (`{plan.plan_hash(saved)}`) is in this --out, but the study was not run as "
        "its confirmatory study (`--confirmatory`)."
    )
    if confirmed is not None:
        status = (
            f"Confirmatory: run under plan `{confirmed}` (the first 12 hex digits of the sha256 of plan.json's "
            "canonical JSON), written before its cells (preregistered.json records each cell's plan): its seeds, "
            "budgets, margin, statistics and thresholds were fixed before any of its cells ran."
        )
    asked = {t: saved["tasks"][t]["seeds"] for t in tasks if t in saved["tasks"]}
    short = ", ".join(t for t, n in asked.items() if num_seeds < n)
    ran = f'fewer than planned for {short}: a "not shown" there may be for want of seeds' if short else ""
    text = (
        f"Plan (`{saved['command']}`, a pilot of {saved['pilot_seeds']} seeds of fp32 and fp16 per task; plan.md): "
        f"seeds per cell for a +-{stats.MARGIN:g} equivalence verdict: "
        f"{', '.join(f'{t}: {n}' for t, n in asked.items()) or 'none of these tasks'}; this study ran {num_seeds}, "
    )
    return [status, "", text + (ran or "as many or more") + "."]


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


def _prepare(out: pathlib.Path, cell_plan: dict, dry_run: bool, cost_path=None, report=False, statistics=False):
    """Checks `cell_plan` ({cell: (task, precision, config)}) against the cells already in `out`
    (`cells.check_kept_cells`; its return, with `report`), then says what the study will train
    and an estimate of its time (`cost.estimate_lines`): on stdout for --dry-run, which then
    writes nothing, else on stderr before the first cell."""
    moved = cells.check_kept_cells(out, {path: config for path, (_, _, config) in cell_plan.items()}, report=report)
    lines = cost.estimate_lines(out, cell_plan, cost_path, statistics)
    if dry_run:
        print("\n".join([*lines, "--dry-run: nothing trained, nothing written"]))
    else:
        print("\n".join(f"study: {line}" for line in lines), file=sys.stderr, flush=True)
        out.mkdir(parents=True, exist_ok=True)
    return moved


def check_out(out: pathlib.Path) -> None:
    """Refuses, in one line, an --out that is a file (or under one) or inside a run directory
    (one holding metrics.jsonl beside summary.json or checkpoints/: a cell's, say; a project's
    own checkpoints/ folder is not one)."""
    for where in (out.resolve(), *out.resolve().parents):
        if where.exists() and not where.is_dir():
            raise ValueError(f"--out {out}: {where} is a file; give the study a directory")
        run = (where / "summary.json").is_file() or (where / "checkpoints").is_dir()
        if run and (where / "metrics.jsonl").is_file():
            raise ValueError(f"--out {out} is inside the run directory {where}; give the study a directory of its own")


def check_flags(args) -> None:
    """Refuses, in one line, a flag of `genesis-jax study` (`args`, its parsed flags) that the
    command would ignore: --plan runs only the pilot, --pilot-seeds is --plan's."""
    if args.plan:
        study_only = {"--report-only": args.report_only, "--confirmatory": args.confirmatory, "--no-cost": args.no_cost}
        study_only |= {"--executor": args.executor != "inline", "--executor-options": args.executor_options is not None}
        if given := [flag for flag, on in study_only.items() if on]:
            raise ValueError(f"--plan runs only the pilot: {given[0]} is the study's; give it to plan.md's command")
    elif args.pilot_seeds is not None:
        raise ValueError("--pilot-seeds is the pilot's: add --plan, or drop it")


def _setup(out_dir, tasks, precisions, num_seeds, reps, total_steps):
    """The study's choices checked (one line for a bad one): (tasks, precisions, budgets, out)."""
    tasks, precisions = list(tasks), list(precisions)
    cells.check_choices(tasks, precisions)
    cells.check_count(num_seeds, 2, "a study needs at least {} seeds per cell")
    refusal = "reps must be an integer of at least {} (bootstrap replications per interval)"
    cells.check_count(reps, stats.MIN_REPS, refusal)
    check_out(pathlib.Path(out_dir))
    return tasks, precisions, cells.budgets(tasks, total_steps), pathlib.Path(out_dir)


def _scores(out: pathlib.Path, done: dict, tasks, precisions, seed: int, fixed: dict) -> tuple:
    """Of the cells trained (`done`: {cell: summary}): ({task: {precision: summary}}, {precision:
    final scores [seeds, tasks]}, {precision: AUCs [seeds, tasks]}, {precision: {task: metric rows}},
    {task: random floor}, {task: known reference or None}: the plan's (`fixed`), else measured)."""
    summaries = {t: {p: done[cells.cell_dir(out, t, p)] for p in precisions} for t in tasks}
    rows = {p: {t: cells.read_rows(cells.cell_dir(out, t, p), summaries[t][p]) for t in tasks} for p in precisions}
    final = {p: np.stack([cells.seed_scores(summaries[t][p]) for t in tasks], axis=1) for p in precisions}
    auc = {p: np.stack([cells.auc_scores(rows[p][t]) for t in tasks], axis=1) for p in precisions}
    randoms = {t: fixed[t]["random"] if fixed else cells.random_floor(t, seed) for t in tasks}
    known = {t: fixed[t]["reference"] if fixed else cells.reference_score(t, seed) for t in tasks}
    return summaries, final, auc, rows, randoms, known


def run_plan(
    out_dir,
    tasks=("CartPole-v1",),
    precisions=tuple(PRECISIONS),
    pilot_seeds: int = plan.PILOT_SEEDS,
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
    cells.check_count(pilot_seeds, plan.MIN_PILOT_SEEDS, "a pilot needs at least {} seeds per cell")
    if num_seeds is not None:  # the confirmatory study's least seeds per cell
        cells.check_count(num_seeds, 2, "--num-seeds of a plan (the study's least seeds per cell) must be at least {}")
    tasks, precisions, budgets, out = _setup(out_dir, tasks, precisions, pilot_seeds, reps, total_steps)
    pilot_out = out / "plan"
    cell_plan = plan_cells(pilot_out, tasks, plan.PILOT_PRECISIONS, pilot_seeds, seed, budgets)
    _prepare(pilot_out, cell_plan, dry_run)
    if dry_run:
        return None
    with StopSignals() as stop:
        done, _ = train_cells(pilot_out, cell_plan, progress, command, stop)
        summaries, final, auc, _, randoms, known = _scores(pilot_out, done, tasks, plan.PILOT_PRECISIONS, seed, {})
        _check_stop(stop, out, "before its plan was written", command)
    refs = report.references(final, tasks, known)
    random, reference = [randoms[t] for t in tasks], [r for r, _ in refs]
    normalised = {p: stats.normalise(m, random, reference) for p, m in final.items()}
    auc = {p: stats.normalise(m, random, reference) for p, m in auc.items()}
    pilot_iqm = f"the pilot's fp32 IQM ({pilot_seeds} seeds)"
    bounds = {t: (randoms[t], r, source if known[t] is not None else pilot_iqm) for t, (r, source) in zip(tasks, refs)}
    steps = {t: "{} {}".format(*cells.budget_of(summaries[t][BASELINE])) for t in tasks}
    # the report's rule for "did not learn": the spread of such runs says nothing of runs that learn
    learnt = report.learned_flags(normalised, stats.per_task(final), tasks, random)
    plan.check_learned(tasks, normalised, learnt, steps, pilot_out)
    col = lambda scores, i: {p: m[:, i] for p, m in scores.items()}
    plans = {t: plan.task_plan(col(normalised, i), col(auc, i), summaries[t], precisions) for i, t in enumerate(tasks)}
    device = ", ".join(sorted({s["device"] for by in summaries.values() for s in by.values()}))
    needed = max(p["seeds"] for p in plans.values())
    first, seeds = seed + pilot_seeds, max(needed, num_seeds or 0)  # fresh seeds, after the pilot's
    settings = dict(tasks=tasks, precisions=precisions, total_steps=budgets, seed=first, num_seeds=seeds, reps=reps)
    pilot = {"pilot_seeds": pilot_seeds, "pilot_seed_range": [seed, first - 1]}
    saved = plan.plan_record(plans, pilot, command or "run_plan(...)", device, settings, bounds)
    digest, before = plan.plan_hash(saved), plan.read(out)
    if before is not None and plan.plan_hash(before) != digest and cells.load_json(out / plan.RECORD):
        raise ValueError(
            f"{out} holds plan {plan.plan_hash(before)}, under which cells have started: a plan is not changed "
            "after its study began; plan the new study in another --out"
        )
    study = re.sub(r" --(seed|num-seeds|reps) \S+", "", study_command or "genesis-jax study")
    study += f" --seed {first} --num-seeds {seeds} --reps {reps} --confirmatory"
    floor = f" (--num-seeds {num_seeds}: more than the {needed} the pilot asks for)" if seeds > needed else ""
    rows = []
    for t, v in saved["tasks"].items():
        raw = {k: f"{v[k]:.4g}" for k in ("random", "reference", "margin_raw", "threshold_raw", "fail_below_raw")}
        rows.append((t, raw["random"], f"{raw['reference']} ({v['reference_source']})", *list(raw.values())[2:]))
    head = "task | random | reference (source) | margin (raw) | threshold (raw) | failure below (raw)"
    paragraphs = [
        "# Study plan",
        f"Command: `{command or 'run_plan(...)'}`",
        f"Plan `{digest}` (the first 12 hex digits of the sha256 of plan.json's canonical JSON: the confirmatory "
        "study's report quotes it).",
        "\n".join(plan.plan_lines(plans, steps, device)),
        f"The confirmatory study: {seeds} seeds per cell{floor}, seeds {first} to {first + seeds - 1} (fresh: the "
        f"pilot ran {seed} to {first - 1}), judged on the paired IQM, mean and CVaR{stats.TAIL:.0%} of each score, "
        f"equivalent only where all three are within +-{stats.MARGIN:g}; learning speed as the time to "
        f"{stats.THRESHOLD:g} normalised; seeds ending below {stats.FAIL_BELOW:g} counted as failures. "
        "Per task in raw units:",
        "\n".join(report.table(head, rows)),
        f"To run it: `{study}`",
    ]
    (out / plan.PLAN_FILE).write_text(json.dumps(saved, indent=1) + "\n")
    (out / "plan.md").write_text("\n\n".join(paragraphs) + "\n")
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
            (`cells.check_kept_cells`). For re-judging committed cells under new statistics.
    """
    tasks, precisions, budgets, out = _setup(out_dir, tasks, precisions, num_seeds, reps, total_steps)
    cell_plan = plan_cells(out, tasks, precisions, num_seeds, seed, budgets)
    study_cells, saved_plan = list(cell_plan), plan.read(out)
    settings = dict(tasks=tasks, precisions=precisions, total_steps=budgets, seed=seed, num_seeds=num_seeds, reps=reps)
    if not confirmatory:
        plan.check_unplanned(out, saved_plan, report_only, study_cells)
    digest = plan.check_confirmatory(out, saved_plan, settings, study_cells) if confirmatory else None
    cluster.check_executor(executor, executor_options or {})
    cost_path = cells.cell_dir(out / "cost", tasks[0], BASELINE) if cost else None
    if cost:  # the first task's fp32 cell again, with 1 seed
        cell_plan.update(plan_cells(out / "cost", tasks[:1], [BASELINE], 1, seed, budgets))
    moved = _prepare(out, cell_plan, dry_run, cost_path, report=report_only, statistics=True)
    if dry_run:
        return None
    jobs = None if executor == "inline" else cluster.make_executor(executor, out / "submitit", executor_options or {})
    with StopSignals() as stop:  # a signal outside a cell's run (compiling, statistics) stops the study too
        started = time.perf_counter()
        record = None if digest is None else (lambda path: plan.record_cell(out, path, digest))
        done, trained = train_cells(out, cell_plan, progress, command, stop, jobs, record)
        seconds = time.perf_counter() - started
        _log("statistics and plots")
        fixed = {}
        if confirmatory:  # the plan's normalisation and thresholds, and no cell under another plan
            saved_plan = plan.read(out)
            digest = plan.check_confirmatory(out, saved_plan, settings, study_cells)
            fixed = {t: saved_plan["tasks"][t] for t in tasks}
        summaries, raw, auc, rows, randoms, known = _scores(out, done, tasks, precisions, seed, fixed)
        sources = {t: f"{v['reference_source']}, fixed by plan {digest}" for t, v in fixed.items()}
        _check_stop(stop, out, "while computing its statistics", command)
        thresholds = {t: v["threshold"] for t, v in fixed.items()}
        analysis = report.analyse(raw, tasks, randoms, reps, 0, auc, known, rows, thresholds, sources)
        curves = {t: {p: cells.learning_curve(rows[p][t], curve_points) for p in precisions} for t in tasks}
        plots = report.plot_curves(curves, out, reps=min(reps, 500)), report.plot_summary(analysis, out)
        lines = header(command, summaries, len(trained - {cost_path}), seconds)
        lines += ["", *plan_header(saved_plan, tasks, num_seeds, digest)]
        lines += ["", *report_only_lines(out, moved)] if report_only else []
        first = summaries[tasks[0]][BASELINE]
        cost_lines = measure_cost(tasks[0], done[cost_path], first) if cost else ["not measured"]
        sections = (("Underflow (opt-in telemetry)", report.underflow_section(out, rows)),)
        _check_stop(stop, out, "while computing its statistics", command)
        planned = {t: v["seeds"] for t, v in saved_plan["tasks"].items()} if saved_plan else None
        return report.write_report(out, analysis, summaries, *plots, lines, cost_lines, planned, sections)
