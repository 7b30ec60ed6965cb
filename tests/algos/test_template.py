"""The algorithm template gives a new algorithm (tests/algos/toy_algorithm.py, 100 lines with
its config) the CLI, the Session, checkpoints and resume, seeds under vmap and bench rows."""

import json
import shutil

import jax
import numpy as np
import pytest

from genesis_jax import algos
from genesis_jax.algos.base import chunk_size
from genesis_jax.cli import main
from tests.algos.toy_algorithm import Toy, ToyConfig
from tests.support.files import metric_rows


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))


def test_registration_gives_the_cli_command(registered, tmp_path, capsys):
    out = tmp_path / "toy"
    status = main(["train", "toy", "--total-steps", "64", "--precision", "fp16", "--out", str(out), "--no-progress"])
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = metric_rows(out)
    assert [r["update"] for r in rows] == list(range(1, 65))
    assert summary["precision"] == "fp16" and summary["total_updates"] == 64 and summary["final_loss"] < 0.05
    assert summary["skipped_updates"] == sum(r["skipped"] for r in rows)
    assert (out / "checkpoints").is_dir() and (out / "curves.png").is_file()
    captured = capsys.readouterr()
    assert captured.out.startswith("toy [fp16]")
    assert captured.err.count("note: fp16 computes in float16") == 1  # printed as training started
    assert main(["train", "toy", "--help"]) == 0
    assert "--lr" in capsys.readouterr().out


def test_resume_from_a_checkpoint_continues_bit_identically(tmp_path):
    config = ToyConfig(precision="fp16", total_steps=64)
    straight = Toy.train(config, str(tmp_path / "run"), checkpoint_every=16, progress=False, max_to_keep=None)
    for later in (48, 64):  # as if the run had died after its checkpoint at step 32
        shutil.rmtree(tmp_path / "run" / "checkpoints" / str(later))
    resumed = Toy.train(config, str(tmp_path / "run"), checkpoint_every=16, progress=False, resume=True)
    jax.tree.map(np.testing.assert_array_equal, resumed.train_state.params, straight.train_state.params)
    assert resumed.metrics == straight.metrics  # the same rows, each update once


def test_seeds_under_vmap_keep_their_own_counts():
    result = Toy.train(ToyConfig(precision="fp16", total_steps=32, num_seeds=3), progress=False)
    assert np.asarray(result.train_state.skipped).shape == (3,)
    assert np.asarray(result.train_state.params["w"]).shape == (3, 3)
    assert result.summary["total_updates"] == 3 * 32


def test_bench_rows_for_free(registered):
    from genesis_jax.cli.bench import Workload, _run

    (row,) = _run(Workload("toy-small", "toy", {"total_steps": 32}), "fp16", [0])
    assert row["accuracy"] < 1.0 and row["total_steps"] == 32 and len(row["scale_trace"]) == 32


def test_chunks_divide_the_run():
    assert chunk_size(64, None) == 2 and chunk_size(10**15 // 4096, None) > 0
    with pytest.raises(ValueError, match="does not divide"):
        chunk_size(64, 5)


def test_a_resume_between_chunk_boundaries_stops_at_the_total(tmp_path):
    # 3 updates, then extended to 64: chunks of 2 (chunk_size(64)) from update 3 once ran to 65.
    assert chunk_size(64, None) == 2
    Toy.train(ToyConfig(total_steps=3), str(tmp_path), progress=False)
    longer = Toy.train(ToyConfig(total_steps=64), str(tmp_path), resume=True, allow_config_change=True, progress=False)
    assert [r["update"] for r in longer.metrics] == list(range(1, 65))
    assert int(longer.train_state.step) == 64
