"""Data parallelism on 4 forced CPU devices, each scenario in its own process (the device
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
from tests.support.parallel_worker import checksum
from tests.support.processes import cpu_env, result_of, run_python
from tests.support.small_run import ppo_argv

# Every test here starts 4-device or 2-process subprocesses: 26-214 s each.
pytestmark = pytest.mark.slow


def run_worker(*args) -> dict:
    proc = run_python(["-m", "tests.support.parallel_worker", *args], cpu_env(host_devices=4), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_of(proc.stdout)
    assert result["device_count"] == 4
    return result


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "ppo4"
    return run_worker("ppo", str(out)), out


def test_ppo_four_devices_match_one_device(ppo_runs):
    runs, _ = ppo_runs
    one, four = runs["1"], runs["4"]
    assert "'data': 4" in four["param_sharding"] and four["replicas_agree"]
    np.testing.assert_allclose(four["losses"], one["losses"], rtol=2e-4, atol=1e-5)
    # the rollouts themselves are identical: same actions, same episodes
    assert four["returns"][:4] == one["returns"][:4]


@pytest.fixture(scope="module")
def world_model_runs():
    return run_worker("world_model")


def test_world_model_four_devices_match_one_device(world_model_runs):
    runs = world_model_runs
    assert runs["4"]["replicas_agree"]
    np.testing.assert_allclose(runs["4"]["losses"], runs["1"]["losses"], rtol=1e-4)
    np.testing.assert_allclose(runs["4"]["eval"], runs["1"]["eval"], rtol=1e-4)


def test_inf_in_one_shard_makes_every_device_skip_once():
    r = run_worker("inject")
    assert r["shards_holding_inf"] == [2]
    assert not r["grads_finite"] and r["params_unchanged"] and r["replicas_agree"]
    assert r["skipped"] == 1 and r["step"] == 1 and r["scale"] == 2.0**15 and r["scale_replicas_agree"]
    assert r["next_step_finite"] and r["skipped_after_clean_step"] == 1


def test_four_device_checkpoint_resumes_on_one_device(ppo_runs):
    runs, out = ppo_runs
    assert jax.device_count() == 1
    config = PPOConfig(precision="fp16", total_steps=8192, num_envs=8, num_steps=64, seed=1, devices=1)
    resumed = train_ppo(config, out_dir=str(out), resume=True, progress=False)  # already complete: restores only
    assert resumed.summary["total_updates"] == 16 * 16 and len(resumed.metrics) == 16
    assert checksum(resumed.train_state.params) == runs["4"]["param_checksum"]
    longer = train_ppo(
        PPOConfig(**{**config.to_dict(), "total_steps": 12288}), out_dir=str(out), resume=True, progress=False
    )
    assert len(longer.metrics) == 24 and np.isfinite(longer.metrics[-1]["loss"])


# -- several processes -------------------------------------------------------------------

PPO_ARGS = ppo_argv(num_envs=8, num_steps=64, seed=1, devices=4, no_progress=False)
LAUNCH = ["-m", "genesis_jax.cli", "launch", "--processes", "2", "--local-devices", "2"]


def launch(*args, timeout=600) -> subprocess.CompletedProcess:
    return run_python([*LAUNCH, *args], cpu_env(drop_xla_flags=True), timeout=timeout)


@pytest.fixture(scope="module")
def two_process_ppo(tmp_path_factory):
    out = tmp_path_factory.mktemp("mp") / "ppo"
    proc = launch("--", *PPO_ARGS, "--total-steps", "8192", "--checkpoint-every", "4096", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_two_processes_give_the_losses_of_one_process_with_four_devices(ppo_runs, two_process_ppo):
    runs, _ = ppo_runs
    proc, out = two_process_ppo
    rows = metric_rows(out)
    assert [r["update"] for r in rows] == list(range(1, 17))  # written once: no update twice, none lost
    np.testing.assert_allclose([r["loss"] for r in rows], runs["4"]["losses"], rtol=2e-4, atol=1e-5)
    assert [r["return_sum"] for r in rows][:4] == runs["4"]["returns"][:4]
    # Quiet workers: every process's stdout reaches the launcher's, yet one summary line comes.
    assert len([line for line in proc.stdout.splitlines() if line.startswith("PPO CartPole-v1")]) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_updates"] == 16 * 16 and summary["device"].endswith("x4")


def test_a_two_process_checkpoint_restores_on_one_process(two_process_ppo):
    _, out = two_process_ppo
    config = PPOConfig(precision="fp16", total_steps=8192, num_envs=8, num_steps=64, seed=1, devices=1)
    resumed = train_ppo(config, out_dir=str(out), resume=True, progress=False)  # complete: restores and verifies
    assert resumed.summary["total_updates"] == 16 * 16 and len(resumed.metrics) == 16


def test_world_model_on_two_processes_matches_one_process(world_model_runs, tmp_path):
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
    np.testing.assert_allclose([r["train_loss"] for r in rows], world_model_runs["4"]["losses"], rtol=1e-4)
    np.testing.assert_allclose([r["eval_loss"] for r in rows], world_model_runs["4"]["eval"], rtol=1e-4)
