"""Nothing duplicated or silently accepted, in one process: bad arguments with --overwrite,
corrupted checkpoints, changed settings on resume, torn metrics, bad values, damaged datasets
and system failures, each refused in one line with the run on disk untouched. Real corrupted
bytes. Killed runs and two processes on one directory are in test_integrity_processes.py."""

import json
import math
import time

import numpy as np
import pytest

from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.cli import main
from genesis_jax.run import run_dir as runs
from genesis_jax.run.checkpoint import CheckpointStore
from tests.support.files import one_line_error, snapshot, unwritable_path
from tests.support.small_run import SMALL, copy_of, metric_updates, ppo_argv, train_small_run


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return train_small_run(tmp_path_factory.mktemp("runs"))


@pytest.mark.slow  # small_run fixture, a CLI PPO run: 9-58 s
@pytest.mark.parametrize(
    "bad",
    [
        ["--updates-per-chunk", "3"],
        ["--devices", "2"],
        ["--num-seeds", "2", "--env-backend", "gymnasium"],
        ["--clip-eps", "nan"],
        ["--lr", "inf"],
        ["--max-grad-norm", "nan"],
    ],
)
def test_overwrite_with_a_bad_argument_leaves_the_old_run_untouched(small_run, tmp_path, capsys, bad):
    run = copy_of(small_run, tmp_path)
    before = snapshot(run)
    assert main(SMALL + ["--out", str(run), "--overwrite"] + bad) == 2
    assert "error" in one_line_error(capsys)
    assert snapshot(run) == before


@pytest.mark.slow  # trains a second run: 10 s
def test_overwrite_replaces_the_run_only_once_the_new_one_has_ended(small_run, tmp_path, capsys):
    from genesis_jax.algos.ppo import train

    run = copy_of(small_run, tmp_path)
    before = snapshot(run)

    def broken(grads, state):
        raise RuntimeError("the new run failed")

    with pytest.raises(RuntimeError, match="the new run failed"):
        train(
            PPOConfig(precision="fp16", total_steps=2048),
            str(run),
            overwrite=True,
            progress=False,
            grad_transform=broken,
        )
    assert snapshot(run) == before  # the old run is back, whole
    train(PPOConfig(precision="fp32", total_steps=2048), str(run), overwrite=True, progress=False)
    assert json.loads((run / "summary.json").read_text())["precision"] == "fp32"
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "ppo.png", "summary.json"]
    # an fp32 run now: its resume in fp16 is refused (the other direction: the next test)
    before, _ = snapshot(run), capsys.readouterr()  # the training runs' own output
    assert main(ppo_argv(4096, precision="fp16") + ["--out", str(run), "--resume"]) == 2
    assert "precision" in one_line_error(capsys)
    assert snapshot(run) == before


@pytest.mark.slow  # small_run fixture (9-58 s)
def test_a_flipped_bit_in_a_checkpoint_is_refused_naming_its_step(small_run, tmp_path, capsys):
    run = copy_of(small_run, tmp_path)
    step = CheckpointStore(run / "checkpoints").latest_step()
    data = max(
        (p for p in (run / "checkpoints" / str(step) / "state").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    data.write_bytes(bytes(raw))
    before = snapshot(run)
    assert main(SMALL + ["--total-steps", "4096", "--out", str(run), "--resume"]) == 2
    line = one_line_error(capsys)
    assert f"checkpoint at step {step}" in line and ("corrupted" in line or "cannot be read" in line), line
    assert snapshot(run) == before


@pytest.mark.slow  # the allowed case resumes training: 10 s
@pytest.mark.parametrize(
    "change, words",
    [
        (["--lr", "0.001"], "lr: 0.00025 -> 0.001"),
        (["--num-steps", "64"], "num-steps: 128 -> 64"),
        (["--seed", "3"], "seed: 0 -> 3"),
    ],
)
def test_resume_refuses_changed_settings_unless_allowed(small_run, tmp_path, capsys, caplog, change, words):
    run = copy_of(small_run, tmp_path)
    if change[0] == "--lr":  # the resume allowed below also drops a torn last metrics line
        with open(run / "metrics.jsonl", "a") as f:
            f.write('{"update": 5, "loss": 0.1')  # a process killed mid-line
    before = snapshot(run)
    argv = SMALL + ["--total-steps", "4096", "--out", str(run), "--resume"] + change
    assert main(argv) == 2
    line = one_line_error(capsys)
    assert words in line and "--allow-config-change" in line, line
    assert snapshot(run) == before
    if change[0] == "--lr":  # allowed: it continues, and the summary says what changed
        caplog.clear()
        assert main(argv + ["--allow-config-change"]) == 0
        summary = json.loads((run / "summary.json").read_text())
        moved = "total-steps: 2048 -> 4096 (moves the learning rate's decay to 0 (anneal-lr) mid-run)"
        assert summary["config_changes"] == [words, moved] and summary["total_steps"] == 4096
        # the torn last metrics line was dropped with a warning, the rows after it appended
        assert "torn last line" in caplog.text
        assert metric_updates(run) == list(range(1, 9))
        assert summary["iterations"] == len(metric_updates(run))


@pytest.mark.slow  # small_run fixture (fp32 -> fp16: on test_overwrite_replaces...'s fp32 run)
def test_resume_refuses_a_precision_change_in_either_direction(small_run, tmp_path, capsys):
    run = copy_of(small_run, tmp_path)  # SMALL: fp16
    before, _ = snapshot(run), capsys.readouterr()
    assert main(ppo_argv(4096, precision="bf16") + ["--out", str(run), "--resume"]) == 2
    assert "precision" in one_line_error(capsys)
    assert snapshot(run) == before


def test_json_output_never_holds_nan_or_infinity(tmp_path):
    run = runs.RunDirectory(tmp_path / "run").open()
    run.write_summary({"final_return": math.nan, "per_seed": [1.0, math.inf], "nested": {"x": -math.inf}}, {})
    run.append_metrics([{"update": 1, "episode_return": math.nan}])
    run.close(succeeded=True)

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))

    assert strict((tmp_path / "run" / "summary.json").read_text())["per_seed"] == [1.0, None]
    assert strict((tmp_path / "run" / "metrics.jsonl").read_text())["episode_return"] is None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--out", ""], "empty path"),
        (["--init-loss-scale", "nan"], "init-loss-scale must be a finite number"),
        (["--total-steps", "1000000000000000", "--num-envs", "4096", "--num-steps", "1"], None),
    ],
)
def test_bad_values_are_refused_in_one_line(tmp_path, capsys, argv, words):
    if words is None:  # a huge step count: the chunk search is O(sqrt n), so the config is answered at once
        from genesis_jax.algos.base import chunk_size

        started = time.perf_counter()
        assert chunk_size(10**15 // 4096, None) > 0 and time.perf_counter() - started < 5
        return
    assert main(["train", "ppo", "--no-progress"] + argv) == 2
    assert words in one_line_error(capsys)


def test_hidden_sizes_must_be_integers_not_a_string():
    with pytest.raises(ValueError, match="hidden must be a sequence of integers"):
        PPOConfig(hidden="64")


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated", "wrong-keys"])
def test_a_damaged_dataset_is_refused_in_one_line(tmp_path, capsys, content):
    path = tmp_path / "data.npz"
    if content == "wrong-keys":
        np.savez(path, x=np.zeros(3))
    else:
        path.write_bytes(content)
    assert main(["train", "world-model", "--data", str(path), "--no-progress"]) == 2
    assert "is not a dataset written by genesis-jax collect" in one_line_error(capsys)


def test_a_horizon_longer_than_the_datas_sequences_is_refused(tmp_path, capsys):
    path = tmp_path / "short.npz"
    assert (
        main(["collect", "--env", "CartPole-v1", "--num-sequences", "16", "--sequence-length", "4", "--out", str(path)])
        == 0
    )
    capsys.readouterr()
    assert main(["train", "world-model", "--data", str(path), "--horizon", "8", "--no-progress"]) == 2
    assert "horizon 8 is longer than the data's sequences (4 steps)" in one_line_error(capsys)


def test_a_missing_optional_dependency_is_an_error_naming_it_in_one_line(capsys):
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401

        pytest.skip("box2d is installed here")
    except ImportError:
        pass
    assert main(["train", "ppo", "--env", "LunarLander-v3", "--no-progress"]) == 2
    line = one_line_error(capsys)
    assert line.startswith("genesis-jax: error:") and "box2d" in line.lower()


@pytest.mark.slow  # trains to divergence: 10-12 s each
@pytest.mark.parametrize("precision, scale_advice", [("fp32", False), ("fp16", True)])
def test_divergence_advice_fits_the_precision(tmp_path, capsys, precision, scale_advice):
    # Every gradient non-finite: fp32 has no scale to tune, so loss-scale advice would mislead.
    argv = [
        "train",
        "ppo",
        "--precision",
        precision,
        "--total-steps",
        "8192",
        "--updates-per-chunk",
        "4",
        "--inject-nonfinite",
        "1.0",
        "--max-consecutive-skips",
        "2",
        "--no-progress",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "training diverged" in err
    assert ("--min-loss-scale" in err) == scale_advice
    assert ("lower the learning rate" in err) == (not scale_advice)


def test_an_unwritable_output_directory_is_a_system_failure_in_one_line(tmp_path, capsys):
    out = unwritable_path(tmp_path, "run")
    assert main(SMALL + ["--out", str(out)]) == 4
    line = one_line_error(capsys)
    assert line.startswith("genesis-jax: system failure") and str(out) in line
    assert not out.exists()
