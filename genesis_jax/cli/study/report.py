"""The study's report: the statistics of `stats` over the cells' scores, drawn with rliable's
plots, and a markdown page that puts the verdicts, the pictures, the overflow counts and the
cost of a seed together."""

from __future__ import annotations

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from genesis_jax.cli.study import stats  # noqa: E402
from genesis_jax.cli.study.cells import BASELINE, TASKS  # noqa: E402


def _fmt(e: stats.Estimate, digits: int = 2) -> str:
    return f"{e.point:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def references(
    raw: dict[str, np.ndarray],
    tasks: list[str],
    randoms: dict[str, float],
    known: dict[str, float | None] | None = None,
) -> list[tuple[float, str]]:
    """Each task's reference score and its source: `known` ({task: score}, default the
    published returns of `TASKS`), else the study's fp32 IQM (said so in its source)."""
    out = []
    for i, task in enumerate(tasks):
        spec = TASKS[task]
        reference = (known or {}).get(task, spec.reference)
        if reference is not None:
            out.append((reference, spec.reference_source))
        else:
            out.append((stats.iqm(raw[BASELINE][:, [i]]), spec.reference_source))
    return out


def learned_flags(normalised: dict, per_task: dict, tasks: list[str], random: list[float]) -> dict[str, list[bool]]:
    """Which precision learned which task (`stats.learned` on normalised scores). Where fp32
    is its own reference (no published return: its normalised IQM is 1 by construction) it is
    judged against the random policy's floor instead (`stats.above_floor`)."""
    flags = stats.learned(normalised)
    for i, task in enumerate(tasks):
        if TASKS[task].reference is None and TASKS[task].score == "return" and BASELINE in per_task:
            flags[BASELINE][i] = stats.above_floor(per_task[BASELINE]["IQM"][i].low, random[i])
    return flags


def analyse(
    raw: dict[str, np.ndarray],
    tasks: list[str],
    randoms: dict[str, float],
    reps: int,
    seed: int = 0,
    auc: dict[str, np.ndarray] | None = None,
    known: dict[str, float | None] | None = None,
) -> dict:
    """Every statistic of the report from the raw score matrices ([seeds, tasks] per
    precision): the final return's, and, given `auc` (each seed's mean return over the whole
    run, same shape), the area under the learning curve's under "auc", normalised with the
    same random and reference returns and judged with the final return's learned flags."""
    refs = references(raw, tasks, randoms, known)
    random = [randoms[t] for t in tasks]
    reference = [r for r, _ in refs]
    normalised = {p: stats.normalise(m, random, reference) for p, m in raw.items()}
    per_task = stats.per_task(raw, reps, seed)
    learned = learned_flags(normalised, per_task, tasks, random)
    out = {
        "tasks": tasks,
        "references": refs,
        "random": random,
        "normalised": normalised,
        "per_task": per_task,
        "aggregate": stats.aggregate(normalised, reps, seed),
        "improvement": stats.probability_of_improvement(normalised, BASELINE, reps, seed),
        "equivalence": stats.equivalence(normalised, BASELINE, reps, seed, learnt=learned),
        "learned": learned,
        "profiles": stats.performance_profiles(normalised, np.linspace(0.0, 1.2, 49), reps, seed),
    }
    if auc is not None:
        auc_normalised = {p: stats.normalise(m, random, reference) for p, m in auc.items()}
        out["auc"] = {
            "normalised": auc_normalised,
            "per_task": stats.per_task(auc_normalised, reps, seed),
            "aggregate": stats.aggregate(auc_normalised, reps, seed),
            "equivalence": stats.equivalence(auc_normalised, BASELINE, reps, seed, learnt=learned),
            "learned": learned,
        }
    return out


def plot_curves(curves: dict[str, dict[str, tuple]], out: pathlib.Path, reps: int) -> list[str]:
    """One PNG per task: the IQM over seeds of the return (a loss task: log10 of the eval
    loss, by epoch) along training, a CI band, one line per precision."""
    files = []
    for task, by_precision in curves.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        estimates = stats.curves({p: returns for p, (_, returns) in by_precision.items()}, reps=reps)
        for precision, (steps, _) in by_precision.items():
            e = estimates[precision]
            ax.plot(steps, [x.point for x in e], label=precision)
            ax.fill_between(steps, [x.low for x in e], [x.high for x in e], alpha=0.2)
        loss = TASKS[task].score == "loss"
        ax.set(
            xlabel="epochs" if loss else "environment steps",
            ylabel=f"{'log10 eval loss' if loss else 'episode return'} (IQM over seeds, 95% CI)",
            title=task,
        )
        ax.legend()
        name = f"curves_{task.replace(':', '_')}.png"
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        files.append(name)
    return files


def plot_summary(analysis: dict, out: pathlib.Path) -> list[str]:
    """rliable's aggregate-interval, probability-of-improvement and profile plots."""
    from rliable import plot_utils

    precisions = list(analysis["aggregate"])
    points = {p: np.array([e.point for e in analysis["aggregate"][p].values()]) for p in precisions}
    intervals = {
        p: np.array(
            [[e.low for e in analysis["aggregate"][p].values()], [e.high for e in analysis["aggregate"][p].values()]]
        )
        for p in precisions
    }
    fig, _ = plot_utils.plot_interval_estimates(
        points, intervals, metric_names=list(stats.AGGREGATES), algorithms=precisions, xlabel="normalised score"
    )
    fig.savefig(out / "aggregate.png", dpi=100, bbox_inches="tight")
    plt.close(fig)

    pairs = {f"{p},{BASELINE}": e for p, e in analysis["improvement"].items()}
    ax = plot_utils.plot_probability_of_improvement(
        {k: np.array([e.point]) for k, e in pairs.items()},
        {k: np.array([[e.low], [e.high]]) for k, e in pairs.items()},
    )
    ax.figure.savefig(out / "improvement.png", dpi=100, bbox_inches="tight")
    plt.close(ax.figure)

    profiles, profile_cis = analysis["profiles"]
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_utils.plot_performance_profiles(
        profiles,
        np.linspace(0.0, 1.2, 49),
        performance_profile_cis=profile_cis,
        xlabel=r"normalised score $\tau$",
        ax=ax,
    )
    ax.legend(list(profiles))
    fig.savefig(out / "profiles.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return ["aggregate.png", "improvement.png", "profiles.png"]


def overflow_table(summaries: dict[str, dict[str, dict]]) -> list[str]:
    """Per precision, over all its cells: updates, skipped updates, overflow rate, halted seeds."""
    lines = ["| precision | updates (all seeds) | skipped | overflow rate | seeds halted | final scales (min-max) |"]
    lines.append("|---|---|---|---|---|---|")
    by_precision: dict[str, list[dict]] = {}
    for cells in summaries.values():
        for precision, summary in cells.items():
            by_precision.setdefault(precision, []).append(summary)
    for precision, cells in by_precision.items():
        updates = sum(s["total_updates"] for s in cells)
        skipped = sum(s["skipped_updates"] for s in cells)
        halted = sum(sum(s.get("halted_per_seed", [False])) for s in cells)
        scales = [x for s in cells for x in s.get("loss_scale_per_seed", [s["loss_scale"]])]
        lines.append(
            f"| {precision} | {updates} | {skipped} | {skipped / updates if updates else 0:.4f} | {halted} "
            f"| {min(scales):g} - {max(scales):g} |"
        )
    return lines


def _verdict_cell(analysis: dict, precision: str, task: int, planned: int | None = None) -> str:
    """A verdict and its difference; "did not learn" names the precisions that did not; a
    "not shown" from fewer seeds than the plan asked for says so."""
    difference, verdict = analysis["equivalence"][precision][task]
    if verdict == "did not learn":
        names = [p for p in (precision, BASELINE) if not analysis["learned"][p][task]]
        verdict = f"did not learn ({', '.join(names)})"
    seeds = analysis["normalised"][precision].shape[0]
    if verdict == "not shown" and planned is not None and seeds < planned:
        verdict = f"not shown, underpowered ({seeds} of {planned} planned seeds)"
    return f"{verdict} ({_fmt(difference)})"


def verdict_counts(analysis: dict) -> dict[str, dict[str, int]]:
    """Per precision: how many tasks each verdict (its first word: "did not learn", "not
    shown" and "too few seeds" whole) went to, for the final return and the AUC."""
    out = {}
    for score, part in (("final", analysis), ("auc", analysis.get("auc"))):
        if part is None:
            continue
        for precision, per_task in part["equivalence"].items():
            counts = out.setdefault(precision, {}).setdefault(score, {})
            for _, verdict in per_task:
                counts[verdict] = counts.get(verdict, 0) + 1
    return out


def verdict_table(analysis: dict, planned: dict[str, int] | None = None) -> list[str]:
    """The verdict table: a row per task and score (final return; AUC where measured)."""
    tasks, precisions = analysis["tasks"], [p for p in analysis["aggregate"] if p != BASELINE]
    planned = planned or {}
    lines = ["| task | score | " + " | ".join(precisions) + " |", "|---|---|" + "---|" * len(precisions)]
    for i, task in enumerate(tasks):
        final = "final return" if TASKS[task].score == "return" else "final eval loss"
        parts = [(final, analysis)] + ([("AUC", analysis["auc"])] if "auc" in analysis else [])
        for name, part in parts:
            cells = [_verdict_cell(part, p, i, planned.get(task)) for p in precisions]
            lines.append(f"| {task} | {name} | " + " | ".join(cells) + " |")
    return lines


def write_report(
    out: pathlib.Path,
    analysis: dict,
    summaries: dict[str, dict[str, dict]],
    curve_files: list[str],
    plot_files: list[str],
    header: list[str],
    cost: list[str],
    planned: dict[str, int] | None = None,
    sections: tuple[tuple[str, list[str]], ...] = (),
) -> pathlib.Path:
    """report.md (and stats.json, the same numbers for programs). `planned`: the seeds per
    cell the plan asked for, per task; `sections`: (title, lines) added before the cost."""
    tasks, precisions = analysis["tasks"], list(analysis["aggregate"])
    lines = ["# Precision study", "", *header, ""]
    lines += ["## Verdicts: each precision against fp32, per task", ""]
    lines += [
        f"The IQM difference of normalised scores (X - {BASELINE}) with its 95% stratified-bootstrap CI, for two "
        "scores: the final return, and the AUC (each seed's mean normalised return over the whole run: "
        "does X learn as fast, not only to the same end). "
        f'"equivalent": the whole CI within +-{stats.MARGIN:g}; "worse"/"better": the whole CI below/above 0 '
        'and not within the margin; "not shown": neither. No verdict where it would say nothing: '
        f'"did not learn" where X or {BASELINE} has an IQM normalised final score below {stats.LEARNED_FROM:g} '
        f"(0 is the random policy; the names in brackets; where {BASELINE} is its own reference, where its "
        "raw IQM's CI does not lie above the random policy's return), "
        f'"too few seeds" below {stats.MIN_SEEDS_FOR_VERDICT} seeds per cell, where the interval is too '
        'narrow to trust; "underpowered" where a cell has fewer seeds than the plan asked for.',
        "",
        *verdict_table(analysis, planned),
    ]
    lines += ["", "## Aggregate over tasks (normalised scores, 95% CIs)", ""]
    lines += ["| score | precision | " + " | ".join(stats.AGGREGATES) + f" | P(X > {BASELINE}) |"]
    lines += ["|---|---|" + "---|" * (len(stats.AGGREGATES) + 1)]
    for p in precisions:
        improvement = _fmt(analysis["improvement"][p]) if p in analysis["improvement"] else "-"
        lines.append(
            f"| final | {p} | " + " | ".join(_fmt(e) for e in analysis["aggregate"][p].values()) + f" | {improvement} |"
        )
    if "auc" in analysis:
        for p in precisions:
            values = analysis["auc"]["aggregate"][p].values()
            lines.append(f"| AUC | {p} | " + " | ".join(_fmt(e) for e in values) + " | - |")
    lines += ["", *[f"![{name}]({name})" for name in plot_files], ""]
    has_loss_task = any(TASKS[t].score == "loss" for t in tasks)
    raw = "final score (a loss task's: log10 of its final eval loss)" if has_loss_task else "final return"
    lines += [f"## Per task: {raw} over seeds (raw, 95% CIs)", ""]
    lines += ["| task | precision | mean | median | IQM |", "|---|---|---|---|---|"]
    for i, task in enumerate(tasks):
        for p in precisions:
            e = analysis["per_task"][p]
            lines.append(f"| {task} | {p} | {_fmt(e['Mean'][i])} | {_fmt(e['Median'][i])} | {_fmt(e['IQM'][i])} |")
    if "auc" in analysis:
        lines += ["", "## Per task: AUC over seeds (normalised, 95% CIs)", ""]
        lines += ["| task | precision | mean | median | IQM |", "|---|---|---|---|---|"]
        for i, task in enumerate(tasks):
            for p in precisions:
                e = analysis["auc"]["per_task"][p]
                lines.append(f"| {task} | {p} | {_fmt(e['Mean'][i])} | {_fmt(e['Median'][i])} | {_fmt(e['IQM'][i])} |")
    lines += [
        "",
        "## Normalisation",
        "",
        "| task | random policy (measured; a loss task: an untrained model) | reference | source |",
        "|---|---|---|---|",
    ]
    for task, random, (ref, source) in zip(tasks, analysis["random"], analysis["references"]):
        lines.append(f"| {task} | {random:.2f} | {ref:.2f} | {source} |")
    lines += ["", "## Learning curves", "", *[f"![{name}]({name})" for name in curve_files], ""]
    lines += ["## Overflows and skips", "", *overflow_table(summaries), ""]
    for title, body in sections:
        lines += [f"## {title}", "", *body, ""]
    lines += ["## Cost of a seed", "", *cost, ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "stats.json").write_text(json.dumps(_jsonable(analysis), indent=1))
    return path


def _jsonable(value):
    if isinstance(value, stats.Estimate):
        return value.as_tuple()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
