"""What a study runs: tasks x precisions as cells, each cell one N-seed run (the seeds
under vmap in one compiled program) at the same environment steps, in its own run directory.

A finished cell (its summary.json) is never run again, an interrupted one resumes from its
checkpoint, so a study that stopped part-way continues where it was. Either is reused only at
the settings it was trained with (`check_kept_cells`): a study never reports cells under
settings they did not run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib

import numpy as np

from genesis_jax.algos import get_algorithm, study_tasks
from genesis_jax.algos.base import StudyTask
from genesis_jax.run.progress import count
from genesis_jax.run.run_dir import jsonable, write_atomically
from genesis_jax.run.signals import DivergenceError

TASKS: dict[str, StudyTask] = study_tasks()  # every registered algorithm's (`Presets.study`)

# What each precision of a study means as config fields; fp16-unscaled shows what scaling buys.
PRECISIONS = {name: {"precision": name} for name in ("fp32", "bf16", "fp16")}
PRECISIONS["fp16-unscaled"] = {"precision": "fp16", "loss_scaling": "none"}
BASELINE = "fp32"
# The precisions whose cells record the underflow telemetry (where the algorithm measures it).
TELEMETRY_PRECISIONS = ("fp16", "fp16-unscaled")


def check_choices(tasks, precisions) -> None:
    """One line for an unknown, missing or repeated task or precision, before anything runs."""
    for kind, chosen, known in (("task", tasks, TASKS), ("precision", precisions, PRECISIONS)):
        if not chosen:
            raise ValueError(f"the study names no {kind}; accepted: {', '.join(known)}")
        for i, c in enumerate(chosen):
            if c not in known:
                raise ValueError(f"unknown {kind} {c!r}; accepted: {', '.join(known)}")
            if c in chosen[:i]:
                raise ValueError(f"{kind} {c!r} is given twice; name each {kind} once")
    if BASELINE not in precisions:
        raise ValueError(f"a study compares with {BASELINE}: include it in the precisions")
    if len(precisions) < 2:
        others = ", ".join(p for p in PRECISIONS if p != BASELINE)
        raise ValueError(f"a study compares at least one precision with {BASELINE}: add one of {others}")


def check_count(value, least: int, refusal: str) -> None:
    """One line (`refusal`, `least` in its braces, then the value) for a count that is not an
    integer of at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{refusal.format(least)}, got {value!r}")


def budgets(tasks, total_steps) -> dict[str, int]:
    """Environment steps per seed of each task: `total_steps` for all, a {task: steps}
    mapping, or None (each task's default)."""
    chosen = total_steps if isinstance(total_steps, dict) else {t: total_steps for t in tasks}
    # one N as environment steps and as epochs: a mistake
    if isinstance(total_steps, int) and len({TASKS[task].budget_field for task in tasks}) > 1:
        other = next(task for task in tasks if TASKS[task].budget_field != "total_steps")
        raise ValueError(
            f"total-steps {total_steps} for every task, but {other} counts its budget in "
            f"{TASKS[other].budget_field.replace('_', ' ')}, the others in environment steps: give each task its "
            "own, TASK=N,TASK=N"
        )
    if unknown := set(chosen) - set(tasks):
        raise ValueError(f"total-steps names {sorted(unknown)[0]!r}, which is not among the study's tasks")
    out = {task: TASKS[task].total_steps if chosen.get(task) is None else chosen[task] for task in tasks}
    for task, steps in out.items():
        check_count(steps, 1, f"total-steps of {task} must be a positive integer")
        fields = {f.name for f in dataclasses.fields(get_algorithm(TASKS[task].algo).config_class)}
        if TASKS[task].budget_field not in fields:  # its budget is counted in something else (epochs, say)
            raise ValueError(
                f"{task} trains {TASKS[task].algo}, whose budget is not environment steps: "
                "total-steps does not apply to it"
            )
    return out


def cell_config(task: str, precision: str, num_seeds: int, seed: int, steps: int):
    """The config a cell trains (its algorithm validates it here, before anything runs)."""
    spec = TASKS[task]
    algorithm = get_algorithm(spec.algo)
    fields = {**spec.settings, **PRECISIONS[precision], spec.budget_field: steps, "seed": seed, "num_seeds": num_seeds}
    if precision in TELEMETRY_PRECISIONS and algorithm.underflow_telemetry:
        fields["underflow_telemetry"] = True  # the study shows what float16 loses with and without scaling
    return algorithm.config_class(**fields)


def check_cell(task: str, config) -> None:
    """Every check `train` makes on `config` before it writes anything: the algorithm built
    from it (its devices, then its setup: data, environments, the int32 step counters), then
    released. A study makes them on every cell before it creates its directory."""
    spec = TASKS[task]
    algorithm = get_algorithm(spec.algo)(config)
    algorithm.close()
    # What the report reads of a cell: an acting algorithm's episode returns, or the world model's eval
    # loss by epoch against its data's noise floor; another's cells trained, then failed to be scored.
    if spec.score == "return":  # normalised from the random policy's return in the gymnax env the task names
        acts = algorithm.spec is not None and "episodes" in algorithm.metrics
        scorable = acts and "env" in spec.settings and algorithm.spec.backend == "gymnax"
        scored_by = "the episode returns of an algorithm that acts in a gymnax environment the task's settings name"
    else:
        reports = algorithm.row_key == "epoch" and "eval_loss" in algorithm.metrics
        scorable = reports and all(hasattr(algorithm, a) for a in ("loss_fn", "data", "noise_floor"))
        scored_by = "the world model's eval loss by epoch, against a noise floor"
    if not scorable:
        raise ValueError(
            f"study task {task!r} is scored by {scored_by}, which {spec.algo} does not report: "
            f"leave it out of its presets.study (bench takes any algorithm)"
        )


def cell_dir(out: pathlib.Path, task: str, precision: str) -> pathlib.Path:
    return out / "cells" / task / precision


def load_json(path: pathlib.Path, default=None):
    """The JSON in `path`, or `default` where there is no such file (or a torn one)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def add_json(path: pathlib.Path, key: str, value, sort_keys: bool = False) -> None:
    """Adds `key`: `value` to the JSON object in `path` (atomically: a new file, then renamed)."""
    write_atomically(path, json.dumps({**load_json(path, {}), key: value}, indent=1, sort_keys=sort_keys) + "\n")


def read_summary(path: pathlib.Path) -> dict | None:
    """The cell's summary if it finished (all its steps, not stopped by a signal), else None."""
    summary = load_json(path / "summary.json")
    finished = summary is not None and summary.get("stopped") in (None, "diverged") and summary.get("failed") is None
    return summary if finished else None


def read_rows(path: pathlib.Path, summary: dict) -> list[dict]:
    """A finished cell's metric rows, refused in one line where metrics.jsonl is torn or ends
    before the budget its `summary` says the cell ran (cut: its scores would be of part of the run)."""
    file, again = path / "metrics.jsonl", f"delete {path} and run the study again to train it anew"
    try:
        rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as err:
        raise ValueError(f"{file} cannot be read ({err}): {again}") from None
    (budget, unit), last = budget_of(summary), rows[-1].get("step", rows[-1].get("epoch")) if rows else None
    if summary.get("stopped") != "diverged" and (last is None or last < budget):
        raise ValueError(f"{file} ends at {last} {unit}, before the {budget} its summary.json ran (cut): {again}")
    return rows


def run_cell(path: pathlib.Path, task: str, config, progress: bool) -> dict:
    """Trains one cell (resuming it when it has a checkpoint); returns its summary, as
    summary.json holds it (the config included)."""
    started = (path / "checkpoints").is_dir() and any((path / "checkpoints").iterdir())
    options = {"resume": True} if started else {"overwrite": path.exists()}
    every, train = max(1, getattr(config, TASKS[task].budget_field) // 4), get_algorithm(TASKS[task].algo).train
    try:
        summary = train(config, str(path), checkpoint_every=every, progress=progress, **options).summary
    except DivergenceError as stop:  # every seed halted: the cell's result is what they reached
        summary = stop.summary
    return read_summary(path) or summary


# What records a cell's settings: summary.json once it ended, and, from the moment it starts,
# the study's own record (a cell killed before its summary is judged by that one).
PLANNED = "planned.json"
# The study's flags, by the config field each sets: a refusal names the flag to change.
FLAGS = {"num_seeds": "--num-seeds", "total_steps": "--total-steps", "epochs": "--total-steps", "seed": "--seed"}
# What makes a cell the cell a study asks for: its flags' fields and its precision's. A report
# (`check_report_cells`) reads cells whose other settings (the algorithm's) may have moved since.
STUDY_FIELDS = {*FLAGS, *(field for fields in PRECISIONS.values() for field in fields)}


def as_json(config) -> dict:
    """A config as summary.json holds it (tuples as lists, a non-finite float as None)."""
    return json.loads(json.dumps(jsonable(config.to_dict()), default=str))


def record_planned(out: pathlib.Path, path: pathlib.Path, config) -> None:
    """Adds the settings of the cell at `path` to the study's record (atomically)."""
    add_json(out / PLANNED, path.relative_to(out).as_posix(), as_json(config))


def recorded_settings(out: pathlib.Path, path: pathlib.Path) -> dict | None:
    """The config the cell at `path` was trained with, as far as anything on disk says
    (nothing where the cell is gone: one deleted to be trained again is not judged)."""
    if not path.exists():
        return None
    summary, name = load_json(path / "summary.json", {}), path.relative_to(out).as_posix()
    return summary["config"] if "config" in summary else load_json(out / PLANNED, {}).get(name)


def settings_changes(recorded: dict, planned: dict, fields=None) -> list[str]:
    """'field: recorded -> planned' for each differing field (of `fields`, default all; study
    flags by their flag). A field only one side has comes from another version of genesis-jax
    and is not compared."""
    names = [n for n in sorted(set(recorded) & set(planned)) if recorded[n] != planned[n] and n in (fields or planned)]
    return [f"{FLAGS.get(n, n)}: {recorded[n]!r} -> {planned[n]!r}" for n in names]


def check_kept_cells(out: pathlib.Path, plan: dict[pathlib.Path, object], report: bool = False) -> dict:
    """Refuses, in one line, a study whose `--out` holds cells trained with other settings
    than `plan` ({cell path: config}) asks for: reusing them would report what did not run.

    `report` (`run_study(report_only=True)`, which trains nothing; `check_report_cells`): a
    cell of `plan` that has not finished is refused too, and only the study settings
    (`STUDY_FIELDS`: seeds, budget, seed, precision) are checked. Returns {cell path: changes}
    of the settings in which a cell differs from what these settings give today (an
    algorithm's default that changed since it ran): the report states them."""
    changed, moved = {}, {}
    for path, config in plan.items():
        if report and read_summary(path) is None:
            raise ValueError(
                f"{path} has not finished: a report (--report-only) trains nothing; run the study without "
                "--report-only to train it (or --no-cost where it is the cost run)"
            )
        if (recorded := recorded_settings(out, path)) is None:
            continue
        planned = as_json(config)
        if changes := settings_changes(recorded, planned, STUDY_FIELDS if report else None):
            changed[path] = changes
        elif changes := settings_changes(recorded, planned):
            moved[path] = changes
    if changed:
        path, changes = next(iter(changed.items()))
        more = f" (and {count(len(changed) - 1, 'more cell')})" if len(changed) > 1 else ""
        raise ValueError(
            f"{path} was trained with other settings than this study asks for ({'; '.join(changes)}){more}: "
            "run the study with the settings it was made with, or give another --out for the new ones"
        )
    return moved


check_report_cells = functools.partial(check_kept_cells, report=True)


def seed_scores(summary: dict) -> np.ndarray:
    """The final return of each seed of a cell, or for a world model's cell log10 of its
    final eval loss."""
    if "eval_loss_per_seed" in summary or summary.get("eval_loss") is not None and "final_return" not in summary:
        per_seed = summary.get("eval_loss_per_seed") or [summary["eval_loss"]]
        return np.log10(np.asarray(per_seed, np.float64))  # a None (a non-finite loss) as NaN
    per_seed = summary.get("final_return_per_seed")
    return np.asarray(per_seed if per_seed is not None else [summary["final_return"]], np.float64)


def budget_of(summary: dict) -> tuple[int, str]:
    """(the budget a cell ran, its unit): environment steps, or a world model's epochs."""
    return (summary["total_steps"], "steps") if "total_steps" in summary else (summary["epochs"], "epochs")


def learning_curve(rows: list[dict], points: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, returns[seeds, points]): each seed's return along the run, in `points` equal
    windows: the mean return of the episodes that ended in the window, or, where the rows carry
    only each seed's recent return (cells written by DQN before 0.4: its last 10 episodes),
    that return at the window's end."""
    windows = np.array_split(np.arange(len(rows)), min(points, len(rows)))
    ends = [w[-1] for w in windows]
    # a None (a non-finite value, or a seed without a recent episode) becomes NaN in the arrays
    if "eval_loss" in rows[0]:  # a world model: log10 of each seed's eval loss, averaged in the window
        per_seed = [r.get("eval_loss_per_seed") or [r["eval_loss"]] for r in rows]
        logs = np.log10(np.asarray(per_seed, np.float64))
        return np.asarray([r["epoch"] for r in rows])[ends], np.stack([logs[w].mean(0) for w in windows], axis=1)
    steps = np.asarray([r["step"] for r in rows])[ends]
    if "return_sum_per_seed" not in rows[0] and "recent_return_per_seed" in rows[0]:
        return steps, np.asarray([rows[i]["recent_return_per_seed"] for i in ends], np.float64).T
    per_seed = lambda key: np.asarray([r.get(f"{key}_per_seed", [r.get(key)]) for r in rows], np.float64)
    sums, episodes = per_seed("return_sum"), per_seed("episodes")
    mean = lambda s, n: np.divide(s, n, out=np.full(len(s), np.nan), where=n > 0)
    return steps, np.stack([mean(sums[w].sum(0), episodes[w].sum(0)) for w in windows], axis=1)


# Windows of a learning curve its AUC averages over (equal shares of the run's rows).
AUC_POINTS = 20


def auc_scores(rows: list[dict], points: int = AUC_POINTS) -> np.ndarray:
    """Each seed's area under its learning curve, per unit of run: the mean over `points`
    equal windows of the run (`learning_curve`) of its return; windows in which a seed
    finished no episode are left out of its mean. Normalised like the final return, 1 means
    "at the reference return from the first step to the last"."""
    _, returns = learning_curve(rows, points)
    finished = np.isfinite(returns)
    totals = np.where(finished, returns, 0.0).sum(1)
    return np.divide(totals, finished.sum(1), out=np.full(len(returns), np.nan), where=finished.sum(1) > 0)


# Windows of a learning curve in which the time to a threshold is looked for (2% of the run each).
SPEED_POINTS = 50


def threshold_times(rows: list[dict], reached, points: int = SPEED_POINTS) -> tuple[np.ndarray, np.ndarray, int]:
    """(each seed's first logged step, or epoch, at which `reached(curve)` holds: the end of
    the first of `points` equal windows of its learning curve (`learning_curve`) whose mean
    reaches the threshold; whether it reached it; the run's budget, its last logged step).
    A seed that never reaches it counts as the budget: its time is at least that (the report
    says how many seeds reached it)."""
    steps, returns = learning_curve(rows, points)
    hit = np.asarray(reached(returns), bool) & np.isfinite(returns)
    budget = int(steps[-1])
    times = np.where(hit.any(1), steps[np.argmax(hit, axis=1)], budget)
    return times.astype(np.float64), hit.any(1), budget


def reference_score(task: str, seed: int = 0) -> float | None:
    """A task's known reference score: its published return, a loss task's log10 noise
    floor (`loss_bounds`), or None (the study's own fp32 IQM)."""
    return loss_bounds(task, seed)[1] if TASKS[task].score == "loss" else TASKS[task].reference


def random_floor(task: str, seed: int = 0) -> float:
    """The score of a task's normalisation floor: the random policy's return, or for a loss
    task log10 of an untrained model's eval loss (`loss_bounds`)."""
    return loss_bounds(task, seed)[0] if TASKS[task].score == "loss" else random_return(TASKS[task].settings["env"])


@functools.lru_cache(maxsize=None)
def loss_bounds(task: str, seed: int = 0) -> tuple[float, float]:
    """(log10 of the eval loss of an untrained model of `task`, log10 of its data's noise
    floor): a loss task's 0 and 1 (float32, the model `seed` initialises)."""
    import jax

    algorithm = get_algorithm(TASKS[task].algo)(cell_config(task, BASELINE, 1, seed, 1))
    state = algorithm.init(jax.random.PRNGKey(seed))
    untrained = float(algorithm.loss_fn(state.train_state.params, algorithm.data[1])[0])
    if algorithm.noise_floor is None:
        raise ValueError(f"{task}'s data has no known noise floor to normalise its loss against")
    return float(np.log10(untrained)), float(np.log10(algorithm.noise_floor))


def random_return(env: str, episodes: int = 64, seed: int = 0, max_steps: int = 10_000) -> float:
    """The mean return of a uniformly random policy over the first episode of `episodes`
    environments (measured with gymnax: the study's normalisation floor)."""
    import jax
    import jax.numpy as jnp

    from genesis_jax.data.trajectories import random_policy
    from genesis_jax.envs.gymnax_env import GymnaxVecEnv

    vec = GymnaxVecEnv(env, episodes)
    act = random_policy(vec.spec, episodes)  # uniform: in the action box, or over the actions

    def step(carry, key):
        state, total, done = carry
        act_key, step_key = jax.random.split(key)
        _, state, reward, ended, cut, _ = vec.step(jax.random.split(step_key, episodes), state, act(act_key, None))
        return (state, total + jnp.where(done, 0.0, reward), done | ended | cut), None

    def run(key):
        start = (vec.reset(key)[1], jnp.zeros(episodes), jnp.zeros(episodes, bool))
        return jax.lax.scan(step, start, jax.random.split(key, max_steps))[0][1:]

    totals, done = jax.jit(run)(jax.random.PRNGKey(seed))
    if not bool(jnp.all(done)):
        raise RuntimeError(f"a random episode of {env} did not end within {max_steps} steps")
    return float(jnp.mean(totals))
