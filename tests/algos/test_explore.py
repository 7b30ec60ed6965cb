"""Epsilon-greedy, written once (algos/explore.py) for DQN and PQN: the schedule relative to the
run, from the config the command line builds, at several --total-steps; DQN's deprecated
--epsilon-steps (0.3's fixed schedule) and the resume of runs that recorded it; the action."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.dqn import DQNConfig
from genesis_jax.algos.explore import epsilon_greedy
from genesis_jax.cli import parse_train_args, train_config


def cli_config(algo: str, *args: str):
    parts, _ = parse_train_args(algo, ["--precision", "fp32", *args])
    return train_config(algo, parts)


def run_steps(config) -> int:
    """The environment steps (one seed's) a run of `config` takes: whole rows, or whole updates."""
    per_row = getattr(config, "steps_per_row", None) or config.batch_size
    return config.total_steps // per_row * per_row


@pytest.mark.parametrize("algo", ["dqn", "pqn"])
@pytest.mark.parametrize("total", [10_000, 50_000, 500_000])
def test_at_default_settings_exploration_ends_within_the_run_whatever_its_length(algo, total):
    args = ["--total-steps", str(total)] + (["--learning-starts", "1000"] if algo == "dqn" and total <= 10_000 else [])
    config = cli_config(algo, *args)
    start, end = config.epsilon_start, config.epsilon_end
    fraction = {"dqn": 0.5, "pqn": 0.2}[algo]  # CleanRL's exploration fraction; purejaxql's
    assert (start, end, config.epsilon_fraction) == ((1.0, 0.05, fraction) if algo == "dqn" else (1.0, 0.2, fraction))
    assert float(config.epsilon(run_steps(config))) == pytest.approx(end)  # the run's end: exploited
    assert float(config.epsilon(total // 2)) == pytest.approx(end)  # the run's midpoint: the fall is over
    half = fraction * run_steps(config) / 2  # of the steps that run (10,000 PQN steps run as 8,192)
    assert float(config.epsilon(half)) == pytest.approx((start + end) / 2)  # half the fall
    assert float(config.epsilon(0)) == pytest.approx(start)


@pytest.mark.parametrize(("algo", "total"), [("dqn", 2_300), ("pqn", 3_000)])
def test_a_fall_over_the_whole_run_ends_at_its_last_step_where_total_steps_is_not_whole_rows(algo, total):
    # 2,300 DQN steps run as 4 rows of 500: epsilon ended at 0.17, not its end, over the 2,300 asked
    args = ["--total-steps", str(total), "--epsilon-fraction", "1"]
    small = ["--num-envs", "1", "--train-frequency", "1", "--steps-per-row", "500", "--learning-starts", "100"]
    config = cli_config(algo, *args, *(small + ["--target-update-interval", "100"] if algo == "dqn" else []))
    ran = run_steps(config)
    assert ran < total and config.epsilon_horizon == ran
    assert float(config.epsilon(ran)) == pytest.approx(config.epsilon_end)
    assert float(config.epsilon(ran - 1)) > config.epsilon_end


@pytest.mark.parametrize("algo", ["dqn", "pqn"])
def test_epsilon_once_fallen_is_its_end_exactly_and_its_start_at_zero(algo):
    # start + 1 * (end - start) in float32 was 0.050000012, which the rows wrote for epsilon-end 0.05
    config = cli_config(algo, "--total-steps", "50000", "--epsilon-end", "0.05", "--epsilon-start", "0.9")
    assert config.epsilon(jnp.int32(50_000)) == jnp.float32(0.05)
    assert config.epsilon(jnp.int32(0)) == jnp.float32(0.9)


@pytest.mark.parametrize("algo", ["dqn", "pqn"])
def test_the_fraction_given_sets_the_fall(algo):
    config = cli_config(algo, "--total-steps", "100000", "--epsilon-fraction", "0.8", "--epsilon-end", "0.1")
    fall = 0.8 * run_steps(config)  # DQN runs all 100,000 steps, PQN 98,304 (48 rollouts of 2,048)
    assert config.epsilon_horizon == pytest.approx(fall) and fall == pytest.approx(
        80_000 if algo == "dqn" else 78_643.2
    )
    assert float(config.epsilon(fall / 2)) == pytest.approx(0.55) and float(config.epsilon(fall)) == pytest.approx(0.1)


def test_dqns_deprecated_epsilon_steps_is_accepted_with_one_warning():
    with pytest.warns(FutureWarning, match="epsilon-steps is deprecated") as caught:
        config = cli_config("dqn", "--total-steps", "50000", "--epsilon-steps", "20000")
    assert len(caught) == 1 and "epsilon-fraction 0.4 is the same schedule" in str(caught[0].message)
    assert config.epsilon_horizon == 20_000 and float(config.epsilon(20_000)) == pytest.approx(0.05)
    assert float(config.epsilon(10_000)) == pytest.approx(0.525)


def test_dqns_epsilon_steps_and_epsilon_fraction_together_are_refused_not_one_ignored():
    # epsilon-steps won without a word, while summary.json recorded the fraction given
    said = r"epsilon-steps 2000 and epsilon-fraction 0.1 \(given, or a preset's\) both set epsilon's schedule"
    with pytest.raises(ValueError, match=said):
        cli_config("dqn", "--epsilon-steps", "2000", "--epsilon-fraction", "0.1")


def test_a_run_that_recorded_epsilon_steps_resumes_on_its_own_schedule():
    # 0.3's runs recorded epsilon-steps (250000 by default): at its default budget the fraction gives the same.
    DQNConfig().check_resume({"epsilon_steps": 250_000, "total_steps": 500_000})
    with pytest.raises(ValueError, match="resume with --epsilon-steps 250000 to keep that schedule"):
        DQNConfig(total_steps=300_000).check_resume({"epsilon_steps": 250_000, "total_steps": 300_000})
    with pytest.warns(FutureWarning):
        extended = DQNConfig(total_steps=600_000, epsilon_steps=250_000)
    extended.check_resume({"epsilon_steps": 250_000, "total_steps": 300_000})  # a longer run, the same schedule
    # A run without it is not held to one (its fields are compared as settings), until one side gives it.
    DQNConfig(total_steps=600_000).check_resume({"epsilon_fraction": 0.5, "total_steps": 300_000})
    with pytest.raises(ValueError, match="falls over its first 150000 environment steps, these settings over 250000"):
        extended.check_resume({"epsilon_fraction": 0.5, "total_steps": 300_000})


def test_epsilon_greedy_explores_at_the_rate_asked_and_exploits_otherwise():
    q = jnp.tile(jnp.array([[0.0, 5.0, 1.0, 2.0]]), (20_000, 1))
    keys = jax.random.split(jax.random.PRNGKey(0))
    greedy = np.asarray(epsilon_greedy(*keys, q, 0.0))
    assert (greedy == 1).all()
    actions = np.asarray(epsilon_greedy(*keys, q, 0.4))
    # 40% of the rows draw uniformly from 4 actions (one of them the greedy one): 30% not greedy.
    assert np.mean(actions != 1) == pytest.approx(0.3, abs=0.01)
    assert set(np.unique(actions)) == {0, 1, 2, 3}
