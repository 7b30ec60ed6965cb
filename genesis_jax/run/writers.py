"""Where a run's metric rows go besides `metrics.jsonl` (the run directory's own): TensorBoard and W&B on request.

Every writer takes the same rows a trainer logs (one dict per update or epoch, with a
position field such as "update") and writes each numeric field as a scalar at that position:
the loss scale, skipped steps and overflow rate among them, as DreamerV3 and fairseq2 log
theirs. Strings and lists are left to `metrics.jsonl`.

>>> writer = TensorBoardWriter("runs/x", step_key="update")     # doctest: +SKIP
>>> writer.write([{"update": 1, "loss": 0.5, "loss_scale": 65536.0}])  # doctest: +SKIP
>>> writer.close()                                               # doctest: +SKIP
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
import time
from typing import Callable, Protocol

from genesis_jax.run.signals import first_line


class MetricWriter(Protocol):
    """What a `Session` calls: `write` per chunk of rows, `write_summary` once, `close` at the end."""

    def write(self, rows: list[dict]) -> None: ...

    def write_summary(self, summary: dict) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict, skip: tuple[str, ...] = ()) -> dict[str, float]:
    """The row's finite numbers (booleans as 0/1), without the `skip` keys; a seed's value
    of an N-seed run's `NAME_per_seed` list becomes `NAME/seed_K` (K: 0 to N-1)."""
    out = {}
    for key, value in row.items():
        if key.endswith(_PER_SEED) and isinstance(value, (list, tuple)):
            out.update(scalars({f"{key.removesuffix(_PER_SEED)}/seed_{k}": v for k, v in enumerate(value)}))
            continue
        if key in skip or isinstance(value, (str, list, tuple, dict)) or value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


_PER_SEED = "_per_seed"


class TensorBoardWriter:
    """TensorBoard event files in `log_dir` (tensorboardX: `pip install genesis-jax[tensorboard]`).

    The event file opens at the first row, with tensorboardX's `purge_step` at that row's
    position: a resumed run (first row: the resumed position + 1) hides the rows an earlier
    process logged from there on, so TensorBoard shows each position once.

    Args:
        log_dir: the directory TensorBoard reads (a run's `tensorboard/`).
        step_key: the rows' position field, used as TensorBoard's step.
        prefix: tag prefix, such as "train/".
    """

    def __init__(self, log_dir: str | os.PathLike, step_key: str, prefix: str = "train/"):
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:
            raise ImportError("--tensorboard needs tensorboardX: pip install 'genesis-jax[tensorboard]'") from err
        self.step_key, self.prefix = step_key, prefix
        self._open = functools.partial(SummaryWriter, logdir=os.fspath(log_dir))
        self._writer = None

    def _opened(self, purge_step: int | None = None):
        if self._writer is None:
            # tensorboardX names its file by the second: a resume within the same second would
            # truncate the earlier file. The nanoseconds keep the names apart, in order.
            self._writer = self._open(purge_step=purge_step, filename_suffix=f".{time.time_ns()}")
        return self._writer

    def write(self, rows: list[dict]) -> None:
        if not rows:
            return
        writer = self._opened(purge_step=int(rows[0][self.step_key]))
        for row in rows:
            step = int(row[self.step_key])
            for key, value in scalars(row, skip=(self.step_key,)).items():
                writer.add_scalar(self.prefix + key, value, step)
        writer.flush()

    def write_summary(self, summary: dict) -> None:
        writer = self._opened()
        for key, value in scalars(summary).items():
            writer.add_scalar("summary/" + key, value, 0)
        writer.add_text("summary/precision", str(summary.get("precision")), 0)
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbWriter:
    """A Weights & Biases run (`pip install genesis-jax[wandb]`). `mode="offline"` (or
    WANDB_MODE=offline) writes to `dir` without a network; `wandb sync` uploads it later.
    A resume of the run in `dir` continues its W&B run (its id is kept in dir/wandb/run-id).

    Args:
        dir: where wandb keeps its files (a run's directory).
        step_key: the rows' position field, used as W&B's step.
        config: the run's settings, shown with it.
        project, mode, name: as `wandb.init`'s.
    """

    def __init__(
        self,
        dir: str | os.PathLike,
        step_key: str,
        config: dict | None = None,
        project: str = "genesis-jax",
        mode: str | None = None,
        name: str | None = None,
    ):
        try:
            import pydantic  # wandb's settings are pydantic's (a dependency of wandb since 0.19)
            import wandb
        except ImportError as err:
            raise ImportError("--wandb needs wandb: pip install 'genesis-jax[wandb]'") from err
        self.step_key = step_key
        id_file = pathlib.Path(dir) / "wandb" / "run-id"  # written by this run's first session
        run_id = id_file.read_text().strip() if id_file.is_file() else None
        try:
            self._run = wandb.init(
                project=project,
                dir=os.fspath(dir),
                config=config,
                mode=mode,
                name=name,
                reinit=True,
                id=run_id,
                resume="allow" if run_id else None,
            )
        except (wandb.errors.UsageError, wandb.errors.CommError) as err:  # no key, a wrong one: one line
            raise ValueError(
                f"--wandb could not start a W&B run: {first_line(err)} (or set WANDB_MODE=offline to log locally)"
            ) from None
        except pydantic.ValidationError as err:  # a bad WANDB_ setting (WANDB_MODE=ofline): pydantic's 4 lines
            bad = err.errors()[0]
            setting = f"WANDB_{'_'.join(map(str, bad['loc'])).upper()}"
            value = bad.get("input", os.environ.get(setting))  # pydantic 1's errors have no input
            raise ValueError(f"--wandb could not start a W&B run: {setting}={value!r}: {bad['msg']}") from None
        if run_id is None:
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(self._run.id)

    def write(self, rows: list[dict]) -> None:
        for row in rows:
            self._run.log(scalars(row, skip=(self.step_key,)), step=int(row[self.step_key]))

    def write_summary(self, summary: dict) -> None:
        self._run.summary.update(scalars(summary))
        self._run.summary["precision"] = summary.get("precision")

    def close(self) -> None:
        self._run.finish()


# Writers a run can ask for by name: (run directory, position key, config dict) -> writer.
NAMED_WRITERS: dict[str, Callable[[pathlib.Path, str, dict], MetricWriter]] = {
    "tensorboard": lambda path, key, config: TensorBoardWriter(path / "tensorboard", key),
    "wandb": lambda path, key, config: WandbWriter(path, key, config=config),
}
