"""The study on a cluster through submitit (`--executor`): cells run as jobs into the same
--out and give the same report as a study in one process; finished cells are never
submitted again (the cells on disk are the state, so a study whose job died resumes); a
failed job is one line naming its cell, with the finished cells kept."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from genesis_jax.algos import get_algorithm
from genesis_jax.cli import main
from genesis_jax.cli.study import cells, cluster, run_study
from tests.e2e.test_study_honesty import SEEDS, STEPS, write_cell

pytest.importorskip("submitit")


class FakeJob:
    def __init__(self, result=None, error=None):
        self.result_, self.error, self.job_id = result, error, "1"

    def done(self):
        return True

    def result(self):
        if self.error is not None:
            raise self.error
        return self.result_


class FakeExecutor:
    """submitit's executor surface the study uses: batch(), submit() and folder."""

    def __init__(self, fail=()):
        self.submitted, self.fail, self.folder = [], fail, "logs"

    def batch(self):
        import contextlib

        return contextlib.nullcontext()

    def submit(self, fn, path, task, config):
        self.submitted.append(path)
        if any(path.endswith(name) for name in self.fail):
            return FakeJob(error=RuntimeError("killed by the node"))
        return FakeJob(result={"path": path})


def test_finished_cells_are_not_submitted_again(tmp_path):
    from genesis_jax.cli.study import plan_cells, train_cells

    out = tmp_path / "study"
    write_cell(out, "fp32")  # finished before (a job that ended)
    planned = plan_cells(out, ["CartPole-v1"], ["fp32", "fp16"], SEEDS, 0, {"CartPole-v1": STEPS})
    executor = FakeExecutor()
    done, trained = train_cells(out, planned, False, None, executor=executor)
    fp16 = cells.cell_dir(out, "CartPole-v1", "fp16")
    assert executor.submitted == [str(fp16)] and trained == {fp16}
    assert done[fp16] == {"path": str(fp16)} and done[cells.cell_dir(out, "CartPole-v1", "fp32")]["num_seeds"] == SEEDS
    assert json.loads((out / cells.PLANNED).read_text()).keys() == {"cells/CartPole-v1/fp16"}  # its settings, first


def test_a_failed_job_names_its_cell_and_keeps_the_others(tmp_path):
    pending = {tmp_path / name: ("CartPole-v1", name, None) for name in ("fp32", "fp16")}
    with pytest.raises(cluster.JobFailed, match=r"1 of 2 cell jobs failed: CartPole-v1 fp16 \(job 1: killed by"):
        cluster.run_jobs(FakeExecutor(fail=("fp16",)), pending)


def test_executor_options_are_submitits_parameters(tmp_path, capsys):
    assert cluster.parse_options("timeout_min=60, mem_gb=7.5,slurm_partition=gpu") == {
        "timeout_min": 60,
        "mem_gb": 7.5,
        "slurm_partition": "gpu",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        cluster.parse_options("timeout_min")
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--num-seeds", "2", "--executor", "submitit-local", "--no-cost"]
    assert main([*argv, "--executor-options", "no_such_option=1"]) == 2
    assert "--executor-options for submitit-local:" in capsys.readouterr().err
    assert not (out / "cells").exists()


def _masked(path):
    return re.sub(r"\d+ cells? trained in this invocation \(\d+ s\)", "N cells trained (T s)", path.read_text())


@pytest.fixture
def tiny_world_model_task(monkeypatch):
    """wm:synthetic's cells at the world model's tiny size (`Presets.tiny`): a job gets its cell's
    config pickled from this process, so the jobs train the same tiny cells as the study in process.
    Its loss bounds (cached per task name) are measured on the tiny cells, and forgotten after."""
    task = cells.TASKS["wm:synthetic"]
    tiny = {k: v for k, v in get_algorithm(task.algo).presets.tiny.items() if k != task.budget_field}
    monkeypatch.setitem(cells.TASKS, "wm:synthetic", dataclasses.replace(task, settings={**task.settings, **tiny}))
    cells.loss_bounds.cache_clear()
    yield
    cells.loss_bounds.cache_clear()


@pytest.mark.slow  # four tiny world-model cells compile and train, two of them in submitit's subprocesses
@pytest.mark.usefixtures("tiny_world_model_task")
def test_a_study_through_submitits_local_executor_reports_as_one_in_process(tmp_path):
    options = dict(
        tasks=["wm:synthetic"], precisions=["fp32", "fp16"], num_seeds=2, total_steps=2, reps=100, cost=False
    )
    inline = run_study(tmp_path / "inline", progress=False, **options)
    jobs = run_study(tmp_path / "jobs", progress=False, executor="submitit-local", **options)
    assert _masked(jobs) == _masked(inline)
    assert (tmp_path / "jobs" / "stats.json").read_text() == (tmp_path / "inline" / "stats.json").read_text()
    assert list((tmp_path / "jobs" / "submitit").glob("*_log.out"))  # the cells ran as jobs
    for precision in ("fp32", "fp16"):  # the same (tiny) cells, byte for byte in what they learned
        a, b = (
            json.loads((p / "cells" / "wm:synthetic" / precision / "summary.json").read_text())
            for p in (tmp_path / "inline", tmp_path / "jobs")
        )
        assert a["eval_loss_per_seed"] == b["eval_loss_per_seed"] and a["config"] == b["config"]
