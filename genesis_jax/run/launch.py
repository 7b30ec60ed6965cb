"""`genesis-jax launch`: one training command as several JAX processes on this machine.

Each process is `genesis-jax <command> --coordinator-address 127.0.0.1:PORT --num-processes N
--process-id i`; `jax.distributed` joins them into one mesh (on CPU, each process gets
`--local-devices` forced host devices and the processes talk through gloo; on a machine with
GPUs, each process gets its own contiguous share of them through CUDA_VISIBLE_DEVICES).
Process 0 prints, logs and writes the run; the others print nothing, and their stderr (the
runtime's own messages) is kept aside and shown only if they fail.

Every input is checked before any process starts: a coordinator port out of range or already
in use is refused in one line (exit status 2). The processes die with the launcher: on Linux
the kernel sends them SIGTERM when it ends (`PR_SET_PDEATHSIG`), and elsewhere a thread in
each process watches the launcher's pid (`exit_with_launcher`).

When a process ends badly, the launcher names it, gives the others a bounded time to stop
on their own (JAX's coordination service stops them once a peer's heartbeat is gone), ends
those that are still running, and exits with 4 (a system failure), or with the failed
process's own status for bad input (2) or a divergence (3). A process that stopped only
because another one failed (status 5) is not the one named. SIGINT / SIGTERM are passed on
to every process, which save a checkpoint and stop at the same update.

This module loads no JAX: the launcher and the command line's argument checks stay fast.
"""

from __future__ import annotations

import errno
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from genesis_jax.run.signals import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_PEER, EXIT_SYSTEM, handling_signals

LAUNCHER_PID_ENV = "GENESIS_LAUNCHER_PID"  # set in every process the launcher starts
# After the launcher is gone, a process gets this long to stop cleanly (a final checkpoint,
# whose first save may compile) before it ends itself.
ORPHAN_GRACE_SECONDS = 30.0


# -- the coordinator's address --------------------------------------------------------------


def parse_coordinator_address(text: str) -> tuple[str, int]:
    """(host, port) of a `host:port` coordinator address (`[v6 address]:port` too); the host
    must resolve. Raises ValueError naming the bad part."""
    host, sep, port_text = str(text).rpartition(":")
    if not sep or not host:
        raise ValueError(f"coordinator-address must be host:port, such as 10.0.0.1:1234, got {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"coordinator-address {text!r}: the port {port_text!r} is not a number") from None
    check_port(port, f"coordinator-address {text!r}: the port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise ValueError(f"coordinator-address {text!r}: the host {host!r} cannot be resolved") from None
    return host, port


def check_port(port: int, what: str = "port") -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} must lie in 1..65535, got {port}")


def port_in_use(port: int) -> bool:
    """Whether something on this machine listens on (or holds) TCP `port`. The coordinator
    binds every address ([::]:port), so the probe does the same."""
    for family, address in ((socket.AF_INET6, ("::", port)), (socket.AF_INET, ("0.0.0.0", port))):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine: the IPv4 probe decides
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is no conflict
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(address)
                return False
            except OSError as err:  # but for EADDRINUSE, this family cannot bind here (no such address): try the other
                if err.errno == errno.EADDRINUSE:
                    return True
    return False


def check_port_free(port: int, advice: str) -> None:
    """Refuses a coordinator port something else holds, in one line ending with `advice`."""
    if port_in_use(port):
        raise ValueError(f"coordinator port {port} is in use; {advice}")


def free_port() -> int:
    """A TCP port nobody listens on right now (for the coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the processes' commands and environments -------------------------------------------------


def process_commands(command: list[str], processes: int, port: int) -> list[list[str]]:
    """The argv of every process: the command plus its place in the group."""
    if len(command) < 2 or command[0] != "train" or command[1].startswith("-"):
        raise ValueError(f"launch runs a 'train WORKLOAD ...' command, got {' '.join(command) or 'nothing'!r}")
    if any(a.startswith(("--coordinator-address", "--num-processes", "--process-id")) for a in command):
        raise ValueError("launch sets --coordinator-address, --num-processes and --process-id itself; leave them out")
    base = [sys.executable, "-m", "genesis_jax.cli", *command]
    return [
        base + ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", str(processes), "--process-id", str(i)]
        for i in range(processes)
    ]


HOST_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def with_host_devices(xla_flags: str, count: int | None) -> str:
    """`xla_flags` with its forced host (CPU) device count replaced by `count` (None: left out)."""
    flags = [f for f in xla_flags.split() if HOST_DEVICE_COUNT_FLAG.lstrip("-") not in f]
    return " ".join(flags + ([] if count is None else [f"{HOST_DEVICE_COUNT_FLAG}={count}"]))


def process_env(local_devices: int | None, visible_devices: str | None = None) -> dict:
    """One process's environment: this one's, plus its forced host devices (CPU), its share of
    the GPUs (None: CUDA_VISIBLE_DEVICES as inherited) and the launcher's pid."""
    env = dict(os.environ)
    if local_devices is not None:
        env["XLA_FLAGS"] = with_host_devices(env.get("XLA_FLAGS", ""), local_devices)
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    env["PYTHONUNBUFFERED"] = "1"
    env[LAUNCHER_PID_ENV] = str(os.getpid())
    return env


def split_visible_devices(visible: str | None, num_gpus: int, num_processes: int) -> list[str | None]:
    """Each process's CUDA_VISIBLE_DEVICES: N contiguous, equal parts of the visible GPUs.

    `visible` is the launcher's CUDA_VISIBLE_DEVICES (a comma-separated list of ids or UUIDs;
    None when unset), `num_gpus` the GPUs the machine has (used only when `visible` is None).
    None for a process means "leave it as inherited": no GPUs (a CPU-only machine, or
    CUDA_VISIBLE_DEVICES set to nothing), or a single process. Raises ValueError when the GPUs
    do not divide evenly over the processes.

    >>> split_visible_devices("4,5,6,7", 0, 2)
    ['4,5', '6,7']
    >>> split_visible_devices(None, 4, 4)
    ['0', '1', '2', '3']
    >>> split_visible_devices(None, 0, 2)
    [None, None]
    """
    ids = [str(i) for i in range(num_gpus)] if visible is None else [p.strip() for p in visible.split(",") if p.strip()]
    if num_processes == 1 or not ids:
        return [None] * num_processes
    if len(ids) % num_processes:
        source = f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "this machine's"
        raise ValueError(
            f"{len(ids)} GPUs ({source}) do not split evenly over {num_processes} processes; "
            "choose a number of processes that divides them, or set CUDA_VISIBLE_DEVICES"
        )
    share = len(ids) // num_processes
    return [",".join(ids[i * share : (i + 1) * share]) for i in range(num_processes)]


def count_gpus() -> int:
    """NVIDIA GPUs on this machine, counted with `nvidia-smi -L` (0 without it): no JAX in the launcher."""
    try:  # a failed listing (CalledProcessError) is a SubprocessError too
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))


def visible_device_shares(processes: int, env=os.environ) -> list[str | None]:
    """`split_visible_devices` for this machine; nothing is split when JAX_PLATFORMS leaves GPUs out."""
    platforms = env.get("JAX_PLATFORMS", "")
    if platforms and not any(p in platforms for p in ("cuda", "gpu")):
        return [None] * processes
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return split_visible_devices(visible, count_gpus() if visible is None and processes > 1 else 0, processes)


# -- dying with the launcher --------------------------------------------------------------------


def _die_with_parent():
    """A `preexec_fn`: the child gets SIGTERM when the launcher ends (Linux), and ends at once
    if the launcher already ended between fork and exec. None where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before fork: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def exit_with_launcher(grace_seconds: float = ORPHAN_GRACE_SECONDS, interval: float = 0.5) -> bool:
    """In a process the launcher started: a daemon thread that, once the launcher is gone,
    sends this process SIGTERM (a clean stop where the run can take one) and ends it after
    `grace_seconds` if it is still there. Returns whether the watch started (no launcher: no)."""
    launcher = os.environ.get(LAUNCHER_PID_ENV, "")
    if not launcher.isdigit():
        return False
    launcher_pid = int(launcher)

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        print("genesis-jax: the launcher is gone; ending this process", file=sys.stderr, flush=True)
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="genesis-launcher-watch", daemon=True).start()
    return True


# -- the launcher -------------------------------------------------------------------------------


def _tail(path: str) -> str:
    """The last 8 lines of a log that say something (the runtime's stack frames left out)."""
    with open(path, errors="replace") as f:
        kept = [line.rstrip() for line in f if line.strip() and not line.startswith("    @ ")]
    return "\n".join(kept[-8:])


def _out_dir(command: list[str]) -> str | None:
    """The train command's --out, if any."""
    for i, arg in enumerate(command):
        if arg == "--out" and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--out="):
            return arg[len("--out=") :]
    return None


def _has_checkpoint(out: str | None) -> bool:
    checkpoints = pathlib.Path(out) / "checkpoints" if out else None
    return bool(checkpoints and checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()))


def launch(
    command: list[str],
    processes: int,
    local_devices: int | None = None,
    port: int | None = None,
    grace_seconds: float = 60.0,
) -> int:
    """Runs `command` (a `genesis-jax train ...` argv) as `processes` processes; returns the exit status.

    Args:
        command: the genesis-jax arguments, e.g. ["train", "ppo", "--devices", "4", ...].
        processes: how many processes.
        local_devices: forced host (CPU) devices per process; None leaves XLA_FLAGS alone.
        port: the coordinator's port (default: a free one); refused if something holds it.
        grace_seconds: how long the others may take to stop after one failed.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if local_devices is not None and local_devices < 1:
        raise ValueError(f"local-devices must be >= 1, got {local_devices}")
    if grace_seconds < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace_seconds:g}")
    if port is not None:
        check_port(port)
        check_port_free(port, "choose another with --port, or leave --port out for a free one")
    argvs = process_commands(command, processes, port or free_port())
    shares = visible_device_shares(processes)
    logs = [None] + [
        tempfile.NamedTemporaryFile("w+", prefix=f"genesis-launch-{i}-", suffix=".log", delete=False)
        for i in range(1, processes)
    ]
    preexec = _die_with_parent()
    procs = [  # started from this (the main) thread: PR_SET_PDEATHSIG follows the thread
        subprocess.Popen(argv, env=process_env(local_devices, share), stderr=log, preexec_fn=preexec)
        for argv, share, log in zip(argvs, shares, logs)
    ]
    pids = " ".join(str(p.pid) for p in procs)
    print(f"genesis-jax launch: {processes} processes, pids {pids}", file=sys.stderr, flush=True)

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    try:
        with handling_signals(forward):
            return _supervise(procs, logs, grace_seconds, _out_dir(command))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs[1:]:
            log.close()
            os.unlink(log.name)


def _origin(procs, failed_first: list[int]) -> int:
    """The failed process to name: of those that failed first (`failed_first`), then of
    all, the first that did not stop only because another one failed (EXIT_PEER)."""
    failed_later = [i for i, p in enumerate(procs) if p.returncode not in (None, 0) and i not in failed_first]
    own = [i for i in failed_first + failed_later if procs[i].returncode != EXIT_PEER]
    return (own or failed_first)[0]


def _supervise(procs, logs, grace_seconds: float, out: str | None) -> int:
    """Waits for every process; on the first bad end, stops the rest within `grace_seconds`."""
    while True:
        statuses = [p.poll() for p in procs]
        failed = [i for i, s in enumerate(statuses) if s not in (None, 0)]
        if failed or all(s is not None for s in statuses):
            break
        time.sleep(0.1)
    if not failed:
        return 0
    deadline = time.monotonic() + grace_seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    stragglers = [i for i, p in enumerate(procs) if p.poll() is None]
    first = _origin(procs, failed)  # before the stragglers are killed: they did not fail on their own
    for i in stragglers:
        procs[i].kill()
        procs[i].wait()
    status = procs[first].returncode
    ended = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
    message = f"genesis-jax launch: process {first} {ended}"
    if stragglers:
        message += f"; stopped process(es) {', '.join(map(str, stragglers))} after {grace_seconds:g} s"
    others = [i for i in range(len(procs)) if i != first and i not in stragglers]
    if others:
        message += f"; process(es) {', '.join(map(str, others))} stopped on their own"
    if first > 0:  # process 0 writes to the launcher's stderr; the others to their logs
        tail = _tail(logs[first].name)
        if tail:
            print(f"process {first}'s last output:\n{tail}", file=sys.stderr)
    if status not in (EXIT_BAD_INPUT, EXIT_DIVERGED):  # those the process's own message explains
        resume = "continue with the same command and --resume" if _has_checkpoint(out) else "run the command again"
        if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            message += f" (stopped by a signal; {resume})"
        else:
            message, status = f"{message}. To go on, {resume}", EXIT_SYSTEM
    print(message, file=sys.stderr, flush=True)
    return status
