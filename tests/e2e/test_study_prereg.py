"""Pre-registration: `study --plan` writes a plan (margin in normalised and raw units, seeds
from an upper bound of the pilot's SD at the verdict's z = 1.96, a fresh seed range, the
statistics and the thresholds) before the confirmatory cells; `--confirmatory` refuses, in
one line, a study without that plan, at other settings, or whose cells started before it or
under another one; the report quotes the plan's hash, or says "exploratory". Cells are
written by hand (tests/e2e/test_study_honesty.py's `write_cell`), so nothing trains."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import pathlib
import shutil

import numpy as np
import pytest
import scipy.stats

from genesis_jax.cli import main
from genesis_jax.cli.study import cells, plan
from tests.e2e.test_study_honesty import STEPS, files, one_line, write_cell

PILOT = 8


def make_plan(out, *extra) -> dict:
    """A plan from hand-written pilot cells: fp16 follows fp32 seed by seed (correlated)."""
    rng = np.random.default_rng(1)
    fp32 = 400 + 40 * rng.standard_normal(PILOT)
    for precision, returns in (("fp32", fp32), ("fp16", fp32 + 2 * rng.standard_normal(PILOT))):
        write_cell(out / "plan", precision, num_seeds=PILOT, returns=returns.tolist())
    argv = ["study", "--plan", "--out", str(out), "--pilot-seeds", str(PILOT), "--precisions", "fp32,fp16"]
    assert main([*argv, "--total-steps", str(STEPS), "--reps", "100", "--no-progress", *extra]) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def planned_study(tmp_path_factory):
    """`make_plan`'s --out, planned once for the tests that take its plan as it is: each one
    works in a copy of it (`copied_plan`)."""
    out = tmp_path_factory.mktemp("planned") / "study"
    make_plan(out)
    return out


def copied_plan(planned_study, tmp_path) -> tuple:
    """(a copy of the planned --out in `tmp_path`, its plan.json): what `make_plan` gives."""
    out = pathlib.Path(shutil.copytree(planned_study, tmp_path / "study"))
    return out, json.loads((out / "plan.json").read_text())


def confirmatory_argv(out, saved, *extra):
    fixed = saved["study"]
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--total-steps", str(STEPS), "--reps", "100"]
    argv += ["--seed", str(fixed["seed"]), "--num-seeds", str(fixed["num_seeds"]), "--no-cost", "--no-progress"]
    return [*argv, "--confirmatory", *extra]


def write_study_cells(out, saved, record: str | None):
    """The plan's study cells, as if trained (`record`: the plan hash they started under)."""
    fixed = saved["study"]
    for precision in ("fp32", "fp16"):
        returns = [450.0 + 5 * k for k in range(fixed["num_seeds"])]
        path = write_cell(out, precision, num_seeds=fixed["num_seeds"], seed=fixed["seed"], returns=returns)
        if record is not None:
            plan.record_cell(out, path, record)


def test_the_plan_fixes_margin_seeds_range_statistics_and_thresholds(planned_study, tmp_path):
    out, saved = copied_plan(planned_study, tmp_path)
    task = saved["tasks"]["CartPole-v1"]
    random = cells.random_floor("CartPole-v1")
    assert task["random"] == pytest.approx(random) and task["reference"] == 500.0
    assert task["margin"] == 0.05 and task["margin_raw"] == pytest.approx(0.05 * (500 - random))
    assert task["threshold_raw"] == pytest.approx(random + 0.5 * (500 - random))
    assert task["fail_below_raw"] == pytest.approx(random + 0.5 * (500 - random))
    # the seeds: the 80% chi-square upper bound of the SD of the paired differences, z = 1.96
    pilot = {
        p: json.loads((out / "plan" / "cells" / "CartPole-v1" / p / "summary.json").read_text())
        for p in ("fp32", "fp16")
    }
    d = (np.asarray(pilot["fp16"]["final_return_per_seed"]) - pilot["fp32"]["final_return_per_seed"]) / (500 - random)
    upper = d.std(ddof=1) * math.sqrt((PILOT - 1) / scipy.stats.chi2.ppf(0.2, PILOT - 1))
    z = scipy.stats.norm.ppf
    n = (z(0.975) + z(0.9)) ** 2 * upper**2 * plan.TAIL_FACTOR / 0.05**2
    assert task["sd_diff_final_upper"] == pytest.approx(upper)
    assert task["seeds_final"] == max(5, math.ceil(n - 1e-9)) and saved["statistics"]["z"] == 1.96
    assert saved["study"]["seed"] == PILOT and task["seed_range"] == [PILOT, PILOT + saved["study"]["num_seeds"] - 1]
    assert saved["statistics"]["statistics"] == ["IQM", "Mean", "CVaR"]
    digest = hashlib.sha256(json.dumps(saved, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
    assert plan.plan_hash(saved) == digest
    text = (out / "plan.md").read_text()
    assert f"Plan `{digest}`" in text and f"--seed {PILOT} --num-seeds {saved['study']['num_seeds']}" in text
    assert text.rstrip().endswith("--confirmatory`")


def test_num_seeds_at_plan_time_is_a_floor(tmp_path):
    saved = make_plan(tmp_path / "study", "--num-seeds", "40")
    assert saved["study"]["num_seeds"] == 40 > saved["tasks"]["CartPole-v1"]["seeds"]


def test_a_confirmatory_study_without_a_plan_is_refused(tmp_path, capsys):
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--precisions", "fp32,fp16", "--num-seeds", "3", "--confirmatory"]) == 2
    assert one_line(capsys).startswith(f"genesis-jax: error: no plan in {out}: a confirmatory study runs under a plan")
    assert not out.exists()


def test_a_confirmatory_study_at_other_settings_than_its_plan_is_refused(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    before = files(out)
    assert main([*confirmatory_argv(out, saved), "--seed", "0"]) == 2  # the pilot's seeds again
    line = one_line(capsys)
    assert f"is not the one plan {plan.plan_hash(saved)} fixed (seed: plan {PILOT}, study 0)" in line
    assert files(out) == before


def test_cells_that_started_before_the_plan_or_under_another_are_refused(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    write_study_cells(out, saved, record=None)  # the cells ran first, the plan was (re)written after
    assert main(confirmatory_argv(out, saved)) == 2
    assert "ran before the plan, not under plan" in one_line(capsys)
    for precision in ("fp32", "fp16"):
        plan.record_cell(out, out / "cells" / "CartPole-v1" / precision, "0123456789ab")
    assert main(confirmatory_argv(out, saved)) == 2
    assert f"ran under plan 0123456789ab, not under plan {plan.plan_hash(saved)}" in one_line(capsys)
    assert not (out / "report.md").exists()


@pytest.mark.slow  # two reports: about a minute on 2 busy cores
def test_the_report_quotes_the_plan_and_is_written_again_only_as_confirmatory(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    digest = plan.plan_hash(saved)
    write_study_cells(out, saved, record=digest)
    assert main(confirmatory_argv(out, saved)) == 0
    text = (out / "report.md").read_text()
    assert f"Confirmatory: run under plan `{digest}`" in text and "fixed by plan" in text
    # its report again without --confirmatory: refused, not rewritten as exploratory
    before = files(out)
    capsys.readouterr()
    assert main([*confirmatory_argv(out, saved)[:-1], "--report-only"]) == 2
    assert (
        one_line(capsys)
        == f"genesis-jax: error: the cells in {out} ran under its plan (preregistered.json): add --confirmatory"
    )
    assert files(out) == before
    assert main([*confirmatory_argv(out, saved), "--report-only"]) == 0
    assert f"Confirmatory: run under plan `{digest}`" in (out / "report.md").read_text()


def test_no_plan_says_exploratory(tmp_path, capsys):
    out = tmp_path / "study"
    for precision in ("fp32", "fp16"):
        write_cell(out, precision)
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--num-seeds", "3", "--total-steps", str(STEPS)]
    assert main([*argv, "--reps", "100", "--no-cost", "--no-progress"]) == 0
    text = (out / "report.md").read_text()
    assert "Exploratory: no plan (`--plan`) fixed this study" in text
    assert "Plan: none (`--plan` was not run in this --out)" in text


def test_a_plan_is_not_changed_after_its_study_began(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    before = (out / "plan.json").read_text()
    plan.record_cell(out, out / "cells" / "CartPole-v1" / "fp32", plan.plan_hash(saved))  # a confirmatory cell began
    argv = ["study", "--plan", "--out", str(out), "--pilot-seeds", str(PILOT), "--precisions", "fp32,fp16"]
    assert main([*argv, "--total-steps", str(STEPS), "--reps", "100", "--no-progress", "--num-seeds", "40"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("genesis-jax: error: ") and f"holds plan {plan.plan_hash(saved)}, under which" in last
    assert (out / "plan.json").read_text() == before


def edit_plan(out, saved, change, restate: bool = True) -> str:
    """plan.json edited by hand (`change` of a copy of it), and with `restate` plan.md's hash
    too (as one who edits both would): the edited plan's hash."""
    edited = change(copy.deepcopy(saved))
    (out / "plan.json").write_text(json.dumps(edited))
    if restate:
        md = out / "plan.md"
        md.write_text(md.read_text().replace(f"Plan `{plan.plan_hash(saved)}`", f"Plan `{plan.plan_hash(edited)}`"))
    return plan.plan_hash(edited)


def test_a_study_without_confirmatory_in_a_planned_out_is_refused(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    before = files(out)
    for extra in ([], ["--dry-run"], ["--report-only"]):  # no cell ran under the plan yet
        assert main([*confirmatory_argv(out, saved)[:-1], *extra]) == 2
        assert one_line(capsys) == (
            f"genesis-jax: error: {out} holds a plan (plan.json): run the plan's command, printed in plan.md, "
            "or use another --out"
        )
    assert files(out) == before
    # An exploratory study whose cells began there (as committed studies did) still reports, as exploratory,
    # and says it ran fewer seeds than the plan asks.
    seed = saved["study"]["seed"]
    for precision in ("fp32", "fp16"):
        write_cell(out, precision, num_seeds=3, seed=seed, returns=[450.0 + 5 * k for k in range(3)])
    argv = ["study", "--out", str(out), "--precisions", "fp32,fp16", "--total-steps", str(STEPS), "--reps", "100"]
    assert main([*argv, "--seed", str(seed), "--num-seeds", "3", "--no-cost", "--no-progress", "--report-only"]) == 0
    report = (out / "report.md").read_text()
    assert f"Exploratory: a plan (`{plan.plan_hash(saved)}`) is in this --out, but the study was not run" in report
    assert "this study ran 3, fewer than planned for CartPole-v1" in report


def test_a_plan_json_edited_after_plan_md_is_refused(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    edited = edit_plan(
        out, saved, lambda p: {**p, "tasks": {"CartPole-v1": {**p["tasks"]["CartPole-v1"], "threshold": 0.3}}}, False
    )
    write_study_cells(out, saved, record=plan.plan_hash(saved))
    before = files(out)
    assert main(confirmatory_argv(out, saved)) == 2
    assert one_line(capsys) == (
        f"genesis-jax: error: plan.json was edited after plan.md was written (plan.md states plan "
        f"{plan.plan_hash(saved)}, plan.json's hash is {edited}): restore plan.json, or plan again in another --out"
    )
    assert files(out) == before


def without_threshold(saved):
    del saved["tasks"]["CartPole-v1"]["threshold"]
    return saved


def test_a_plan_missing_a_field_is_refused_before_anything_trains(planned_study, tmp_path, capsys):
    out, saved = copied_plan(planned_study, tmp_path)
    edit_plan(out, saved, without_threshold)
    assert main(confirmatory_argv(out, saved)) == 2
    assert one_line(capsys) == (
        f"genesis-jax: error: {out / 'plan.json'} lacks tasks.CartPole-v1.threshold: restore it, or plan again in "
        "another --out"
    )
    assert not (out / "cells").exists()


@pytest.mark.parametrize(("key", "ours"), [("margin", "0.05"), ("fail_below", "0.5")])
def test_a_plan_judged_at_another_margin_or_failure_threshold_is_refused(planned_study, tmp_path, capsys, key, ours):
    out, saved = copied_plan(planned_study, tmp_path)
    changed = lambda p: {**p, "tasks": {"CartPole-v1": {**p["tasks"]["CartPole-v1"], key: 0.2}}}
    edited = edit_plan(out, saved, changed)
    assert main(confirmatory_argv(out, saved)) == 2
    assert one_line(capsys) == (
        f"genesis-jax: error: plan {edited} fixes {key} 0.2 for CartPole-v1, but this genesis-jax judges at {ours}: "
        "run the study with the genesis-jax that wrote the plan, or plan again in another --out"
    )
    assert not (out / "cells").exists()


@pytest.mark.parametrize("confirmatory", [True, False])
def test_a_torn_plan_is_said_to_be_unreadable(planned_study, tmp_path, capsys, confirmatory):
    out, saved = copied_plan(planned_study, tmp_path)
    (out / "plan.json").write_text((out / "plan.json").read_text()[:40])
    argv = confirmatory_argv(out, saved)
    assert main(argv if confirmatory else argv[:-1]) == 2
    line = one_line(capsys)
    assert line.startswith(f"genesis-jax: error: {out / 'plan.json'} cannot be read (")
    assert line.endswith("): restore it, or plan again in another --out")
    assert not (out / "cells").exists()
