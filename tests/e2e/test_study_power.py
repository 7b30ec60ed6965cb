"""experiments/study_power.py at smoke size, on fixed synthetic paired scores: alike arms
within a wide margin are always called equivalent, a large true difference never is, and its
"alike" populations against independent numpy computations; its command on written cells."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import numpy as np
import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "study_power.py"
_spec = importlib.util.spec_from_file_location("study_power", _PATH)
study_power = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study_power)

# 12 seeds of two precisions sharing a draw per seed (normalised scores near 0.8, learned).
_rng = np.random.default_rng(3)
_SHARED = _rng.normal(0.8, 0.1, 12)
FP32 = _SHARED + _rng.normal(0.0, 0.01, 12)
X = _SHARED + _rng.normal(0.0, 0.01, 12)


def test_alike_arms_within_a_wide_margin_are_equivalent_in_nearly_every_study():
    share = study_power.power(FP32, X, n=12, sims=20, reps=100, seed=0, margin=0.5)
    assert share["all"] >= 0.95 and all(share[k] >= 0.95 for k in ("IQM", "Mean", "CVaR"))


def test_a_large_true_difference_is_never_called_equivalent():
    share = study_power.power(FP32, X - 0.4, n=12, sims=20, reps=100, seed=0, centre="none")
    assert share["all"] <= 0.05


def test_the_alike_populations_match_independent_numpy_computations():
    base, other = np.append(FP32, np.nan), np.append(X - 0.3, 0.5)  # the last pair is dropped
    a, b = study_power.alike(base, other, "swap")
    # swap: the pairs (f, x) and (x, f): both arms the same multiset (so every statistic's
    # difference is 0), each seed's difference once with each sign (their mean exactly 0)
    assert np.array_equal(np.sort(a), np.sort(b)) and np.array_equal(np.sort(a), np.sort(np.r_[FP32, X - 0.3]))
    assert np.array_equal((a - b)[:12], -(a - b)[12:]) and np.array_equal((a - b)[:12], FP32 - (X - 0.3))
    # shift: fp32 as observed, X less the observed mean paired difference
    a, b = study_power.alike(base, other, "shift")
    assert np.array_equal(a, FP32)
    np.testing.assert_allclose(b, (X - 0.3) - np.mean((X - 0.3) - FP32), rtol=0, atol=1e-15)
    assert np.mean(b - a) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="unknown centre"):
        study_power.alike(base, other, "mean")


def test_the_command_reads_a_study_s_cells_and_prints_a_row_per_precision_and_n(tmp_path, capsys):
    """Raw returns normalised with the plan's random (0) and reference (100) returns: X is fp32
    here, so every study is equivalent at a margin of 0.05 (the differences are all 0)."""
    plan = {"tasks": {"T": {"random": 0.0, "reference": 100.0, "seeds": 6}}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    for precision in ("fp32", "fp16"):
        cell = tmp_path / "cells" / "T" / precision
        cell.mkdir(parents=True)
        summary = {"seeds": list(range(12)), "total_steps": 10, "final_return_per_seed": list(100 * FP32)}
        (cell / "summary.json").write_text(json.dumps(summary))
    assert study_power.main([str(tmp_path), "--sims", "3", "--reps", "100"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| T |")]
    assert [(r[1], r[3], r[-1]) for r in rows] == [("fp16", str(n), "100% |") for n in (6, 12, 18, 24)]
