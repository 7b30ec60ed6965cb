"""The study's cells as jobs of a cluster (`--executor`), through submitit: one job per cell
that has not finished, each training its cell into the same `--out` (a filesystem the jobs
share), then the report made here from the cells on disk, as a study run in this process
makes it.

The cells on disk are the state, as they are for a study in one process: a finished cell
(its summary.json) is never submitted again, a cell whose job died resumes from its last
checkpoint when the study runs again, and a cell is reused only at the settings it was
trained with. submitit pickles a function and its arguments per job and runs it on SLURM
(`slurm`) or as processes on this machine (`submitit-local`, what CI runs); no cluster
service runs beside it (docs/study.md#cluster).

>>> parse_options("timeout_min=120,slurm_partition=gpu,gpus_per_node=1")
{'timeout_min': 120, 'slurm_partition': 'gpu', 'gpus_per_node': 1}
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
import time

from genesis_jax.cli.study import cells
from genesis_jax.run.signals import first_line

# --executor: where cells run. "inline" is this process, one cell after another.
EXECUTORS = ("inline", "slurm", "submitit-local")
# submitit's local jobs end at their timeout (its default is minutes): a day, unless given.
LOCAL_TIMEOUT_MIN = 24 * 60


class JobFailed(OSError):
    """A cell's job ended without its summary (the node failed, the job was killed, or the
    cell raised): the finished cells are kept, and the study run again resumes the others."""


def parse_options(text: str | None) -> dict:
    """--executor-options KEY=VALUE,...: submitit's parameters (integers and floats as numbers)."""
    options = {}
    for part in filter(str.strip, (text or "").split(",")):
        if "=" not in part:
            raise ValueError(f"--executor-options takes KEY=VALUE,KEY=VALUE, got {part.strip()!r}")
        key, value = (x.strip() for x in part.split("=", 1))
        for kind in (int, float):
            with contextlib.suppress(ValueError):
                value = kind(value)
                break
        options[key] = value
    return options


def make_executor(name: str, folder: pathlib.Path, options: dict):
    """The submitit executor of `name` (`EXECUTORS`), its logs and pickles in `folder`,
    `options` given to its `update_parameters` (refused in one line where it has no such one,
    and "slurm" where SLURM's srun is not on the PATH)."""
    if name not in EXECUTORS or name == "inline":
        raise ValueError(f"unknown executor {name!r}; accepted: {', '.join(EXECUTORS)}")
    if name == "slurm" and shutil.which("srun") is None:
        raise ValueError("--executor slurm needs SLURM (srun not found); use --executor submitit-local")
    try:
        import submitit
    except ImportError as err:
        raise ImportError(f"--executor {name} needs submitit: pip install 'genesis-jax[cluster]' ({err})") from err
    # AutoExecutor: one set of parameter names (timeout_min, gpus_per_node, slurm_partition, ...), checked
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm" if name == "slurm" else "local")
    defaults = {} if name == "slurm" else {"timeout_min": LOCAL_TIMEOUT_MIN}  # SLURM's: its partition's
    try:
        executor.update_parameters(**{**defaults, **options})
    except (ValueError, TypeError, NameError) as err:
        raise ValueError(f"--executor-options for {name}: {first_line(err)}") from None
    return executor


def check_executor(name: str, options: dict) -> None:
    """`make_executor`'s refusals, before anything is written (its folder made in a temporary one);
    options without an executor to take them."""
    if name == "inline" and options:
        raise ValueError(
            "--executor-options are a job executor's: add --executor slurm or submitit-local, or drop them"
        )
    if name != "inline":
        with tempfile.TemporaryDirectory() as folder:
            make_executor(name, pathlib.Path(folder), options)


def run_cell_job(path: str, task: str, config) -> dict:
    """One job: trains (or resumes) the cell at `path` and returns its summary (`cells.run_cell`)."""
    return cells.run_cell(pathlib.Path(path), task, config, progress=False)


def run_jobs(executor, pending: dict, stopped=lambda: False, poll_seconds: float = 1.0) -> dict:
    """Submits a job per cell of `pending` ({path: (task, precision, config)}), as one array
    where the executor makes arrays, and waits for them. Returns {path: summary}; raises
    `JobFailed` naming the cells whose jobs failed once every job has ended (the others'
    cells are kept). `stopped()`: checked while waiting; where it holds the jobs are cancelled
    (a cell saves its checkpoint on the signal SLURM sends) and None is returned."""
    items = list(pending.items())
    with executor.batch() if len(items) > 1 else contextlib.nullcontext():
        jobs = [executor.submit(run_cell_job, str(path), task, config) for path, (task, _, config) in items]
    while not all(job.done() for job in jobs):
        if stopped():
            for job in (job for job in jobs if not job.done()):
                job.cancel(check=False)
            return None
        time.sleep(poll_seconds)
    summaries, failed = {}, []
    for (path, (task, precision, _)), job in zip(items, jobs):
        try:
            summaries[path] = job.result()
        except Exception as err:  # noqa: BLE001  (submitit's FailedJobError, or what the cell raised)
            where = getattr(getattr(job, "paths", None), "stderr", None) or str(err).strip().splitlines()[-1][:200]
            failed.append(f"{task} {precision} (job {job.job_id}: {where})")
    if failed:
        raise JobFailed(
            f"{len(failed)} of {len(jobs)} cell jobs failed: {'; '.join(failed)}; their logs are in "
            f"{executor.folder}; the finished cells are kept: run the study again to resume the others"
        )
    return summaries
