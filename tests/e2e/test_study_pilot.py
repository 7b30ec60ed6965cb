"""A study plan that knows its pilot: no plan is made from a pilot that did not learn (the
report's rule, `stats.LEARNED_FROM`), and every check `train` makes before it writes anything
the study makes on every cell before it creates `--out`. Pilot cells are written by hand
(tests/e2e/test_study_honesty.py's `write_cell`), so nothing trains."""

from __future__ import annotations

import pytest

from genesis_jax.cli import main
from genesis_jax.cli.study import cells
from tests.e2e.test_study_honesty import STEPS, one_line, write_cell

RANDOM = 22.0  # CartPole-v1's random return, stubbed: measuring it compiles a program


def plan_argv(out, *extra) -> list[str]:
    argv = ["study", "--plan", "--out", str(out), "--pilot-seeds", "8", "--precisions", "fp32,fp16"]
    return [*argv, "--total-steps", str(STEPS), "--no-progress", *extra]


@pytest.mark.parametrize(
    ("scores", "named"),
    [
        ({"fp32": 0.02, "fp16": -0.001}, "fp32, fp16"),  # the issue's: both at the random policy's floor
        ({"fp32": 0.8, "fp16": 0.003}, "fp16"),  # fp32 learned, fp16 did not: their pooled spread says nothing either
    ],
)
def test_no_plan_from_a_pilot_that_did_not_learn(tmp_path, capsys, monkeypatch, scores, named):
    monkeypatch.setattr(cells, "random_floor", lambda task, seed=0: RANDOM)
    out = tmp_path / "study"
    for precision, score in scores.items():  # 8 seeds whose IQM normalised final score is `score`
        returns = [RANDOM + (score + 0.01 * (k - 3.5)) * (500 - RANDOM) for k in range(8)]
        write_cell(out / "plan", precision, num_seeds=8, returns=returns)
    assert main(plan_argv(out)) == 2
    printed = capsys.readouterr()
    line = printed.err.strip().splitlines()[-1]  # after the pilot cells' "finished before, kept"
    assert "Traceback" not in printed.err and "seeds per cell" not in printed.out
    assert line.startswith("genesis-jax: error: no plan from a pilot that did not learn: CartPole-v1 at 2048 steps")
    assert f"(did not learn: {named}; IQM normalised final score fp32 {scores['fp32']:.3f}, fp16 " in line
    assert f"fp16 {scores['fp16']:.3f})" in line and "a run learns from 0.1" in line
    assert not (out / "plan.json").exists() and not (out / "plan.md").exists()


@pytest.mark.parametrize("flags", [["--num-seeds", "2", "--no-cost"], ["--plan", "--pilot-seeds", "3"]])
def test_a_budget_train_refuses_is_refused_before_out_is_made(tmp_path, capsys, flags):
    # 10^8 epochs x 25 batches per epoch overflow the int32 step counters: the world model's
    # setup refuses it, which train runs before it writes anything, and so does the study
    out = tmp_path / "study"
    argv = ["study", "--out", str(out), "--tasks", "wm:synthetic-small", "--precisions", "fp32,fp16"]
    assert main([*argv, "--total-steps", "100000000", "--no-progress", *flags]) == 2
    line = one_line(capsys)
    assert line.startswith("genesis-jax: error: epochs 100000000 x 25 batches per epoch is more optimizer steps")
    assert not out.exists()
