"""`genesis-jax launch`: one training command as several JAX processes on this machine.

Each process is `genesis-jax <command> --coordinator-address 127.0.0.1:PORT --num-processes N
--process-id i`; `jax.distributed` joins them into one mesh (on CPU, each process gets
`--local-devices` forced host devices and the processes talk through gloo). Process 0 prints,
logs and writes the run; the others print nothing, and their stderr (the runtime's own
messages) is kept aside and shown only if they fail.

When a process ends badly, the launcher names it, gives the others a bounded time to stop
on their own (JAX's coordination service stops them once a peer's heartbeat is gone), ends
those that are still running, and exits with 4 (a system failure), or with the failed
process's own status for bad input (2) or a divergence (3). SIGINT / SIGTERM are passed on to
every process, which save a checkpoint and stop at the same update.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from genesis_jax.run.signals import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_SYSTEM


def free_port() -> int:
    """A TCP port nobody listens on right now (for the coordinator)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_commands(command: list[str], processes: int, port: int) -> list[list[str]]:
    """The argv of every process: the command plus its place in the group."""
    if not command or command[0] != "train":
        raise ValueError(f"launch runs a 'train ...' command, got {' '.join(command) or 'nothing'!r}")
    if any(a.startswith(("--coordinator-address", "--num-processes", "--process-id")) for a in command):
        raise ValueError("launch sets --coordinator-address, --num-processes and --process-id itself; leave them out")
    base = [sys.executable, "-m", "genesis_jax.cli", *command]
    return [
        base + ["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", str(processes), "--process-id", str(i)]
        for i in range(processes)
    ]


def process_env(local_devices: int | None) -> dict:
    env = dict(os.environ)
    if local_devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={local_devices}"])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _describe(status: int) -> str:
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def _tail(path: str, lines: int = 8) -> str:
    with open(path, errors="replace") as f:
        kept = [line.rstrip() for line in f if line.strip() and not line.startswith("    @ ")]
    return "\n".join(kept[-lines:])


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
        port: the coordinator's port (default: a free one).
        grace_seconds: how long the others may take to stop after one failed.
    """
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    if local_devices is not None and local_devices < 1:
        raise ValueError(f"local-devices must be >= 1, got {local_devices}")
    argvs = process_commands(command, processes, port or free_port())
    env = process_env(local_devices)
    logs = [None] + [
        tempfile.NamedTemporaryFile("w+", prefix=f"genesis-launch-{i}-", suffix=".log", delete=False)
        for i in range(1, processes)
    ]
    procs = []
    for i, argv in enumerate(argvs):
        procs.append(subprocess.Popen(argv, env=env, stderr=logs[i]))
    print(
        f"genesis-jax launch: {processes} processes, pids {' '.join(str(p.pid) for p in procs)}",
        file=sys.stderr,
        flush=True,
    )

    def forward(signum, frame):
        del frame
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _supervise(procs, logs, grace_seconds)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs[1:]:
            log.close()
            os.unlink(log.name)


def _supervise(procs, logs, grace_seconds: float) -> int:
    """Waits for every process; on the first bad end, stops the rest within `grace_seconds`."""
    while True:
        statuses = [p.poll() for p in procs]
        failed = [i for i, s in enumerate(statuses) if s not in (None, 0)]
        if failed or all(s is not None for s in statuses):
            break
        time.sleep(0.1)
    if not failed:
        return 0
    first = failed[0]
    deadline = time.monotonic() + grace_seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    stragglers = [i for i, p in enumerate(procs) if p.poll() is None]
    for i in stragglers:
        procs[i].kill()
        procs[i].wait()
    status = procs[first].returncode
    message = f"genesis-jax launch: process {first} {_describe(status)}"
    if stragglers:
        message += f"; stopped process(es) {', '.join(map(str, stragglers))} after {grace_seconds:g} s"
    others = [i for i in range(len(procs)) if i != first and i not in stragglers]
    if others:
        message += f"; process(es) {', '.join(map(str, others))} stopped on their own"
    if first > 0 and logs[first] is not None:
        logs[first].flush()
        tail = _tail(logs[first].name)
        if tail:
            print(f"process {first}'s last output:\n{tail}", file=sys.stderr)
    if status in (EXIT_BAD_INPUT, EXIT_DIVERGED):
        print(message, file=sys.stderr, flush=True)
        return status
    if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        print(message + " (stopped by a signal; continue with the same command and --resume)", file=sys.stderr)
        return status
    print(
        message + ". Continue from the last checkpoint with the same command and --resume", file=sys.stderr, flush=True
    )
    return EXIT_SYSTEM
