"""A run's output directory and what every trainer writes there: metrics.jsonl,
summary.json and checkpoints/ (the PNG: `plots`), and the config check of a resumed run.
Shared by every algorithm."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import shutil

_RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "tensorboard", "wandb")


class RunDirectoryError(ValueError):
    """An output directory that may not be used as asked."""


def jsonable(value):
    """`value` with every non-finite float (nested ones included) as None: JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def _dumps(value, **kwargs) -> str:
    return json.dumps(jsonable(value), allow_nan=False, default=str, **kwargs)


def config_changes(saved: dict, current: dict, may_change=()) -> list[str]:
    """'name: saved -> current' for every config field that differs, but those in `may_change`."""
    names = sorted((set(saved) | set(current)) - set(may_change))
    # JSON turned the saved tuples into lists: compare both as JSON values.
    return [
        f"{n}: {saved.get(n)!r} -> {current.get(n)!r}"
        for n in names
        if jsonable(saved.get(n)) != jsonable(current.get(n))
    ]


def check_config_changes(meta: dict, config, allow: bool) -> list[str]:
    """The changes of `config` against the resumed checkpoint's (`meta["config"]`), beyond
    `config.RESUMABLE_FIELDS`; refused (one sentence listing them) unless `allow`."""
    from genesis_jax.run.checkpoint import CheckpointMismatchError

    changes = config_changes(meta.get("config", {}), config.to_dict(), config.RESUMABLE_FIELDS)
    if changes and not allow:
        raise CheckpointMismatchError(
            f"the checkpoint at step {meta.get('step')} was written by a run with other settings "
            f"({'; '.join(changes)}); "
            "pass --allow-config-change to continue it anyway"
        )
    return changes


class RunDirectory:
    """A run's output directory, and the rules that keep runs apart:

    - a directory holding another run is refused unless `resume` (continue it) or
      `overwrite` (replace it) is given;
    - the constructor only checks; nothing is written until `open()`, which the trainers
      call once every other input is validated;
    - one process at a time: `open()` takes an exclusive lock (`.lock`, holding the pid);
      a second process is refused, naming the holder. The kernel drops the lock of a killed
      process, so a stale `.lock` is taken over;
    - `overwrite` sets the old run aside (`.replaced/`) and deletes it only when the new
      run ends (its final checkpoint written); a run that fails first puts it back.
    """

    LOCK = ".lock"
    ASIDE = ".replaced"

    def __init__(self, path, resume: bool = False, overwrite: bool = False):
        if resume and overwrite:
            raise RunDirectoryError("choose either resume or overwrite, not both")
        if not str(path).strip():
            raise RunDirectoryError("the output directory is an empty path; name a directory")
        self.path = pathlib.Path(path)
        self.resume, self.overwrite = resume, overwrite
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"output path {self.path} exists and is not a directory")
        holds_run = any((self.path / name).exists() for name in _RUN_FILES)
        if holds_run and not (resume or overwrite):
            raise RunDirectoryError(
                f"output directory {self.path} holds another run; "
                "pass --resume to continue it or --overwrite to replace it"
            )
        if resume and not (self.path / "checkpoints").exists():
            raise RunDirectoryError(f"nothing to resume in {self.path}: it has no checkpoints/")
        self._lock_file = None

    def open(self) -> "RunDirectory":
        """Locks the directory and, with `overwrite`, sets the old run aside."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        if self.overwrite:
            aside = self.path / self.ASIDE
            if aside.exists():  # left by an earlier overwrite that was killed: the older run
                shutil.rmtree(aside)
            moved = [name for name in _RUN_FILES if (self.path / name).exists()]
            if moved:
                aside.mkdir()
                for name in moved:
                    os.replace(self.path / name, aside / name)
        return self

    @contextlib.contextmanager
    def opened(self, finished=()):
        """`open()` for the block; `close()` after it, as a success when the block ends
        normally or with one of the `finished` exceptions (a run that stopped cleanly)."""
        self.open()
        succeeded = False
        try:
            yield self
            succeeded = True
        except finished:
            succeeded = True
            raise
        finally:
            self.close(succeeded)

    def _lock(self):
        import fcntl

        lock_path = self.path / self.LOCK
        while True:
            f = open(lock_path, "a+")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                f.close()
                raise RunDirectoryError(
                    f"output directory {self.path} is in use by another run (pid {holder})"
                ) from None
            # The holder before us may have removed the file while we waited for it: lock anew.
            if lock_path.exists() and os.stat(lock_path).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock_file = f

    def close(self, succeeded: bool) -> None:
        """Ends the run: drops the set-aside old run (`succeeded`) or puts it back, and unlocks."""
        if self._lock_file is None:
            return
        aside = self.path / self.ASIDE
        if aside.exists():
            if succeeded:
                shutil.rmtree(aside)
            else:
                for name in _RUN_FILES:
                    target = self.path / name
                    if target.is_dir():
                        shutil.rmtree(target)
                    elif target.exists():
                        target.unlink()
                for moved in aside.iterdir():
                    os.replace(moved, self.path / moved.name)
                aside.rmdir()
        (self.path / self.LOCK).unlink(missing_ok=True)
        self._lock_file.close()
        self._lock_file = None

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def metrics_file(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    def append_metrics(self, rows: list[dict]) -> None:
        with open(self.metrics_file, "a") as f:
            for row in rows:
                f.write(_dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self, up_to_update: int, key: str = "update", rewrite: bool = True) -> list[dict]:
        """Rows up to a resumed checkpoint (none where there is none); later rows, written
        after it, are dropped, so no update is ever logged twice. A torn last line (a
        process killed while writing it) is dropped with a warning."""
        if not self.metrics_file.exists():
            return []
        lines = [line for line in self.metrics_file.read_text().splitlines() if line.strip()]
        rows = []
        for i, line in enumerate(lines):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if i < len(lines) - 1:
                    raise RunDirectoryError(f"{self.metrics_file} is damaged at line {i + 1}") from None
                if rewrite:
                    logging.getLogger("genesis_jax").warning("dropping the torn last line of %s", self.metrics_file)
        rows = [r for r in rows if r[key] <= up_to_update]
        if not rewrite:
            return rows
        tmp = self.metrics_file.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(_dumps(row) + "\n" for row in rows))
        os.replace(tmp, self.metrics_file)
        return rows

    def write_summary(self, summary: dict, config: dict) -> None:
        tmp = self.path / "summary.json.tmp"
        tmp.write_text(_dumps({**summary, "config": config}, indent=2) + "\n")
        os.replace(tmp, self.path / "summary.json")
