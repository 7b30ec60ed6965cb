"""One training run's outer layer, the same under every trainer.

A `Session` owns what a run does around its compiled steps: the run directory (refuse,
`resume` or `overwrite`), the checkpoint store and resume, the metric writers, the progress
bar, SIGINT / SIGTERM, the divergence-guard stop, the save cadence, `summary.json` and the
final exception. A trainer supplies its initial state, one compiled chunk (`step`), the
metric rows of a chunk (`to_rows`) and its summary fields. Its keywords are the algorithm
template's (`algos.base`), in the words of the glossary: a *row* is one line of
`metrics.jsonl`, and `rows_done` counts the rows run so far:

>>> import jax.numpy as jnp
>>> from genesis_jax.run.session import Session
>>> def step(w):                                      # one compiled chunk: state -> (state, metrics)
...     return w * 0.5, {"loss": w}
>>> def to_rows(metrics, done):                       # the chunk's metric rows (host)
...     return [{"update": done + 1, "loss": float(metrics["loss"])}]
>>> with Session(None, name="toy", num_rows=3, progress=False) as session:
...     w = session.restore(jnp.float32(8.0))
...     w = session.run(w, step, to_rows)
...     summary = session.finish({"final_loss": session.rows[-1]["loss"]})
>>> summary["final_loss"], session.rows_done
(2.0, 3)

With a directory (`Session("runs/toy", ...)`) the state is checkpointed, so it must be a dict,
dataclass or flax struct of arrays, `session.restore({"w": jnp.float32(8.0)})`: a bare array
is refused at `restore`, before anything runs, and the run files the session made are removed.

With several processes (`jax.distributed`), every process runs the same session; only
process 0 writes the run directory, the metrics and the progress bar, and the processes agree
on every stop so their collectives stay in step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import sys
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np

from genesis_jax.run import parallel, progress
from genesis_jax.run import run_dir as runs
from genesis_jax.run.checkpoint import (
    CheckpointMismatchError,
    CheckpointShapeError,
    CheckpointStore,
    as_typed_as,
    check_kind,
    position_of,
    replay_dropped,
)
from genesis_jax.run.config import budget_schedules, resume_flags, summary_config
from genesis_jax.run.signals import DivergenceError, StopSignals, TrainingInterrupted, first_line, halted_report
from genesis_jax.run.writers import NAMED_WRITERS, MetricWriter


def check_checkpointable(state) -> None:
    """Refuses, before the loop, a state no checkpoint can hold: checkpoints store named arrays
    (a dict, a dataclass or a flax struct of arrays and numbers), not a bare array or scalar."""
    from flax import serialization

    tree = serialization.to_state_dict(state)
    if not isinstance(tree, dict):
        raise ValueError(
            f"a Session with an output directory checkpoints its state, which must be a dict, dataclass or flax "
            f"struct of arrays; got a bare {type(state).__name__}: wrap it, such as {{'params': state}}"
        )
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool)):
            raise ValueError(
                f"the Session's state holds a {type(leaf).__name__} at {jax.tree_util.keystr(path)}; "
                "a checkpoint holds arrays and numbers only"
            )


def _until_halt(rows: list[dict]) -> list[dict]:
    """Rows up to and including the one where the divergence guard stopped training."""
    halt = next((i for i, row in enumerate(rows) if row.get("halted")), len(rows))
    return rows[: halt + 1]


# 0.3's spellings of Session's keywords, read until 0.5 with a FutureWarning: old -> new.
RENAMED_KEYWORDS = {"kind": "name", "total": "num_rows", "position_key": "row_key", "unit_size": "steps_per_row"}
# Keywords a Session no longer needs, read and ignored until 0.5 with a FutureWarning: the
# checkpoint's own step is the run's position, so no meta field has to be named for it.
RETIRED_KEYWORDS = {"meta_key", "checkpoint_key"}


def _renamed_keywords(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        for old in RETIRED_KEYWORDS & kwargs.keys():
            kwargs.pop(old)
            message = f"Session({old}=) is no longer needed and is ignored; it goes in 0.5"
            warnings.warn(message, FutureWarning, stacklevel=2)
        for old in RENAMED_KEYWORDS.keys() & kwargs.keys():
            new = RENAMED_KEYWORDS[old]
            if new in kwargs:
                raise TypeError(f"Session got both {old}= (0.3's spelling) and {new}=: pass {new}= only")
            warnings.warn(f"Session({old}=) is now Session({new}=); {old}= goes in 0.5", FutureWarning, stacklevel=2)
            kwargs[new] = kwargs.pop(old)
        return init(self, *args, **kwargs)

    return wrapper


def renamed_attribute(owner: str, old: str, new: str) -> property:
    """0.4.0's attribute `old` of an `owner` ("session"), read until 0.5 with a FutureWarning: now `new`."""

    def read(self):
        warnings.warn(f"{owner}.{old} is {owner}.{new} now; it goes in 0.5", FutureWarning, stacklevel=2)
        return getattr(self, new)

    return property(read, doc=f"0.4.0's attribute, read until 0.5: now `{new}`.")


class Session:
    """A run of `num_rows` rows (updates, epochs: whatever one metric row counts).

    Args:
        out_dir: run directory, or None for a run that writes nothing.
        config: the trainer's config (`to_dict()`, `RESUMABLE_FIELDS`, `divergence_guard()`);
            None for a loop without one (no config check on resume, no guard advice).
        name: the workload's name, stored in checkpoints (as `kind`); resume refuses another's.
        num_rows: rows in the whole run.
        row_key: the rows' counter field ("update", "epoch").
        steps_per_row: progress-bar units per row (PPO: environment steps per update).
        unit: the progress bar's unit name.
        checkpoint_every: rows between checkpoints (0: only at the end and on a stop).
        resume, overwrite, allow_config_change: as the CLI's flags of the same names.
        allow_unverified: resume from a checkpoint without a checksum (refused otherwise; the
            CLI's --allow-unverified-checkpoint); the summary records its step as `unverified_checkpoint`.
        progress: show a progress bar (process 0 only).
        max_to_keep: checkpoints kept.
        writers: metric writers besides `metrics.jsonl`, process 0 only: names ("tensorboard"
            writes `tensorboard/` in the run directory, "wandb" a W&B run there) or `MetricWriter`s.
        postfix: a row -> dict for the progress bar's postfix.
        train_state_path: where the `TrainState` sits in the state (() for a `TrainState` or a
            state without one; ("train_state",) for PPO's runner): checkpoints record its
            precision and scaler, and restores check them.
        inputs: what the run computes from besides its config, as names and texts (the world
            model's dataset: its source, size and digest): checkpoints record them, and a
            resume compares them as settings (refused, or recorded in `config_changes`).
    """

    @_renamed_keywords
    def __init__(
        self,
        out_dir: str | None,
        config: Any = None,
        *,
        name: str,
        num_rows: int,
        row_key: str = "update",
        steps_per_row: int = 1,
        unit: str = "update",
        checkpoint_every: int = 0,
        resume: bool = False,
        overwrite: bool = False,
        progress: bool = True,
        max_to_keep: int = 3,
        allow_config_change: bool = False,
        allow_unverified: bool = False,
        writers: Sequence[str | MetricWriter] = (),
        postfix: Callable[[dict], dict] | None = None,
        train_state_path: tuple[str, ...] = (),
        inputs: dict[str, str] | None = None,
    ):
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint-every must be >= 0, got {checkpoint_every}")
        if resume and out_dir is None:
            raise ValueError("resume needs an output directory")
        writers = (writers,) if isinstance(writers, str) else writers  # "tensorboard" alone, not its letters
        unknown = [w for w in writers if isinstance(w, str) and w not in NAMED_WRITERS]
        if unknown:
            raise ValueError(f"unknown metric writer {unknown[0]!r}; choose from {', '.join(NAMED_WRITERS)}")
        methods = ("write", "write_summary", "close")  # `MetricWriter`'s: one missing failed after the training
        for w in writers:
            missing = [m for m in methods if not isinstance(w, str) and not callable(getattr(w, m, None))]
            if missing:
                raise TypeError(
                    f"metric writer {w!r:.60} has no {', '.join(missing)}: give a name ({', '.join(NAMED_WRITERS)}) "
                    "or an object with write(rows), write_summary(summary) and close()"
                )
        if any(isinstance(w, str) for w in writers) and out_dir is None:
            raise ValueError(f"metric writers {', '.join(map(str, writers))} need an output directory (--out)")
        # Every process checks the directory before any process writes to it.
        self.run_dir = runs.RunDirectory(out_dir, resume=resume, overwrite=overwrite) if out_dir is not None else None
        self.config, self.name, self.num_rows = config, name, num_rows
        self.row_key = row_key
        self.steps_per_row, self.unit = steps_per_row, unit
        self.checkpoint_every, self.resume, self.max_to_keep = checkpoint_every, resume, max_to_keep
        self.allow_config_change = allow_config_change
        self.allow_unverified, self.unverified_checkpoint = allow_unverified, None
        self.primary = parallel.is_primary()
        self.progress = progress and self.primary
        self.extra_writers = list(writers)
        self.postfix = postfix
        self.train_state_path = tuple(train_state_path)
        self.inputs = dict(inputs or {})
        self._replay_dropped = 0  # what a grown replay buffer dropped (`checkpoint.replay_dropped`)
        self.store: CheckpointStore | None = None
        self.writers: list[MetricWriter] = []
        self.rows_done = 0  # rows run, those restored included
        self.rows: list[dict] = []
        self.config_changes: list[str] = []
        self._moved_schedules: str | None = None  # a new total-steps' note, said once training begins
        self.stopped: str | None = None
        self.rows_run = 0  # rows `run` ran in this session
        self.run_seconds = 0.0  # seconds `run` waited for compiled chunks
        self.wall_start = time.perf_counter()
        self._last_save = 0
        self._saved = False  # whether this session saved a checkpoint
        self._signals: StopSignals | None = None
        self._waiting = False  # a chunk is being waited for (`_fetched`)
        self.previous_summary: dict = {}  # on resume: the summary.json found in the directory
        self._summary: dict | None = None  # the summary `finish` wrote

    # -- the run directory ------------------------------------------------------------------

    def __enter__(self) -> "Session":
        # From here to the end a signal only sets a flag the loop reads: a SIGTERM while the
        # old run is set aside or the chunk compiles still ends in a clean stop.
        self._signals = StopSignals(notice=self._stopping_note).__enter__()
        try:
            parallel.barrier("genesis-session-checked")
            if self.run_dir is not None:
                if self.primary:
                    self.run_dir.open()
                    config = self.config.to_dict() if self.config is not None else {}
                    for spec in self.extra_writers:  # one at a time, so those made are closed if one fails
                        named = NAMED_WRITERS.get(spec) if isinstance(spec, str) else None
                        self.writers.append(named(self.run_dir.path, self.row_key, config) if named else spec)
                parallel.barrier("genesis-session-opened")
                self.store = CheckpointStore(self.run_dir.checkpoints, max_to_keep=self.max_to_keep)
        except BaseException:
            # `with` calls __exit__ only after __enter__ returned: unlock and put a set-aside run back here.
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # A guard stop or a signal is a clean end: the run's files are complete.
        clean = exc_type is None or issubclass(exc_type, (DivergenceError, TrainingInterrupted))
        try:
            if self.store is not None:
                self.store.close()
            for writer in self.writers:
                writer.close()
        finally:
            try:
                if self.run_dir is not None and self.primary:
                    if not clean:
                        self._write_failure(exc_type, exc)
                    # An old run set aside by --overwrite goes only once the new one saved a checkpoint; a run
                    # that failed before its first row takes the files it made with it (the same call runs again).
                    # So does a signal before the first row (a Ctrl-C while compiling): it wrote nothing either.
                    wrote = (clean and not self._stopped_untouched) or self._saved or bool(self.rows_run)
                    self.run_dir.close(clean and self._saved, wrote=wrote)
            finally:
                if self._signals is not None:
                    self._signals.__exit__()
                    self._signals = None

    def _write_failure(self, exc_type, exc) -> None:
        """A fresh summary.json for a run that failed after training something: where it
        got to (`iterations`) and why (`error`); `stopped` is "failed"."""
        if not self.rows_run:
            return  # nothing new trained: the directory keeps the summary it had
        detail = first_line(exc) if exc is not None and str(exc).strip() else ""
        summary = {
            **(self._summary or {"config_changes": self.config_changes}),
            "stopped": "failed",
            "error": f"{exc_type.__name__}: {detail}" if detail else exc_type.__name__,
            "iterations": len(self.rows),
        }
        try:
            self.run_dir.write_summary(summary, summary_config(self.config) if self.config is not None else {})
        except Exception as err:  # a full disk, say: the original error is the one to report
            logging.getLogger("genesis_jax").warning("could not write the failed run's summary: %s", err)

    @property
    def path(self):
        return None if self.run_dir is None else self.run_dir.path

    @property
    def _stopped_untouched(self) -> bool:
        """Stopped by a signal before its first row: nothing new to save, the directory as it was."""
        return self.stopped not in (None, "diverged") and not self.rows_run

    position = renamed_attribute("session", "position", "rows_done")  # the rows run so far
    checkpoint_key = renamed_attribute("session", "checkpoint_key", "row_key")  # the meta's row field, always `row_key`

    def restore(
        self,
        state,
        reshape: Callable[[Any, dict], tuple[Any, Callable]] | None = None,
        check_resume: Callable[[dict], None] | None = None,
    ):
        """With `resume`: the newest complete checkpoint at or before the last intact metric
        row (so no row goes missing), its state, its rows done, and the metric rows up to it
        (later ones, logged after it, are dropped: no row twice). A run killed before its
        first checkpoint starts cleanly from `state`; without `resume`, `state`. Refused in
        one sentence: changed settings (named first, before anything is counted in their
        units), a run with a summary but no checkpoint, checkpoints without the rows they
        follow, and a `num_rows` below the rows already run. `reshape(state, meta)`, where
        given, returns the state shaped as the checkpoint (`meta`) holds it and a function from
        that to this run's state (SAC grows its replay buffer to a longer run's capacity).
        `check_resume(saved_config)`, where given, refuses settings whose state no longer fits
        the newest checkpoint's (an algorithm config's `check_resume`), before the shapes are compared."""
        if self.store is not None:
            check_checkpointable(state)  # fails now, not at the first save
        if self.store is None or not self.resume:
            return state
        steps = self.store.all_steps()
        if steps:  # another workload's run is named as such, before its rows are read as this one's
            newest = self.store.read_meta(steps[-1])
            check_kind(newest, step=steps[-1], kind=self.name)
            if self.config is not None:  # changed settings, named before any count in their units
                self.config_changes = self._config_changes(newest)
            if check_resume is not None:  # a setting whose state no longer fits, named before the shapes are
                check_resume(newest.get("config", {}))
        rows = self.run_dir.read_metrics(self.row_key, warn=self.primary)
        step = self._resume_step(steps, rows)
        self.previous_summary = self.run_dir.read_summary() or {}
        if step is not None:
            saved_meta = self.store.read_meta(step)
            self._check_row_units(saved_meta)
            target, fit = reshape(state, saved_meta) if reshape else (state, lambda s: s)
            try:
                restored, meta = self.store.restore(
                    target, step, self.name, self.train_state_path, allow_unverified=self.allow_unverified
                )
            except CheckpointShapeError as err:
                if not self.config_changes:
                    raise
                raise CheckpointMismatchError(
                    f"the checkpoint at step {step} holds a state these settings change the shape of "
                    f"({'; '.join(self.config_changes)}): {err.differences}; resume with the run's own settings, "
                    "or start a new run (another --out, or --overwrite)"
                ) from None
            state = as_typed_as(fit(restored), state)  # typed as `state`: the program of a run not resumed
            self._replay_dropped = replay_dropped(state, meta.get("replay_dropped", 0))
            # The row beside the step the store checked (PPO's, DQN's, PQN's before 0.4.1: none).
            if self.row_key in meta:
                position_of(meta, self.row_key, step, self.store.directory)
            self.rows_done = step
            self.unverified_checkpoint = None if "digest" in meta else step
            if self.config is not None:  # against the checkpoint resumed (the newest's, above, may differ)
                self.config_changes = self._config_changes(meta)
        self.rows = [row for row in rows if row[self.row_key] <= self.rows_done]
        if self.primary:  # of several processes, one trims metrics.jsonl; the others only read it
            self.run_dir.keep_metrics(len(self.rows))
        if newer := [s for s in steps if s > self.rows_done]:  # of rows lost (metrics.jsonl cut short): run again
            listed = ", ".join(map(str, newer))
            self.note(f"checkpoints at {self.row_key} {listed} follow rows {self.run_dir.metrics_file.name} lost: "
                      f"removed; the run continues from {self.row_key} {self.rows_done}")  # fmt: skip
            self.store.discard(newer)
        self._last_save = self.rows_done
        return state

    def _config_changes(self, meta: dict) -> list[str]:
        """The settings changed against `meta`'s, refused unless allowed; and a new total-steps,
        allowed (a longer run extends this one) but named where schedules follow it."""
        changes = runs.check_config_changes(meta, self.config, self.allow_config_change, self.inputs)
        saved, now = meta.get("config", {}).get("total_steps"), getattr(self.config, "total_steps", None)
        schedules = budget_schedules(self.config) if saved is not None and saved != now else []
        moved = f"total-steps: {saved!r} -> {now!r} (moves {' and '.join(schedules)} mid-run)"
        self._moved_schedules = moved if schedules else None
        return changes + [moved] if schedules else changes

    def _resume_step(self, steps: list[int], rows: list[dict]) -> int | None:
        """The checkpoint step to resume from (None: start cleanly), or a refusal."""
        key, where = self.row_key, self.run_dir.path
        last_row = rows[-1][key] if rows else 0
        done = max([last_row, *steps])
        if done > self.num_rows:
            raise runs.RunDirectoryError(
                f"{where} has run {self._amount(done)} already, more than the {self._amount(self.num_rows)} "
                f"asked for; ask for at least {self._amount(done)} to continue it"
            )
        if not steps:
            if self.run_dir.read_summary() is not None:  # an ended run whose checkpoints are gone
                raise self.run_dir.no_checkpoint_error()
            return None  # killed before its first checkpoint: its rows are logged again
        usable = [s for s in steps if s <= last_row]
        if not usable:
            metrics = self.run_dir.metrics_file
            holds = f"holds rows up to {key} {last_row}" if rows else "is empty" if metrics.exists() else "is missing"
            raise runs.RunDirectoryError(
                f"{metrics} {holds} but the oldest checkpoint in {where} is at {key} "
                f"{min(steps)}: resuming would leave {key}s without a row; "
                "use --overwrite to start over, or a new directory"
            )
        return max(usable)

    def _check_row_units(self, meta: dict) -> None:
        """Refuses, even where changes are allowed, a resume whose rows count other steps than the
        checkpoint's (PPO's num-envs x num-steps): the rows run would be counted in other units.
        (Older checkpoints do not record it: not checked.)"""
        saved = meta.get("steps_per_row", self.steps_per_row)
        if saved != self.steps_per_row:
            changes = f" ({'; '.join(self.config_changes)})" if self.config_changes else ""
            raise CheckpointMismatchError(
                f"the checkpoint at {self.row_key} {meta.get(self.row_key)} counts {saved} {self.unit}s per "
                f"{self.row_key}, these settings {self.steps_per_row}{changes}: the {self.row_key}s run would be "
                "counted in other units; resume with the run's own settings, or start a new run (another --out, "
                "or --overwrite)"
            )

    def _amount(self, rows: int) -> str:
        """`rows` in the run's units: '8 updates (4096 steps)', or '3 epochs'; in rows alone where
        settings changed (allowed): the rows already run may have counted other units."""
        text = progress.count(rows, self.row_key)
        if self.steps_per_row != 1 and set(self.config_changes) <= {self._moved_schedules}:  # units unchanged
            text += f" ({progress.count(rows * self.steps_per_row, self.unit)})"
        return text

    def save(self, state) -> None:
        """A checkpoint of `state` after the rows done (every process takes part)."""
        if self.store is None:
            return
        meta = {"kind": self.name, self.row_key: self.rows_done, "steps_per_row": self.steps_per_row}
        if self.config is not None:
            meta["config"] = self.config.to_dict()
        if self.inputs:
            meta["inputs"] = self.inputs
        if self._replay_dropped:
            meta["replay_dropped"] = self._replay_dropped
        self.store.save(self.rows_done, state, meta, force=True, train_state_path=self.train_state_path)
        self._last_save = self.rows_done
        self._saved = True

    # -- the loop ---------------------------------------------------------------------------

    def run(
        self,
        state,
        step: Callable,
        to_rows: Callable[[Any, int], list[dict]],
        per_call: int = 1,
        on_start: Callable[[], None] | None = None,
    ):
        """Calls `step(state) -> (state, metrics)` (`per_call` rows) until `num_rows` rows ran, the guard halted
        (`metrics["halted"]`), or a signal arrived; logs `to_rows(metrics, rows_done)` and saves on
        the cadence and at the end. `on_start()` is called once just before the first step, when
        one runs: past every refusal, so a note it prints never joins a one-line error. The next
        call is dispatched before this one's rows are written, so the device and the host
        overlap, except where this call's state is still needed (a save or a stop). Returns the
        last state; `stopped` says why it ended early."""
        bar = progress.progress_bar(0, enabled=False)  # the real one after on_start's notes, not inside them

        def dispatch(state):
            self._dispatched = time.perf_counter()
            return step(state)

        # The session's handlers, installed since `__enter__`; a run outside `with` installs its own.
        handlers = StopSignals() if self._signals is None else contextlib.nullcontext(self._signals)
        try:
            with handlers as signals:
                signal_name = lambda: signal.Signals(signals.received or signal.SIGTERM).name  # noqa: E731
                starts = self.rows_done < self.num_rows
                if starts and self.rows and self.rows[-1].get("halted"):  # resumed past a halt: nothing would change
                    self.stopped, starts = "diverged", False
                if starts and parallel.any_process(signals.received is not None):
                    self.stopped, starts = signal_name(), False  # a signal while the chunk compiled: no chunk runs
                if starts and self._moved_schedules in self.config_changes:  # said past every refusal
                    warnings.warn(f"this resume's {self._moved_schedules}", UserWarning, stacklevel=2)
                if starts and on_start is not None:
                    on_start()
                total, done = self.num_rows * self.steps_per_row, self.rows_done * self.steps_per_row
                bar = progress.progress_bar(total, done, enabled=self.progress, unit=self.unit)
                every = self.checkpoint_every if self.store is not None else 0  # rows between saves (0: none due)
                pending = dispatch(state) if starts else None
                while pending is not None:
                    (state, metrics), pending = pending, None
                    metrics = self._fetched(metrics)
                    self.run_seconds += time.perf_counter() - self._dispatched
                    halted = isinstance(metrics, dict) and "halted" in metrics and bool(np.any(metrics["halted"]))
                    # A halted chunk logs rows only up to the halt, and nothing runs after it.
                    after = self.rows_done + per_call
                    due = every and after - self._last_save >= every
                    signalled = parallel.any_process(signals.received is not None)
                    go_on = after < self.num_rows and not halted and not signalled
                    if go_on and not due:  # dispatched before this call's rows are written: device and host overlap
                        pending = dispatch(state)
                    new_rows = _until_halt(to_rows(metrics, self.rows_done))
                    self.rows_done += len(new_rows)
                    self.rows_run += len(new_rows)
                    self._log(new_rows, bar)
                    if pending is not None:
                        continue
                    if halted or signalled:
                        self.stopped = "diverged" if halted else signal_name()
                    if due or not go_on:
                        self.save(state)
                    if go_on:
                        pending = dispatch(state)
        finally:
            bar.close()
        return state

    def _fetched(self, metrics):
        """The chunk's metrics on the host. Waited for by polling, not inside `jax.device_get`: a
        signal's handler runs only in Python, so there it ran when the chunk returned (minutes
        later for a big one); between polls it runs at once, so a stop is said when it is asked
        for (and a second one stops at once, leaving no thread inside the runtime)."""
        pending = [leaf for leaf in jax.tree.leaves(metrics) if isinstance(leaf, jax.Array)]
        self._waiting = True
        began = time.perf_counter()
        try:
            while not all(leaf.is_ready() for leaf in pending):
                # late by about a 32nd of the wait (0.1 ms at least, 50 ms at most): the next chunk waits too
                time.sleep(min(0.05, max(1e-4, (time.perf_counter() - began) / 32)))
        finally:
            self._waiting = False
        return jax.device_get(metrics)

    def _stopping_note(self, signum, at_once: bool) -> None:
        name = signal.Signals(signum).name
        if at_once:  # handled next as without the run: a KeyboardInterrupt, or the process ends
            lost = "; the chunk now running is lost" if self._waiting else ""
            self.note(f"{name} received again: stopping at once{lost} (the checkpoints saved stay)")
        elif self._waiting:  # a chunk is running: it ends, and is saved, first
            self.note(
                f"{name} received: stopping when the chunk now running ends (a checkpoint is saved then; "
                f"another {name} stops at once and loses it)"
            )

    def note(self, text: str) -> None:
        """One line on stderr from process 0 (a notice before the progress bar starts)."""
        if self.primary:
            print(text, file=sys.stderr, flush=True)

    def _log(self, rows: list[dict], bar) -> None:
        self.rows.extend(rows)
        if self.run_dir is not None and self.primary:  # metrics.jsonl first, one strict-JSON line a row
            self.run_dir.append_metrics(rows)
        for writer in self.writers:
            writer.write(rows)
        if rows and self.postfix is not None:  # shown with the update it belongs to
            bar.set_postfix(refresh=False, **self.postfix(rows[-1]))
        bar.update(len(rows) * self.steps_per_row)

    # -- the end ----------------------------------------------------------------------------

    def finish(self, summary: dict, train_state=None, plot: Callable[[list[dict], Any], None] | None = None) -> dict:
        """Writes `summary.json` (with the config and any resume changes) and the plot, then
        raises `DivergenceError` or `TrainingInterrupted` where the run stopped early; returns
        the summary otherwise. `train_state` (a `TrainState`) names the guard's cause."""
        summary = {**summary, "stopped": self.stopped, "config_changes": self.config_changes}
        if self.unverified_checkpoint is not None:
            summary["unverified_checkpoint"] = self.unverified_checkpoint
        untouched = self._stopped_untouched
        config = summary_config(self.config) if self.config is not None else {}
        if self.run_dir is not None and self.primary and not untouched:
            self._summary = summary
            self.run_dir.write_summary(summary, config)
            for writer in self.writers:
                writer.write_summary(summary)
            if plot is not None:
                plot(self.rows, self.run_dir.path)
        if self.config is not None:  # as summary.json holds it
            summary["config"] = config
        where = f"; metrics and a checkpoint are in {self.path}" if self.run_dir else ""
        if self.stopped == "diverged":
            report = None
            if train_state is not None and self.config is not None:
                report = halted_report(train_state, self.config.divergence_guard())
            raise DivergenceError((report or "training diverged") + where, summary)
        if self.stopped is None:
            return summary
        at = f"{self.row_key} {self.rows_done} of {self.num_rows}"
        if untouched:  # stopped before the first chunk: nothing new to save, the directory as it was
            kept = f"; {self.path} is left as it was" if self.run_dir else ""
            message = f"{self.stopped} received before training began ({at}): nothing was trained{kept}"
        else:
            hint = f"; continue with --resume --out {self.path} {resume_flags(self.config)}".rstrip()
            if getattr(self.config, "num_processes", None):  # each process's own, which `launch` gives
                hint += " (each process with its own --coordinator-address, --num-processes and --process-id)"
            hint = hint if self.run_dir else ""
            message = f"{self.stopped} received: stopped after {at}{where}{hint}"
        raise TrainingInterrupted(message, getattr(signal, self.stopped), summary)

    def steps_per_second(self, steps_per_row: int) -> float:
        """Steps per second of `run` so far (waiting for compiled chunks; host work overlapped)."""
        return self.rows_run * steps_per_row / self.run_seconds if self.run_seconds else float("nan")

    def elapsed(self) -> float:
        """Seconds since the session was made (the run's wall-clock time so far)."""
        return time.perf_counter() - self.wall_start
