"""The quick precision benchmark end to end (it is what CI runs of it), and the mismatch
grid's helpers."""

import csv

import numpy as np
import pytest

from genesis_jax.cli import main
from genesis_jax.cli.mismatch import grid_matrix

# The quick grid but wm-wide (wm-small's network 8x wider, the same code path) and PPO on
# gymnasium (host environments step through the same compiled loop; tests/algos/test_ppo_train.py
# trains them): each cell is a compile, and the fixture is this suite's longest setup.
WORKLOADS = ("ppo-cartpole-gymnax", "wm-small")


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    assert main(["bench", "--quick", "--workloads", ",".join(WORKLOADS), "--out", str(out)]) == 0
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    return out, {(r["workload"], r["precision"]): r for r in rows}


def num(row, key):
    return float(row[key]) if row[key] not in ("", "None") else None


@pytest.mark.slow  # the quick_bench fixture runs the benchmark grid: about 100 s
def test_every_workload_and_precision_is_measured(quick_bench):
    out, rows = quick_bench
    workloads = set(WORKLOADS)
    assert set(rows) == {(w, p) for w in workloads for p in ("fp32", "bf16", "fp16", "fp16-full")}
    for row in rows.values():
        assert num(row, "steps_per_second") > 0 and num(row, "compile_seconds") > 0
    assert all(num(rows[(w, "fp32")], "speedup") == 1.0 for w in workloads)
    assert rows[("ppo-cartpole-gymnax", "fp32")]["seeds"] == "2"
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
