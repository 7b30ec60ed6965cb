"""PPO end to end on tiny budgets: learning, determinism, outputs, mismatch, the CLI."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from genesis_jax.algos import get_algorithm
from genesis_jax.algos.ppo import PPOConfig, train
from genesis_jax.cli import main
from tests.support.processes import run_python

SUMMARY_KEYS = {
    "env",
    "precision",
    "rollout_precision",
    "seed",
    "total_steps",
    "final_return",
    "steps_per_second",
    "compile_seconds",
    "wall_seconds",
    "loss_scale",
    "skipped_updates",
    "total_updates",
    "overflow_rate",
    "mismatch_kl_v1",
    "mismatch_kl_v2",
    "device",
}


def early_and_late_return(rows, k=5):
    def mean(rs):
        eps = sum(r["episodes"] for r in rs)
        return sum(r["return_sum"] for r in rs) / max(eps, 1)

    return mean(rows[:k]), mean(rows[-k:])


@pytest.fixture(scope="module")
def gymnax_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo") / "run"
    # eval_episodes=0 here and below: no greedy evaluation after training (its own compile), which
    # tests/e2e/test_eval.py and tests/algos/test_dqn.py check; these tests read the training's rows
    config = PPOConfig(env="CartPole-v1", precision="fp16", total_steps=61_440, lr=1e-3, seed=0, eval_episodes=0)
    return train(config, out_dir=str(out), progress=False), out


@pytest.mark.slow  # the gymnax_run fixture, a 61,440-step learning run: 20-25 s on 2 cores
def test_gymnax_path_improves_cartpole(gymnax_run):
    result, _ = gymnax_run
    assert_timing_is_plausible(result.summary)
    early, late = early_and_late_return(result.metrics)
    assert late > 2 * early and late > 100, (early, late)


@pytest.mark.slow  # the gymnax_run fixture, a 61,440-step learning run: 20-25 s on 2 cores
def test_outputs_written(gymnax_run):
    result, out = gymnax_run
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["total_updates"] == 120 * 16  # 120 iterations x 4 epochs x 4 minibatches
    assert summary["skipped_updates"] == int(result.train_state.skipped)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 120
    assert sum(json.loads(line)["skipped"] for line in lines) == summary["skipped_updates"]
    assert (out / "ppo.png").stat().st_size > 1000
    assert (out / "checkpoints").is_dir()


@pytest.mark.slow  # three trainings of one program (tests/support/small_run.py's SMALL: the seed is no part of it)
def test_same_seed_same_result():
    config = PPOConfig(env="CartPole-v1", precision="fp16", total_steps=2048, seed=3, eval_episodes=0)
    a = train(config, progress=False)
    b = train(config, progress=False)
    c = train(dataclasses.replace(config, seed=4), progress=False)
    jax.tree.map(np.testing.assert_array_equal, a.train_state.params, b.train_state.params)
    assert [r["loss"] for r in a.metrics] == [r["loss"] for r in b.metrics]
    assert [r["loss"] for r in a.metrics] != [r["loss"] for r in c.metrics]


@pytest.mark.slow  # learning run on host (gymnasium) environments: 19 s
@pytest.mark.long  # (the gymnax path learns in this file's gymnax_run, every run)
def test_gymnasium_path_improves_cartpole():
    config = PPOConfig(
        env="CartPole-v1", env_backend="gymnasium", precision="fp16", total_steps=30_720, lr=1e-3, seed=0
    )
    result = train(config, progress=False)
    early, late = early_and_late_return(result.metrics)
    assert result.summary["env_backend"] == "gymnasium"
    assert late > 1.5 * early, (early, late)
    assert_timing_is_plausible(result.summary)


def assert_timing_is_plausible(s):
    """steps/s counts the time the chunks ran: within the wall time outside compilation, and
    not a sliver of it (set-up, checkpoint saves and the rest take the remainder)."""
    running = s["total_steps"] * s["num_seeds"] / s["steps_per_second"]
    assert 0.05 * (s["wall_seconds"] - s["compile_seconds"]) <= running <= s["wall_seconds"] - s["compile_seconds"], s


@pytest.mark.slow  # two trainings: 20 s
def test_mismatch_zero_for_same_precision_and_visible_for_bf16_rollout():
    base = dict(env="CartPole-v1", total_steps=8192, seed=1, eval_episodes=0)
    same = train(PPOConfig(precision="fp32", **base), progress=False).summary
    mixed = train(PPOConfig(precision="fp32", rollout_precision="bf16", **base), progress=False).summary
    assert abs(same["mismatch_kl_v1"]) < 1e-6 and same["mismatch_kl_v2"] < 1e-6
    assert mixed["rollout_precision"] == "bf16"
    # measured: bf16 rollout kl_v2 ~7e-8 and max |dp| ~1e-3 at this budget; fp32 gives 0
    assert mixed["mismatch_kl_v2"] > 1e-9 and mixed["mismatch_max_dp"] > 1e-4
    assert mixed["mismatch_kl_v2"] > 1000 * max(same["mismatch_kl_v2"], 1e-15)


@pytest.mark.slow  # 12 s
def test_continuous_actions_run():
    result = train(
        PPOConfig(env="Pendulum-v1", precision="bf16", total_steps=2048, num_envs=4, num_steps=256, eval_episodes=0),
        progress=False,
    )
    assert np.isfinite(result.summary["final_return"]) and result.summary["total_updates"] == 2 * 16


def test_float_image_observations_train_the_cnn_from_the_command_line(tmp_path):
    # Box(0.0, 1.0, (10, 10, 3), float32) observations: once flattened, so that --network cnn was refused;
    # 2 updates of 2 minibatch steps
    env, out = "tests.support.custom_envs:ProbeFloatImage-v0", tmp_path / "run"
    tiny = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "1"]
    argv = ["train", "ppo", "--env", env, "--network", "cnn", *tiny, "--total-steps", "64", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"] == env and summary["total_updates"] == 2 * 2 and np.isfinite(summary["final_return"])


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "ppo", "--env", "CartPol-v1"], "did you mean CartPole-v1"),
        (["train", "ppo", "--precision", "fp8"], "unknown precision 'fp8'"),
        (["train", "ppo", "--total-steps", "0"], "total-steps must be a positive integer"),
        (["train", "ppo", "--num-minibatches", "3"], "not divisible into 3 minibatches"),
        # minibatches of 1 transition: each advantage normalised to 0, the policy loss 0 every step, unsaid
        (
            ["train", "ppo", "--num-envs", "1", "--num-steps", "8", "--num-minibatches", "8", "--total-steps", "64"],
            "is 1 transition each",
        ),
        (["train", "ppo", "--env-backend", "gymnax", "--env", "LunarLander-v3"], "gymnax has no environment"),
    ],
)
def test_cli_bad_input_one_line_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_a_resume_allowed_to_change_settings_is_refused_minibatches_of_one(tmp_path, capsys):
    # a resume is built as its run ran (a setting refused since still resumes); a changed one is a new choice
    out, run = tmp_path / "run", ["train", "ppo", "--num-envs", "1", "--num-steps", "8", "--update-epochs", "1"]
    assert main([*run, "--num-minibatches", "2", "--total-steps", "16", "--out", str(out), "--no-progress"]) == 0
    more = [*run, "--total-steps", "32", "--out", str(out), "--resume", "--allow-config-change", "--no-progress"]
    assert main([*more, "--num-minibatches", "8"]) == 2
    assert "is 1 transition each" in capsys.readouterr().err
    assert main([*more, "--num-minibatches", "2"]) == 0  # the run itself resumes


@pytest.mark.slow  # the gymnax_run fixture, a 61,440-step learning run: 20-25 s on 2 cores
def test_cli_refuses_existing_run_and_exits_2_in_a_real_process(gymnax_run):
    _, out = gymnax_run
    before = (out / "summary.json").read_text()
    proc = run_python(["-m", "genesis_jax.cli", "train", "ppo", "--out", str(out), "--total-steps", "512"], timeout=120)
    assert proc.returncode == 2
    assert "holds another run" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (out / "summary.json").read_text() == before


def test_an_update_whose_every_step_was_skipped_logs_no_loss_rather_than_zero():
    """Every gradient non-finite (fault injection at rate 1, the guard off): no step was applied,
    so the row's loss and gradient norm are None (null in metrics.jsonl, as DQN's), not the 0.0
    an empty mean once gave while the value loss beside it read 43."""
    from tests.support.registry import tiny_config

    config = tiny_config("ppo", precision="fp16", inject_nonfinite=1.0, guard_min_scale=None)
    config = dataclasses.replace(config, max_consecutive_skips=None)
    result = train(config, progress=False)
    assert result.metrics and all(row["skipped"] > 0 for row in result.metrics)
    assert all(row["loss"] is None and row["grad_norm"] is None for row in result.metrics)  # null in the file
    assert all(np.isfinite(row["value_loss"]) for row in result.metrics)
    # of several seeds, one whose every step was skipped leaves the others' values in the row
    from genesis_jax.algos.base import metric_columns
    from genesis_jax.algos.ppo.train import PPO

    columns = metric_columns(
        {"loss": [[np.nan, 1.0], [2.0, 3.0]], "grad_norm": [[np.nan, 4.0], [6.0, 8.0]]}, PPO.metrics, 2
    )
    assert columns == {"loss": [2.0, 2.0], "grad_norm": [6.0, 6.0]}


@pytest.mark.parametrize(("rollout", "shown"), [("bf16", "[fp32, rollout bf16]"), ("fp32", "[fp32]")])
def test_the_result_line_names_a_rollout_precision_other_than_the_learners(rollout, shown):
    # `--precision fp32 --rollout-precision bf16` printed "PPO CartPole-v1 [fp32]": the run acted in bf16
    ppo = get_algorithm("ppo")
    summary = dict(env="CartPole-v1", precision="fp32", rollout_precision=rollout, final_return=9.0)
    summary |= dict(steps_per_second=1.0, compile_seconds=1.0, loss_scale=1.0, skipped_updates=0, total_updates=4)
    assert ppo.describe(object.__new__(ppo), summary).startswith(f"PPO CartPole-v1 {shown} final_return=9.0 ")
