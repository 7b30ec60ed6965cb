"""Faults across processes of one run (jax.distributed on localhost, gloo): an inf in one
process's gradients makes every process skip the same step, and a killed process stops the
other in bounded time, both resuming. (Apart from tests/run/test_parallel.py, whose runs these
do not need: the test files spread over the suite's workers.)"""

import os
import re
import signal
import time

import pytest

from genesis_jax.run.checkpoint import CheckpointStore
from genesis_jax.run.launch import free_port
from tests.run.test_parallel import LAUNCH, PPO_ARGS, launch
from tests.support.files import metric_rows
from tests.support.processes import cpu_env, result_of, start_python

# Every test here starts 2-process subprocesses.
pytestmark = pytest.mark.slow


def test_an_inf_in_one_process_makes_both_skip_the_same_step():
    port = free_port()
    env = cpu_env(host_devices=2)
    procs = [
        start_python(["-m", "tests.support.multiprocess_worker", f"127.0.0.1:{port}", str(i)], env) for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[1][1][-2000:]
    seen = [result_of(out) for out, _ in outs]
    assert [s["process"] for s in seen] == [0, 1] and all(s["devices"] == 4 and s["local_devices"] == 2 for s in seen)
    expected = [
        {"grads_finite": True, "skipped": 0, "scale": 2.0**16},
        {"grads_finite": False, "skipped": 1, "scale": 2.0**15},
        {"grads_finite": True, "skipped": 1, "scale": 2.0**15},
    ]
    assert seen[0]["steps"] == seen[1]["steps"] == expected
    assert seen[0]["params"] == seen[1]["params"]


def test_a_killed_process_stops_the_other_in_bounded_time_and_both_resume(tmp_path):
    out = tmp_path / "killed"
    args = [*PPO_ARGS, "--checkpoint-every", "1024", "--heartbeat-timeout", "10", "--no-progress", "--out", str(out)]
    env = cpu_env(drop_xla_flags=True)
    proc = start_python([*LAUNCH, "--grace", "60", "--", *args, "--total-steps", "400000"], env)
    pids = [int(p) for p in re.search(r"pids (\d+) (\d+)", proc.stderr.readline()).groups()]
    checkpoints = out / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints.exists() and any(p.name.isdigit() for p in checkpoints.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    os.kill(pids[1], signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = proc.communicate(timeout=120)
    waited = time.monotonic() - killed_at
    assert proc.returncode == 4, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("genesis-jax launch: process")][-1]
    # Process 0 noticed on its own (JAX's heartbeat), well before the launcher's 60 s grace.
    assert "process 1 was killed by SIGKILL" in line and "0 stopped on their own" in line and "--resume" in line, line
    assert waited < 45, waited
    with CheckpointStore(checkpoints) as store:
        last = store.latest_step()  # in updates of 512 steps
    # 4 updates more: 2 checkpoints of the resumed run's own
    resumed = launch("--", *args, "--total-steps", str((last + 4) * 512), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["update"] for r in metric_rows(out)] == list(range(1, last + 5))  # none twice, none lost
