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

from genesis_jax.study import stats  # noqa: E402
from genesis_jax.study.cells import BASELINE, TASKS  # noqa: E402


def _fmt(e: stats.Estimate, digits: int = 2) -> str:
    return f"{e.point:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def references(raw: dict[str, np.ndarray], tasks: list[str], randoms: dict[str, float]) -> list[tuple[float, str]]:
    """Each task's reference return and its source; a task without a published one uses
    the study's fp32 IQM (said so in its source)."""
    out = []
    for i, task in enumerate(tasks):
        spec = TASKS[task]
        if spec.reference is not None:
            out.append((spec.reference, spec.reference_source))
        else:
            out.append((stats.iqm(raw[BASELINE][:, [i]]), spec.reference_source))
    return out


def analyse(raw: dict[str, np.ndarray], tasks: list[str], randoms: dict[str, float], reps: int, seed: int = 0) -> dict:
    """Every statistic of the report from the raw score matrices ([seeds, tasks] per precision)."""
    refs = references(raw, tasks, randoms)
    random = [randoms[t] for t in tasks]
    normalised = {p: stats.normalise(m, random, [r for r, _ in refs]) for p, m in raw.items()}
    return {
        "tasks": tasks,
        "references": refs,
        "random": random,
        "normalised": normalised,
        "per_task": stats.per_task(raw, reps, seed),
        "aggregate": stats.aggregate(normalised, reps, seed),
        "improvement": stats.probability_of_improvement(normalised, BASELINE, reps, seed),
        "equivalence": stats.equivalence(normalised, BASELINE, reps, seed),
        "learned": stats.learned(normalised),
        "profiles": stats.performance_profiles(normalised, np.linspace(0.0, 1.2, 49), reps, seed),
    }


def plot_curves(curves: dict[str, dict[str, tuple]], out: pathlib.Path, reps: int) -> list[str]:
    """One PNG per task: the IQM over seeds of the return along training, a CI band, one
    line per precision."""
    files = []
    for task, by_precision in curves.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        estimates = stats.curves({p: returns for p, (_, returns) in by_precision.items()}, reps=reps)
        for precision, (steps, _) in by_precision.items():
            e = estimates[precision]
            ax.plot(steps, [x.point for x in e], label=precision)
            ax.fill_between(steps, [x.low for x in e], [x.high for x in e], alpha=0.2)
        ax.set(xlabel="environment steps", ylabel="episode return (IQM over seeds, 95% CI)", title=task)
        ax.legend()
        name = f"curves_{task}.png"
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


def _verdict_cell(analysis: dict, precision: str, task: int) -> str:
    """A verdict and its difference; "did not learn" names the precisions that did not."""
    difference, verdict = analysis["equivalence"][precision][task]
    if verdict == "did not learn":
        names = [p for p in (precision, BASELINE) if not analysis["learned"][p][task]]
        verdict = f"did not learn ({', '.join(names)})"
    return f"{verdict} ({_fmt(difference)})"


def write_report(
    out: pathlib.Path,
    analysis: dict,
    summaries: dict[str, dict[str, dict]],
    curve_files: list[str],
    plot_files: list[str],
    header: list[str],
    cost: list[str],
) -> pathlib.Path:
    """report.md (and stats.json, the same numbers for programs)."""
    tasks, precisions = analysis["tasks"], list(analysis["aggregate"])
    lines = ["# Precision study", "", *header, ""]
    lines += ["## Verdicts: each precision against fp32, per task", ""]
    lines += [
        f"The IQM difference of normalised scores (X - {BASELINE}) with its 95% stratified-bootstrap CI. "
        f'"equivalent": the whole CI within +-{stats.MARGIN:g}; "worse"/"better": the whole CI below/above 0 '
        'and not within the margin; "not shown": neither. No verdict where it would say nothing: '
        f'"did not learn" where X or {BASELINE} has an IQM normalised score below {stats.LEARNED_FROM:g} '
        f'(0 is the random policy; the names in brackets), "too few seeds" below {stats.MIN_SEEDS_FOR_VERDICT} '
        "seeds per cell, where the interval is too narrow to trust.",
        "",
        "| task | " + " | ".join(p for p in precisions if p != BASELINE) + " |",
        "|---|" + "---|" * (len(precisions) - 1),
    ]
    for i, task in enumerate(tasks):
        cells = [_verdict_cell(analysis, p, i) for p in precisions if p != BASELINE]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    lines += ["", "## Aggregate over tasks (normalised scores, 95% CIs)", ""]
    lines += ["| precision | " + " | ".join(stats.AGGREGATES) + f" | P(X > {BASELINE}) |"]
    lines += ["|---|" + "---|" * (len(stats.AGGREGATES) + 1)]
    for p in precisions:
        improvement = _fmt(analysis["improvement"][p]) if p in analysis["improvement"] else "-"
        lines.append(
            f"| {p} | " + " | ".join(_fmt(e) for e in analysis["aggregate"][p].values()) + f" | {improvement} |"
        )
    lines += ["", *[f"![{name}]({name})" for name in plot_files], ""]
    lines += ["## Per task: final return over seeds (raw, 95% CIs)", ""]
    lines += ["| task | precision | mean | median | IQM |", "|---|---|---|---|---|"]
    for i, task in enumerate(tasks):
        for p in precisions:
            e = analysis["per_task"][p]
            lines.append(f"| {task} | {p} | {_fmt(e['Mean'][i])} | {_fmt(e['Median'][i])} | {_fmt(e['IQM'][i])} |")
    lines += [
        "",
        "## Normalisation",
        "",
        "| task | random policy (measured) | reference | source |",
        "|---|---|---|---|",
    ]
    for task, random, (ref, source) in zip(tasks, analysis["random"], analysis["references"]):
        lines.append(f"| {task} | {random:.2f} | {ref:.2f} | {source} |")
    lines += ["", "## Learning curves", "", *[f"![{name}]({name})" for name in curve_files], ""]
    lines += ["## Overflows and skips", "", *overflow_table(summaries), ""]
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
