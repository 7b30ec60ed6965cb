"""Nothing lost or silently shared when a process dies or two meet: a run killed before its first
checkpoint, a second process on a run directory in use, a full disk. Real CLI subprocesses, real
signals. The in-process checks (bad arguments, corrupted checkpoints, changed settings, torn
metrics, bad values, damaged datasets) are in test_integrity_inputs.py."""

import json
import signal

import pytest

from genesis_jax.cli import main
from genesis_jax.run.checkpoint import CheckpointStore
from tests.support.files import written_rows
from tests.support.processes import start_python, wait_until
from tests.support.small_run import SMALL, copy_of, metric_updates, ppo_argv, train_small_run

# A run long enough to be caught in the middle: 64 updates of 512 steps, 8 per chunk (the
# program of test_reliability_kills.py's runs, which a test run compiles once for both files).
LONG = ppo_argv(32768, updates_per_chunk=8)


def start(argv, preamble=""):
    script = f"import sys\n{preamble}\nfrom genesis_jax.cli import main\nsys.exit(main(sys.argv[1:]))"
    return start_python(["-c", script, *argv])


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return train_small_run(tmp_path_factory.mktemp("runs"))


@pytest.mark.slow  # kills a CLI subprocess, resumes: 30 s
def test_killed_before_its_first_checkpoint_then_resumed_logs_every_update_once(tmp_path):
    run = tmp_path / "run"
    proc = start(LONG + ["--out", str(run)])
    wait_until(lambda: written_rows(run) >= 8, proc)  # the 8th row may still be half written: whole lines
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not any(p.name.isdigit() for p in (run / "checkpoints").iterdir())  # killed before any checkpoint
    assert main(LONG + ["--out", str(run), "--resume"]) == 0
    assert metric_updates(run) == list(range(1, 65))  # a clean start: no update twice
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 64 and summary["total_steps"] == 32768


# Long enough (about 15 s on 2 cores) for a second process to start while the first runs.
LONGER = ppo_argv(1048576, updates_per_chunk=64)


@pytest.mark.slow  # a CLI subprocess, then two runs in this process: 10-15 s
def test_a_second_process_is_refused_naming_the_holder_and_a_killed_holder_leaves_no_lock(tmp_path, capsys):
    run = tmp_path / "run"
    first = start(LONGER + ["--out", str(run)])
    # The run directory is locked before the run restores or compiles anything: the second
    # process (this one, with its own pid) is refused as soon as the lock names the first,
    # which never needs to finish compiling.
    wait_until(lambda: (run / ".lock").exists() and (run / ".lock").read_text().strip() == str(first.pid), first)
    assert main(LONGER + ["--out", str(run), "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"in use by another run (pid {first.pid})" in err[0], err
    assert first.poll() is None  # refused by a live holder, not after it ended
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (run / ".lock").read_text().strip() == str(first.pid)  # stale: its holder is dead
    assert main(SMALL + ["--out", str(run), "--overwrite"]) == 0  # a third run takes the stale lock over
    assert not (run / ".lock").exists() and metric_updates(run) == list(range(1, 5))


@pytest.mark.slow  # a CLI subprocess: 22 s
def test_a_full_disk_ends_in_one_line_with_the_system_status_and_the_last_checkpoint_intact(small_run, tmp_path):
    """RLIMIT_FSIZE makes every write past 4 KiB fail with EFBIG, as a full disk would: the
    new checkpoint's files are larger than that."""
    run = copy_of(small_run, tmp_path)
    step = CheckpointStore(run / "checkpoints").latest_step()
    preamble = (
        "import resource, signal\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))"
    )
    proc = start(SMALL + ["--total-steps", "4096", "--out", str(run), "--resume"], preamble)
    assert proc.wait(timeout=300) == 4
    said = proc.stderr.read().strip().splitlines()
    err = [line for line in said if line.startswith("genesis-jax") and not line.startswith("genesis-jax: warning:")]
    assert len(err) == 1 and "system failure" in err[0], err  # (the warning: the longer run moves the lr's decay)
    with CheckpointStore(run / "checkpoints") as store:
        assert store.latest_step() == step
        store.restore_raw(step)  # still reads, checksum and all
