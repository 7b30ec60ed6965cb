"""Data parallelism on 4 forced CPU devices, each scenario in its own process (the device
count is fixed when JAX starts); the checkpoint written there is restored here, on 1 device."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from genesis_jax.ppo import PPOConfig
from genesis_jax.ppo import train as train_ppo
from tests.parallel_worker import checksum

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_worker(*args) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    proc = subprocess.run([sys.executable, "-m", "tests.parallel_worker", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
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


def test_world_model_four_devices_match_one_device():
    runs = run_worker("world_model")
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
    longer = train_ppo(PPOConfig(**{**config.to_dict(), "total_steps": 12288}), out_dir=str(out), resume=True, progress=False)
    assert len(longer.metrics) == 24 and np.isfinite(longer.metrics[-1]["loss"])
