"""`genesis-jax launch` and the processes of a multi-process run: bad input is refused in one
line before any process starts, the processes die with the launcher, and no process waits
forever for another (a refused run directory, a barrier, a signal)."""

import fcntl
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest

from genesis_jax.run import launch as launcher
from genesis_jax.run import parallel
from genesis_jax.run.launch import (
    LAUNCHER_PID_ENV,
    free_port,
    parse_coordinator_address,
    port_in_use,
    split_visible_devices,
)
from genesis_jax.run.parallel import check_distributed_args
from genesis_jax.run.signals import EXIT_BAD_INPUT, EXIT_PEER
from tests.support.processes import REPO, cpu_env, start_python
from tests.support.small_run import ppo_argv

TINY_PPO = ppo_argv(precision=None, num_envs=4, num_steps=16, devices=2)
LAUNCH = ["-m", "genesis_jax.cli", "launch", "--processes", "2", "--local-devices", "1"]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def wait_gone(pids, timeout: float) -> float:
    """Seconds until every pid is gone; fails after `timeout` (and kills what is left)."""
    start = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - start > timeout:
            left = [p for p in pids if alive(p)]
            for p in left:
                os.kill(p, signal.SIGKILL)
            pytest.fail(f"processes {left} still ran {timeout} s after the launcher died")
        time.sleep(0.05)
    return time.monotonic() - start


def launched_pids(proc: subprocess.Popen) -> list[int]:
    line = proc.stderr.readline()
    found = re.search(r"pids ([\d ]+)$", line.strip())
    assert found, line
    return [int(p) for p in found.group(1).split()]


def genesis_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("genesis-jax")]


# -- CUDA_VISIBLE_DEVICES ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "visible, num_gpus, processes, expected",
    [
        ("0,1,2,3", 0, 2, ["0,1", "2,3"]),
        ("4,5,6,7", 8, 4, ["4", "5", "6", "7"]),  # the visible list wins over the machine's count
        (None, 8, 2, ["0,1,2,3", "4,5,6,7"]),
        (None, 2, 2, ["0", "1"]),
        ("GPU-aa, GPU-bb", 0, 2, ["GPU-aa", "GPU-bb"]),  # UUIDs, spaces dropped
        (None, 0, 2, [None, None]),  # a CPU-only machine: never set
        ("", 4, 2, [None, None]),  # set to nothing: no GPUs, left as it is
        ("0,1,2,3", 4, 1, [None]),  # one process keeps what it inherits
    ],
)
def test_split_visible_devices_gives_each_process_a_contiguous_share(visible, num_gpus, processes, expected):
    shares = split_visible_devices(visible, num_gpus, processes)
    assert shares == expected
    if expected[0] is not None:  # every GPU once, in order
        ids = visible.replace(" ", "").split(",") if visible else [str(i) for i in range(num_gpus)]
        assert ",".join(shares).split(",") == ids


@pytest.mark.parametrize("visible, num_gpus, processes", [("0,1,2", 0, 2), (None, 3, 2), ("0,1", 0, 4)])
def test_split_visible_devices_refuses_gpus_that_do_not_divide(visible, num_gpus, processes):
    with pytest.raises(ValueError, match=f"do not split evenly over {processes} processes"):
        split_visible_devices(visible, num_gpus, processes)


def test_visible_device_shares_leave_a_cpu_run_alone(monkeypatch):
    monkeypatch.setattr(launcher, "count_gpus", lambda: 3)  # 3 GPUs would not divide over 2
    assert launcher.visible_device_shares(2, {"JAX_PLATFORMS": "cpu"}) == [None, None]
    with pytest.raises(ValueError, match="3 GPUs"):
        launcher.visible_device_shares(2, {})
    assert launcher.visible_device_shares(2, {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]


# -- the coordinator's address and port -------------------------------------------------------


@pytest.mark.parametrize(
    "address, message",
    [
        ("nothost", "coordinator-address must be host:port, such as 10.0.0.1:1234, got 'nothost'"),
        (":1234", "coordinator-address must be host:port"),
        ("host:notaport", "coordinator-address 'host:notaport': the port 'notaport' is not a number"),
        ("localhost:99999", "coordinator-address 'localhost:99999': the port must lie in 1..65535, got 99999"),
        ("localhost:0", "the port must lie in 1..65535, got 0"),
        ("nosuchhost.invalid:1234", "the host 'nosuchhost.invalid' cannot be resolved"),
    ],
)
def test_bad_coordinator_addresses_are_refused_in_one_sentence(address, message):
    with pytest.raises(ValueError) as refused:
        check_distributed_args(address, 2, 1)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_good_coordinator_addresses_parse():
    assert parse_coordinator_address("127.0.0.1:1234") == ("127.0.0.1", 1234)
    assert parse_coordinator_address("localhost:65535") == ("localhost", 65535)
    assert parse_coordinator_address("[::1]:80") == ("::1", 80)
    check_distributed_args("127.0.0.1:1234", 2, 1)
    check_distributed_args("auto", None, None)
    with pytest.raises(ValueError, match=r"process-id must lie in \[0, num-processes\), got 2 of 2"):
        check_distributed_args("127.0.0.1:1234", 2, 2)


def test_port_in_use_sees_a_listening_socket():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port_in_use(port)
    assert not port_in_use(port)


@pytest.mark.slow  # the train command's parse loads JAX: about 10 s on 2 busy cores
def test_train_refuses_a_coordinator_address_without_port():
    proc = subprocess.run(
        [sys.executable, "-m", "genesis_jax.cli", *TINY_PPO, "--coordinator-address", "nothost"]
        + ["--num-processes", "2", "--process-id", "1"],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.splitlines() == [
        "genesis-jax: error: coordinator-address must be host:port, such as 10.0.0.1:1234, got 'nothost'"
    ]


def run_launch(*args, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, *LAUNCH, *args, "--", *TINY_PPO],
        cwd=REPO,
        env=cpu_env(drop_xla_flags=True),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.monotonic() - start


def test_launch_refuses_a_coordinator_port_in_use_before_starting_anyone():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc, seconds = run_launch("--port", str(port))
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.splitlines() == [
        f"genesis-jax: error: coordinator port {port} is in use; choose another with --port, "
        "or leave --port out for a free one"
    ]  # no "pids" line: no process was started
    assert proc.stdout == "" and seconds < 10, seconds


@pytest.mark.parametrize("port", ["99999", "0"])
def test_launch_refuses_a_port_out_of_range(port):
    proc, seconds = run_launch("--port", port)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.splitlines() == [f"genesis-jax: error: port must lie in 1..65535, got {port}"]
    assert seconds < 10, seconds


# -- naming the process that failed -------------------------------------------------------------


def fake_processes(*statuses):
    return [types.SimpleNamespace(returncode=s) for s in statuses]


def test_several_processes_need_a_device_each_on_the_data_axis():
    """Without --devices (1), each process trained the whole run alone, then failed at its first
    checkpoint (Orbax cannot save a host-local array across processes)."""
    from genesis_jax.algos.ppo import PPOConfig

    with pytest.raises(ValueError, match="devices 1 with 2 processes: .* devices must be at least 2"):
        PPOConfig(num_envs=4, coordinator_address="127.0.0.1:1234", num_processes=2, process_id=0)


@pytest.mark.slow  # two processes load JAX and stop before training: about 15 s on 2 cores
def test_a_data_axis_that_leaves_a_process_without_a_device_is_refused_not_waited_on(tmp_path):
    """--devices 2 of 2 processes x 2 devices: the mesh was process 0's two devices, and process 1,
    holding none, waited for ever (SIGINT did not end it)."""
    argv = [*LAUNCH[:-1], "2", "--", *TINY_PPO, "--num-envs", "8", "--out", str(tmp_path / "run")]
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=cpu_env(drop_xla_flags=True),
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert "genesis-jax: error: devices 2 are the first 2 of the 4 of 2 processes, and process(es) 1 would hold " \
        "none: give devices from 3 to 4" in genesis_lines(proc.stderr)  # fmt: skip


@pytest.mark.parametrize("command", [[], ["eval", "runs/x"], ["train"], ["train", "--out", "runs/x"]])
def test_launch_needs_a_train_command_with_its_workload(command):
    """Before, `launch -- train` started every process, and each said "invalid choice: '127.0.0.1:PORT'"."""
    with pytest.raises(ValueError, match=r"^launch runs a 'train WORKLOAD \.\.\.' command, got "):
        launcher.process_commands(command, 2, 1234)


def test_the_launcher_names_the_process_that_failed_on_its_own():
    # process 1 stopped only because process 0 failed: process 0 is named, though 1 ended first
    assert launcher._origin(fake_processes(2, EXIT_PEER), [1]) == 0
    assert launcher._origin(fake_processes(EXIT_PEER, -9, None), [0, 1]) == 1
    assert launcher._origin(fake_processes(-6, -9), [1]) == 1  # the first to fail, not the lowest index
    assert launcher._origin(fake_processes(EXIT_PEER, EXIT_PEER), [0]) == 0  # nobody else to name


def test_the_resume_advice_needs_a_checkpoint(tmp_path):
    assert launcher._out_dir(["train", "ppo", "--out", "runs/x"]) == "runs/x"
    assert launcher._out_dir(["train", "ppo", "--out=runs/y"]) == "runs/y"
    assert not launcher._has_checkpoint(str(tmp_path)) and not launcher._has_checkpoint(None)
    (tmp_path / "checkpoints" / "8").mkdir(parents=True)
    assert launcher._has_checkpoint(str(tmp_path))


# -- dying with the launcher ------------------------------------------------------------------------

# A stand-in launcher: starts one child the way `launch` does (or, with "watch-only", with the
# watchdog thread alone), prints the child's pid and waits.
STAND_IN = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from genesis_jax.run import launch
    child = sys.argv[2]
    env = {**os.environ, launch.LAUNCHER_PID_ENV: str(os.getpid())}
    preexec = launch._die_with_parent() if sys.argv[1] == "launch" else None
    proc = subprocess.Popen([sys.executable, "-c", child], env=env, preexec_fn=preexec)
    print(proc.pid, flush=True)
    time.sleep(600)
    """
)
CHILD = textwrap.dedent(
    """
    import signal, time
    from genesis_jax.run.launch import exit_with_launcher
    if {ignore_term}:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    assert exit_with_launcher(grace_seconds=1.0, interval=0.05) is {watch}
    print("watching", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    "how, watch, ignore_term",
    [
        ("launch", False, False),  # PR_SET_PDEATHSIG alone (no launcher pid in the child's watch)
        ("watch-only", True, False),  # the watchdog alone: SIGTERM
        ("watch-only", True, True),  # the watchdog, SIGTERM ignored: ended after its grace
    ],
)
def test_a_child_dies_with_its_launcher(how, watch, ignore_term):
    if how == "launch" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    child = CHILD.format(ignore_term=ignore_term, watch=watch)
    if not watch:  # the child does not watch: only the kernel's death signal can end it
        child = child.replace("exit_with_launcher(", "(lambda **_: False)(")
    stand_in = start_python(["-c", STAND_IN, how, child])
    lines = queue.Queue()  # read on a thread: a child that never says "watching" fails the test, not hangs it
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in stand_in.stdout], daemon=True).start()
    pid = int(lines.get(timeout=60))
    assert lines.get(timeout=60) == "watching"  # the child is up and watching
    assert alive(pid)
    stand_in.kill()
    stand_in.wait()
    seconds = wait_gone([pid], timeout=10)
    assert seconds < (3 if ignore_term else 2), seconds
    assert (seconds > 0.8) is ignore_term  # the ignored SIGTERM: ended after the 1 s grace


def test_killing_the_launcher_at_once_ends_the_processes():
    """SIGKILL of the launcher while its processes start: none of them goes on."""
    proc = start_python([*LAUNCH, "--", *TINY_PPO, "--total-steps", "100000"], cpu_env(drop_xla_flags=True))
    pids = launched_pids(proc)
    assert all(alive(p) for p in pids)
    proc.kill()
    proc.wait()
    assert wait_gone(pids, timeout=10) < 5


@pytest.mark.slow
def test_killing_the_launcher_while_training_ends_every_process(tmp_path):
    """SIGKILL of the launcher in the middle of training: both processes get SIGTERM (a clean
    stop with a final checkpoint where it comes in time) and are gone within the grace. A checkpoint
    every 4 updates: compiled chunks of 2 updates, so the first rows come, and a stop is taken, soon."""
    out = tmp_path / "run"
    args = [*TINY_PPO, "--total-steps", "10000000", "--checkpoint-every", "256", "--out", str(out)]
    proc = start_python([*LAUNCH, "--", *args], cpu_env(drop_xla_flags=True))
    pids = launched_pids(proc)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    seconds = wait_gone(pids, timeout=60)
    assert seconds < launcher.ORPHAN_GRACE_SECONDS + 10, seconds


# -- no process waits forever ---------------------------------------------------------------------


def start_processes(args, count=2):
    port = free_port()
    return [
        start_python(
            [
                *args,
                "--coordinator-address",
                f"127.0.0.1:{port}",
                "--num-processes",
                str(count),
                "--process-id",
                str(i),
            ],
            cpu_env(host_devices=1),
        )
        for i in range(count)
    ]


@pytest.mark.slow
def test_a_run_directory_refused_to_process_0_ends_every_process_in_one_line(tmp_path):
    out = tmp_path / "locked"
    out.mkdir()
    with open(out / ".lock", "a+") as held:  # another live run holds the directory
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"{os.getpid()}\n")
        held.flush()
        procs = start_processes(["-m", "genesis_jax.cli", *TINY_PPO, "--total-steps", "128", "--out", str(out)])
        start = time.monotonic()
        outs = [p.communicate(timeout=180) for p in procs]
        seconds = time.monotonic() - start
    assert [p.returncode for p in procs] == [EXIT_BAD_INPUT, EXIT_PEER], outs
    assert genesis_lines(outs[0][1]) == [
        f"genesis-jax: error: output directory {out} is in use by another run (pid {os.getpid()})"
    ]
    assert genesis_lines(outs[1][1]) == [
        "genesis-jax: stopped: process 0 ended before reaching 'genesis-session-opened'; its own message says why"
    ]
    assert "Traceback" not in outs[0][1] + outs[1][1]
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written, the holder's lock kept
    assert seconds < 120, seconds


BARRIER = textwrap.dedent(
    """
    import signal, sys, time
    from genesis_jax.run import parallel
    process, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "handler":  # as a training loop's own handler would
        signal.signal(signal.SIGTERM, lambda *_: None)
    parallel.initialize_distributed(f"127.0.0.1:{port}", 2, process)
    if process == 0:
        time.sleep(600)  # never comes to the barrier
    print("waiting", flush=True)
    try:
        parallel.barrier("together", timeout=float(sys.argv[4]))
    except Exception as err:
        print(f"{type(err).__name__}: {err}", flush=True)
        sys.exit(7)  # replaced by the status it would have had (see parallel._leave)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "handler"])
def test_sigterm_ends_a_process_waiting_in_a_barrier(mode):
    port = str(free_port())
    procs = [start_python(["-c", BARRIER, str(i), port, mode, "600"], cpu_env()) for i in range(2)]
    try:
        assert procs[1].stdout.readline().strip() == "waiting", procs[1].stderr.read()[-2000:]
        time.sleep(0.5)
        procs[1].send_signal(signal.SIGTERM)
        out, _ = procs[1].communicate(timeout=20)  # before: JAX's preemption service kept it waiting
    finally:
        procs[0].kill()
        procs[0].communicate()
    if mode == "default":
        assert procs[1].returncode == -signal.SIGTERM
    else:  # it left alone: the exit status it would have had, not a wait at JAX's shutdown barrier
        assert procs[1].returncode == 128 + signal.SIGTERM
        assert "TrainingInterrupted: stopped by SIGTERM while waiting for the other processes ('together')" in out


@pytest.mark.slow
def test_a_barrier_gives_up_after_its_timeout():
    port = str(free_port())
    procs = [start_python(["-c", BARRIER, str(i), port, "default", "3"], cpu_env()) for i in range(2)]
    try:
        assert procs[1].stdout.readline().strip() == "waiting"
        start = time.monotonic()
        out, _ = procs[1].communicate(timeout=60)
        seconds = time.monotonic() - start
    finally:
        procs[0].kill()
        procs[0].communicate()
    assert procs[1].returncode == EXIT_PEER
    assert "PeerFailed: process(es) 0 did not reach 'together' within 3 s" in out
    assert 3 < seconds < 3 + parallel.LEAVE_ALONE_SECONDS + 15, seconds


JOIN = textwrap.dedent(
    """
    import signal, sys
    from genesis_jax.run import parallel
    signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler would run only after the wait
    print("joining", flush=True)
    parallel.initialize_distributed(f"127.0.0.1:{sys.argv[1]}", 2, 1)
    """
)


@pytest.mark.slow
def test_sigterm_ends_a_process_waiting_for_the_coordinator():
    proc = start_python(["-c", JOIN, str(free_port())], cpu_env())  # process 0 never comes
    assert proc.stdout.readline().strip() == "joining"
    time.sleep(3)  # inside jax.distributed.initialize
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGTERM


NO_COORDINATOR = textwrap.dedent(
    """
    import sys
    from genesis_jax.run import parallel
    try:
        parallel.initialize_distributed(f"127.0.0.1:{sys.argv[1]}", 2, 1, initialization_timeout=3)
    except ConnectionError as err:
        print(err, flush=True)
    """
)


@pytest.mark.slow
def test_a_process_that_finds_no_coordinator_ends_in_one_line():
    port = free_port()  # nobody serves it: process 0 never started
    proc = subprocess.run(
        [sys.executable, "-c", NO_COORDINATOR, str(port)],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]  # before: JAX's fatal error, SIGABRT and a stack trace
    assert proc.stdout.splitlines() == [
        f"no coordinator answered at 127.0.0.1:{port} within 3 s; start process 0 there, or check --coordinator-address"
    ]
    assert "checkpoint" not in proc.stdout + proc.stderr


def test_auto_outside_a_cluster_is_bad_input_not_a_300_s_timeout(monkeypatch):
    """Before: exit 4, "could not join the other processes ... within 300 s", after one second."""
    import jax

    def no_cluster(**_):
        raise ValueError("coordinator_address should be defined.")  # JAX's, when it detects no cluster

    monkeypatch.setattr(jax.distributed, "initialize", no_cluster)
    monkeypatch.setattr(jax.config, "update", lambda *_: None)
    with pytest.raises(ValueError, match=r"^coordinator-address auto: coordinator_address should be defined. \(no "):
        parallel.initialize_distributed("auto", None, None)


def test_the_watch_needs_a_launcher(monkeypatch):
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    assert launcher.exit_with_launcher() is False
