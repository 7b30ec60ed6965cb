"""The power plan of a study (`genesis-jax study --plan`): a small pilot, fp32 and fp16 with a
few seeds per task at the study's budgets, whose seed-to-seed spread of the normalised score
gives the seeds per cell an equivalence verdict needs, and the wall time they would take here.

The verdict "equivalent" asks the whole 95% CI of the difference X - fp32 to lie within
+-`stats.MARGIN`: two one-sided tests (TOST), each at level alpha = (1 - 0.95) / 2. With a
true difference of 0, seed-to-seed standard deviation `sd` (the pilot's, pooled over fp32 and
fp16) and power 1 - beta, the seeds per cell are (normal approximation, equal cells)

    n = 2 (z_{1 - alpha} + z_{1 - beta / 2})^2 sd^2 / margin^2

(Chow, Shao & Wang, "Sample Size Calculations in Clinical Research", equivalence of two
means). The study's interval is a bootstrap of the IQM, not a t-interval of the mean: the
formula is the plan's approximation, and a study that ran the planned seeds but still says
"not shown" says so.

>>> seeds_needed(0.05)  # sd equal to the margin: 2 (1.96 + 1.28)^2 = 21.0
22
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from genesis_jax.cli.study import stats

POWER = 0.8  # the chance of "equivalent" when the precisions truly are alike
PILOT_PRECISIONS = ("fp32", "fp16")
MIN_PILOT_SEEDS = 3  # a standard deviation from fewer is a guess
# The compute precision whose pilot cell stands in for each study precision's time.
TIME_LIKE = {"fp32": "fp32", "bf16": "fp16", "fp16": "fp16", "fp16-unscaled": "fp16"}


def seeds_needed(sd: float, margin: float = stats.MARGIN, confidence: float = stats.CONFIDENCE, power=POWER) -> int:
    """Seeds per cell for a TOST equivalence verdict within +-`margin` (module docstring),
    never fewer than `stats.MIN_SEEDS_FOR_VERDICT` (below it the study gives no verdict)."""
    if not math.isfinite(sd):
        raise ValueError(f"the pilot's standard deviation is not finite ({sd}): no plan can be made from it")
    alpha = (1.0 - confidence) / 2.0
    z = NormalDist().inv_cdf
    n = 2.0 * (z(1.0 - alpha) + z(1.0 - (1.0 - power) / 2.0)) ** 2 * sd**2 / margin**2
    return max(stats.MIN_SEEDS_FOR_VERDICT, math.ceil(n))


def pooled_sd(*columns) -> float:
    """The pooled standard deviation (ddof 1) of the seeds' scores of several cells."""
    columns = [np.asarray(c, np.float64)[np.isfinite(c)] for c in columns]
    dof = sum(len(c) - 1 for c in columns)
    if dof < 1:
        return float("nan")
    return float(math.sqrt(sum(np.sum((c - c.mean()) ** 2) for c in columns) / dof))


def estimate_seconds(pilot: dict, seeds: int, precisions) -> float:
    """Wall seconds of a task's cells at `seeds` seeds, from its pilot cells' summaries
    ({precision: summary}): each study precision costs like its `TIME_LIKE` pilot cell, its
    compilation once and its training in proportion to the seeds (as on a CPU, where every
    seed costs compute; on a GPU seeds cost less)."""
    total = 0.0
    for precision in precisions:
        s = pilot[TIME_LIKE.get(precision, "fp16")]
        training = max(0.0, s["wall_seconds"] - s["compile_seconds"])
        total += s["compile_seconds"] + training * seeds / len(s["seeds"] if "seeds" in s else [0])
    return total


def task_plan(normalised: dict, auc: dict, pilot: dict, precisions) -> dict:
    """One task's plan from its pilot: the pooled SD of the normalised final return and AUC,
    the seeds each needs, the seeds per cell (the larger) and the wall-time estimate."""
    sd_final = pooled_sd(*normalised.values())
    sd_auc = pooled_sd(*auc.values())
    final, area = seeds_needed(sd_final), seeds_needed(sd_auc) if math.isfinite(sd_auc) else 0
    seeds = max(final, area)
    return {
        "pilot_seeds": min(len(v) for v in normalised.values()),
        "sd_final": sd_final,
        "sd_auc": sd_auc,
        "seeds_final": final,
        "seeds_auc": area,
        "seeds": seeds,
        "estimated_seconds": estimate_seconds(pilot, seeds, precisions),
    }


def check_learned(tasks, normalised: dict, learnt: dict, steps: dict, pilot_out) -> None:
    """Refuses, in one line, a plan from a pilot in which fp32 or fp16 did not learn a task
    (`learnt`: the report's rule, `report.learned_flags`): the spread of runs at the random
    policy's floor says nothing of the spread of runs that learn."""
    failed = []
    for i, task in enumerate(tasks):
        names = [p for p in PILOT_PRECISIONS if not learnt[p][i]]
        if names:
            scores = ", ".join(f"{p} {stats.iqm(normalised[p][:, [i]]):.3f}" for p in PILOT_PRECISIONS)
            failed.append(
                f"{task} at {steps[task]} per seed (did not learn: {', '.join(names)}; IQM normalised "
                f"final score {scores})"
            )
    if failed:
        raise ValueError(
            f"no plan from a pilot that did not learn: {'; '.join(failed)}; a run learns from "
            f"{stats.LEARNED_FROM:g}, the random policy is 0, and the spread of runs that did not learn says nothing "
            "of runs that do: plan again with a budget each task learns in (--total-steps TASK=N), in another --out "
            f"or after deleting its pilot cells in {pilot_out / 'cells'}"
        )


def plan_lines(plans: dict[str, dict], steps: dict[str, int], device: str) -> list[str]:
    """The plan as a markdown table, with the total time."""
    lines = [
        f"Seeds per cell for an equivalence verdict within +-{stats.MARGIN:g} at {stats.CONFIDENCE:.0%} "
        f"confidence with {POWER:.0%} power (TOST, the pilot's pooled SD of fp32 and fp16; docs/study.md), "
        f"and the wall time of every precision's cell at those seeds on {device}:",
        "",
        "| task | steps per seed | pilot seeds | SD final | SD AUC | seeds (final) | seeds (AUC) | seeds per cell "
        "| estimated wall time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task, p in plans.items():
        lines.append(
            f"| {task} | {steps[task]} | {p['pilot_seeds']} | {p['sd_final']:.3f} | {p['sd_auc']:.3f} "
            f"| {p['seeds_final']} | {p['seeds_auc']} | {p['seeds']} | {p['estimated_seconds'] / 60:.0f} min |"
        )
    total = sum(p["estimated_seconds"] for p in plans.values())
    lines += ["", f"All tasks: {total / 3600:.1f} h at the planned seeds."]
    return lines
