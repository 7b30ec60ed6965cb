"""The power plan of a study (`genesis-jax study --plan`): a small pilot, fp32 and fp16 with a
few seeds per task at the study's budgets, whose seed-to-seed spread of the normalised score
gives the seeds per cell an equivalence verdict needs, and the wall time they would take here.

The verdict "equivalent" asks the whole 95% CI of the difference X - fp32 to lie within
+-`stats.MARGIN`: two one-sided tests (TOST), each at level alpha = (1 - 0.95) / 2. With a
true difference of 0, seed-to-seed standard deviation `sd` (the pilot's, pooled over fp32 and
fp16) and power 1 - beta, the seeds per cell are (normal approximation, equal cells)

    n = 2 (z_{1 - alpha} + z_{1 - beta / 2})^2 sd^2 / margin^2

(Chow, Shao & Wang, "Sample Size Calculations in Clinical Research", equivalence of two
means), z_{1 - alpha} = 1.96: the verdict's own two-sided 95%. The study's analysis is paired
(seed k shared by every precision), so the plan sizes it from the SD of the pilot's paired
differences fp16 - fp32 (`sd_d`, with n = (z_{1 - alpha} + z_{1 - beta / 2})^2 sd_d^2 /
margin^2), and conservatively: not the pilot's point estimate but its one-sided `SD_LEVEL`
chi-square upper confidence bound (Browne 1995, "On the use of a pilot sample for sample
size determination"), times `TAIL_FACTOR` for the noisiest statistic a verdict needs (the
CVaR at 25%). The study's intervals are paired bootstraps of the IQM, the mean and the CVaR,
not t-intervals of the mean: the formula is the plan's approximation, and a study that ran
the planned seeds but still says "not shown" says so.

The plan is written before the confirmatory cells (`plan_record`): per task the margin (in
normalised and raw units), the seeds sized as above, the seed range (fresh seeds after the
pilot's), the statistics, the time-to-threshold threshold and the failure threshold; its
hash (`plan_hash`) is quoted by the report of the study run under it (`--confirmatory`).

>>> seeds_needed(0.05)  # sd equal to the margin: 2 (1.96 + 1.28)^2 = 21.0
22
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from statistics import NormalDist

import numpy as np
import scipy.stats

from genesis_jax.cli.study import stats
from genesis_jax.cli.study.cells import add_json, load_json

POWER = 0.8  # the chance of "equivalent" when the precisions truly are alike
PILOT_PRECISIONS = ("fp32", "fp16")
MIN_PILOT_SEEDS = 3  # a standard deviation from fewer is a guess
PILOT_SEEDS = 8  # --pilot-seeds' default
# The one-sided level of the upper confidence bound on the pilot's SD the seeds are sized from.
SD_LEVEL = 0.8
# The variance of a 25% CVaR estimate over the mean's (the normal's, asymptotically: 2.03;
# the IQM's is 1.19): the seeds the mean needs, times this, give the tail the same precision
# only for independent normal scores. On paired differences the ratio grows with the seeds'
# correlation (2.7 at 0.5), and on the committed studies' skewed scores it was 1.6-16, so the
# tail is often underpowered at the planned seeds (docs/study.md, "The plan").
TAIL_FACTOR = 2.03
# The compute precision whose pilot cell stands in for each study precision's time.
TIME_LIKE = {"fp32": "fp32", "bf16": "fp16", "fp16": "fp16", "fp16-unscaled": "fp16"}
PLAN_FILE = "plan.json"
# {cell: the hash of the plan it started under}, written as each confirmatory cell starts.
RECORD = "preregistered.json"
z = NormalDist().inv_cdf
# What plan.json says of its statistics besides their numbers.
SD_BOUND = f"the {SD_LEVEL:.0%} chi-square upper bound of the SD of the pilot's paired differences fp16 - fp32"
BOOTSTRAP = "percentile, paired: seed indices drawn once per task for every precision"


def seeds_needed(sd: float, margin: float = stats.MARGIN, confidence: float = stats.CONFIDENCE, power=POWER) -> int:
    """Seeds per cell for a TOST equivalence verdict within +-`margin` (module docstring),
    never fewer than `stats.MIN_SEEDS_FOR_VERDICT` (below it the study gives no verdict)."""
    if not math.isfinite(sd):
        raise ValueError(f"the pilot's standard deviation is not finite ({sd}): no plan can be made from it")
    n = 2.0 * (z(1.0 - (1.0 - confidence) / 2.0) + z(1.0 - (1.0 - power) / 2.0)) ** 2 * sd**2 / margin**2
    return max(stats.MIN_SEEDS_FOR_VERDICT, math.ceil(n))


def paired_seeds(x, y) -> tuple[float, float, int]:
    """(the SD of the paired differences x - y, its one-sided `SD_LEVEL` chi-square upper
    confidence bound sd sqrt(dof / chi2_{1 - level}(dof)), the seeds per cell a paired
    verdict needs from it: `seeds_needed` of the bound / sqrt 2, times `TAIL_FACTOR`)."""
    d = np.asarray(x, np.float64) - np.asarray(y, np.float64)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return float("nan"), float("nan"), 0
    sd = float(np.std(d, ddof=1))
    upper = float(sd * math.sqrt((d.size - 1) / scipy.stats.chi2.ppf(1.0 - SD_LEVEL, d.size - 1)))
    return sd, upper, seeds_needed(upper * math.sqrt(TAIL_FACTOR / 2.0))


def plan_hash(saved: dict) -> str:
    """The first 12 hex digits of the sha256 of a plan's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(saved, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def pooled_sd(*columns) -> float:
    """The pooled standard deviation (ddof 1) of the seeds' scores of several cells."""
    columns = [np.asarray(c, np.float64)[np.isfinite(c)] for c in columns]
    dof = sum(len(c) - 1 for c in columns)
    return float(math.sqrt(sum(np.sum((c - c.mean()) ** 2) for c in columns) / dof)) if dof >= 1 else float("nan")


def estimate_seconds(pilot: dict, seeds: int, precisions) -> float:
    """Wall seconds of a task's cells at `seeds` seeds, from its pilot cells' summaries
    ({precision: summary}): each study precision costs like its `TIME_LIKE` pilot cell, its
    compilation once and its training in proportion to the seeds (as on a CPU, where every
    seed costs compute; on a GPU seeds cost less)."""
    training = lambda s: max(0.0, s["wall_seconds"] - s["compile_seconds"]) * seeds / len(s.get("seeds", [0]))
    ran = [pilot[TIME_LIKE.get(precision, "fp16")] for precision in precisions]
    return sum(s["compile_seconds"] + training(s) for s in ran)


def task_plan(normalised: dict, auc: dict, pilot: dict, precisions) -> dict:
    """One task's plan from its pilot: the pooled SD of the normalised final return and AUC,
    the SD of their paired differences fp16 - fp32 and its upper bound (`paired_seeds`), the
    seeds each needs, the seeds per cell (the larger) and the wall-time estimate."""
    diff_final, upper_final, final = paired_seeds(normalised["fp16"], normalised["fp32"])
    diff_auc, upper_auc, area = paired_seeds(auc["fp16"], auc["fp32"])
    seeds = max(final, area)
    out = dict(pilot_seeds=min(len(v) for v in normalised.values()), sd_final=pooled_sd(*normalised.values()))
    out.update(sd_auc=pooled_sd(*auc.values()), sd_diff_final=diff_final, sd_diff_final_upper=upper_final)
    out.update(sd_diff_auc=diff_auc, sd_diff_auc_upper=upper_auc, seeds_final=final, seeds_auc=area, seeds=seeds)
    return {**out, "estimated_seconds": estimate_seconds(pilot, seeds, precisions)}


def check_learned(tasks, normalised: dict, learnt: dict, steps: dict, pilot_out) -> None:
    """Refuses, in one line, a plan from a pilot in which fp32 or fp16 did not learn a task
    (`learnt`: the report's rule, `report.learned_flags`): the spread of runs at the random
    policy's floor says nothing of the spread of runs that learn."""
    failed = []
    for i, task in enumerate(tasks):
        if names := [p for p in PILOT_PRECISIONS if not learnt[p][i]]:
            scores = ", ".join(f"{p} {stats.iqm(normalised[p][:, [i]]):.3f}" for p in PILOT_PRECISIONS)
            what = f"did not learn: {', '.join(names)}; IQM normalised final score {scores}"
            failed.append(f"{task} at {steps[task]} per seed ({what})")
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
        f"confidence (two-sided: z = 1.96) with {POWER:.0%} power (TOST on the paired differences fp16 - fp32: "
        f"the {SD_LEVEL:.0%} chi-square upper bound of their SD in the pilot, times {TAIL_FACTOR:g} for the "
        "CVaR's variance, the factor of independent normal scores: on paired, skewed scores the CVaR's power can be "
        f"far lower; docs/study.md), and the wall time of every precision's cell at those seeds on {device}:",
        "",
        "| task | steps per seed | pilot seeds | SD final | SD AUC | SD of differences final (upper bound) "
        "| SD of differences AUC (upper bound) | seeds (final) | seeds (AUC) | seeds per cell | estimated wall time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, p in plans.items():
        lines.append(
            f"| {task} | {steps[task]} | {p['pilot_seeds']} | {p['sd_final']:.3f} | {p['sd_auc']:.3f} "
            f"| {p['sd_diff_final']:.3f} ({p['sd_diff_final_upper']:.3f}) "
            f"| {p['sd_diff_auc']:.3f} ({p['sd_diff_auc_upper']:.3f}) "
            f"| {p['seeds_final']} | {p['seeds_auc']} | {p['seeds']} | {p['estimated_seconds'] / 60:.0f} min |"
        )
    total = sum(p["estimated_seconds"] for p in plans.values())
    return [*lines, "", f"All tasks: {total / 3600:.1f} h at the planned seeds."]


def read(out) -> dict | None:
    """The plan in `out` (plan.json), None where there is none, refused in one line where it
    cannot be read."""
    try:
        return json.loads((out / PLAN_FILE).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{out / PLAN_FILE} cannot be read ({err}): restore it, or plan again in another --out"
        ) from None


def check_unplanned(out, saved: dict | None, report_only: bool, cell_paths) -> None:
    """Refuses, in one line, a study begun without --confirmatory in an --out holding a plan
    (`saved`): it would run the pilot's seeds as an exploratory study, and a confirmatory one
    could not follow there; and a report of cells that ran under the plan, as exploratory.
    An exploratory study whose cells began there before (`cell_paths`) goes on."""
    if saved is not None and report_only and load_json(out / RECORD):
        raise ValueError(f"the cells in {out} ran under its plan (preregistered.json): add --confirmatory")
    if saved is not None and not any(path.exists() for path in cell_paths):
        raise ValueError(
            f"{out} holds a plan (plan.json): run the plan's command, printed in plan.md, or use another --out"
        )


# What a confirmatory study reads of its plan: at the top, and per task.
FIELDS = ("command", "pilot_seeds", "tasks")
TASK_FIELDS = ("seeds", "random", "reference", "reference_source", "threshold", "margin", "fail_below")


def check_plan(out, saved: dict, tasks) -> None:
    """Refuses, in one line, a plan that is not the one plan.md states (its hash: plan.json
    edited after), that lacks a field the study reads, or whose margin or failure threshold
    is not the one this genesis-jax judges at (`stats.MARGIN`, `stats.FAIL_BELOW`)."""
    digest, md = plan_hash(saved), out / "plan.md"
    if not md.exists():
        raise ValueError(f"{md} is missing: it states the plan's hash; restore it, or plan again in another --out")
    stated = re.search(r"^Plan `(\w+)`", md.read_text(), re.M)
    if stated is None or stated[1] != digest:
        said = f"states plan {stated[1]}" if stated else "states no plan"
        raise ValueError(
            f"plan.json was edited after plan.md was written (plan.md {said}, plan.json's hash is {digest}): "
            "restore plan.json, or plan again in another --out"
        )
    have = saved.get("tasks") or {}
    missing = [f for f in FIELDS if f not in saved] + [f"tasks.{t}" for t in tasks if t not in have]
    missing += [f"tasks.{t}.{f}" for t in tasks if t in have for f in TASK_FIELDS if f not in have[t]]
    if missing:
        raise ValueError(f"{out / PLAN_FILE} lacks {', '.join(missing)}: restore it, or plan again in another --out")
    for t in tasks:
        for key, ours in (("margin", stats.MARGIN), ("fail_below", stats.FAIL_BELOW)):
            if have[t][key] != ours:
                raise ValueError(
                    f"plan {digest} fixes {key} {have[t][key]!r} for {t}, but this genesis-jax judges at {ours:g}: "
                    "run the study with the genesis-jax that wrote the plan, or plan again in another --out"
                )


def record_cell(out, path, digest: str) -> None:
    """Records that the cell at `path` starts under the plan `digest` (atomically)."""
    add_json(out / RECORD, path.relative_to(out).as_posix(), digest, sort_keys=True)


def check_confirmatory(out, saved: dict | None, settings: dict, cell_paths) -> str:
    """The hash of the plan in `out` a confirmatory study of `settings` runs under, or one
    line refusing it: no plan, a plan that fixed other settings, or a cell in `cell_paths`
    that started before the plan or under another one (preregistered.json)."""
    if saved is None:
        raise ValueError(
            f"no plan in {out}: a confirmatory study runs under a plan written before its cells "
            "(genesis-jax study --plan, in this --out), or run it without --confirmatory, whose report says it is "
            "exploratory"
        )
    exploratory = "or run an exploratory study (without --confirmatory) in another --out"
    digest, fixed = plan_hash(saved), saved.get("study")
    if not isinstance(fixed, dict):
        raise ValueError(
            f"the plan in {out} ({digest}) fixes no study settings (an earlier version's plan): "
            f"plan again in a new --out, {exploratory}"
        )
    changes = [f"{key}: plan {fixed.get(key)!r}, study {v!r}" for key, v in settings.items() if fixed.get(key) != v]
    if changes:
        raise ValueError(
            f"this study is not the one plan {digest} fixed ({'; '.join(changes)}): run it with the plan's "
            f"settings (plan.md says the command), {exploratory}"
        )
    check_plan(out, saved, settings["tasks"])
    record = load_json(out / RECORD, {})
    for path in cell_paths:
        name = path.relative_to(out).as_posix()
        if path.exists() and record.get(name) != digest:
            when = f"under plan {record[name]}" if name in record else "before the plan"
            raise ValueError(
                f"{path} ran {when}, not under plan {digest}: its cells cannot give a confirmatory verdict; "
                f"run the plan's study in a fresh --out, {exploratory}"
            )
    return digest


def plan_record(plans: dict, pilot: dict, command: str, device: str, settings: dict, bounds: dict) -> dict:
    """plan.json: the study's settings, the statistics and, per task, its power plan with the
    margin, the threshold and the failure threshold in normalised and raw units.
    `bounds`: {task: (random, reference, its source)} the normalisation the study then uses."""
    statistics = dict(confidence=stats.CONFIDENCE, z=round(z(1.0 - (1.0 - stats.CONFIDENCE) / 2.0), 4), power=POWER)
    statistics.update(sd=SD_BOUND, tail_factor=TAIL_FACTOR, statistics=list(stats.STATISTICS), tail=stats.TAIL)
    statistics.update(bootstrap=BOOTSTRAP, verdict="equivalent only where the IQM, the mean and the CVaR all are")
    tasks, first, seeds = {}, settings["seed"], settings["num_seeds"]
    for task, p in plans.items():
        low, high, source = bounds[task]
        raw = lambda x: low + x * (high - low)
        tasks[task] = {**p, "margin": stats.MARGIN, "margin_raw": stats.MARGIN * abs(high - low), "random": low}
        tasks[task].update(reference=high, reference_source=source, threshold=stats.THRESHOLD)
        tasks[task].update(threshold_raw=raw(stats.THRESHOLD), fail_below=stats.FAIL_BELOW)
        tasks[task].update(fail_below_raw=raw(stats.FAIL_BELOW), seed_range=[first, first + seeds - 1])
    head = dict(version=2, command=command, device=device, **pilot)
    return {**head, "study": settings, "statistics": statistics, "tasks": tasks}
