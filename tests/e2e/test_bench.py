"""The quick precision benchmark end to end (it is what CI runs of it), and the mismatch
grid's helpers."""

import contextlib
import csv
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from genesis_jax.cli import main
from genesis_jax.cli.mismatch import grid_matrix, mismatch_grid
from tests.support.xla import optimized_compiles

# Each cell is a compile, and the fixture is this suite's longest setup: the quick grid's
# world model at every precision (wm-wide is wm-small 8x wider, the same code path), and its
# gymnax PPO, which runs 65536 steps a cell, at fp32 and fp16 (bf16 and fp16-full train it in
# tests/algos/test_every_precision.py; gymnasium PPO steps through the same compiled loop,
# tests/algos/test_ppo_train.py trains it), compiled with XLA's optimisations (run-bound).
GRID = {"wm-small": ("fp32", "bf16", "fp16", "fp16-full"), "ppo-cartpole-gymnax": ("fp32", "fp16")}
RUN_BOUND = {"ppo-cartpole-gymnax"}


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    outs, rows = [], {}
    for workload, precisions in GRID.items():
        out = tmp_path_factory.mktemp("bench")
        argv = ["bench", "--quick", "--workloads", workload, "--precisions", ",".join(precisions), "--out", str(out)]
        with optimized_compiles() if workload in RUN_BOUND else contextlib.nullcontext():
            assert main(argv) == 0
        with open(out / "results.csv") as f:
            rows.update({(r["workload"], r["precision"]): r for r in csv.DictReader(f)})
        outs.append(out)
    return outs, rows


def num(row, key):
    return float(row[key]) if row[key] not in ("", "None") else None


@pytest.mark.slow  # the quick_bench fixture runs the benchmark grid: about 50 s
def test_every_workload_and_precision_is_measured(quick_bench):
    outs, rows = quick_bench
    assert set(rows) == {(w, p) for w, precisions in GRID.items() for p in precisions}
    for row in rows.values():
        assert num(row, "steps_per_second") > 0 and num(row, "compile_seconds") > 0
    assert all(num(rows[(w, "fp32")], "speedup") == 1.0 for w in GRID)
    assert rows[("ppo-cartpole-gymnax", "fp32")]["seeds"] == "2"
    for out in outs:
        for name in ("results.md", "precision.png"):
            assert (out / name).stat().st_size > 0


@pytest.mark.slow  # quick_bench fixture
def test_half_precision_halves_world_model_activations(quick_bench):
    _, rows = quick_bench
    for p in ("bf16", "fp16"):
        assert 0.45 <= num(rows[("wm-small", p)], "memory_ratio") <= 0.55


@pytest.mark.slow  # quick_bench fixture
def test_no_loss_scaling_means_no_overflow_and_scale_one(quick_bench):
    _, rows = quick_bench
    scaled = {}
    for (w, p), row in rows.items():
        if p in ("fp32", "bf16"):
            assert num(row, "overflow_rate") == 0.0 and num(row, "final_loss_scale") == 1.0
        else:
            scaled[(w, p)] = (num(row, "overflow_rate"), num(row, "final_loss_scale"))
    # fp16 runs use the dynamic scaler (initial 2^16): without an overflow it never backs off,
    # and somewhere in the benchmark an overflow did make it back off.
    assert all(scale >= 2.0**16 for rate, scale in scaled.values() if rate == 0)
    assert any(rate > 0 and scale < 2.0**16 for rate, scale in scaled.values())


def test_grid_matrix_places_cells():
    cells = [
        {"env": "E", "rollout": r, "learner": learner, "k": 10 * i + j}
        for i, learner in enumerate(("fp32", "bf16", "fp16"))
        for j, r in enumerate(("fp32", "bf16", "fp16"))
    ]
    np.testing.assert_array_equal(grid_matrix(cells, "E", "k"), [[0, 1, 2], [10, 11, 12], [20, 21, 22]])


def test_the_accuracy_panel_says_its_seeds_and_what_quick_budgets_cannot_show():
    from genesis_jax.cli.bench import accuracy_caption

    assert accuracy_caption([{"seeds": 2}, {"seeds": 2}], quick=True) == (
        "accuracy over fp32 (higher is better; 2 seeds each; --quick: tiny budgets, not a learning comparison)"
    )
    assert accuracy_caption([{"seeds": 1}, {"seeds": 3}], quick=False) == (
        "accuracy over fp32 (higher is better; 1-3 seeds each)"
    )


def test_a_training_runs_directory_is_refused_as_the_benchmarks_out(tmp_path, capsys):
    # the bench wrote its results.csv, results.md and precision.png into a run's directory
    (tmp_path / "checkpoints").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["bench", "--quick", "--workloads", "wm-small", "--precisions", "fp32", "--out", str(tmp_path)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    said = f"{tmp_path} holds a training run (checkpoints): give the benchmark its own --out"
    assert line == f"genesis-jax: error: {said}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_unknown_workload_is_named_and_a_full_one_asked_of_quick_says_so(tmp_path, capsys):
    # "unknown workload in ['dqn-cnn-minatar']": a workload of the full benchmark, which --quick leaves out
    for name, said in [("dqn-cnn-minatar", "'dqn-cnn-minatar' (it runs without --quick)"), ("nope", "'nope';")]:
        argv = ["bench", "--quick", "--workloads", f"pqn-cartpole,{name}", "--out", str(tmp_path / "b")]
        assert main(argv) == 2 and f"error: unknown workload {said}" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_the_mismatch_grid_refuses_bad_input_before_any_cell_trains(monkeypatch, tmp_path, capsys):
    # A typo in the second env once failed after the first env's nine cells had trained, writing nothing.
    experiments = pathlib.Path(__file__).resolve().parents[2] / "experiments"
    monkeypatch.syspath_prepend(str(experiments))  # the script's `_report`
    spec = importlib.util.spec_from_file_location("mismatch_script", experiments / "mismatch.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    trained = lambda *args, **kwargs: pytest.fail("a cell trained")
    monkeypatch.setattr(script, "mismatch_grid", trained)
    monkeypatch.setattr("genesis_jax.algos.ppo.train", trained)
    (tmp_path / "file").write_text("")
    for argv, said in [
        (["--envs", "CartPole-v1,Pendulm-v1"], "did you mean Pendulum-v1"),
        (["--total-steps", "100"], "less than one rollout"),
        (["--out", str(tmp_path / "file")], "is a file"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            script.main(["--out", str(tmp_path / "out"), *argv])
        assert exit_.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        mismatch_grid("CartPole-v1", 2048, precisions=("fp32", "fp8"))


def test_the_mismatch_grid_keeps_each_envs_table_as_it_finishes_and_runs_a_repeated_env_once(monkeypatch, tmp_path):
    experiments = pathlib.Path(__file__).resolve().parents[2] / "experiments"
    monkeypatch.syspath_prepend(str(experiments))
    spec = importlib.util.spec_from_file_location("mismatch_script", experiments / "mismatch.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ran = []

    def grid(env, *args, **kwargs):  # CartPole's cells, then a failure in the next env's grid
        ran.append(env)
        if env != "CartPole-v1":
            raise RuntimeError("a later cell failed")
        cell = dict(mismatch_kl_v1=0.0, mismatch_kl_v2=0.0, mismatch_max_dp=0.0, final_return=9.0)
        return [{"env": env, "rollout": r, "learner": lr, **cell} for lr in ("fp32", "bf16") for r in ("fp32", "bf16")]

    monkeypatch.setattr(script, "mismatch_grid", grid)
    with pytest.raises(RuntimeError, match="a later cell failed"):  # the results were written at the end alone
        script.main(["--out", str(tmp_path), "--envs", "CartPole-v1,CartPole-v1,Pendulum-v1", "--total-steps", "2048"])
    assert ran == ["CartPole-v1", "Pendulum-v1"]  # CartPole's grid ran twice, and the table kept the last
    assert len(json.loads((tmp_path / "mismatch.json").read_text())) == 4 and (tmp_path / "mismatch.md").is_file()
