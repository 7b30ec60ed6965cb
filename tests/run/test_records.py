"""A run's records are never replaced or lost. Resume refuses what it cannot continue whole
(naming what the directory holds), starts from a checkpoint that no metric row is missing
after, refuses a damaged metrics line by file and line number, keeps a finished run's summary
and refuses a shorter run; SIGINT / SIGTERM are handled from the moment a Session touches its
directory; TensorBoard shows each position once after a resume; a run that fails mid-way
writes a summary saying so. Each test checks the one-line message and the bytes on disk."""

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import struct
import threading
import time

import jax.numpy as jnp
import pytest

from genesis_jax import algos
from genesis_jax.cli import main
from genesis_jax.run.checkpoint import CheckpointMismatchError, CheckpointStore
from genesis_jax.run.run_dir import RunDirectoryError
from genesis_jax.run.session import Session
from genesis_jax.run.signals import StopSignals, TrainingInterrupted
from tests.algos.toy_algorithm import Toy, ToyConfig
from tests.support.files import metric_rows, one_line_error, snapshot
from tests.support.processes import start_python, wait_until
from tests.support.small_run import ppo_argv


def toy_loss(chunk: int) -> float:
    """The toy's loss at `chunk`: w starts at 8 and halves every chunk (exact in float32)."""
    return 8.0 * 0.5 ** (chunk - 1)


def toy(out, total, *, calls=None, fail_at=None, signal_first=False, checkpoint_every=1, **options):
    """A toy run of `total` chunks under a Session (the loop of session.py's docstring, with a
    checkpoint every chunk). `calls` collects the chunks run; the chunk call `fail_at` raises a
    full disk's OSError; `signal_first` sends SIGTERM right after the Session opened (while a
    real trainer would compile)."""
    calls = [] if calls is None else calls

    def step(state):
        calls.append(len(calls) + 1)
        if len(calls) == fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return {"w": state["w"] * 0.5}, {"loss": state["w"]}

    def to_rows(metrics, done):
        return [{"chunk": done + 1, "loss": float(metrics["loss"])}]

    options = {"progress": False, "checkpoint_every": checkpoint_every, **options}
    with Session(str(out), name="toy", num_rows=total, row_key="chunk", unit="chunk", **options) as session:
        if signal_first:
            os.kill(os.getpid(), signal.SIGTERM)
        state = session.restore({"w": jnp.float32(8.0)})
        state = session.run(state, step, to_rows)
        return session.finish({"final_loss": session.rows[-1]["loss"] if session.rows else None})


def metric_chunks(run: pathlib.Path) -> list[int]:
    return [r["chunk"] for r in metric_rows(run)]


@pytest.fixture
def registered(monkeypatch):
    """`genesis-jax train toy`: the template's toy algorithm on the command line."""
    monkeypatch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))


TOY = ["train", "toy", "--precision", "fp16", "--total-steps", "32", "--no-progress"]


@pytest.fixture(scope="module")
def toy_cli_run(tmp_path_factory):
    """A finished `genesis-jax train toy` run of 32 updates (copy it before changing it)."""
    run = tmp_path_factory.mktemp("toy") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))
        assert main([*TOY, "--out", str(run)]) == 0
    return run


def copy_of(run: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(run, tmp_path / "copy"))


# --- resume never replaces an ended run, nor leaves a row missing ----------------------------


@pytest.mark.parametrize("gone", ["emptied", "removed"])
def test_resume_refuses_an_ended_run_whose_checkpoints_are_gone(tmp_path, gone):
    run = tmp_path / "run"
    toy(run, 3)
    if gone == "removed":
        shutil.rmtree(run / "checkpoints")
    else:
        for step in (run / "checkpoints").iterdir():
            shutil.rmtree(step)
    before = snapshot(run)
    with pytest.raises(RunDirectoryError) as refused:
        toy(run, 3, resume=True)
    assert str(refused.value) == (
        f"{run} holds 3 metric rows and a summary of a finished run but no checkpoint; "
        "resume cannot continue it: use --overwrite to start over, or a new directory"
    )
    assert snapshot(run) == before


@pytest.mark.slow  # a PPO and a world-model run through the CLI: about 20 s
def test_ppo_and_the_world_model_refuse_alike_a_resume_whose_metrics_are_gone(tmp_path, capsys):
    workloads = {
        "ppo": (ppo_argv(2048, no_progress=False), "--total-steps", 4096, "update", 4),
        "world-model": (
            ["train", "world-model", "--epochs", "1", "--num-sequences", "64", "--batch-size", "256", "--width", "16"],
            "--epochs",
            2,
            "epoch",
            1,
        ),
    }
    for name, (argv, longer, value, key, done) in workloads.items():
        run = tmp_path / name
        assert main([*argv, "--no-progress", "--out", str(run)]) == 0
        capsys.readouterr()
        if name == "ppo":  # a shorter run than the one already done: refused, naming both
            before = snapshot(run)
            assert main([*argv, "--total-steps", "1024", "--no-progress", "--out", str(run), "--resume"]) == 2
            assert one_line_error(capsys) == (
                f"genesis-jax: error: {run} has run 4 updates (2048 steps) already, more than the 2 updates "
                "(1024 steps) asked for; ask for at least 4 updates (2048 steps) to continue it"
            )
            assert snapshot(run) == before
        (run / "metrics.jsonl").unlink()
        before = snapshot(run)
        assert main([*argv, longer, str(value), "--no-progress", "--out", str(run), "--resume"]) == 2
        assert one_line_error(capsys) == (
            f"genesis-jax: error: {run}/metrics.jsonl is missing but the oldest checkpoint in {run} is at {key} "
            f"{done}: resuming would leave {key}s without a row; use --overwrite to start over, or a new directory"
        )
        assert snapshot(run) == before


def test_a_torn_last_row_resumes_from_the_checkpoint_before_it_so_no_row_is_missing(tmp_path, caplog):
    run = tmp_path / "run"
    toy(run, 4)  # checkpoints at chunks 2, 3 and 4 (the newest 3 kept)
    whole = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(whole[:-8])  # chunk 4's row torn: killed while writing it
    calls = []
    with caplog.at_level("WARNING", logger="genesis_jax"):
        summary = toy(run, 4, resume=True, calls=calls)
    assert "torn last line" in caplog.text
    assert calls == [1]  # chunk 4 alone, again, from the checkpoint of chunk 3
    assert (run / "metrics.jsonl").read_bytes() == whole  # every row back, byte for byte
    assert summary["final_loss"] == toy_loss(4)


def test_checkpoints_after_the_rows_kept_are_removed_so_a_resume_on_other_settings_saves_its_own(tmp_path, capsys):
    """A torn row resumes from the checkpoint before it; the newer one followed the lost row. A
    resume whose run differs from there (a longer run's learning rate) saved over it: refused, as
    a step is saved once, after the training, and a second resume mixed the two runs."""

    def run(total, factor, **options):
        step = lambda s: ({"w": s["w"] * factor}, {"loss": s["w"]})  # noqa: E731
        to_rows = lambda metrics, done: [{"chunk": done + 1, "loss": float(metrics["loss"])}]  # noqa: E731
        with Session(str(tmp_path), name="toy", num_rows=total, row_key="chunk", unit="chunk", progress=False,
                     checkpoint_every=1, **options) as session:  # fmt: skip
            state = session.run(session.restore({"w": jnp.float32(8.0)}), step, to_rows)
            return session.finish({}, state)

    run(4, 0.5)
    (tmp_path / "metrics.jsonl").write_bytes((tmp_path / "metrics.jsonl").read_bytes()[:-8])  # chunk 4's row torn
    run(6, 0.25, resume=True)
    assert "checkpoints at chunk 4 follow rows metrics.jsonl lost: removed; the run continues from chunk 3" in (
        capsys.readouterr().err
    )
    assert [row["loss"] for row in metric_rows(tmp_path)] == [8, 4, 2, 1, 0.25, 0.0625]
    with CheckpointStore(tmp_path / "checkpoints") as store:
        assert store.all_steps() == [4, 5, 6]
        assert float(store.restore({"w": jnp.float32(0)}, 4)[0]["w"]) == 0.25  # this run's, not the first's (0.5)


def test_an_unreadable_newest_checkpoint_names_the_older_ones_and_how_to_use_them(tmp_path):
    run = tmp_path / "run"
    toy(run, 4)  # checkpoints at chunks 2, 3 and 4
    (run / "checkpoints" / "9").mkdir()  # a stray step directory: Orbax lists it as the newest
    with pytest.raises(CheckpointMismatchError) as refused:
        toy(run, 4, resume=True)
    assert str(refused.value).endswith(
        f"; older checkpoints remain (2, 3, 4): move {run}/checkpoints/9 aside to continue from 4"
    )
    shutil.move(run / "checkpoints" / "9", tmp_path / "aside")
    assert toy(run, 4, resume=True)["final_loss"] == toy_loss(4)


def test_a_torn_row_with_no_checkpoint_before_it_is_refused(tmp_path):
    run = tmp_path / "run"
    toy(run, 4, max_to_keep=1)  # the checkpoint of chunk 4 alone
    whole = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(whole[:-8])
    before = snapshot(run)
    with pytest.raises(RunDirectoryError) as refused:
        toy(run, 4, resume=True, max_to_keep=1)
    assert str(refused.value) == (
        f"{run}/metrics.jsonl holds rows up to chunk 3 but the oldest checkpoint in {run} is at chunk 4: "
        "resuming would leave chunks without a row; use --overwrite to start over, or a new directory"
    )
    assert snapshot(run) == before  # the torn line too: nothing trimmed before the refusal


@pytest.mark.parametrize(
    "line, content, words",
    [
        (2, b"[1, 2]", "is not a metric row (a JSON object with an integer 'chunk')"),
        (2, b'"a string"', "is not a metric row (a JSON object with an integer 'chunk')"),
        (2, b'{"loss": 4.0}', "is not a metric row (a JSON object with an integer 'chunk')"),
        (2, b'{"chunk": "2", "loss": 4.0}', "is not a metric row (a JSON object with an integer 'chunk')"),
        (2, b'{"chunk": 2, "loss": \xff\xfe}', "is not UTF-8 text"),
        (2, b'{"chunk": 2, "lo', "is not JSON"),
        (3, b'{"chunk": 3, "loss": 2.0}\xc3', "is not UTF-8 text"),  # the last line, whole (newline-ended)
    ],
)
def test_a_line_that_is_not_a_metric_row_is_refused_naming_the_file_and_line(tmp_path, line, content, words):
    run = tmp_path / "run"
    toy(run, 3)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    lines[line - 1] = content + b"\n"
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
    before = snapshot(run)
    with pytest.raises(RunDirectoryError) as refused:
        toy(run, 5, resume=True)
    assert str(refused.value) == f"{run}/metrics.jsonl is damaged: line {line} {words}"
    assert snapshot(run) == before


def test_non_utf8_metrics_are_one_line_with_exit_status_2_on_the_command_line(
    registered, toy_cli_run, tmp_path, capsys
):
    run = copy_of(toy_cli_run, tmp_path)
    with open(run / "metrics.jsonl", "r+b") as f:
        f.seek(5)
        f.write(b"\xff")
    before = snapshot(run)
    assert main([*TOY, "--total-steps", "64", "--out", str(run), "--resume"]) == 2
    assert one_line_error(capsys) == f"genesis-jax: error: {run}/metrics.jsonl is damaged: line 1 is not UTF-8 text"
    assert snapshot(run) == before


# --- a finished run resumed; a shorter one refused --------------------------------------------


def test_resuming_a_finished_run_compiles_nothing_and_keeps_its_summary(toy_cli_run, tmp_path, monkeypatch):
    run = copy_of(toy_cli_run, tmp_path)
    config = ToyConfig(precision="fp16", total_steps=32)  # the run's own settings
    first = json.loads((run / "summary.json").read_text())
    compiled = []
    original = Toy.compile_chunk
    monkeypatch.setattr(Toy, "compile_chunk", lambda self, *a: compiled.append(1) or original(self, *a))
    resumed = Toy.train(config, str(run), progress=False, resume=True)
    assert compiled == []
    again = json.loads((run / "summary.json").read_text())
    assert again == first  # speed, compile time and memory as measured when the run ran, not null
    assert first["steps_per_second"] > 0 and first["compile_seconds"] > 0 and first["train_step_bytes"] > 0
    assert resumed.summary["steps_per_second"] == first["steps_per_second"]


def test_a_shorter_run_than_the_one_done_is_refused_naming_both(registered, toy_cli_run, tmp_path, capsys):
    run = copy_of(toy_cli_run, tmp_path)
    before = snapshot(run)
    assert main([*TOY, "--total-steps", "16", "--out", str(run), "--resume"]) == 2
    assert one_line_error(capsys) == (
        f"genesis-jax: error: {run} has run 32 updates already, more than the 16 updates asked for; "
        "ask for at least 32 updates to continue it"
    )
    assert snapshot(run) == before


# --- signals for the Session's whole life; a set-aside run is never deleted unasked ----------


@pytest.fixture
def sigterm_reaching_the_test(monkeypatch):
    """A SIGTERM that no Session handled lands here (recorded), instead of ending pytest."""
    reached = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: reached.append(signum))
    yield reached
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_before_the_first_chunk_of_an_overwrite_puts_the_old_run_back(tmp_path, sigterm_reaching_the_test):
    run = tmp_path / "run"
    toy(run, 3)
    before = snapshot(run)
    with pytest.raises(TrainingInterrupted) as stop:
        toy(run, 3, overwrite=True, signal_first=True)
    assert sigterm_reaching_the_test == []  # the Session's handler took it
    assert stop.value.signum == signal.SIGTERM
    assert str(stop.value) == (
        f"SIGTERM received before training began (chunk 0 of 3): nothing was trained; {run} is left as it was"
    )
    assert snapshot(run) == before
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "summary.json"]


# Runs the CLI with the chunk's compilation held for 3 s, after writing a marker.
SLOW_COMPILE = """
import os, sys, time
from genesis_jax import algos
from genesis_jax.algos.base import Algorithm
algos.REGISTRY["toy"] = ("tests.algos.toy_algorithm", "a toy regression")
compile_chunk = Algorithm.compile_chunk
def slow_compile(self, state, per_chunk):
    open(os.environ["COMPILING"], "w").close()
    time.sleep(3)
    return compile_chunk(self, state, per_chunk)
Algorithm.compile_chunk = slow_compile
from genesis_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a CLI subprocess held 3 s in its compilation: about 12 s
def test_sigterm_while_an_overwrite_compiles_exits_143_in_one_line_with_the_old_run_back(toy_cli_run, tmp_path):
    run, marker = copy_of(toy_cli_run, tmp_path), tmp_path / "compiling"
    before = snapshot(run)
    proc = start_python(
        ["-c", SLOW_COMPILE, *TOY, "--overwrite", "--out", str(run)],
        {**os.environ, "JAX_PLATFORMS": "cpu", "COMPILING": str(marker)},
    )
    wait_until(marker.exists, proc, timeout=180)
    assert (run / ".replaced").is_dir()  # the old run is set aside while the new one compiles
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.strip().splitlines() == [
        f"genesis-jax: SIGTERM received before training began (update 0 of 32): nothing was trained; "
        f"{run} is left as it was"
    ]
    assert snapshot(run) == before and not (run / ".replaced").exists()


def test_an_overwrite_replaces_the_old_run_s_plots_too(tmp_path):
    """The plot of a run of another algorithm has another name: it stayed beside the new run."""
    run = tmp_path / "run"
    toy(run, 2)
    (run / "ppo.png").write_bytes(b"the old run's plot")
    before = snapshot(run)
    with pytest.raises(OSError):  # a new run that fails puts the old one back, its plot too
        toy(run, 2, overwrite=True, fail_at=1)
    assert snapshot(run) == before
    toy(run, 2, overwrite=True)
    assert not (run / "ppo.png").exists() and not (run / ".replaced").exists()


def test_an_overwrite_never_deletes_the_run_a_killed_overwrite_set_aside(tmp_path):
    run = tmp_path / "run"
    toy(run, 3)
    # What an --overwrite killed with SIGKILL while it compiled leaves: the old run in
    # .replaced/, the new run's empty checkpoints/.
    (run / ".replaced").mkdir()
    for name in ("checkpoints", "metrics.jsonl", "summary.json"):
        os.replace(run / name, run / ".replaced" / name)
    (run / "checkpoints").mkdir()
    before = snapshot(run)
    for options in ({"overwrite": True}, {}):
        with pytest.raises(RunDirectoryError) as refused:
            toy(run, 3, **options)
        assert str(refused.value) == (
            f"{run}/.replaced holds the run an earlier --overwrite set aside and did not finish replacing; "
            f"move its files back into {run} to keep that run, or delete {run}/.replaced, then run again"
        )
        assert snapshot(run) == before
    toy(run, 2, resume=True)  # the killed run, continued: it had no checkpoint, so from chunk 1
    assert metric_chunks(run) == [1, 2]
    assert {k: v for k, v in snapshot(run).items() if k.startswith(".replaced")} == {
        k: v for k, v in before.items() if k.startswith(".replaced")
    }


# --- TensorBoard after a resume; the summary of a failed run ---------------------------------


def tensorboard_scalars(log_dir: pathlib.Path, purge: bool) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in `log_dir` (file-name order), read from the TFRecord
    framing with tensorboardX's Event message. With `purge`, as TensorBoard shows them: a
    SessionLog START event at step s (tensorboardX's `purge_step`) hides the earlier events
    at steps >= s."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.iterdir()):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            if purge and event.HasField("session_log") and event.session_log.status == SessionLog.START:
                scalars = {tag: [(s, v) for s, v in values if s < event.step] for tag, values in scalars.items()}
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_shows_each_position_once_after_a_resume(tmp_path):
    run = tmp_path / "run"
    toy(run, 4, checkpoint_every=2, writers=("tensorboard",))
    shutil.rmtree(run / "checkpoints" / "4")  # as if killed after logging chunk 4, before its save
    toy(run, 4, checkpoint_every=2, writers=("tensorboard",), resume=True)  # chunks 3 and 4 again
    events = run / "tensorboard"
    assert len(list(events.iterdir())) == 2  # the first process's file is kept, not overwritten
    assert [s for s, _ in tensorboard_scalars(events, purge=False)["train/loss"]] == [1, 2, 3, 4, 3, 4]
    assert tensorboard_scalars(events, purge=True)["train/loss"] == [(c, toy_loss(c)) for c in (1, 2, 3, 4)]


def test_a_run_that_fails_midway_writes_a_summary_saying_so(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(OSError, match="No space left on device"):
        toy(run, 4, fail_at=4)  # chunks 1 to 3 ran and were saved; the 4th fails
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped"] == "failed" and summary["iterations"] == 3
    assert summary["error"] == f"OSError: [Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"
    assert metric_chunks(run) == [1, 2, 3]
    before = snapshot(run)
    with pytest.raises(OSError):
        toy(run, 4, resume=True, fail_at=1)  # fails before training anything: nothing changes
    assert snapshot(run) == before
    assert toy(run, 4, resume=True)["stopped"] is None  # from the checkpoint of chunk 3
    assert metric_chunks(run) == [1, 2, 3, 4]
    assert json.loads((run / "summary.json").read_text())["final_loss"] == toy_loss(4)


def timed_work(seconds: float):
    """A compiled step of about `seconds` on this machine, dispatched and not waited for (the
    wait is the run's): `step(state) -> (state, metrics)` for a state from `timed_work_state`."""
    import time

    import jax

    work = jax.jit(lambda m, n: jax.lax.fori_loop(0, n, lambda i, a: jnp.tanh(a @ a), m))
    m = jnp.full((256, 256), 0.01, jnp.float32)
    work(m, 1).block_until_ready()  # compiled; then timed, the fastest of three: a chunk timed while
    taken = []  # other work loaded the machine ran short once the load fell, and ended before its signal
    for _ in range(3):
        start = time.perf_counter()
        work(m, 20).block_until_ready()
        taken.append(time.perf_counter() - start)
    n = max(20, int(20 * seconds / min(taken)))

    def step(state):
        out = work(state["m"], state["n"])
        return {**state, "m": out}, {"loss": out[0, 0]}

    return step, {"m": m, "n": jnp.int32(n)}


@contextlib.contextmanager
def signals_at(*seconds: float, signum=signal.SIGTERM):
    """`signum` to this process at each of `seconds` from now; those not sent when the block ends
    never are (a run that ended early fails its test, not the suite's process)."""
    timers = [threading.Timer(at, os.kill, (os.getpid(), signum)) for at in seconds]
    for timer in timers:
        timer.start()
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()


def events_of(session, events: list):
    """The session's notes and its rows, each with its time, in `events`; the run's `to_rows`."""
    session.note = lambda text: events.append((text, time.perf_counter()))
    return lambda metrics, done: events.append(("rows", time.perf_counter())) or [{"chunk": done + 1}]


def test_a_stop_asked_for_while_a_chunk_runs_is_said_at_once(tmp_path):
    """The run waits for a chunk by polling it, so a signal's handler runs at once: waited for
    in `jax.device_get`, it ran only when the chunk returned (minutes for a big one), and the
    run said nothing in between. The chunk still ends, and is saved, first. The same signal
    twice within a second (under `launch`: the terminal's and the launcher's) is one stop."""
    step, state = timed_work(3)
    events, signals, dispatched = [], contextlib.ExitStack(), []

    def signalled_from_dispatch(state):  # timed from the chunk's start, not the run's
        signals.enter_context(signals_at(0.2, 0.21))
        dispatched.append(time.perf_counter())
        return step(state)

    with Session(str(tmp_path), name="toy", num_rows=3, row_key="chunk", unit="chunk", progress=False,
                 checkpoint_every=1) as session:  # fmt: skip
        to_rows = events_of(session, events)
        state = session.restore(state)
        with signals:
            state = session.run(state, signalled_from_dispatch, to_rows)
        with pytest.raises(TrainingInterrupted):
            session.finish({}, state)
    assert [text for text, _ in events] == [
        "SIGTERM received: stopping when the chunk now running ends (a checkpoint is saved then; "
        "another SIGTERM stops at once and loses it)",
        "rows",
    ]  # said while the chunk ran; that chunk's row, then the stop
    assert events[0][1] < events[1][1] and metric_chunks(tmp_path) == [1]
    # said at once: well before the 3 s chunk ended (a handler that ran only when it returned said it after)
    assert events[0][1] - dispatched[0] < 1.5 < events[1][1] - dispatched[0]


def test_a_second_ctrl_c_a_second_later_stops_at_once_losing_only_the_chunk_running(tmp_path):
    """A second SIGINT is Python's own: a KeyboardInterrupt while the chunk still runs (also where
    the shell left SIGINT ignored). The run keeps what it saved (its summary says how it ended)
    and resumes from there."""
    step, state = timed_work(8)
    calls, events, stop = [0], [], contextlib.ExitStack()

    def first_at_once_then_interrupted(state):
        calls[0] += 1
        if calls[0] == 1:  # the first chunk: at once
            done, metrics = step({**state, "n": jnp.int32(1)})
            return {**done, "n": state["n"]}, metrics
        stop.enter_context(signals_at(0.2, 1.4, signum=signal.SIGINT))  # from the chunk's start
        return step(state)

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background shell leaves it: sent on purpose
    try:
        with stop, pytest.raises(KeyboardInterrupt, match="SIGINT received again: stopped at once"):
            with Session(str(tmp_path), name="toy", num_rows=3, row_key="chunk", unit="chunk", progress=False,
                         checkpoint_every=1) as session:  # fmt: skip
                to_rows = events_of(session, events)
                session.run(session.restore(state), first_at_once_then_interrupted, to_rows)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert [text for text, _ in events] == [
        "rows",
        "SIGINT received: stopping when the chunk now running ends (a checkpoint is saved then; "
        "another SIGINT stops at once and loses it)",
        "SIGINT received again: stopping at once; the chunk now running is lost (the checkpoints saved stay)",
    ]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stopped"] == "failed"
    assert summary["error"] == "KeyboardInterrupt: SIGINT received again: stopped at once"
    assert metric_chunks(tmp_path) == [1] and CheckpointStore(tmp_path / "checkpoints").all_steps() == [1]
    with Session(str(tmp_path), name="toy", num_rows=3, row_key="chunk", unit="chunk", progress=False,
                 resume=True) as session:  # fmt: skip
        session.restore(state)
        assert session.rows_done == 1


SECOND_SIGTERM = """
import signal, time
from genesis_jax.run.signals import StopSignals
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever the shell left
with StopSignals(notice=lambda signum, at_once: print("again" if at_once else "first", flush=True)):
    print("ready", flush=True)
    time.sleep(60)
"""


def test_a_second_sigterm_a_second_later_ends_the_process_as_an_unhandled_one_would():
    proc = start_python(["-c", SECOND_SIGTERM])
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "first\n"
    time.sleep(StopSignals.SAME_STOP_SECONDS + 0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM and proc.stdout.read() == "again\n"


def test_a_directory_in_use_by_a_run_of_the_same_process_says_so_not_its_own_pid(tmp_path):
    from genesis_jax.run.run_dir import RunDirectory

    first = RunDirectory(tmp_path / "run").open()
    try:
        with pytest.raises(RunDirectoryError, match=r"is in use by another run in this process$"):
            RunDirectory(tmp_path / "run", overwrite=True).open()
    finally:
        first.close(succeeded=True)
