"""Bad input anywhere ends in one sentence naming the value and what is accepted (the CLI:
exit status 2, or 4 for a missing optional package, never a traceback), before anything is
collected, compiled or written: config fields of the wrong type, range or size, an
environment variable a flag overrides, a missing optional package, `collect` to a place it
cannot write or of a size that does not fit, and a session state no checkpoint can hold."""

from __future__ import annotations

import math
import re
import sys
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.algos.world_model import WorldModelConfig, WorldModelTrainer
from genesis_jax.amp.policy import get_precision
from genesis_jax.cli import main, parse_train_args, train_config
from genesis_jax.data import trajectories
from genesis_jax.envs import registry
from genesis_jax.run.session import Session
from tests.support.files import unwritable_path
from tests.support.registry import tiny_argv


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- config fields: type, range and overflow, one sentence naming field, value and what is accepted --

PPO_BAD = [
    ("activation", "swish", "one of tanh, relu, gelu, silu"),
    ("seed", 1.5, "an integer from 0 to 4294967295"),
    ("seed", -1, "an integer from 0 to 4294967295"),
    ("seed", 2**32, "an integer from 0 to 4294967295"),
    ("num_envs", True, "a positive integer"),
    ("num_envs", 2.0, "a positive integer"),
    ("lr", "0.001", "a finite number > 0"),
    ("lr", 0.0, "> 0"),
    ("lr", math.inf, "a finite number"),
    ("lr", 1e39, "a finite number"),  # beyond float32: inf in the update
    ("clip_eps", -0.1, "> 0"),
    ("clip_eps", 0, "> 0"),
    ("vf_coef", -0.5, ">= 0"),
    ("ent_coef", -0.01, ">= 0"),
    ("gamma", 1.5, "in [0, 1]"),
    ("gae_lambda", -0.1, "in [0, 1]"),
    ("total_steps", 10**20, "a positive integer (at most 9223372036854775807)"),
    ("update_epochs", 0, "a positive integer"),
    ("num_minibatches", None, "a positive integer"),
    ("anneal_lr", "yes", "true or false"),
    ("clip_value", 1, "true or false"),
    ("hidden", "64", "a sequence of integers"),
    ("hidden", (64, 2**40), "a non-empty sequence, each a positive integer (at most 2147483647)"),
    ("hidden", (64, 0), "a non-empty sequence, each a positive integer"),
    ("hidden", (), "a non-empty sequence, each a positive integer"),
    ("env", "", "a non-empty string"),
    ("env", 7, "a non-empty string"),
    ("env_backend", "gym", "one of gymnax, gymnasium, envpool or None"),
    ("vectorization", "threads", "one of sync, async"),
    ("updates_per_chunk", 0, "a positive integer"),
    ("precision", 16, "a non-empty string or None"),
    ("devices", True, "a positive integer"),
    ("heartbeat_timeout", 0, "a positive integer"),
    ("growth_interval", False, "a positive integer"),
    ("max_grad_norm", -1.0, "> 0 or None"),
    ("inject_nonfinite", 1.5, "a rate in [0, 1]"),
]


def flag(field: str) -> str:
    return field.replace("_", "-")


@pytest.mark.parametrize("field, value, accepted", PPO_BAD, ids=[f"{f}={v!r}" for f, v, _ in PPO_BAD])
def test_ppo_config_refuses_a_bad_field_naming_it_its_value_and_what_is_accepted(field, value, accepted):
    with pytest.raises(ValueError) as err:
        PPOConfig(**{"total_steps": 1024, field: value})
    message = str(err.value)
    assert message == f"{flag(field)} must be {accepted}, got {value!r}" or (
        message.startswith(f"{flag(field)} must be {accepted}") and message.endswith(f"got {value!r}")
    ), message


WORLD_MODEL_BAD = [
    ("core", "lstm", "one of mlp, gru"),
    ("epochs", True, "a positive integer"),
    ("batch_size", 2.5, "a positive integer"),
    ("horizon", 0, "a positive integer"),
    ("num_sequences", 2**31, "a positive integer"),
    ("eval_fraction", 1.0, "in (0, 1)"),
    ("eval_fraction", "0.2", "a finite number in (0, 1)"),
    ("seed", -3, "an integer from 0 to 4294967295"),
    ("lr", "1e-3", "a finite number > 0"),
    ("data", "", "a non-empty string"),
    ("width", np.float32(8), "a positive integer"),
]


@pytest.mark.parametrize("field, value, accepted", WORLD_MODEL_BAD, ids=[f"{f}={v!r}" for f, v, _ in WORLD_MODEL_BAD])
def test_world_model_config_refuses_a_bad_field(field, value, accepted):
    with pytest.raises(ValueError) as err:
        WorldModelConfig(**{field: value})
    message = str(err.value)
    assert message.startswith(f"{flag(field)} must be {accepted}") and message.endswith(f"got {value!r}"), message


def test_good_values_of_other_numeric_types_are_accepted_as_plain_python_values():
    """The control: an int for a float field, numpy scalars and a list of sizes are fine,
    stored as the Python types the annotations name (so the config's JSON is plain)."""
    config = PPOConfig(total_steps=1024, lr=1, seed=np.int64(3), hidden=[32, np.int32(16)], gamma=np.float32(0.5))
    assert (config.lr, config.seed, config.hidden, config.gamma) == (1.0, 3, (32, 16), 0.5)
    assert type(config.lr) is float and type(config.seed) is int and type(config.gamma) is float
    assert all(type(h) is int for h in config.hidden)
    assert PPOConfig(total_steps=1024, seed=2**32 - 1, gae_lambda=0, ent_coef=0).seed == 2**32 - 1
    assert WorldModelConfig(eval_fraction=0.5, epochs=np.int16(2)).epochs == 2


def test_total_steps_that_overflow_the_int32_step_counters_are_refused():
    # 512 environment steps per update, 16 optimizer steps per update: 2^31 optimizer steps
    # are 2^27 updates, 2^36 environment steps.
    limit = (2**31 - 1) // 16 * 512
    assert PPOConfig(total_steps=limit).num_updates * 16 <= 2**31 - 1
    with pytest.raises(ValueError, match=f"the step counters are int32: at most {limit} total-steps"):
        PPOConfig(total_steps=limit + 512)


def test_seeds_trained_together_must_stay_within_32_bits():
    with pytest.raises(ValueError, match="seed \\+ num-seeds - 1 must be at most 4294967295, got 4294967296"):
        PPOConfig(total_steps=1024, seed=2**32 - 1, num_seeds=2)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["train", "ppo", "--seed", str(10**20)], "seed must be an integer from 0 to 4294967295"),
        (["train", "ppo", "--total-steps", str(10**20)], "total-steps must be a positive integer (at most"),
        (["train", "ppo", "--total-steps", str(10**13)], "the step counters are int32"),
        *(  # their environment step counter is int32: past it epsilon, learning-starts and SAC's warm-up wrapped
            (
                ["train", name, "--total-steps", "3000000000"],
                "at most 2147483647 (the environment step counter is int32)",
            )
            for name in ("dqn", "pqn", "sac")
        ),
        (["train", "ppo", "--num-envs", str(10**8), "--total-steps", str(10**11)], "above 2147483647 (int32)"),
        (["train", "ppo", "--clip-eps", "-0.1"], "clip-eps must be > 0, got -0.1"),
        (
            ["train", "ppo", "--precision", "fp16", "--min-loss-scale", "1e9"],
            "min-loss-scale must be finite, > 0 and <= init-loss-scale",
        ),  # fmt: skip
        (["train", "ppo", "--init-loss-scale", "1e-40"], "init-loss-scale must be finite and >= 2^-126"),
        (["train", "ppo", "--vf-coef", "-1"], "vf-coef must be >= 0, got -1.0"),
        (["train", "dqn", "--learning-starts", "-5"], "learning-starts must be an integer >= 0, got -5"),
        (["train", "world-model", "--seed", str(2**64)], "seed must be an integer from 0 to 4294967295"),
        (["train", "world-model", "--eval-fraction", "1"], "eval-fraction must be in (0, 1), got 1.0"),
        (["train", "world-model", "--num-sequences", str(10**9)], "synthetic data of 1000000000 sequences x 32 steps"),
    ],
)
def test_the_cli_refuses_overflowing_and_negative_values_in_one_line(tmp_path, capsys, argv, words):
    out = tmp_path / "run"
    assert main([*argv, "--no-progress", "--out", str(out)]) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax") and "error" in line and words in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--init-loss-scale", "1e-40"], "init-loss-scale must be finite and >= 2^-126"),  # as train's flags say it
        (["--precision", "fp16", "--min-loss-scale", "1e9"], "min-loss-scale must be finite, > 0 and <= init-loss"),
        (["--seed", "-5"], "seed must be an integer from 0 to 4294967295, got -5"),  # it ran, as train refuses
    ],
)
def test_the_demo_refuses_what_train_refuses_in_train_s_words(capsys, argv, words):
    assert main(["demo", *argv, "--steps", "1"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("genesis-jax: error: ") and words in line, line


# -- the environment's precision variables and the fp16-full warning ------------------------------


@pytest.mark.parametrize("given", [["--precision", "bf16"], ["--precision=bf16"]])
def test_a_precision_flag_wins_and_a_bad_variable_is_not_read(monkeypatch, capsys, given):
    monkeypatch.setenv("GENESIS_PRECISION", "fp17")
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "perhaps")
    parts, _ = parse_train_args("ppo", [*given, "--total-steps", "1024"])
    assert train_config("ppo", parts).precision == "bf16"
    assert capsys.readouterr().err == ""
    # The control: without the flag the variable is read, and refused in one line.
    assert main(["train", "ppo", "--no-progress"]) == 2
    assert "unknown precision 'fp17'" in one_line(capsys)


def test_the_fp16_full_warning_is_shown_once_however_often_the_precision_is_resolved():
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")  # Python's own filter for UserWarning
        config = WorldModelConfig(precision="fp16-full", num_sequences=8, sequence_length=4, batch_size=8)
        config.train_precision()
        get_precision("fp16-full")
        WorldModelTrainer(config)  # sets up the run: resolves the precision again, builds the model
    fp16_full = [w for w in shown if "fp16-full" in str(w.message)]
    assert len(fp16_full) == 1, [str(w.message) for w in fp16_full]
    with pytest.warns(UserWarning, match="less stable"):  # still seen where every warning is
        get_precision("fp16-full")


@pytest.mark.filterwarnings("always")  # every resolution issues it: the CLI says it once all the same
def test_the_cli_says_the_fp16_full_warning_in_one_line_once(capsys):
    assert main(["train", "world-model", *tiny_argv("world-model", precision="fp16-full")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "fp16-full" in line and "stores" in line]
    assert lines == [
        "genesis-jax: warning: precision 'fp16-full' stores parameters and optimizer moments in float16; "
        "it is less stable than 'fp16' (float32 master weights)"
    ]


# -- a missing optional package: one install hint, exit 2, nothing written --------------------------

HINT = re.compile(r"^genesis-jax: error: .+ needs [\w.-]+: pip install 'genesis-jax\[(\w+)\]'$")


@pytest.mark.parametrize(
    "module, argv, needs, extra",
    [
        ("ale_py", ["--env", "ALE/Pong-v5"], "ALE/Pong-v5 needs ale-py", "atari"),
        ("cv2", ["--env", "ALE/Breakout-v5"], "ALE/Breakout-v5 needs opencv-python-headless", "atari"),
        ("envpool", ["--env", "ALE/Pong-v5", "--env-backend", "envpool"], "envpool needs envpool", "envpool"),
        ("tensorboardX", ["--tensorboard"], "--tensorboard needs tensorboardX", "tensorboard"),
        ("wandb", ["--wandb"], "--wandb needs wandb", "wandb"),
    ],
)
def test_a_missing_optional_package_is_one_install_hint_and_exit_2(
    monkeypatch, tmp_path, capsys, module, argv, needs, extra
):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if it were not installed
    monkeypatch.setenv("WANDB_MODE", "offline")
    argv = ["train", "ppo", "--total-steps", "512", "--num-envs", "4", "--num-steps", "128", *argv]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()
    line = one_line(capsys)
    match = HINT.match(line)
    assert match and needs in line and match.group(1) == extra, line


def test_the_registry_reports_the_missing_package_not_an_unknown_id(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(ImportError, match=r"^ALE/Pong-v5 needs ale-py: pip install 'genesis-jax\[atari\]'$"):
        registry.resolve_backend("ALE/Pong-v5")
    with pytest.raises(ValueError, match="unknown environment id 'NoSuchGame-v0'"):  # the control
        registry.resolve_backend("NoSuchGame-v0")


# -- collect: its output and sizes checked before anything is collected ---------------------------


@pytest.fixture
def no_collecting(monkeypatch):
    """Fails the test if `collect` gets as far as collecting."""

    def refuse(*args, **kwargs):
        raise AssertionError("collect_dataset was called")

    monkeypatch.setattr(trajectories, "collect_dataset", refuse)


def test_collect_to_a_missing_directory_fails_at_once(tmp_path, capsys, no_collecting):
    out = tmp_path / "missing" / "data.npz"
    assert main(["collect", "--env", "CartPole-v1", "--out", str(out)]) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax: error: ") and str(out.parent) in line and "does not exist" in line
    assert not out.parent.exists()


def test_collect_to_an_unwritable_directory_is_a_system_failure_at_once(tmp_path, capsys, no_collecting):
    out = unwritable_path(tmp_path, "data.npz")
    assert main(["collect", "--env", "CartPole-v1", "--out", str(out)]) == 4
    line = one_line(capsys)
    assert line.startswith("genesis-jax: system failure: cannot write to") and str(out) in line
    assert not out.exists()


def test_collect_refuses_an_existing_file_and_leaves_it_as_it_was(tmp_path, capsys, no_collecting):
    out = tmp_path / "data.npz"
    out.write_bytes(b"an earlier dataset")
    assert main(["collect", "--env", "CartPole-v1", "--out", str(out)]) == 2
    assert "exists; choose another path" in one_line(capsys)
    assert out.read_bytes() == b"an earlier dataset"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--num-sequences", str(10**9)], "collecting 1000000000 sequences x 64 steps of CartPole-v1 needs about"),
        (["--sequence-length", str(2**40)], "sequence-length must be a positive integer (below 2^31-1"),
        (["--num-sequences", "0"], "num-sequences must be a positive integer"),
        (["--seed", str(2**64)], "seed must be an integer from 0 to 4294967295"),
        (["--seed", "-1"], "seed must be an integer from 0 to 4294967295"),
    ],
)
def test_collect_refuses_sizes_that_do_not_fit_before_collecting(tmp_path, capsys, no_collecting, argv, words):
    out = tmp_path / "data.npz"
    assert main(["collect", "--env", "CartPole-v1", *argv, "--out", str(out)]) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax: error: ") and words in line, line
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_collect_dataset_checks_its_sizes_before_stepping_an_environment(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the environment was stepped")

    monkeypatch.setattr(trajectories, "_rollout", refuse)
    with pytest.raises(ValueError, match="GiB is available"):
        trajectories.collect_dataset("CartPole-v1", num_sequences=10**9, length=64)
    assert trajectories.dataset_bytes(2, 3, obs_dim=4, action_dim=2, continuous=False) == 2 * 4 * 4 * (2 * 4 + 1 + 2)


# -- a Session whose state no checkpoint can hold -------------------------------------------------


@pytest.mark.parametrize("state", [jnp.float32(8.0), 8.0, np.ones(3), {"w": jnp.ones(2), "name": "abc"}])
def test_a_session_refuses_a_state_no_checkpoint_holds_before_the_loop(tmp_path, state):
    steps = []

    def step(s):
        steps.append(1)
        return s, {"loss": 0.0}

    with pytest.raises(ValueError, match="bare|a checkpoint holds arrays and numbers only"):
        with Session(str(tmp_path / "run"), name="toy", num_rows=2, progress=False) as session:
            state = session.restore(state)
            session.run(state, step, lambda m, done: [{"update": done + 1}])
    assert steps == []
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not checkpoints.exists() or not any(checkpoints.iterdir())


def test_a_session_takes_a_dict_of_arrays_and_a_bare_scalar_where_nothing_is_saved(tmp_path):
    """The controls: a dict of arrays checkpoints, and without a directory any state runs."""
    with Session(str(tmp_path / "run"), name="toy", num_rows=2, progress=False) as session:
        state = session.run(
            session.restore({"w": jnp.float32(8.0)}), lambda s: (s, {}), lambda m, d: [{"update": d + 1}]
        )
    assert float(state["w"]) == 8.0 and list((tmp_path / "run" / "checkpoints").iterdir())
    with Session(None, name="toy", num_rows=2, progress=False) as session:
        assert (
            float(
                session.run(
                    session.restore(jnp.float32(8.0)), lambda s: (s * 0.5, {}), lambda m, d: [{"update": d + 1}]
                )
            )
            == 2.0
        )


# -- every setting is checked before the run directory is touched, for every algorithm --------

# Settings the config accepts alone but the environment refuses (every algorithm's `--devices 2`:
# tests/algos/test_registry.py).
REFUSED_BEFORE_THE_DISK = {
    "ppo": [["--network", "cnn"]],
    "dqn": [["--network", "impala"], ["--learning-starts", "10000", "--total-steps", "10000"]],
    "sac": [["--learning-starts", "1000", "--total-steps", "1000"]],
}


@pytest.mark.parametrize("name, argv", [(n, a) for n, cases in REFUSED_BEFORE_THE_DISK.items() for a in cases], ids=str)
def test_a_refused_setting_leaves_no_run_directory(name, argv, tmp_path, capsys):
    # Once an empty checkpoints/ was left, and the corrected command was refused as "holds another run".
    out = tmp_path / "run"
    assert main(["train", name, *argv, "--out", str(out), "--no-progress"]) == 2
    assert one_line(capsys).startswith("genesis-jax: error: ")
    assert not out.exists()


@pytest.mark.parametrize("value", [1e4, "1000"])
def test_an_integer_field_given_another_type_is_said_to_take_an_integer(value):
    from genesis_jax.algos.dqn import DQNConfig

    with pytest.raises(ValueError, match=f"learning-starts must be an integer >= 0, got {value!r}"):
        DQNConfig(learning_starts=value)  # "must be >= 0, got 10000.0" named the wrong fault


@pytest.mark.parametrize("algorithm", ["ppo", "dqn", "sac", "pqn", "world-model"])
def test_a_mistyped_config_field_in_python_names_the_field_it_resembles(algorithm):
    # the dataclass's own TypeError named the typo alone; the CLI already suggested the flag
    from genesis_jax.algos import get_algorithm

    config_class = get_algorithm(algorithm).config_class
    with pytest.raises(
        TypeError, match=rf"^{config_class.__name__} has no field 'precison'; did you mean 'precision'\?"
    ):
        config_class(precison="fp16")
    with pytest.raises(TypeError, match=rf"^{config_class.__name__} has no field 'no_such_setting'$"):
        config_class(no_such_setting=1)
