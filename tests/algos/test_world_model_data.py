"""Every malformed world-model dataset is refused in one sentence that names the file, the key
and what is wrong, before anything is compiled, and the file is left as it was; a run whose
every step was skipped says that no update was applied instead of showing a loss."""

from __future__ import annotations

import hashlib
import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.world_model import WorldModelConfig, WorldModelTrainer, train
from genesis_jax.algos.world_model import data as wm_data
from genesis_jax.cli import main
from genesis_jax.data import trajectories

N, T, D = 6, 4, 3  # sequences, steps, observation features of the hand-made datasets


def discrete_dataset() -> dict:
    """A valid dataset with 3 discrete actions, as `genesis-jax collect` writes one."""
    rng = np.random.default_rng(0)
    return {
        "obs": rng.normal(size=(N, T + 1, D)).astype(np.float32),
        "next_obs": rng.normal(size=(N, T, D)).astype(np.float32),
        "action": rng.integers(0, 3, size=(N, T)).astype(np.int32),
        "reward": rng.normal(size=(N, T)).astype(np.float32),
        "terminated": (rng.uniform(size=(N, T)) < 0.1).astype(np.float32),
        "meta": {"source": "hand-made", "discrete_actions": True, "action_dim": 3},
    }


def write_raw(path, data: dict) -> None:
    """Saves as `save_dataset` does, but writes any meta (a list too) as JSON."""
    arrays = {k: v for k, v in data.items() if k != "meta"}
    np.savez_compressed(path, meta=json.dumps(data["meta"]), **arrays)


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def changed(**changes):
    """A function making a copy of the valid dataset with `changes` (None: the key removed)."""

    def make():
        data = discrete_dataset()
        for key, value in changes.items():
            if value is None:
                data.pop(key)
            else:
                data[key] = value(data) if callable(value) else value
        return data

    return make


def with_value(key, index, value):
    """An edit setting `data[key][index] = value` (on a copy)."""

    def edit(data):
        array = data[key].copy()
        array[index] = value
        return array

    return edit


def first_sequence(key):
    """An edit keeping the first sequence of `key` alone."""
    return lambda data: data[key][:1]


MALFORMED = {
    # meta: a list, or a dict without a key it needs, or a value of the wrong kind
    "meta-list": (changed(meta=["source", "action_dim"]), "meta", "must be a dict"),
    "meta-no-action-dim": (changed(meta={"source": "x", "discrete_actions": True}), "meta", "no action_dim"),
    "meta-no-source": (changed(meta={"discrete_actions": True, "action_dim": 3}), "meta", "no source"),
    "meta-action-dim-text": (
        changed(meta={"source": "x", "discrete_actions": True, "action_dim": "3"}),
        "meta action_dim",
        "an integer",
    ),
    "meta-action-dim-zero": (
        changed(meta={"source": "x", "discrete_actions": True, "action_dim": 0}),
        "meta action_dim",
        ">= 1",
    ),
    # sequence counts that disagree between keys
    "reward-fewer-sequences": (changed(reward=lambda d: d["reward"][:-1]), "reward", "5 sequences, obs has 6"),
    "action-more-sequences": (
        changed(action=lambda d: np.concatenate([d["action"], d["action"][:1]])),
        "action",
        "7 sequences, obs has 6",
    ),
    "next-obs-fewer-sequences": (changed(next_obs=lambda d: d["next_obs"][:2]), "next_obs", "2 sequences"),
    # string observations, a 1-D reward, short observations, other shapes
    "string-obs": (changed(obs=np.full((N, T + 1, D), "a")), "obs", "must hold real numbers"),
    "bytes-reward": (changed(reward=np.full((N, T), b"x")), "reward", "must hold real numbers"),
    "complex-next-obs": (
        changed(next_obs=lambda d: d["next_obs"].astype(np.complex64)),
        "next_obs",
        "must hold real numbers",
    ),
    "1d-reward": (changed(reward=lambda d: d["reward"][:, 0]), "reward", "[sequences, steps]"),
    "short-obs": (changed(obs=lambda d: d["obs"][:, :T]), "obs", "4 observations per sequence, but action"),
    "reward-one-step-short": (changed(reward=lambda d: d["reward"][:, :-1]), "reward", "3 steps per sequence"),
    "2d-obs": (changed(obs=lambda d: d["obs"][:, :, 0]), "obs", "[sequences, steps + 1, features]"),
    "next-obs-features": (changed(next_obs=lambda d: d["next_obs"][:, :, :2]), "next_obs", "got (6, 4, 2)"),
    "missing-terminated": (changed(terminated=None), "terminated", "no terminated"),
    "one-sequence": (
        changed(**{key: first_sequence(key) for key in ("obs", "next_obs", "action", "reward", "terminated")}),
        "obs",
        "at least 2 sequences",
    ),
    "meta-discrete-text": (
        changed(meta={"source": "x", "discrete_actions": "yes", "action_dim": 3}),
        "meta discrete_actions",
        "true or false",
    ),
    # actions out of range or not integers
    "action-too-large": (changed(action=with_value("action", (2, 1), 3)), "action", "holds 3 at [2, 1]"),
    "action-negative": (changed(action=with_value("action", (0, 3), -1)), "action", "holds -1 at [0, 3]"),
    "action-floats": (changed(action=lambda d: d["action"].astype(np.float32)), "action", "must hold integers"),
    # values: all-NaN, inf, huge, flags outside [0, 1]
    "all-nan-obs": (changed(obs=lambda d: np.full_like(d["obs"], np.nan)), "obs", "must be finite"),
    "inf-reward": (changed(reward=with_value("reward", (1, 1), np.inf)), "reward", "holds inf at [1, 1]"),
    "huge-obs": (changed(obs=lambda d: d["obs"] * 1e30), "obs", "squared error"),
    "huge-reward": (changed(reward=lambda d: d["reward"] + 1e20), "reward", "squared error"),
    "terminated-2": (changed(terminated=lambda d: d["terminated"] + 2), "terminated", "[0, 1]"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_dataset_is_refused_in_one_line_naming_the_file_and_key(tmp_path, case):
    make, key, words = MALFORMED[case]
    path = tmp_path / "bad.npz"
    write_raw(path, make())
    before = digest(path)
    with pytest.raises(ValueError) as err:
        trajectories.load_dataset(str(path))
    message = str(err.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(str(path)) and key in message and words in message, message
    assert digest(path) == before


@pytest.mark.parametrize("meta", [{"source": "x", "discrete_actions": True, "action_dim": 3}, "x"])
def test_a_meta_that_is_not_json_text_is_refused_saying_how_to_write_it(tmp_path, meta):
    """np.savez(meta={...}), as a user writes a dict, pickles it: numpy's refusal to load an
    object array, or a JSON parser's 'Expecting value', said nothing of what meta must be."""
    path = tmp_path / "hand.npz"
    np.savez(path, meta=meta, **{k: v for k, v in discrete_dataset().items() if k != "meta"})
    with pytest.raises(ValueError, match=r"hand\.npz .*meta is not a dict's JSON text \(write meta=json\.dumps"):
        trajectories.load_dataset(str(path))


def test_the_valid_datasets_pass_and_load_unchanged(tmp_path):
    """The control for the cases above: the datasets they break are accepted as they are."""
    for name, data in (("discrete", discrete_dataset()), ("synthetic", wm_data.synthetic_dataset(8, 5))):
        path = tmp_path / f"{name}.npz"
        trajectories.save_dataset(data, str(path))
        loaded = trajectories.load_dataset(str(path))
        assert loaded["meta"] == data["meta"]
        for key in data:
            if key != "meta":
                np.testing.assert_array_equal(loaded[key], data[key])


def test_the_magnitude_bound_is_the_train_precisions():
    """|obs| = 1e5 is beyond float16 (65504) but not bfloat16 or float32: refused for fp16 alone."""
    data = discrete_dataset()
    data["obs"][0, 0, 0] = 1e5
    trajectories.validate_dataset(data, "d.npz", jnp.float32, "fp32")
    trajectories.validate_dataset(data, "d.npz", jnp.bfloat16, "bf16")
    with pytest.raises(ValueError, match=r"d\.npz: obs holds 100000 at \[0, 0, 0\] .*65504"):
        trajectories.validate_dataset(data, "d.npz", jnp.float16, "fp16")


def test_the_trainer_checks_the_data_against_its_precision_before_building_anything(tmp_path):
    data = discrete_dataset()
    data["obs"][1, 2, 0] = -7e4  # float16's largest is 65504
    path = tmp_path / "loud.npz"
    trajectories.save_dataset(data, str(path))
    config = dict(data=str(path), batch_size=4, width=8, depth=1, epochs=1)
    WorldModelTrainer(WorldModelConfig(precision="fp32", **config))  # sets up: the data fits float32
    with pytest.raises(ValueError, match="obs holds -70000 at \\[1, 2, 0\\]"):
        WorldModelTrainer(WorldModelConfig(precision="fp16", **config))


@pytest.mark.parametrize("case", ["meta-list", "action-too-large"])
def test_the_cli_refuses_a_malformed_dataset_in_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case):
    make, key, words = MALFORMED[case]
    path = tmp_path / "bad.npz"
    write_raw(path, make())
    before = digest(path)
    out = tmp_path / "run"
    argv = ["train", "world-model", "--data", str(path), "--batch-size", "4", "--no-progress", "--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("genesis-jax: error: ") and str(path) in err[0], err
    assert key in err[0] and words in err[0] and "Traceback" not in captured.err
    assert digest(path) == before and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("rate", [0.0, 1.0])  # each a tiny run
def test_a_run_that_applied_no_update_says_so_instead_of_a_loss(rate):
    """Every gradient non-finite (fault injection at rate 1, the guard off): the line the CLI
    prints says no update was applied and how many were skipped; the summary has
    applied_updates 0 and a NaN train loss (null in summary.json), not a perfect 0.0. At rate 0
    the same run applies every update and shows its loss."""
    config = WorldModelConfig(
        **dict(num_sequences=10, sequence_length=4, epochs=2, batch_size=8, width=8, depth=1, precision="fp32"),
        **dict(inject_nonfinite=rate, max_consecutive_skips=None, guard_min_scale=None),
    )
    result = train(config, progress=False)
    summary, line = result.summary, result.line
    # 8 training sequences x 4 one-step windows = 32 samples: 4 batches of 8 per epoch, 2 epochs
    assert summary["total_updates"] == 8
    if rate == 1.0:
        assert summary["applied_updates"] == 0 and summary["skipped_updates"] == 8
        assert np.isnan(summary["final_train_loss"]) and all(np.isnan(row["train_loss"]) for row in result.metrics)
        assert "no update was applied (all 8 skipped: gradients not finite)" in line and "train_loss" not in line
    else:
        assert summary["applied_updates"] == 8 and summary["skipped_updates"] == 0
        assert np.isfinite(summary["final_train_loss"]) and summary["final_train_loss"] > 0
        assert "train_loss=" in line and "no update was applied" not in line


def test_float16_data_is_checked_against_float32_limits_without_an_overflow_warning():
    """Comparing float16 values with float32's maximum overflowed the limit to inf, which numpy
    said in a warning the run printed ("overflow encountered in cast"); the data was fine."""
    data = wm_data.synthetic_dataset(4, 5)
    half = {**data, "obs": data["obs"].astype(np.float16), "reward": data["reward"].astype(np.float16)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trajectories.validate_dataset(half, "half.npz", jnp.float32, "fp32")
    with pytest.raises(trajectories.DatasetError, match="obs holds .* takes \\|x\\| <= 65504"):  # still checked
        trajectories.validate_dataset({**data, "obs": data["obs"] * 1e5}, "big.npz", jnp.float16, "fp16")
