"""Subprocesses for the tests: a fresh Python (the CLI, a worker script, a snippet) started from
the repository root on CPU, and waiting on one without hanging the suite."""

import json
import os
import pathlib
import subprocess
import sys
import time

from genesis_jax.run.launch import with_host_devices

REPO = pathlib.Path(__file__).resolve().parents[2]


def cpu_env(
    *, host_devices: int | None = None, drop_xla_flags: bool = False, compile_cache: bool = True, **extra: str
) -> dict[str, str]:
    """This process's environment with JAX on CPU. `host_devices` splits the CPU into that many
    XLA devices (XLA_FLAGS, read when JAX starts); `drop_xla_flags` clears an inherited forced
    device count (for `genesis-jax launch`, which sets its own per process; the suite's other
    flags stay); `compile_cache=False` compiles with no persistent cache at all, neither the test
    run's shared one nor the command line's user folder (a process whose every write may fail);
    `extra` is added last."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    if not compile_cache:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        env["GENESIS_COMPILE_CACHE"] = "0"
    if drop_xla_flags or host_devices is not None:
        env["XLA_FLAGS"] = with_host_devices(env.get("XLA_FLAGS", ""), host_devices)
    return {**env, **extra}


def start_python(args, env=None) -> subprocess.Popen:
    """`python ARGS` started in the repository root (default environment: `cpu_env()`), with
    stdout and stderr as text pipes."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        env=cpu_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_python(args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`python ARGS` run to the end in the repository root (default environment: `cpu_env()`),
    its output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=cpu_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_until(condition, proc: subprocess.Popen, timeout: float = 120, interval: float = 0.01) -> None:
    """Polls `condition()` until it holds. Fails (with the tail of the process's stderr) if the
    process ends first; kills the process and fails if `timeout` seconds pass."""
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("timed out")
        time.sleep(interval)


def result_of(stdout: str, prefix: str = "RESULT ") -> dict:
    """The JSON a worker script printed on its last line starting with `prefix`."""
    return json.loads([line for line in stdout.splitlines() if line.startswith(prefix)][-1][len(prefix) :])
