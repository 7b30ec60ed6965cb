"""DQN on the template: the loop's invariants on a tiny run (gymnax, and gymnasium on the host
path, ALE Atari's uint8 frames included), the TD target against a numpy reference, the target
network's updates, learning CartPole on a CPU budget, bad input (SIGKILL and resume: tests/algos/test_registry.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.dqn import DQN, DQNConfig, train
from genesis_jax.algos.dqn.train import td_targets
from genesis_jax.cli import main
from tests.support.helpers import tree_equal

TINY = dict(
    total_steps=2_000,
    num_envs=2,
    train_frequency=2,
    steps_per_row=200,
    learning_starts=500,
    buffer_size=1_000,
    batch_size=32,
    target_update_interval=100,
    hidden=(16,),
)  # epsilon falls over the first half (1000 steps): the default epsilon-fraction


@pytest.fixture(scope="module")
def tiny_run():
    return train(DQNConfig(**TINY), progress=False)


@pytest.mark.slow  # the tiny run compiles the whole loop: 10-15 s on 2 cores
def test_tiny_run_counts_updates_fills_the_buffer_and_follows_the_schedule(tiny_run):
    config, rows, state = DQNConfig(**TINY), tiny_run.metrics, tiny_run.state
    iterations = np.arange(1, config.total_steps // config.train_frequency + 1)
    expected_updates = int(np.sum(iterations * config.train_frequency > config.learning_starts))
    assert int(state.train_state.step) == expected_updates == sum(r["updates"] for r in rows) == 750
    # each row's own: none before learning starts at step 500, then 50 (steps 502-600), then 100 a row
    assert [r["updates"] for r in rows] == [0, 0, 50] + [100] * 7
    assert int(state.steps) == config.total_steps and len(rows) == config.total_steps // config.steps_per_row
    assert [r["buffer_size"] for r in rows] == [min(r["step"], config.buffer_size) for r in rows]
    expected_eps = [1.0 + min(r["step"] / 1_000, 1.0) * (0.05 - 1.0) for r in rows]  # half the run: 1000
    np.testing.assert_allclose([r["epsilon"] for r in rows], expected_eps, rtol=1e-6)
    assert sum(r["skipped"] for r in rows) == 0 and tiny_run.summary["skipped_updates"] == 0
    assert rows[1]["loss"] is None and rows[2]["loss"] is not None  # learning starts after step 500
    assert sum(r["episodes"] for r in rows) > 0 and np.all(np.asarray(state.episode_return) >= 0)


@pytest.mark.slow  # the tiny run compiles the whole loop: 10-15 s on 2 cores
def test_target_equals_online_right_after_a_periodic_copy(tiny_run):
    # 2000 steps is a multiple of the 100-step interval: the last iteration learned, then copied.
    tree_equal(tiny_run.state.target_params, tiny_run.state.train_state.params)
    assert tiny_run.state.train_state.step > 0


@pytest.mark.slow  # the tiny run compiles the whole loop: 10-15 s on 2 cores
def test_final_return_is_the_mean_return_of_the_last_tenth_of_the_rows_episodes(tiny_run):
    last = tiny_run.metrics[-1:]  # 10 rows: the last one
    assert tiny_run.summary["final_return"] == pytest.approx(last[0]["return_sum"] / last[0]["episodes"])
    assert "last tenth of the rows" in tiny_run.summary["final_return_is"] and tiny_run.summary["final_return"] >= 1
    assert tiny_run.summary["buffer_bytes"] == 1_000 * (4 * 4 + 4 + 4 + 1 + 4 * 4) + 5


@pytest.mark.slow  # the tiny run compiles the whole loop: 10-15 s on 2 cores
def test_the_summary_evaluates_the_greedy_policy_as_pqns_does(tiny_run):
    summary = tiny_run.summary
    assert len(summary["eval_return_per_seed"]) == 1 and summary["eval_return"] == summary["eval_return_per_seed"][0]
    assert 1 <= summary["eval_return"] <= 500 and "32 greedy episodes" in summary["eval_return_is"]


@pytest.mark.slow
def test_polyak_target_update_mixes_by_tau():
    algo = DQN(DQNConfig(**{**TINY, "tau": 0.25, "target_update_interval": 2}))
    state = algo.init(jax.random.PRNGKey(0))
    state = state.replace(target_params=jax.tree.map(jnp.zeros_like, state.target_params))
    after, _ = jax.jit(algo.iteration)(state, jax.random.PRNGKey(1))  # steps 0 -> 2: before learning starts
    expected = jax.tree.map(lambda p: 0.25 * p, state.train_state.params)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), after.target_params, expected)
    tree_equal(after.train_state.params, state.train_state.params)  # no gradient step yet


def test_td_targets_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    q_target, q_online = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)
    reward, terminated = rng.normal(size=6).astype(np.float32), np.array([0, 1, 0, 0, 1, 0], np.float32)
    double = q_target[np.arange(6), q_online.argmax(1)]
    expected = reward + 0.9 * (1 - terminated) * double
    np.testing.assert_allclose(td_targets(q_target, q_online, reward, terminated, 0.9), expected, rtol=1e-6)
    plain = reward + 0.9 * (1 - terminated) * q_target.max(1)
    np.testing.assert_allclose(td_targets(q_target, q_target, reward, terminated, 0.9), plain, rtol=1e-6)


@pytest.mark.parametrize(
    "env, channels, actions",
    [("Breakout-MinAtar", 4, 3), ("Asterix-MinAtar", 4, 5), ("Freeway-MinAtar", 7, 3), ("SpaceInvaders-MinAtar", 6, 4)],
)
def test_each_minatar_game_stores_uint8_frames_and_traces_a_whole_update(env, channels, actions):
    # Traced, not compiled: the update's shapes and dtypes on each game's frames and actions.
    algo = DQN(DQNConfig(env=env, buffer_size=1_000, batch_size=32, num_envs=2, train_frequency=2, steps_per_row=200))
    state = jax.eval_shape(algo.init, jax.random.PRNGKey(0))
    frames = state.buffer.experience["obs"]
    assert frames.dtype == state.buffer.experience["next_obs"].dtype == jnp.uint8
    assert frames.shape == (1, 1_000, 10, 10, channels) and algo.spec.action_dim == actions  # [1, capacity, ...]
    new_state, metrics = jax.eval_shape(algo.update, state, None)
    shapes = lambda tree: [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]  # noqa: E731
    assert shapes(new_state) == shapes(state)
    assert metrics["loss"].dtype == jnp.float32 and metrics["updates"].dtype == jnp.int32


@pytest.mark.slow
def test_the_host_path_counts_as_the_gymnax_one_on_gymnasium_cartpole():
    config = DQNConfig(**{**TINY, "total_steps": 1_000}, env_backend="gymnasium")
    result = train(config, progress=False)
    rows, state = result.metrics, result.state
    # 500 iterations of 2 steps; a gradient step in each past step 500: iterations 251 to 500.
    assert int(state.train_state.step) == sum(r["updates"] for r in rows) == 250 and int(state.steps) == 1_000
    assert [r["updates"] for r in rows] == [0, 0, 50, 100, 100]  # each row's own
    assert len(rows) == 5 and [r["buffer_size"] for r in rows] == [200, 400, 600, 800, 1_000]
    # Each of the 2 environments steps 500 times: CartPole's time limit ends at least one episode of each.
    assert result.summary["env_backend"] == "gymnasium" and sum(r["episodes"] for r in rows) >= 2
    assert state.buffer.experience["obs"].dtype == jnp.float32 and state.obs.shape == (2, 4)
    # eval-episodes (32 by default) are not played under jit on a host environment: said, not skipped silently
    assert "eval_return" not in result.summary
    assert result.summary["eval_return_is"] == "not played: a host environment (genesis-jax eval plays it)"


@pytest.mark.slow  # Nature CNN on 84x84x4 frames, compiled and trained on the CPU: about 30 s on 2 cores
@pytest.mark.run_bound
def test_atari_frames_stay_uint8_in_the_buffer():
    # The dtypes do not depend on the sizes: two rows, 16 updates of 8 frames (at 256 steps and
    # batches of 32, running them took longer than compiling them).
    pytest.importorskip("ale_py")
    config = DQNConfig(
        env="ALE/Pong-v5", num_envs=1, total_steps=128, steps_per_row=64, train_frequency=4, learning_starts=64,
        buffer_size=128, batch_size=8, target_update_interval=64,
    )  # fmt: skip
    result = train(config, progress=False)
    obs = result.state.buffer.experience["obs"]
    assert obs.dtype == jnp.uint8 and obs.shape[-3:] == (84, 84, 4) and result.state.obs.dtype == jnp.uint8
    assert result.summary["env_backend"] == "gymnasium" and result.summary["buffer_dtypes"]["obs"] == "uint8"
    assert int(result.state.steps) == 128 and int(result.state.train_state.step) == (128 - 64) // 4
    assert result.summary["buffer_bytes"] > 2 * 128 * 84 * 84 * 4  # obs and next_obs, a byte a pixel


@pytest.mark.parametrize(
    "args, words",
    [
        (["--env", "Pendulum-v1"], "dqn needs discrete actions; Pendulum-v1 has continuous ones: use sac"),
        (["--buffer-size", "64", "--batch-size", "128"], "buffer-size 64 is smaller than batch-size 128"),
        (["--env", "Breakout-MinAtar", "--buffer-size", "1000000000"], "of memory is available"),
        (["--train-frequency", "15"], "train-frequency 15 must be a multiple of num-envs 10"),
        (["--env-backend", "gymnasium", "--num-seeds", "2"], "num-seeds 2 needs a JAX environment"),
        (["--env", "ALE/Pong-v5", "--action-repeat", "4"], "ALE/Pong-v5 skips 4 frames per action itself"),
        (["--env", "PongNoFrameskip-v4", "--action-repeat", "2"], "PongNoFrameskip-v4 skips 4 frames per action"),
        (["--action-repeat", "4"], "action-repeat act on gymnasium environments; CartPole-v1 runs on gymnax"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, capsys, args, words):
    out = tmp_path / "run"
    assert main(["train", "dqn", *args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not out.exists()


@pytest.mark.slow  # about 40-60 s on 2 cores
@pytest.mark.long  # a learning run (benchmarks/dqn-cartpole-cpu.md)
@pytest.mark.run_bound
def test_dqn_learns_cartpole_on_a_cpu_budget():
    config = DQNConfig(
        total_steps=60_000, learning_starts=2_000, epsilon_fraction=1 / 3, target_update_interval=500, seed=1
    )
    result = train(config, progress=False)
    assert result.summary["final_return"] >= 150, result.metrics[-3:]  # a random policy averages about 22


def test_the_steps_that_run_not_the_steps_asked_decide_whether_anything_learns():
    """total-steps runs in whole rows: 599 of rows of 200 runs 400, so a learning-starts of 450
    took no gradient step (the run exited 0 with a return); and a target update interval with no
    multiple after learning starts left the target network as initialised."""
    tiny = dict(steps_per_row=200, num_envs=2, train_frequency=2, buffer_size=400, batch_size=16)
    with pytest.raises(ValueError) as refused:
        DQNConfig(**tiny, total_steps=599, learning_starts=450, target_update_interval=2)
    assert str(refused.value) == (
        "learning-starts must lie in [0, 400) (total-steps 599 runs 400: whole rows) for any gradient step to be "
        "taken, got 450"
    )
    never = "^target-update-interval 1000 puts no target update between learning-starts 100 and the end \\(400\\)"
    with pytest.raises(ValueError, match=never):
        DQNConfig(**tiny, total_steps=400, learning_starts=100, target_update_interval=1000)
    assert DQNConfig(**tiny, total_steps=400, learning_starts=100, target_update_interval=200).total_steps == 400


def test_a_batch_the_buffer_never_holds_is_refused_as_no_gradient_step():
    """The first gradient step waits for batch-size transitions too: a batch of 300 in a run of
    200 steps (learning-starts 0) took none, and the run exited 0 with a return."""
    tiny = dict(steps_per_row=200, num_envs=2, train_frequency=2, buffer_size=400, learning_starts=0, hidden=(8,))
    never = DQNConfig(**tiny, batch_size=300, total_steps=200, target_update_interval=2)
    with pytest.raises(ValueError, match="^batch-size 300 is more transitions than the run collects \\(200\\)"):
        DQN(never)
    late = "^target-update-interval 300 puts no target update between the first gradient step \\(once the buffer"
    stale = DQNConfig(**tiny, batch_size=350, total_steps=400, target_update_interval=300)
    with pytest.raises(ValueError, match=late):  # learning starts at 350 steps: the target's update at 300 precedes it
        DQN(stale)
    DQN(DQNConfig(**tiny, batch_size=300, total_steps=400, target_update_interval=400)).close()
    for recorded in (never, stale):  # a run 0.4.2 wrote with them loads (eval) and resumes as it ran
        DQN(recorded, recorded=True).close()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--network", "resmlp", "--hidden", "512", "512"], "hidden shapes dqn's mlp network only; its resmlp torso"),
        (["--env", "Breakout-MinAtar", "--activation", "tanh"], "activation shapes dqn's mlp network only; its cnn"),
    ],
)
def test_network_settings_the_torso_does_not_use_are_refused(tmp_path, capsys, args, words):
    # the run built a 256-wide resmlp (or MinAtar's CNN) and recorded hidden [512, 512] in its summary
    out = tmp_path / "run"
    assert main(["train", "dqn", *args, "--out", str(out), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert words in line and line.endswith("or give network mlp")
    assert not out.exists()


@pytest.mark.parametrize(
    "settings",
    [dict(network="resmlp", hidden=(32, 32)), dict(env="ALE/Pong-v5", action_repeat=4, num_envs=1, train_frequency=1)],
)
def test_a_run_recorded_with_a_setting_refused_since_is_still_built_as_it_ran(settings):
    # 0.4.1 recorded these without applying them: its runs still load (eval) and resume
    from genesis_jax.algos.dqn.train import DQN

    config = DQNConfig(**settings)
    with pytest.raises(ValueError, match="leave"):
        DQN(config)  # a new run
    DQN(config, recorded=True).close()


def test_float_image_frames_train_the_cnn_and_stay_float32_in_the_buffer():
    # Each pixel is 0.5: stored as uint8 (as pixels are) it would read 0.
    config = DQNConfig(
        env="tests.support.custom_envs:ProbeFloatImage-v0", network="cnn", num_envs=2, total_steps=128,
        steps_per_row=64, train_frequency=2, learning_starts=64, buffer_size=128, batch_size=8,
        target_update_interval=32,
    )  # fmt: skip
    result = train(config, progress=False)
    obs, state = result.state.buffer.experience["obs"], result.state
    assert obs.dtype == jnp.float32 and obs.shape[-3:] == (10, 10, 3) and bool(jnp.all(obs == 0.5))
    assert state.obs.dtype == jnp.float32 and bool(jnp.all(state.obs == 0.5))
    assert result.summary["buffer_dtypes"]["obs"] == "float32" and int(state.train_state.step) == (128 - 64) // 2
    assert "conv_0" in str(jax.tree_util.tree_structure(state.train_state.params))  # the CNN, not a flattening MLP
