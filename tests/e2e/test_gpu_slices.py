"""The GPU study's slice script (experiments/gpu_slices.py) at smoke size, on the CPU: it runs
the pending cells in order until its deadline, archives them, the archive unpacks into
benchmarks/, and nothing is pending after. In the long lane (pytest --long): each cell is a
study in a subprocess."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "gpu_slices.py"


@pytest.fixture
def slices(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_slices", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tiny = {"tasks": ["wm:synthetic"], "num_seeds": 2, "total_steps": {"wm:synthetic": 1}}
    monkeypatch.setitem(module.PRESETS, "gpu", tiny)
    monkeypatch.setattr(module, "PRECISIONS", ("fp32", "bf16"))
    monkeypatch.setattr(module, "BENCH_WORKLOADS", ("big-a", "big-b"))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    return module


@pytest.mark.slow
@pytest.mark.long  # subprocess studies: minutes on 2 busy cores
def test_order_then_run_archive_and_unpack(slices, tmp_path):
    study, bench = tmp_path / "study-gpu", tmp_path / "bench"
    pending = slices.pending_slices(study, bench)
    assert pending == [("bench", "big-a"), ("bench", "big-b"), ("task", "wm:synthetic", slices.PRECISIONS)]

    (bench / "run-1").mkdir(parents=True)
    (bench / "run-1" / "results.csv").write_text("workload,precision\nbig-a,fp32\nbig-b,fp32\n")  # came back
    done = slices.run(600.0, tmp_path / "out", study, bench, num_seeds=2)
    assert done == [("task", "wm:synthetic", slices.PRECISIONS)]
    assert slices.pending_slices(study, bench) == []

    names = slices.unpack(tmp_path / "out" / "slices.tar.gz", root=tmp_path / "repo")
    cells = [f"benchmarks/study-gpu/cells/wm:synthetic/{p}/summary.json" for p in slices.PRECISIONS]
    assert names == sorted([*cells, "benchmarks/bench/run-1/results.csv"])
    summary = json.loads((tmp_path / "repo" / cells[0]).read_text())
    assert len(summary["seeds"]) == 2


def test_a_spent_deadline_runs_nothing_but_still_archives(slices, tmp_path):
    done = slices.run(10.0, tmp_path / "out", tmp_path / "study", tmp_path / "bench")
    assert done == []
    assert (tmp_path / "out" / "slices.tar.gz").exists()


def test_the_bench_runs_a_workload_a_slice_and_resumes_after_those_that_came_back(slices, tmp_path):
    bench = tmp_path / "bench"
    (bench / "big-a").mkdir(parents=True)
    (bench / "big-a" / "results.csv").write_text("workload,precision\nbig-a,fp32\nbig-a,fp16\n")
    assert slices.benched_workloads(bench) == {"big-a"}
    assert slices.pending_slices(tmp_path / "study", bench)[0] == ("bench", "big-b")
