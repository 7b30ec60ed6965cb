"""A trainer the package does not know (supervised regression) run through `Session`: it gets
a run directory, resume, signal handling, the divergence guard and metric writers without
copying any of the drivers' code. TensorBoard's event file and an offline W&B run are read back."""

import dataclasses
import json
import os
import signal
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import DynamicLossScale, TrainState, train_step
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.testing import FaultInjection
from genesis_jax.run.run_dir import RunDirectoryError
from genesis_jax.run.session import Session
from genesis_jax.run.signals import DivergenceError, TrainingInterrupted
from genesis_jax.run.writers import WandbWriter
from tests.support.files import metric_rows
from tests.support.helpers import mlp_loss, regression_problem
from tests.support.processes import cpu_env, run_python

STEPS_PER_CHUNK = 5


@dataclasses.dataclass(frozen=True)
class RegressionConfig:
    """The toy trainer's config: what Session needs of one (to_dict, RESUMABLE_FIELDS, the guard)."""

    chunks: int = 6
    lr: float = 3e-3
    nonfinite_rate: float = 0.0
    RESUMABLE_FIELDS = ("chunks",)

    def to_dict(self):
        return dataclasses.asdict(self)

    def divergence_guard(self):
        return DivergenceGuard(min_scale=None, max_consecutive_skips=3)


def make_regression(config: RegressionConfig):
    """(initial state, one compiled chunk of STEPS_PER_CHUNK updates, chunk metrics -> rows)."""
    x, y = regression_problem(n=128)
    model, loss_fn = mlp_loss(jnp.float16)
    state = TrainState.create(
        params=model.init(jax.random.PRNGKey(1), x[:1]),
        tx=optax.adam(config.lr),
        scaler=DynamicLossScale(),
        precision="fp16",
        max_grad_norm=1.0,
        guard=config.divergence_guard(),
    )
    faults = FaultInjection(nonfinite_rate=config.nonfinite_rate)
    faults = faults if config.nonfinite_rate else None
    update = lambda s, batch: train_step(s, loss_fn, batch, has_aux=True, faults=faults)  # noqa: E731

    @jax.jit
    def chunk(state):
        state, m = jax.lax.scan(lambda s, _: update(s, (x, y)), state, None, STEPS_PER_CHUNK)
        return state, {
            "loss": m["loss"],
            "loss_scale": state.scaler.loss_scale,
            "skipped": state.skipped,
            "halted": state.halted,
        }

    def to_rows(m, done):
        return [
            {
                "chunk": done + 1,
                "loss": float(m["loss"][-1]),
                "loss_scale": float(m["loss_scale"]),
                "skipped": int(m["skipped"]),
                "halted": bool(m["halted"]),
            }
        ]

    return state, chunk, to_rows


def train_regression(config, out_dir, *, resume=False, signal_at=None, writers=()):
    state, chunk, to_rows = make_regression(config)
    calls = [0]

    def step(state):
        calls[0] += 1
        if calls[0] == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the chunk runs, as a real one would
        return chunk(state)

    with Session(
        out_dir,
        config,
        name="regression",
        num_rows=config.chunks,
        row_key="chunk",
        resume=resume,
        checkpoint_every=2,
        progress=False,
        writers=writers,
    ) as session:
        state = session.restore(state)
        state = session.run(state, step, to_rows)
        summary = session.finish({"final_loss": session.rows[-1]["loss"], "steps": int(state.step)}, state)
    return summary, session.rows, calls[0]


@pytest.mark.slow  # 27 s
def test_a_toy_trainer_gets_a_run_directory_and_exact_resume(tmp_path):
    straight, straight_rows, _ = train_regression(RegressionConfig(), str(tmp_path / "straight"))
    assert [r["chunk"] for r in straight_rows] == list(range(1, 7)) and straight["steps"] == 6 * STEPS_PER_CHUNK
    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as stop:
        train_regression(RegressionConfig(), str(run), signal_at=3)
    assert stop.value.signum == signal.SIGTERM and "stopped after chunk 3 of 6" in str(stop.value)
    assert json.loads((run / "summary.json").read_text())["stopped"] == "SIGTERM"
    with pytest.raises(RunDirectoryError, match="holds another run"):
        train_regression(RegressionConfig(), str(run))
    resumed, rows, calls = train_regression(RegressionConfig(), str(run), resume=True)
    assert calls == 3  # chunks 4..6 only
    assert [r["chunk"] for r in rows] == list(range(1, 7))
    lines = metric_rows(run)
    assert [r["chunk"] for r in lines] == list(range(1, 7))
    # The same losses as the straight run: the whole state (scaler, optimizer) came back.
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in straight_rows], rtol=1e-6)
    assert resumed["steps"] == straight["steps"]


@pytest.mark.slow
def test_the_guard_stops_a_toy_trainer_with_its_own_message(tmp_path):
    with pytest.raises(DivergenceError, match="consecutive updates were skipped as non-finite") as stop:
        train_regression(RegressionConfig(nonfinite_rate=1.0), str(tmp_path / "bad"))
    # 4 skips in a row trip the guard (limit 3), inside the first chunk of 5: one row, then the stop.
    assert stop.value.summary["stopped"] == "diverged"
    assert [r["chunk"] for r in metric_rows(tmp_path / "bad")] == [1]


def read_tensorboard_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalars of every event file under `log_dir`, read from the TFRecord framing directly
    (length, crc, Event proto, crc), with tensorboardX's own Event message."""
    from tensorboardX.proto.event_pb2 import Event

    scalars = {}
    for name in sorted(os.listdir(log_dir)):
        data = (log_dir / name).read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_loss_scale_of_every_row(tmp_path):
    _, rows, _ = train_regression(RegressionConfig(chunks=4), str(tmp_path / "tb"), writers=("tensorboard",))
    scalars = read_tensorboard_scalars(tmp_path / "tb" / "tensorboard")
    assert scalars["train/loss_scale"] == [(r["chunk"], r["loss_scale"]) for r in rows]
    assert [s for _, s in scalars["train/skipped"]] == [r["skipped"] for r in rows]
    np.testing.assert_allclose([v for _, v in scalars["train/loss"]], [r["loss"] for r in rows], rtol=1e-6)
    assert "summary/final_loss" in scalars


@pytest.mark.slow  # starts wandb's service twice
def test_weights_and_biases_offline_writes_the_rows_without_a_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "wb"
    with pytest.raises(TrainingInterrupted):
        train_regression(RegressionConfig(chunks=4), str(run), writers=("wandb",), signal_at=3)
    train_regression(RegressionConfig(chunks=4), str(run), writers=("wandb",), resume=True)
    # the resume continues the first session's W&B run (it started another, unrelated one): the same id
    run_id = (run / "wandb" / "run-id").read_text()
    logs = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2 and all(log.parent.name.endswith(f"-{run_id}") for log in logs)
    assert all(b"loss_scale" in log.read_bytes() for log in logs)


@pytest.mark.slow  # a fresh process: wandb keeps its settings (an offline run's) for the rest of one
def test_weights_and_biases_without_a_login_is_one_sentence_not_a_traceback(tmp_path):
    pytest.importorskip("wandb")
    env = {k: v for k, v in cpu_env().items() if not k.startswith("WANDB_")} | {"HOME": str(tmp_path)}  # logged out
    argv = ["train", "ppo", "--total-steps", "1024", "--no-progress", "--wandb", "--out", str(tmp_path / "run")]
    done = run_python(["-c", f"from genesis_jax.cli import main; raise SystemExit(main({argv!r}))"], env=env)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("genesis-jax: error: --wandb could not start a W&B run: ") and "WANDB_MODE=offline" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("message", ["", "  \n", "no API key configured\nsee the docs"])
def test_a_weights_and_biases_error_of_any_text_is_one_sentence(tmp_path, monkeypatch, message):
    wandb = pytest.importorskip("wandb")

    def refuse(**kwargs):
        raise wandb.errors.CommError(message)

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(ValueError) as err:  # an empty one raised IndexError from the message itself
        WandbWriter(tmp_path, "update")
    quoted = "no API key configured" if message.strip() else "CommError"
    assert str(err.value) == f"--wandb could not start a W&B run: {quoted} (or set WANDB_MODE=offline to log locally)"


def test_a_weights_and_biases_setting_it_refuses_is_named_in_one_sentence(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    # WANDB_MODE=ofline: wandb.init raised pydantic's 4-line ValidationError, quoted whole (its settings are
    # read once a process, so the test raises the error they raise, not through the environment)
    monkeypatch.setattr(wandb, "init", lambda **kwargs: wandb.Settings(mode="ofline"))
    with pytest.raises(ValueError) as err:
        WandbWriter(tmp_path, "update")
    (line,) = str(err.value).splitlines()
    assert line.startswith("--wandb could not start a W&B run: WANDB_MODE='ofline': Input should be 'online'")


@pytest.mark.parametrize("flag", ["--resume", "--overwrite", "--checkpoint-every 2"])
def test_what_only_a_run_directory_does_is_refused_without_one(flag, capsys):
    # --checkpoint-every and --overwrite without --out once ran, exit 0, and saved nothing
    from genesis_jax.cli import main

    assert main(["train", "ppo", "--total-steps", "1024", "--no-progress", *flag.split()]) == 2
    said = capsys.readouterr().err.strip()
    assert said == f"genesis-jax: error: {flag.split()[0]} needs a run directory: give --out"


def test_writers_need_a_run_directory_and_a_known_name():
    with pytest.raises(ValueError, match="need an output directory"):
        Session(None, name="x", num_rows=1, writers=("tensorboard",))
    with pytest.raises(ValueError, match="unknown metric writer 'csv'"):
        Session(None, name="x", num_rows=1, writers=("csv",))
    with pytest.raises(ValueError, match="unknown metric writer 'csv'"):  # one name, not its letters ('c')
        Session(None, name="x", num_rows=1, writers="csv")
    with pytest.raises(ValueError, match="metric writers tensorboard need"):
        Session(None, name="x", num_rows=1, writers="tensorboard")


class _RowsOnly:
    def write(self, rows):
        pass


@pytest.mark.parametrize(
    ("writer", "missing"), [(42, "write, write_summary, close"), (_RowsOnly(), "write_summary, close")]
)
def test_a_writer_object_without_the_writer_methods_is_refused_before_the_run(tmp_path, writer, missing):
    # it trained the whole run, then failed on close() with an AttributeError
    with pytest.raises(TypeError, match=f"metric writer .* has no {missing}: give a name"):
        Session(str(tmp_path / "run"), name="x", num_rows=1, writers=(writer,))
    assert not (tmp_path / "run").exists()


def test_the_0_3_keywords_still_work_with_a_future_warning(tmp_path):
    old = dict(kind="toy", total=2, position_key="chunk", meta_key="chunk_done", unit_size=4)
    with pytest.warns(FutureWarning) as caught:
        session = Session(str(tmp_path / "run"), progress=False, **old)
    assert sorted(str(w.message) for w in caught) == [
        "Session(kind=) is now Session(name=); kind= goes in 0.5",
        "Session(meta_key=) is no longer needed and is ignored; it goes in 0.5",
        "Session(position_key=) is now Session(row_key=); position_key= goes in 0.5",
        "Session(total=) is now Session(num_rows=); total= goes in 0.5",
        "Session(unit_size=) is now Session(steps_per_row=); unit_size= goes in 0.5",
    ]
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller's line
    with session:  # the same run as under the new names: its rows and its checkpoint's meta say so
        session.run(session.restore({"w": jnp.float32(1.0)}), lambda s: (s, {}), lambda m, d: [{"chunk": d + 1}])
        session.finish({})
        meta = session.store.read_meta(2)
    assert (session.name, session.num_rows, session.steps_per_row) == ("toy", 2, 4)
    assert (meta["kind"], meta["chunk"], meta["step"]) == ("toy", 2, 2)
    assert [row["chunk"] for row in metric_rows(tmp_path / "run")] == [1, 2]


def test_checkpoint_key_is_ignored_with_a_future_warning_the_checkpoints_step_being_the_position(tmp_path):
    with pytest.warns(FutureWarning, match=r"^Session\(checkpoint_key=\) is no longer needed and is ignored"):
        session = Session(str(tmp_path / "run"), name="toy", num_rows=2, checkpoint_key="done", progress=False)
    with session:
        session.run(session.restore({"w": jnp.float32(1.0)}), lambda s: (s, {}), lambda m, d: [{"update": d + 1}])
        session.finish({})
    again = Session(str(tmp_path / "run"), name="toy", num_rows=3, resume=True, progress=False)
    with again:
        again.restore({"w": jnp.float32(1.0)})
        assert again.rows_done == 2 and "done" not in again.store.read_meta(2)
        with pytest.warns(FutureWarning, match=r"session.checkpoint_key is session.row_key now"):
            assert again.checkpoint_key == "update"
        with pytest.warns(FutureWarning, match=r"session.position is session.rows_done now; it goes in 0.5"):
            assert again.position == 2


def test_an_old_keyword_beside_its_new_spelling_is_refused_not_silently_chosen():
    with pytest.raises(TypeError, match=r"both kind= \(0.3's spelling\) and name=: pass name= only"):
        Session(None, kind="old", name="new", num_rows=1, progress=False)


def test_the_cli_refuses_writers_without_out(capsys):
    from genesis_jax.cli import main

    assert main(["train", "world-model", "--tensorboard", "--epochs", "1", "--no-progress"]) == 2
    assert "need an output directory" in capsys.readouterr().err


def test_a_writer_that_cannot_start_leaves_the_old_run_in_place_and_unlocked(tmp_path, monkeypatch):
    from genesis_jax.run import writers as metric_writers

    run = tmp_path / "run"
    train_regression(RegressionConfig(chunks=2), str(run))
    before = (run / "metrics.jsonl").read_text()

    def missing(path, key, config):
        raise ImportError("--tensorboard needs tensorboardX")

    monkeypatch.setitem(metric_writers.NAMED_WRITERS, "tensorboard", missing)
    session = Session(
        str(run), RegressionConfig(), name="regression", num_rows=2, overwrite=True, writers=("tensorboard",)
    )
    with pytest.raises(ImportError, match="tensorboardX"):
        with session:
            pass
    assert (run / "metrics.jsonl").read_text() == before  # the old run is back
    assert not (run / ".replaced").exists() and not (run / ".lock").exists()


def halve(w):
    return {"w": w["w"] * 0.5}, {"loss": w["w"]}


def fail_first_chunk(w):
    raise FloatingPointError("the first chunk failed")


@pytest.mark.parametrize(
    "state, step, refusal",
    [(jnp.float32(8.0), halve, "got a bare"), ({"w": jnp.float32(8.0)}, fail_first_chunk, "the first chunk failed")],
    ids=["a bare array refused at restore", "the first chunk fails"],
)
def test_a_run_that_fails_before_its_first_row_leaves_no_run_behind(tmp_path, state, step, refusal):
    """Once its empty checkpoints/ stayed, and the corrected call was refused as "holds another run"."""
    run, to_rows = tmp_path / "run", lambda metrics, done: [{"update": done + 1, "loss": float(metrics["loss"])}]
    with pytest.raises((ValueError, FloatingPointError), match=refusal):
        with Session(str(run), name="toy", num_rows=3, progress=False) as session:
            session.run(session.restore(state), step, to_rows)
    assert not run.exists()
    with Session(str(run), name="toy", num_rows=3, progress=False) as session:  # the corrected call, as it stands
        session.run(session.restore({"w": jnp.float32(8.0)}), halve, to_rows)
        assert session.finish({})["stopped"] is None
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "summary.json"]


def test_progress_in_a_log_is_a_line_a_report_with_the_row_s_values(capsys):
    """Where stderr is a file (a batch job's log), tqdm's redraws were one long line of carriage
    returns: a report is a line of its own there, with what the bar's postfix would show."""
    step = lambda state: (state + 1, {"loss": state * 0.5})  # noqa: E731
    to_rows = lambda metrics, done: [{"chunk": done + 1, "loss": float(metrics["loss"])}]  # noqa: E731
    with Session(None, name="toy", num_rows=3, row_key="chunk", steps_per_row=2000, unit="step",
                 postfix=lambda row: {"loss": row["loss"]}) as session:  # fmt: skip
        capsys.readouterr()
        session.run(jnp.float32(0), step, to_rows)
    assert capsys.readouterr().err.splitlines() == [
        "2.0k/6.0k steps (33%), loss=0.0",
        "4.0k/6.0k steps (67%), loss=0.5",
        "6.0k/6.0k steps (100%), loss=1.0",
    ]
