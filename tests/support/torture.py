"""The torture test's driver: one `genesis-jax train` command killed again and again at random
moments with SIGKILL, SIGTERM and SIGINT, resumed each time, then compared with the same command
run once without a stop.

A schedule is a pure function of its seed (`schedule(kills, seed)`): which moment each kill waits
for, which signal it sends, and where in that moment it lands (a fraction of the moment's length,
measured on the runs themselves). Replaying a seed replays the same plan; the exact instants
depend on the machine's speed.

The moments:

- ``start``: interpreter start, imports and setup, before the run directory is locked (the
  run's signal handlers are not installed yet: SIGTERM and SIGINT may end the process by
  their default action);
- ``compile``: the run directory is locked (restore, then compilation), no row logged yet;
- ``chunk``: after this process logged a row, somewhere in the next chunk;
- ``save``: while a checkpoint is being written (an Orbax temporary directory in checkpoints/).

Every restart uses the same JAX persistent compilation cache as the uninterrupted run, which
runs first and fills it, so a restart loads the very executable the uninterrupted run compiled
instead of compiling again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import pathlib
import resource
import signal
import statistics
import subprocess
import time

import numpy as np

from tests.support.files import committed_steps, metric_rows
from tests.support.processes import cpu_env, start_python

MOMENTS = ("start", "compile", "chunk", "save")
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
TMP_MARK = ".orbax-checkpoint-tmp"  # Orbax writes a step here and renames it when complete
POLL = 0.002  # seconds between looks at the run directory


@dataclasses.dataclass(frozen=True)
class Plan:
    """One planned kill: the moment it waits for, the signal, and where in the moment it lands."""

    moment: str
    signum: int
    fraction: float


@dataclasses.dataclass
class Kill:
    """What one kill did. `moment` is the one observed when the signal went (a `compile` kill
    whose process logged a row first is a `chunk` kill); `rows_at_kill` are the intact metric
    rows then, `rows_at_exit` once the process ended, `resume_from` the position the next run
    resumes from (the newest complete checkpoint at or before the last intact row)."""

    planned: str
    moment: str
    signal: str
    at: float  # seconds after launch
    status: int
    locked: bool
    rows_at_kill: int
    rows_at_exit: int
    resume_from: int
    stderr: str = ""


@dataclasses.dataclass
class Torture:
    """A torture run: the command, the kills, both run directories, and the processes' wall time."""

    command: list[str]
    kills: list[Kill]
    straight: pathlib.Path
    tortured: pathlib.Path
    final_status: int
    final_stderr: str
    straight_seconds: float
    restart_seconds: list[float]
    straight_cpu: float  # CPU seconds (user + system) of the uninterrupted run
    restart_cpu: float  # CPU seconds of all the tortured processes


# DQN's and SAC's small runs: (their sizes, environment steps per metrics row, the position).
OFF_POLICY = {
    "dqn": (
        "--num-envs 2 --train-frequency 2 --row-steps 200 --learning-starts 400 --buffer-size 1000 --batch-size 32 "
        "--target-update-interval 100 --epsilon-steps 2000 --hidden 16".split(),
        200,
    ),
    "sac": (
        "--num-envs 8 --steps-per-row 8 --batch-size 8 --learning-starts 8 --buffer-size 512 --hidden 16 16".split(),
        8,
    ),
}


def schedule(kills: int, seed: int) -> list[Plan]:
    """`kills` plans from `seed`: every moment x signal pair as evenly as `kills` allows, in a
    seeded random order, each with a seeded fraction of its moment."""
    rng = np.random.default_rng(seed)
    pairs = list(itertools.product(MOMENTS, SIGNALS))
    picked = pairs * (kills // len(pairs))
    picked += [pairs[i] for i in rng.choice(len(pairs), kills % len(pairs), replace=False)]
    order = rng.permutation(len(picked))
    fractions = rng.uniform(0.0, 1.0, kills)
    return [Plan(picked[i][0], int(picked[i][1]), float(f)) for i, f in zip(order, fractions)]


# --- what the run directory shows -------------------------------------------------------------


def intact_rows(out: pathlib.Path) -> int:
    """Metric rows with their newline written (a torn last line is not one)."""
    try:
        return (out / "metrics.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def saves_in_progress(out: pathlib.Path) -> set[str]:
    checkpoints = out / "checkpoints"
    return {p.name for p in checkpoints.iterdir() if TMP_MARK in p.name} if checkpoints.exists() else set()


def resume_point(out: pathlib.Path) -> int:
    """Where `--resume` continues (docs/runs.md): the newest complete checkpoint at or before
    the last intact row, 0 where there is none."""
    rows = intact_rows(out)
    return max([s for s in committed_steps(out) if s <= rows], default=0)


def locked_by(out: pathlib.Path, pid: int) -> bool:
    try:
        return (out / ".lock").read_text().strip() == str(pid)
    except FileNotFoundError:
        return False


def leftovers(out: pathlib.Path) -> list[str]:
    """Files a finished run must not leave: the lock, temporary files and directories, a run
    set aside by --overwrite."""
    return sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.name in (".lock", ".replaced") or "tmp" in p.name
    )


# --- one process ----------------------------------------------------------------------------


def expected_statuses(signum: int, locked: bool) -> set[int]:
    """The exit statuses docs/runs.md allows: SIGKILL -9; SIGTERM and SIGINT a clean stop,
    128 + N. Before the run locked its directory its handlers are not installed: the signal's
    default action (-N), or for SIGINT Python's KeyboardInterrupt turned into 130 by the CLI,
    or 1 where it lands while the interpreter itself still starts (importing `site`, before any
    code of the command runs: Python prints the traceback and exits 1; nothing is on disk)."""
    if signum == signal.SIGKILL:
        return {-signal.SIGKILL}
    if locked:
        return {128 + signum}
    return {128 + signum, -signum} | ({1} if signum == signal.SIGINT else set())


def started_run(args: list[str], out: pathlib.Path, env: dict) -> subprocess.Popen:
    """The command on `out`: `--resume` where a run left checkpoints/ to resume from; a fresh
    start where the killed one never got that far (resume refuses a directory without it)."""
    resume = ["--resume"] if (out / "checkpoints").exists() else []
    return start_python(["-m", "genesis_jax.cli", *args, "--out", str(out), *resume], env)


class Watch:
    """Polls one process's run directory for the moments: the lock, its first row, a save."""

    def __init__(self, proc: subprocess.Popen, out: pathlib.Path):
        self.proc, self.out = proc, out
        self.launched = time.perf_counter()
        self.launched_ns = time.time_ns()
        self.old_saves = saves_in_progress(out)  # a killed save's leftover is not this process's
        self.kept = resume_point(out)
        self.locked_at: float | None = None
        self.first_row_at: float | None = None

    def look(self) -> None:
        now = time.perf_counter()
        if self.locked_at is None and locked_by(self.out, self.proc.pid):
            self.locked_at = now
        if self.first_row_at is None and self.logged_a_row():
            self.first_row_at = now

    def logged_a_row(self) -> bool:
        """A row of this process: metrics.jsonl changed since launch and holds more rows than
        the resume keeps (before the resume trims it, the old rows are still there)."""
        try:
            changed = (self.out / "metrics.jsonl").stat().st_mtime_ns > self.launched_ns
        except FileNotFoundError:
            return False
        return changed and intact_rows(self.out) > self.kept

    def saving(self) -> bool:
        return bool(saves_in_progress(self.out) - self.old_saves)

    def wait_for(self, condition, timeout: float) -> bool:
        """Polls until `condition()`; False if the process ended first."""
        deadline = time.perf_counter() + timeout
        while True:
            self.look()
            if condition():
                return True
            if self.proc.poll() is not None:
                return False
            if time.perf_counter() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out after {timeout} s waiting on {self.out}")
            time.sleep(POLL)

    def moment_now(self) -> str:
        self.look()
        if not locked_by(self.out, self.proc.pid):
            return "start"
        if self.saving():
            return "save"
        return "chunk" if self.first_row_at is not None else "compile"


@dataclasses.dataclass
class Estimates:
    """Seconds from launch to the lock, from the lock to the first row (the newest restarts'
    median: a restart loads the compiled chunk from the cache, unlike the uninterrupted run),
    and between chunks."""

    first_to_lock: float
    per_chunk: float
    to_lock: list[float] = dataclasses.field(default_factory=list)
    to_row: list[float] = dataclasses.field(default_factory=list)

    def note(self, watch: Watch) -> None:
        if watch.locked_at is not None:
            self.to_lock.append(watch.locked_at - watch.launched)
            if watch.first_row_at is not None:
                self.to_row.append(watch.first_row_at - watch.locked_at)

    def length(self, moment: str) -> float:
        to_lock = statistics.median(self.to_lock[-5:]) if self.to_lock else self.first_to_lock
        if moment == "start":
            return to_lock
        if moment == "compile":  # before any restart showed it: about as long as the start, a guess
            return statistics.median(self.to_row[-5:]) if self.to_row else to_lock
        return self.per_chunk if moment == "chunk" else 0.0


def straight_run(args: list[str], out: pathlib.Path, env: dict, timeout: float) -> tuple[Estimates, float]:
    """The uninterrupted run (which fills the compilation cache), timed for the estimates."""
    proc = started_run(args, out, env)
    watch = Watch(proc, out)
    times, rows = [], 0  # when rows came: once per chunk (a chunk's rows are written together)
    while proc.poll() is None:
        watch.look()
        if intact_rows(out) > rows:
            times.append(time.perf_counter())
            rows = intact_rows(out)
        if time.perf_counter() - watch.launched > timeout:
            proc.kill()
            raise AssertionError(f"the uninterrupted run took over {timeout} s")
        time.sleep(POLL)
    seconds = time.perf_counter() - watch.launched
    _, stderr = proc.communicate()
    assert proc.returncode == 0, f"the uninterrupted run failed ({proc.returncode}): {stderr[-2000:]}"
    to_lock = (watch.locked_at or watch.launched) - watch.launched
    return Estimates(to_lock, per_chunk=float(np.median(np.diff(times))) if len(times) > 1 else 0.5), seconds


def reached_compile(watch: Watch) -> bool:
    return watch.locked_at is not None


def reached_chunk(watch: Watch) -> bool:
    return watch.first_row_at is not None


def kill_once(plan: Plan, args, out, env, estimates: Estimates, timeout: float) -> Kill | None:
    """Starts the command, waits for the plan's moment, signals, waits for the exit. None if
    the run finished before its moment came (its status is checked by the caller's final run)."""
    proc = started_run(args, out, env)
    watch = Watch(proc, out)
    reached = {
        "start": lambda: True,
        "compile": lambda: reached_compile(watch),
        "chunk": lambda: reached_chunk(watch),
        "save": watch.saving,
    }[plan.moment]
    delay = plan.fraction * estimates.length(plan.moment)
    # A start kill goes at once when the directory gets locked first, a compile kill when a
    # row comes first: each lands in its own moment or the next, never later.
    next_moment = {"start": reached_compile, "compile": reached_chunk}.get(plan.moment, lambda w: False)
    if watch.wait_for(reached, timeout):
        until = time.perf_counter() + delay
        while time.perf_counter() < until and proc.poll() is None and not next_moment(watch):
            watch.look()
            time.sleep(POLL)
    if proc.poll() is not None:  # finished before the signal: no kill
        proc.communicate()
        estimates.note(watch)
        return None
    moment = watch.moment_now()
    locked = moment != "start"
    rows_at_kill, at = intact_rows(out), time.perf_counter() - watch.launched
    proc.send_signal(plan.signum)
    _, stderr = proc.communicate(timeout=timeout)
    estimates.note(watch)
    return Kill(
        planned=plan.moment,
        moment=moment,
        signal=signal.Signals(plan.signum).name,
        at=round(at, 3),
        status=proc.returncode,
        locked=locked,
        rows_at_kill=rows_at_kill,
        rows_at_exit=intact_rows(out),
        resume_from=resume_point(out),
        stderr=stderr[-3000:],
    )


def children_cpu() -> float:
    """CPU seconds of this process's ended children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def sigint_not_ignored():
    """A shell starts background jobs with SIGINT ignored, children inherit that, and a Python
    started so never turns SIGINT into KeyboardInterrupt: a SIGINT before the run's own handler
    would be lost. While the runs start, this process takes Python's usual handler, which exec
    turns back into the default for the children."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def torture(
    command_args: list[str],
    out_dir,
    kills: int,
    rng_seed: int,
    *,
    cache: bool = True,
    timeout: float = 600.0,
    log=None,
) -> Torture:
    """Runs `genesis-jax COMMAND_ARGS` (without --out) once straight into OUT_DIR/straight, then
    into OUT_DIR/tortured with `kills` kills planned by `schedule(kills, rng_seed)`, each
    followed by a restart (`--resume`), and a last restart that runs to the end. `cache`: share
    a JAX persistent compilation cache (OUT_DIR/jax-cache) between all of them. `log(kill)` is
    called after each kill."""
    with sigint_not_ignored():
        return _torture(command_args, pathlib.Path(out_dir), kills, rng_seed, cache, timeout, log)


def _torture(command_args, out_dir: pathlib.Path, kills: int, rng_seed: int, cache: bool, timeout: float, log):
    extra = {}
    if cache:
        extra = {
            "JAX_COMPILATION_CACHE_DIR": str(out_dir / "jax-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        }
    env = cpu_env(**extra)
    straight, tortured = out_dir / "straight", out_dir / "tortured"
    cpu = children_cpu()
    estimates, straight_seconds = straight_run(command_args, straight, env, timeout)
    straight_cpu, cpu = children_cpu() - cpu, children_cpu()
    done, restart_seconds = [], []
    for plan in schedule(kills, rng_seed):
        began = time.perf_counter()
        kill = kill_once(plan, command_args, tortured, env, estimates, timeout)
        restart_seconds.append(time.perf_counter() - began)
        if kill is None:
            break  # the run finished: no moment left to kill it in
        done.append(kill)
        if log is not None:
            log(kill)
    began = time.perf_counter()
    final = started_run(command_args, tortured, env)
    _, stderr = final.communicate(timeout=timeout)
    restart_seconds.append(time.perf_counter() - began)
    return Torture(
        list(command_args),
        done,
        straight,
        tortured,
        final.returncode,
        stderr[-3000:],
        straight_seconds,
        restart_seconds,
        straight_cpu,
        children_cpu() - cpu,
    )


# --- the verdict ----------------------------------------------------------------------------


def state_differences(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """Where the newest checkpoints of two runs differ: step, checksum, or any leaf's dtype,
    shape or bits (every leaf of the whole state: params, optimizer, scaler, keys)."""
    import jax

    from genesis_jax.run.checkpoint import CheckpointStore

    restored = []
    for out in (a, b):
        store = CheckpointStore(out / "checkpoints")
        try:
            restored.append(store.restore_raw())
        finally:
            store.close()
    (state_a, meta_a), (state_b, meta_b) = restored
    problems = [f"{key}: {meta_a[key]} != {meta_b[key]}" for key in ("step", "digest") if meta_a[key] != meta_b[key]]
    leaves_a = dict(jax.tree_util.tree_flatten_with_path(state_a)[0])
    leaves_b = dict(jax.tree_util.tree_flatten_with_path(state_b)[0])
    if leaves_a.keys() != leaves_b.keys():
        return [*problems, "the two states hold different leaves"]
    for path, x in leaves_a.items():
        x, y = np.asarray(x), np.asarray(leaves_b[path])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            problems.append(f"leaf {jax.tree_util.keystr(path)} differs")
    return problems


def verdict(result: Torture, total: int, wall_clock=()) -> list[str]:
    """Everything that keeps the tortured run from being the uninterrupted one (empty: none):
    an exit status not documented for its signal, a failed last run, metric rows (values and
    count; `wall_clock` keys left out), the final state, the summary (its measured times left
    out), leftovers, an unfinished summary."""
    problems = []
    for i, kill in enumerate(result.kills, start=1):
        if kill.status not in expected_statuses(getattr(signal, kill.signal), kill.locked):
            problems.append(f"kill {i} ({kill.signal} at {kill.moment}): exit status {kill.status}: {kill.stderr}")
    if result.final_status != 0:
        return [*problems, f"the last run ended with {result.final_status}: {result.final_stderr}"]
    straight, tortured = metric_rows(result.straight, wall_clock), metric_rows(result.tortured, wall_clock)
    if len(tortured) != total or straight != tortured:
        differ = [i + 1 for i, (x, y) in enumerate(zip(straight, tortured)) if x != y]
        problems.append(f"metric rows: {len(tortured)} rows (expected {total}), first differing row {differ[:1]}")
    problems += state_differences(result.straight, result.tortured)
    summaries = [json.loads((out / "summary.json").read_text()) for out in (result.straight, result.tortured)]
    summaries = [{k: v for k, v in s.items() if k not in wall_clock} for s in summaries]
    if summaries[0] != summaries[1]:
        keys = sorted(
            k for k in summaries[0].keys() | summaries[1].keys() if summaries[0].get(k) != summaries[1].get(k)
        )
        problems.append(f"summary.json differs in {keys}")
    if summaries[1].get("stopped") is not None or summaries[1].get("iterations") != total:
        problems.append(
            f"summary.json says stopped={summaries[1].get('stopped')}, {summaries[1].get('iterations')} rows"
        )
    if leftovers(result.tortured):
        problems.append(f"left over in the run directory: {leftovers(result.tortured)}")
    return problems


def table(result: Torture) -> list[str]:
    """The kills as a markdown table."""
    lines = [
        "| # | planned | moment | signal | seconds after launch | exit status | rows at kill | rows at exit "
        "| resumes from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, k in enumerate(result.kills, start=1):
        lines.append(
            f"| {i} | {k.planned} | {k.moment} | {k.signal} | {k.at:.2f} | {k.status} | {k.rows_at_kill} "
            f"| {k.rows_at_exit} | {k.resume_from} |"
        )
    return lines
