"""World model: deterministic data, reaching the noise floor in fp32 and fp16, exact skip counts."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.world_model import WorldModelConfig, train
from genesis_jax.algos.world_model import data as wm_data
from genesis_jax.cli import main
from genesis_jax.data import trajectories
from tests.support.processes import run_python

TINY = dict(epochs=2, num_sequences=16, sequence_length=8, batch_size=64, width=16, depth=1)


def test_synthetic_data_is_deterministic_per_seed():
    a, b, c = (wm_data.synthetic_dataset(16, 8, seed=s) for s in (0, 0, 1))
    for key in ("obs", "action", "reward", "terminated", "floor"):
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["obs"], c["obs"])


def test_wide_data_is_the_system_seen_through_many_dimensions():
    wide, small = wm_data.wide_dataset(16, 8, seed=3, obs_dim=64), wm_data.small_units_dataset(16, 8, 3, scale=1.0)
    assert wide["obs"].shape == (16, 9, 64) and wide["obs"].dtype == np.float32
    # an orthogonal projection scaled by sqrt(64 / 8): each dimension keeps the state's mean square
    np.testing.assert_allclose(np.mean(wide["obs"] ** 2), np.mean(small["obs"] ** 2), rtol=1e-5)
    projection = np.linalg.lstsq(small["obs"].reshape(-1, 8), wide["obs"].reshape(-1, 64), rcond=None)[0]
    np.testing.assert_allclose(projection @ projection.T, 8.0 * np.eye(8), atol=1e-3)
    for key in ("reward", "terminated", "floor"):  # the same system, noise and attainable loss
        np.testing.assert_array_equal(wide[key], small[key])
    np.testing.assert_array_equal(wide["obs"], wm_data.wide_dataset(16, 8, seed=3, obs_dim=64)["obs"])
    in_small_units = wm_data.wide_dataset(16, 8, seed=3, obs_dim=64, scale=0.01)
    np.testing.assert_allclose(in_small_units["obs"], 0.01 * wide["obs"], rtol=1e-5, atol=1e-8)
    with pytest.raises(ValueError, match="obs_dim >= 8"):
        wm_data.wide_dataset(4, 4, obs_dim=4)


@pytest.mark.slow  # two studies' normalisations on 1024 sequences: 12 s
def test_loss_weight_weights_the_loss_trained_on_and_its_telemetry_not_the_losses_reported():
    from genesis_jax.algos import get_algorithm
    from genesis_jax.amp.policy import get_precision
    from genesis_jax.cli.study.cells import loss_bounds

    config = WorldModelConfig(data="synthetic-wide", loss_weight=0.25, underflow_telemetry=True, **TINY)
    trainer = get_algorithm("world-model")(config)
    params, batch = trainer.init(jax.random.PRNGKey(0)).train_state.params, trainer.data[1]
    trainer.close()
    loss, aux = trainer.loss_fn(params, batch)
    for weighted in (trainer.train_loss_fn, trainer.loss_of(get_precision("fp32"))):  # trained on; the telemetry's
        weighted_loss, weighted_aux = weighted(params, batch)
        assert float(weighted_loss) == 0.25 * float(loss) and weighted_aux == aux  # 0.25: exact in binary
    # The study's untrained-model normalisation is unweighted: the same as at weight 1.
    assert loss_bounds("wm:small-loss") == loss_bounds("wm:synthetic-wide")


@pytest.mark.slow  # a CLI subprocess and a run in process: 15 s
def test_a_cli_run_with_a_loss_weight_records_it_reports_unweighted_losses_and_keeps_info_logs_off_stderr(tmp_path):
    out = tmp_path / "run"
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    argv += ["--data", "synthetic-wide", "--precision", "fp32", "--max-grad-norm", "None", "--loss-weight", "1e-3"]
    argv += ["--no-progress", "--checkpoint-every", "1"]
    proc = run_python(["-m", "genesis_jax.cli", "train", "world-model", *argv, "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weighted = json.loads((out / "summary.json").read_text())
    assert weighted["config"]["loss_weight"] == 1e-3
    assert len(list((out / "checkpoints").iterdir())) >= 2  # it did save, more than once
    for info in ("Saving checkpoint", "Finished saving"):  # orbax's INFO lines at each save
        assert info not in proc.stderr, proc.stderr[-3000:]
    # Adam does not see a loss's scale, so this run and one at weight 1 report losses that agree
    # unweighted (weighted, the first's would be 1000x smaller).
    config = WorldModelConfig(data="synthetic-wide", precision="fp32", max_grad_norm=None, loss_weight=1.0, **TINY)
    unweighted = train(config, progress=False).summary
    for key in ("final_train_loss", "eval_loss"):
        assert 0.5 < weighted[key] / unweighted[key] < 2, (key, weighted, unweighted)


@pytest.fixture(scope="module")
def fp32_and_fp16():
    config = dict(data="synthetic", epochs=10, batch_size=512, seed=0)
    return {p: train(WorldModelConfig(precision=p, **config), progress=False).summary for p in ("fp32", "fp16")}


@pytest.mark.slow  # fp32_and_fp16 fixture trains twice: 44 s
@pytest.mark.long  # a learning run (benchmarks/world_model_cpu.md holds its figures)
@pytest.mark.run_bound  # the fixture's runs, whichever test sets it up
def test_eval_loss_reaches_noise_floor(fp32_and_fp16):
    for precision, s in fp32_and_fp16.items():
        assert s["noise_floor"] is not None
        # measured: eval 0.274 vs floor 0.265 after 10 epochs
        assert s["eval_loss"] < 1.06 * s["noise_floor"], (precision, s["eval_loss"], s["noise_floor"])


@pytest.mark.slow  # fp32_and_fp16 fixture (44 s)
@pytest.mark.long
@pytest.mark.run_bound
def test_fp16_within_2_percent_of_fp32(fp32_and_fp16):
    e32, e16 = fp32_and_fp16["fp32"]["eval_loss"], fp32_and_fp16["fp16"]["eval_loss"]
    assert abs(e16 - e32) / e32 < 0.02


@pytest.mark.slow  # fp32_and_fp16 fixture (44 s)
@pytest.mark.long
@pytest.mark.run_bound
def test_fp16_halves_saved_activations(fp32_and_fp16):
    ratio = fp32_and_fp16["fp16"]["activation_bytes"] / fp32_and_fp16["fp32"]["activation_bytes"]
    assert ratio <= 0.6


@pytest.mark.slow
def test_per_epoch_skips_equal_injected_steps(tmp_path):
    injected = {3, 4, 17, 40}  # global optimizer steps made non-finite

    def inject(grads, state):
        bad = jnp.isin(state.step, jnp.asarray(sorted(injected)))
        return jax.tree.map(lambda g: jnp.where(bad, jnp.nan, g), grads)

    # TINY's model (width 16, depth 1): its compile is the cost; 512 sequences of 32 steps in batches
    # of 1024 still give over 10 updates an epoch, so step 40 falls in the 4 epochs
    config = WorldModelConfig(
        precision="fp16", epochs=4, batch_size=1024, num_sequences=512, width=16, depth=1, init_loss_scale=2.0**10
    )
    result = train(config, out_dir=str(tmp_path / "wm"), progress=False, grad_transform=inject)
    per_epoch = [r["skipped"] for r in result.metrics]
    steps_per_epoch = result.summary["total_updates"] // 4
    expected = [sum(1 for s in injected if e * steps_per_epoch <= s < (e + 1) * steps_per_epoch) for e in range(4)]
    # an fp16 overflow could add a skip of its own; a scale of 2^10 keeps this model clear of that
    assert per_epoch == expected
    assert result.summary["skipped_updates"] == len(injected)
    summary = json.loads((tmp_path / "wm" / "summary.json").read_text())
    for key in (
        "precision",
        "final_train_loss",
        "eval_loss",
        "noise_floor",
        "steps_per_second",
        "compile_seconds",
        "loss_scale",
        "skipped_updates",
        "overflow_rate",
        "activation_bytes",
        "compiled_temp_bytes",
        "param_bytes",
        "device",
    ):
        assert key in summary
    assert (tmp_path / "wm" / "world_model.png").exists()


@pytest.mark.slow  # trains PPO, then collects: 59 s
def test_collect_with_trained_ppo_policy_and_gymnasium(tmp_path, capsys):
    from genesis_jax.algos.evaluate import load
    from genesis_jax.algos.ppo import PPOConfig
    from genesis_jax.algos.ppo import train as train_ppo

    run = tmp_path / "ppo"
    # eval_episodes=0: no greedy evaluation after training (its own compile), which collecting does not use;
    # fp16 at 2,048 steps: the chunk program of tests/support/small_run.py's SMALL, compiled once for the run
    config = PPOConfig(env="CartPole-v1", precision="fp16", total_steps=2048, eval_episodes=0)
    train_ppo(config, out_dir=str(run), progress=False)
    policy = load(str(run), greedy=False)  # as in training: it samples
    assert policy.spec.env_id == "CartPole-v1"
    assert (policy.row_key, policy.row) == ("update", 4)  # 2,048 steps of 4 x 128
    with pytest.warns(FutureWarning, match=r"Policy.position is Policy.row now; it goes in 0.5"):
        assert policy.position == 4
    with pytest.warns(FutureWarning, match=r"Policy.position_key is Policy.row_key now; it goes in 0.5"):
        assert policy.position_key == "update"
    name = f"PPO checkpoint {run} update {policy.row}"
    trained = trajectories.collect_dataset("CartPole-v1", 8, 10, seed=0, policy=policy.act, policy_name=name)
    assert "PPO checkpoint" in trained["meta"]["source"] and trained["action"].shape == (8, 10)
    host = trajectories.collect_dataset("CartPole-v1", 4, 12, seed=0, backend="gymnasium")
    assert host["obs"].shape == (4, 13, 4) and host["meta"]["source"].startswith("gymnasium:")
    # one-step targets are the true next observations, before any reset
    assert np.all(np.abs(host["next_obs"][:, :, 0] - host["obs"][:, :12, 0]) < 0.2)
    out = str(tmp_path / "acrobot.npz")
    assert main(["collect", "--env", "Acrobot-v1", "--policy", str(run), "--out", out]) == 2
    assert "trained on CartPole-v1, not Acrobot-v1" in capsys.readouterr().err


@pytest.mark.slow  # collects, then trains a GRU: 64 s
def test_multistep_gru_and_collected_data(tmp_path):
    path = str(tmp_path / "cartpole.npz")
    assert (
        main(["collect", "--env", "CartPole-v1", "--num-sequences", "32", "--sequence-length", "16", "--out", path])
        == 0
    )
    data = trajectories.load_dataset(path)
    assert data["obs"].shape == (32, 17, 4) and data["meta"]["discrete_actions"]
    s = train(
        WorldModelConfig(data=path, precision="bf16", epochs=2, batch_size=64, core="gru", horizon=3),
        progress=False,
    ).summary
    assert np.isfinite(s["eval_loss"]) and s["noise_floor"] is None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "world-model", "--epochs", "0"], "epochs must be a positive integer"),
        (["train", "world-model", "--batch-size", "100000", "--num-sequences", "8"], "larger than the"),
        (["train", "world-model", "--precision", "fp7"], "unknown precision"),
        (["train", "world-model", "--data", "missing.npz"], "no dataset at missing.npz"),
    ],
)
def test_bad_arguments_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_config_refuses_what_it_would_ignore_and_leaves_a_npz_s_length_to_the_data():

    # The GRU core built one cell whatever --depth said (the runs were identical to the digit).
    with pytest.raises(ValueError, match="^depth 6 is the MLP core's blocks: the GRU core is one cell; drop --depth$"):
        WorldModelConfig(core="gru", depth=6)
    assert WorldModelConfig(core="gru", depth=1).depth == 1  # what the one cell is: said, not refused
    # --sequence-length is not a .npz's (its own length is checked against the horizon when it is read).
    with pytest.raises(ValueError, match="horizon 35 is longer than the sequences \\(32\\)"):
        WorldModelConfig(horizon=35)
    assert WorldModelConfig(data="runs/cartpole-40-steps.npz", horizon=35).horizon == 35
    # ...nor are its sizes: a .npz run took --num-sequences 4 and trained on all 2048 of its own.
    for size in ({"num_sequences": 4}, {"sequence_length": 5}):
        with pytest.raises(ValueError, match="^--num-sequences and --sequence-length size generated data; d.npz has"):
            WorldModelConfig(data="d.npz", **size)


def test_collecting_repeats_each_action_as_the_agent_was_trained_to():
    """A policy trained with action-repeat 4 acts at a quarter of the control rate: `collect
    --policy` played it at every step (Pendulum's 200-step episodes, not 50) and said nothing."""
    ends = {}
    for repeat in (1, 4):
        data = trajectories.collect_dataset("Pendulum-v1", 2, 60, 0, "gymnasium", action_repeat=repeat)
        ends[repeat] = np.flatnonzero(np.any(data["obs"][0, 1:] != data["next_obs"][0], axis=-1)).tolist()
        assert data["meta"]["source"].endswith("seed=0)" if repeat == 1 else "seed=0, action-repeat 4)")
    assert ends == {1: [], 4: [49]}  # the 50th agent step is the 200th environment step: the episode's end


def test_an_unknown_data_name_lists_what_data_takes(capsys):
    assert main(["train", "world-model", "--data", "synthetic_small", "--epochs", "1", "--no-progress"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("genesis-jax: error: --data takes synthetic, synthetic-small, synthetic-wide, an envir")
    assert line.endswith(" (or synthetic-small?)"), line
    # Image observations: refused before the dataset is collected (it was collected whole, then refused).
    assert main(["train", "world-model", "--data", "Breakout-MinAtar", "--epochs", "1", "--no-progress"]) == 2
    line = capsys.readouterr().err.strip()
    assert line == "genesis-jax: error: the world model takes vector observations; Breakout-MinAtar's are [10, 10, 4]"


def test_collecting_from_a_host_environment_that_computes_with_jax():
    """gymnasium's phys2d environments compute with JAX: their reset, traced inside the
    collecting program, raised JAX's TracerArrayConversionError (train dqn ran on them)."""
    data = trajectories.collect_dataset("phys2d/CartPole-v1", 2, 3, 0, "gymnasium")
    assert data["obs"].shape == (2, 4, 4) and np.isfinite(data["obs"]).all()
    assert data["meta"]["source"] == "gymnasium:phys2d/CartPole-v1(random policy, seed=0)"


@pytest.mark.parametrize("env_id", ["tests.support.custom_envs:ProbeFloatImage-v0", "Breakout-MinAtar"])
def test_a_dataset_of_image_observations_is_refused_before_anything_is_collected(env_id):
    # It wrote obs [sequences, steps + 1, height, width, channels], which no world model takes (a
    # float image's were flattened to features until float images stayed images)
    with pytest.raises(ValueError, match=r"^a dataset holds vector observations \(the world model's\); .* \[10, 10, "):
        trajectories.collect_dataset(env_id, 2, 3)


def test_a_random_policy_refuses_infinite_action_bounds_in_one_line():
    from tests.support import custom_envs  # noqa: F401 (registers ProbeUnbounded-v0)

    with pytest.raises(ValueError, match=r"^a random policy draws .* bounds; ProbeUnbounded-v0 has infinite ones$"):
        trajectories.collect_dataset("ProbeUnbounded-v0", 2, 3)  # NaN actions, collected as data


@pytest.mark.parametrize("core", ["mlp", "gru"])  # the gru: flax's GRUCell summed its bias gradients in half
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_sum_and_the_loss_in_float32_hidden_activations_in_half_precision(precision, core):
    """The hidden layers' outputs stay half precision (the saved activations' halving), but their
    bias gradients, sums over the batch, accumulate in float32, as every reduction does; the loss
    is float32. Read from the loss's gradient's jaxpr (`amp.dtype_report`); nothing runs."""
    from genesis_jax.algos.world_model.train import make_loss_fn
    from genesis_jax.amp import dtype_report, get_precision
    from genesis_jax.nets.world_model import WorldModel

    half = jnp.dtype(get_precision(precision).compute_dtype).name
    compute = get_precision(precision).compute_dtype
    model = WorldModel(obs_dim=5, action_dim=2, width=16, depth=1, core=core, dtype=compute)
    batch = {"obs": jnp.ones((8, 5)), "action": jnp.ones((8, 2, 2)), "next_obs": jnp.zeros((8, 2, 5))}
    batch |= {"reward": jnp.zeros((8, 2)), "terminated": jnp.zeros((8, 2))}
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), batch["obs"], batch["action"][:, 0])
    report = dtype_report(jax.value_and_grad(lambda p: make_loss_fn(model)(p, batch)[0]), params)
    assert set(report.dtypes("matmul")) == {half}
    assert set(report.dtypes("reduction")) <= {"float32", "int32"}, report
    assert report.outputs[0] == "float32"


def test_the_gru_core_is_flaxs_cell_in_parameters_and_values():
    # Its own cell (bias gradients in float32) keeps flax's names, shapes, inits and float32 arithmetic:
    # a run of the gru core written before resumes into it.
    import flax.linen as nn

    from genesis_jax.nets.world_model import GRUCell

    h, x = jax.random.normal(jax.random.PRNGKey(1), (4, 16)), jax.random.normal(jax.random.PRNGKey(2), (4, 16))
    ours, flax_params = GRUCell(16).init(jax.random.PRNGKey(0), h, x), nn.GRUCell(16).init(jax.random.PRNGKey(0), h, x)
    assert jax.tree.structure(ours) == jax.tree.structure(flax_params)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(flax_params)))
    np.testing.assert_allclose(GRUCell(16).apply(ours, h, x)[0], nn.GRUCell(16).apply(ours, h, x)[0], rtol=1e-6)


def test_a_multistep_loss_stops_at_the_episode_end_a_window_crosses():
    """A window over an episode end (a step whose next_obs is not the next observation: a
    reset) was trained, open loop, on the next episode's targets, which nothing predicts from
    the window's start. Its later steps are now left out of the loss, and only they."""
    from genesis_jax.algos.world_model.train import make_loss_fn, windows
    from genesis_jax.nets.world_model import WorldModel

    data = trajectories.collect_dataset("CartPole-v1", 4, 60, seed=0)
    samples = windows(data, 3)
    resets = np.argwhere(~samples["valid"])
    assert len(resets) and samples["valid"][:, 0].all()  # a window's first step is always its own
    np.testing.assert_array_equal(windows(data, 1)["valid"], True)
    model = WorldModel(obs_dim=4, action_dim=2, discrete_actions=True, width=8, depth=1)
    batch = jax.tree.map(jnp.asarray, samples)
    params = model.init(jax.random.PRNGKey(0), batch["obs"][:1], batch["action"][:1], method=WorldModel.unroll)
    loss = lambda b: float(make_loss_fn(model)(params, b)[0])  # noqa: E731
    other_episode = {**batch, "reward": batch["reward"].at[tuple(resets.T)].add(1e3)}
    assert loss(other_episode) == loss(batch)
    own_episode = {**batch, "reward": batch["reward"].at[0, 0].add(1e3)}
    assert loss(own_episode) > loss(batch) + 1
