"""Bad input to `genesis-jax study` and `bench` is one line (exit status 2) before anything
trains: flags the command would ignore, a study with nothing to compare with fp32, an --out
that is a file or inside a run directory, SLURM without srun, bench seeds a vmapped run would
not train; and damaged cell files are refused naming the file. Cells are written by hand
(tests/e2e/test_study_honesty.py's `write_cell`), so nothing trains."""

from __future__ import annotations

import json

import pytest

from genesis_jax.cli import build_parser, main
from genesis_jax.cli.bench import seeds_line
from genesis_jax.cli.study import check_flags, header
from tests.e2e.test_study_honesty import SEEDS, files, one_line, study_argv, write_cell


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--plan", "--report-only"], "--plan runs only the pilot: --report-only is the study's"),
        (["--plan", "--confirmatory"], "--plan runs only the pilot: --confirmatory is the study's"),
        (["--plan", "--no-cost"], "--plan runs only the pilot: --no-cost is the study's"),
        (["--plan", "--executor", "slurm"], "--plan runs only the pilot: --executor is the study's"),
        (["--plan", "--executor-options", "timeout_min=5"], "--plan runs only the pilot: --executor-options is"),
        (["--pilot-seeds", "4"], "--pilot-seeds is the pilot's: add --plan, or drop it"),
        (["--pilot-seeds", "8"], "--pilot-seeds is the pilot's: add --plan, or drop it"),  # its default value too
    ],
)
def test_flags_the_command_would_ignore_are_refused(flags, message):
    args = build_parser().parse_args(["study", "--out", "s", *flags])
    with pytest.raises(ValueError, match=f"^{message}"):
        check_flags(args)


def test_the_flags_a_command_uses_are_not_refused():
    for flags in ([], ["--plan", "--pilot-seeds", "4"], ["--executor", "slurm", "--executor-options", "mem_gb=4"]):
        check_flags(build_parser().parse_args(["study", "--out", "s", *flags]))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--executor-options", "timeout_min=5"], "--executor-options are a job executor's: add --executor slurm or "),
        (["--plan", "--num-seeds", "0"], "--num-seeds of a plan (the study's least seeds per cell) must be at least 2"),
        (["--plan", "--num-seeds", "-3"], "--num-seeds of a plan (the study's least seeds per cell) must be at least"),
        (["--precisions", "fp32"], "a study compares at least one precision with fp32: add one of bf16, fp16, fp16-"),
        (["--executor", "slurm"], "--executor slurm needs SLURM (srun not found); use --executor submitit-local"),
    ],
)
def test_bad_study_flags_are_one_line(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--num-seeds", "2", "--no-progress", "--dry-run", *flags]) == 2
    assert one_line(capsys).startswith(f"genesis-jax: error: {message}")
    assert not out.exists()


def test_an_out_that_is_a_file_or_inside_a_run_directory_is_refused(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "study"):
        assert main(study_argv(out, "--dry-run")) == 2
        assert one_line(capsys) == f"genesis-jax: error: --out {out}: {afile} is a file; give the study a directory"
    cell = write_cell(tmp_path / "done", "fp32")  # a finished cell's run directory
    before = files(tmp_path / "done")
    assert main(study_argv(cell / "study", "--dry-run")) == 2
    assert one_line(capsys) == (
        f"genesis-jax: error: --out {cell / 'study'} is inside the run directory {cell}; give the study a directory "
        "of its own"
    )
    assert files(tmp_path / "done") == before
    # A project's own checkpoints/ folder (or a summary.json) above --out is no run directory.
    (tmp_path / "project" / "checkpoints").mkdir(parents=True)
    (tmp_path / "project" / "summary.json").write_text("{}")
    assert main(study_argv(tmp_path / "project" / "studies" / "s", "--dry-run")) == 0


def last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_cut_or_torn_metrics_file_is_refused_naming_it(tmp_path, capsys):
    out = tmp_path / "study"
    write_cell(out, "fp32")
    fp16 = write_cell(out, "fp16")
    metrics = fp16 / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:2]))  # cut at a line boundary: half the run
    assert main(study_argv(out)) == 2
    assert last_line(capsys) == (
        f"genesis-jax: error: {metrics} ends at 1024 steps, before the 2048 its summary.json ran (cut): delete "
        f"{fp16} and run the study again to train it anew"
    )
    metrics.write_text("".join(lines) + lines[-1][:20])  # a torn last line
    assert main(study_argv(out)) == 2
    line = last_line(capsys)
    assert line.startswith(f"genesis-jax: error: {metrics} cannot be read (") and "Expecting" in line
    assert not (out / "report.md").exists()


def test_counts_of_one_are_singular(tmp_path, capsys):
    out = tmp_path / "study"
    summary = json.loads((write_cell(out, "fp32", num_seeds=1) / "summary.json").read_text())
    text = " ".join(header("genesis-jax study", {"CartPole-v1": {"fp32": summary}}, 1, 3.0))
    assert "1 seed per cell (seeds 0 to 0;" in text and "1 cell trained in this invocation (3 s), 0 kept" in text
    assert main(study_argv(tmp_path / "other", "--precisions", "fp32,fp16", "--dry-run")) == 0
    assert capsys.readouterr().out.startswith(
        f"2 cells: 1 task x 2 precisions (fp32, fp16)\n  CartPole-v1: 2 cells x {SEEDS} seeds"
    )


@pytest.mark.parametrize("seeds", ["5,9", "0,0", "1,0"])
def test_bench_seeds_a_vmapped_run_would_not_train_are_refused(tmp_path, capsys, seeds):
    assert main(["bench", "--quick", "--seeds", seeds, "--out", str(tmp_path / "b")]) == 2
    assert one_line(capsys) == f"genesis-jax: error: --seeds must be consecutive and distinct (as 0,1,2), got {seeds}"
    assert not (tmp_path / "b").exists()


def test_the_bench_header_says_the_seeds_each_workload_ran():
    assert seeds_line({"ppo-cartpole-gymnax": [5, 6], "wm-small": [5, 6]}) == "seeds [5, 6]"
    assert seeds_line({"ppo-cartpole-gymnax": [5, 6], "wm-small": [5]}) == (
        "seeds [5, 6] for ppo-cartpole-gymnax; [5] for wm-small"
    )


def test_the_cost_of_a_resumed_cell_is_not_measured():
    from genesis_jax.cli.study import measure_cost

    cell = dict(seeds=[0, 1], total_steps=2048, device="cpu:cpu x1", wall_seconds=4.0, compile_seconds=1.0)
    single = {**cell, "seeds": [0], "wall_seconds": 2.0}
    assert "2 seeds take 2.00x the wall time of 1 seed (3.00x without compilation)." in measure_cost("T", single, cell)
    (line,) = measure_cost("T", single, {**cell, "resumed_from": 3})
    assert line == (
        "T, fp32, 2048 steps per seed, on cpu:cpu x1: not measured: the 2-seed cell resumed after a stop, so its "
        "wall time is its last session's alone; delete it and run the study again to measure the cost"
    )
