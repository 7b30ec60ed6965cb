"""A run's output directory and what every trainer writes there: metrics.jsonl,
summary.json and checkpoints/ (the PNG: `plots`), and the config check of a resumed run.
Shared by every algorithm."""

from __future__ import annotations

import contextlib
import dataclasses
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


def write_atomically(path: pathlib.Path, data: str | bytes) -> None:
    """Writes `data` to `path` atomically: into a new file beside it, then renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def check_config_changes(meta: dict, config, allow: bool, inputs: dict | None = None) -> list[str]:
    """The changes of `config` against the resumed checkpoint's (`meta["config"]`), beyond
    `config.RESUMABLE_FIELDS`, and of the run's `inputs` (a dataset's identity) against those
    it recorded (`meta["inputs"]`), each named as its command-line flag ("num-envs: 4 -> 8");
    refused (one sentence listing them) unless `allow`."""
    from genesis_jax.amp.policy import get_precision, recorded_spelling
    from genesis_jax.run.checkpoint import CheckpointMismatchError

    # A field the checkpoint's version did not have yet is compared as its default: how that version ran;
    # an input it did not record, as this run's (nothing to compare it with).
    fields = dataclasses.fields(config) if dataclasses.is_dataclass(config) else ()
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    saved = {**defaults, **(inputs or {}), **meta.get("config", {}), **meta.get("inputs", {})}
    settings = config.to_dict()
    for values in (saved, settings):  # 'auto' as what it picks here (the CLI records the pick; a run may hold 'auto')
        if "precision" in values:  # a run before names were kept as names may hold 'FP16'
            name = recorded_spelling(values["precision"])
            values["precision"] = get_precision("auto").name if name == "auto" else name
    current = {**settings, **(inputs or {})}
    names = sorted((set(saved) | set(current)) - set(config.RESUMABLE_FIELDS))
    # JSON turned the saved tuples into lists: compare both as JSON values.
    changed = [n for n in names if jsonable(saved.get(n)) != jsonable(current.get(n))]
    changes = [f"{n.replace('_', '-')}: {saved.get(n)!r} -> {current.get(n)!r}" for n in changed]
    if changes and not allow:
        advice = "pass --allow-config-change to continue it anyway"
        # A precision change is refused even with the flag (the checkpoint's arrays are in its own).
        if "precision" in saved and jsonable(saved["precision"]) != jsonable(settings.get("precision")):
            advice = (
                f"a run resumes in its own precision: resume with --precision {saved['precision']}, or start a new run"
            )
        raise CheckpointMismatchError(
            f"the checkpoint at step {meta.get('step')} was written by a run with other settings "
            f"({'; '.join(changes)}); {advice}"
        )
    return changes


def _remove(path: pathlib.Path, names) -> None:
    """Removes the files and directories `names` in `path`, where they exist."""
    for name in names:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


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
      run ends having saved a checkpoint; a run that fails or stops before that puts it
      back. A `.replaced/` left by a killed overwrite is never deleted unasked: a new run
      or an overwrite is refused, naming it; a resume leaves it alone.
    """

    LOCK = ".lock"
    ASIDE = ".replaced"

    def __init__(self, path, resume: bool = False, overwrite: bool = False):
        if resume and overwrite:
            raise RunDirectoryError("choose either resume or overwrite, not both")
        if not str(path).strip():
            raise RunDirectoryError("the output directory is an empty path; name a directory")
        self.path = pathlib.Path(path)
        self.overwrite = overwrite
        if self.path.exists() and not self.path.is_dir():
            raise RunDirectoryError(f"output path {self.path} exists and is not a directory")
        aside = self.path / self.ASIDE
        if aside.exists() and not resume:
            # A killed --overwrite left the run it replaced there: never delete it unasked.
            raise RunDirectoryError(
                f"{aside} holds the run an earlier --overwrite set aside and did not finish replacing; "
                f"move its files back into {self.path} to keep that run, or delete {aside}, then run again"
            )
        holds_run = any((self.path / name).exists() for name in _RUN_FILES)
        if holds_run and not (resume or overwrite):
            raise RunDirectoryError(
                f"output directory {self.path} holds another run; "
                "pass --resume to continue it or --overwrite to replace it"
            )
        if resume and not self.checkpoints.exists():
            if self.read_summary() is not None:
                raise self.no_checkpoint_error()
            raise RunDirectoryError(f"nothing to resume in {self.path}: it has no checkpoints/")
        self._lock_file = None
        self.set_aside = False  # whether this run moved an old one into .replaced/
        self._made_dir, self._made_files = False, []  # what `open` made

    def open(self) -> "RunDirectory":
        """Locks the directory and, with `overwrite`, sets the old run aside."""
        # What this run makes, so a run that wrote nothing of its own leaves the directory as found (`close`).
        self._made_dir = not self.path.exists()
        self._made_files = [name for name in _RUN_FILES if not (self.path / name).exists()]
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock()
        if self.overwrite:
            aside = self.path / self.ASIDE
            plots = [p.name for p in self.path.glob("*.png")]  # the old run's (another algorithm's: another name)
            moved = [name for name in _RUN_FILES if (self.path / name).exists()] + plots
            if moved:
                aside.mkdir()  # the constructor refused an existing one: it is never deleted unasked
                self.set_aside = True
                for name in moved:
                    os.replace(self.path / name, aside / name)
        return self

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
                who = "in this process" if holder == str(os.getpid()) else f"(pid {holder})"  # its own pid misled
                raise RunDirectoryError(f"output directory {self.path} is in use by another run {who}") from None
            # The holder before us may have removed the file while we waited for it: lock anew.
            if lock_path.exists() and os.stat(lock_path).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock_file = f

    def close(self, succeeded: bool, wrote: bool = True) -> None:
        """Ends the run: drops the old run this one set aside (`succeeded`) or puts it back, and
        unlocks. A `.replaced/` this run did not make (a resume after a killed overwrite) stays.
        `wrote` False (a run that failed before its first row): the run files and the directory
        this run made are removed, so the same command is not refused as "holds another run"."""
        if self._lock_file is None:
            return
        if not (succeeded or wrote):
            _remove(self.path, self._made_files)
        aside = self.path / self.ASIDE
        if self.set_aside and aside.exists():
            if succeeded:
                shutil.rmtree(aside)
            else:
                _remove(self.path, _RUN_FILES)
                for moved in aside.iterdir():
                    os.replace(moved, self.path / moved.name)
                aside.rmdir()
            self.set_aside = False
        (self.path / self.LOCK).unlink(missing_ok=True)
        self._lock_file.close()
        self._lock_file = None
        if self._made_dir and not (succeeded or wrote):
            with contextlib.suppress(OSError):  # not empty: something else was put there meanwhile
                self.path.rmdir()

    @property
    def checkpoints(self) -> pathlib.Path:
        return self.path / "checkpoints"

    @property
    def metrics_file(self) -> pathlib.Path:
        return self.path / "metrics.jsonl"

    def append_metrics(self, rows: list[dict]) -> None:
        with open(self.metrics_file, "a") as f:
            f.writelines(_dumps(row) + "\n" for row in rows)
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self, key: str | None = "update", warn: bool = True) -> list[dict]:
        """The rows of metrics.jsonl (none where it is missing). A torn last line (a process
        killed while writing it: no newline, not JSON) is left out, with a warning if `warn`;
        any other line that is not a row (not UTF-8, not JSON, not an object with an integer
        `key`; None: any object) is refused in one sentence naming the file and the line."""
        if not self.metrics_file.exists():
            return []
        data = self.metrics_file.read_bytes()
        lines = data.split(b"\n")
        rows = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                if number == len(lines) and not data.endswith(b"\n"):  # the unterminated last line
                    if warn:
                        logging.getLogger("genesis_jax").warning("dropping the torn last line of %s", self.metrics_file)
                    break
                what = "is not UTF-8 text" if isinstance(err, UnicodeDecodeError) else "is not JSON"
                raise RunDirectoryError(f"{self.metrics_file} is damaged: line {number} {what}") from None
            if not isinstance(row, dict) or (key is not None and type(row.get(key)) is not int):  # bool is no int
                raise RunDirectoryError(
                    f"{self.metrics_file} is damaged: line {number} is not a metric row "
                    f"(a JSON object with an integer {key!r})"
                )
            rows.append(row)
        return rows

    def keep_metrics(self, count: int) -> None:
        """Cuts metrics.jsonl to its first `count` rows, byte for byte (atomically), where it
        holds more or a torn line: rows logged after a resumed checkpoint are logged again."""
        if not self.metrics_file.exists():
            return
        data = self.metrics_file.read_bytes()
        kept, end = 0, 0
        for line in data.splitlines(keepends=True):
            if kept == count:
                break
            end += len(line)
            kept += bool(line.strip())
        if end == len(data):
            return
        write_atomically(self.metrics_file, data[:end])

    def read_summary(self) -> dict | None:
        """summary.json as a dict; None where there is none; {} where it cannot be read."""
        try:
            summary = json.loads((self.path / "summary.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return summary if isinstance(summary, dict) else {}

    def contents(self) -> str:
        """What the directory holds, in words: 'N metric rows and a summary of a finished run'."""
        try:
            rows = f"{len(self.read_metrics(None, warn=False))} metric rows"
        except RunDirectoryError:
            rows = "a damaged metrics.jsonl"
        summary = self.read_summary()
        if summary is None:
            return rows
        stopped = summary.get("stopped", "?")
        how = {None: "a finished run", "diverged": "a run the divergence guard stopped", "failed": "a failed run"}
        return f"{rows} and a summary of {how.get(stopped, f'a run stopped by {stopped}')}"

    def no_checkpoint_error(self) -> RunDirectoryError:
        return RunDirectoryError(
            f"{self.path} holds {self.contents()} but no checkpoint; resume cannot continue it: "
            "use --overwrite to start over, or a new directory"
        )

    def write_summary(self, summary: dict, config: dict) -> None:
        write_atomically(self.path / "summary.json", _dumps({**summary, "config": config}, indent=2) + "\n")
