"""Data parallelism on 4 forced CPU devices, every scenario in one other process (the device
count is fixed when JAX starts); the checkpoint written there is restored here, on 1 device.
Then the same runs as 2 processes of 2 devices each (jax.distributed on localhost, gloo),
started by `genesis-jax launch`, against the 1-process 4-device results. Faults across
processes (an inf in one, a killed one): tests/run/test_parallel_faults.py."""

import json
import subprocess

import jax
import numpy as np
import pytest

from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.algos.ppo import train as train_ppo
from tests.support.files import metric_rows
from tests.support.parallel_worker import PPO, PPO_CHECKPOINT_EVERY, checksum
from tests.support.processes import cpu_env, result_of, run_python
from tests.support.small_run import ppo_argv

# Every test here starts 4-device or 2-process subprocesses, or reads their results.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """Every scenario of tests/support/parallel_worker.py, in one 4-device process: its results,
    and the run directory of its 4-device PPO run."""
    out = tmp_path_factory.mktemp("dp") / "ppo4"
    proc = run_python(["-m", "tests.support.parallel_worker", str(out)], cpu_env(host_devices=4), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_of(proc.stdout)
    assert result["device_count"] == 4
    return result, out


def test_ppo_four_devices_match_one_device(four_devices):
    runs = four_devices[0]["ppo"]
    one, four = runs["1"], runs["4"]
    assert "'data': 4" in four["param_sharding"] and four["replicas_agree"]
    assert (one["device"], four["device"]) == ("cpu:cpu x1", "cpu:cpu x4")  # the devices used, of 4 visible
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=2e-4, atol=1e-5)
    # the rollouts themselves are identical: same actions, same episodes
    assert four["returns"][:4] == one["returns"][:4]


def test_world_model_four_devices_match_one_device(four_devices):
    runs = four_devices[0]["world_model"]
    assert runs["4"]["replicas_agree"]
    np.testing.assert_allclose(runs["4"]["losses"], runs["1"]["losses"], rtol=1e-4)
    np.testing.assert_allclose(runs["4"]["eval"], runs["1"]["eval"], rtol=1e-4)


def test_inf_in_one_shard_makes_every_device_skip_once(four_devices):
    r = four_devices[0]["inject"]
    assert r["shards_holding_inf"] == [2]
    assert not r["grads_finite"] and r["params_unchanged"] and r["replicas_agree"]
    assert r["skipped"] == 1 and r["step"] == 1 and r["scale"] == 2.0**15 and r["scale_replicas_agree"]
    assert r["next_step_finite"] and r["skipped_after_clean_step"] == 1


PPO_UPDATES = PPO["total_steps"] // (PPO["num_envs"] * PPO["num_steps"])  # 8, each of 16 optimizer steps


def test_four_device_checkpoint_resumes_on_one_device(four_devices):
    runs, out = four_devices
    assert jax.device_count() == 1
    config = PPOConfig(**PPO, devices=1)
    resumed = train_ppo(config, out_dir=str(out), resume=True, progress=False)  # already complete: restores only
    assert resumed.summary["total_updates"] == PPO_UPDATES * 16 and len(resumed.metrics) == PPO_UPDATES
    assert checksum(resumed.train_state.params) == runs["ppo"]["4"]["param_checksum"]
    longer = train_ppo(
        PPOConfig(**{**config.to_dict(), "total_steps": PPO["total_steps"] * 3 // 2}),
        out_dir=str(out),
        resume=True,
        progress=False,
    )
    assert len(longer.metrics) == PPO_UPDATES * 3 // 2 and np.isfinite(longer.metrics[-1]["loss"])


# -- several processes -------------------------------------------------------------------

PPO_ARGS = ppo_argv(
    num_envs=PPO["num_envs"], num_steps=PPO["num_steps"], seed=PPO["seed"], devices=4, no_progress=False
)
LAUNCH = ["-m", "genesis_jax.cli", "launch", "--processes", "2", "--local-devices", "2"]


def launch(*args, timeout=600) -> subprocess.CompletedProcess:
    return run_python([*LAUNCH, *args], cpu_env(drop_xla_flags=True), timeout=timeout)


@pytest.fixture(scope="module")
def two_process_ppo(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp") / "ppo"
    proc = launch(
        "--",
        *PPO_ARGS,
        "--total-steps",
        str(PPO["total_steps"]),
        "--checkpoint-every",
        str(PPO_CHECKPOINT_EVERY),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_two_processes_give_the_losses_of_one_process_with_four_devices(four_devices, two_process_ppo):
    runs = four_devices[0]["ppo"]
    proc, out = two_process_ppo
    rows = metric_rows(out)
    assert [r["update"] for r in rows] == list(range(1, PPO_UPDATES + 1))  # written once: no update twice, none lost
    np.testing.assert_allclose([r["loss"] for r in rows], runs["4"]["losses"], rtol=2e-4, atol=1e-5)
    assert [r["return_sum"] for r in rows][:4] == runs["4"]["returns"][:4]
    # Quiet workers: every process's stdout reaches the launcher's, yet one summary line comes.
    assert len([line for line in proc.stdout.splitlines() if line.startswith("PPO CartPole-v1")]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_updates"] == PPO_UPDATES * 16 and summary["device"].endswith("x4")


def test_a_two_process_checkpoint_restores_on_one_process(two_process_ppo):
    _, out = two_process_ppo
    resumed = train_ppo(
        PPOConfig(**PPO, devices=1), out_dir=str(out), resume=True, progress=False
    )  # complete: restores and verifies
    assert resumed.summary["total_updates"] == PPO_UPDATES * 16 and len(resumed.metrics) == PPO_UPDATES


def test_world_model_on_two_processes_matches_one_process(four_devices, tmp_path):
    out = tmp_path / "wm"
    proc = launch(
        "--",
        "train",
        "world-model",
        "--precision",
        "fp16",
        "--epochs",
        "3",
        "--batch-size",
        "256",
        "--num-sequences",
        "128",
        "--width",
        "32",
        "--devices",
        "4",
        "--no-progress",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metric_rows(out)
    one_process = four_devices[0]["world_model"]["4"]
    np.testing.assert_allclose([r["train_loss"] for r in rows], one_process["losses"], rtol=1e-4)
    np.testing.assert_allclose([r["eval_loss"] for r in rows], one_process["eval"], rtol=1e-4)
