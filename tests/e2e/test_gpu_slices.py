"""The GPU study's slice script (experiments/gpu_slices.py) at smoke size, on the CPU: it runs
the pending cells in order until its deadline, archives them, the archive unpacks into
benchmarks/, and nothing is pending after. In the long lane (pytest --long): each cell is a
study in a subprocess."""

import importlib.util
import json
import pathlib
import shutil
import subprocess

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
    benchmarks = tmp_path / "benchmarks"  # no planned study: the repository's own are not this test's
    pending = slices.pending_slices(study, bench, benchmarks)
    assert pending == [("bench", "big-a"), ("bench", "big-b"), ("task", "wm:synthetic", slices.PRECISIONS)]

    (bench / "run-1").mkdir(parents=True)
    (bench / "run-1" / "results.csv").write_text("workload,precision\nbig-a,fp32\nbig-b,fp32\n")  # came back
    done = slices.run(600.0, tmp_path / "out", study, bench, num_seeds=2, benchmarks=benchmarks)
    assert done == [("task", "wm:synthetic", slices.PRECISIONS)]
    assert slices.pending_slices(study, bench, benchmarks) == []

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


def planned(benchmarks: pathlib.Path, name: str, num_seeds: int) -> pathlib.Path:
    study = {"tasks": ["t"], "precisions": ["fp32", "fp16"], "total_steps": {"t": 100}, "seed": 8, "reps": 2000}
    (benchmarks / name).mkdir(parents=True)
    (benchmarks / name / "plan.json").write_text(json.dumps({"study": {**study, "num_seeds": num_seeds}}))
    return benchmarks / name


def finish(study: pathlib.Path, cell: str) -> None:
    (study / "cells" / cell).mkdir(parents=True)
    (study / "cells" / cell / "summary.json").write_text("{}")


def test_planned_studies_with_cells_to_run_are_slices_the_fewest_steps_first(slices, tmp_path):
    benchmarks = tmp_path / "benchmarks"
    big, small = planned(benchmarks, "a-big", 376), planned(benchmarks, "b-small", 8)
    (benchmarks / "c-old").mkdir()
    (benchmarks / "c-old" / "plan.json").write_text("{}")  # an earlier version's plan fixes no study: no slice
    finish(small, "t/fp32")
    assert slices.confirmatory_slices(benchmarks) == [
        ("confirm", "b-small", ("t/fp16",)),
        ("confirm", "a-big", ("t/fp32", "t/fp16")),
    ]
    finish(small, "t/fp16")
    assert slices.confirmatory_slices(benchmarks) == [("confirm", "a-big", ("t/fp32", "t/fp16"))]
    bench = tmp_path / "bench"
    assert slices.pending_slices(tmp_path / "study", bench, benchmarks)[:3] == [
        ("bench", "big-a"),
        ("bench", "big-b"),
        ("confirm", "a-big", ("t/fp32", "t/fp16")),
    ]
    command = slices.confirmatory_command(big)
    flags = dict(zip(command[4::2], command[5::2]))
    assert flags["--out"] == str(big) and flags["--num-seeds"] == "376" and flags["--total-steps"] == "t=100"
    assert command[-2:] == ["--confirmatory", "--no-progress"]


@pytest.mark.slow
def test_a_committed_plan_accepts_its_slice_command_and_refuses_another(slices, tmp_path):
    """The PQN MinAtar plan, copied: the study checks a confirmatory command against its plan
    before anything trains (--dry-run trains nothing)."""
    study = tmp_path / "study-pqn-minatar-cpu"
    study.mkdir()
    for name in ("plan.json", "plan.md"):  # plan.md states the hash plan.json must have
        shutil.copy(SCRIPT.parents[1] / "benchmarks" / "study-pqn-minatar-cpu" / name, study)
    command = slices.confirmatory_command(study)
    accepted = subprocess.run([*command, "--dry-run"], capture_output=True, text=True)
    assert accepted.returncode == 0 and "--dry-run: nothing trained" in accepted.stdout, accepted.stderr
    command[command.index("--num-seeds") + 1] = "32"
    refused = subprocess.run([*command, "--dry-run"], capture_output=True, text=True)
    assert refused.returncode != 0 and "num_seeds: plan 376, study 32" in refused.stderr, refused.stderr
