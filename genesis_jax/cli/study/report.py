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

from genesis_jax.cli.study import cells, stats  # noqa: E402
from genesis_jax.cli.study.cells import BASELINE, TASKS  # noqa: E402


def _fmt(e: stats.Estimate, digits: int = 2) -> str:
    return f"{e.point:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def references(
    raw: dict[str, np.ndarray],
    tasks: list[str],
    randoms: dict[str, float],
    known: dict[str, float | None] | None = None,
    sources: dict[str, str] | None = None,
) -> list[tuple[float, str]]:
    """Each task's reference score and its source: `known` ({task: score}, default the
    published returns of `TASKS`; `sources`: {task: where it came from} where not the
    task's own), else the study's fp32 IQM (said so in its source)."""
    out = []
    for i, task in enumerate(tasks):
        spec = TASKS[task]
        reference = (known or {}).get(task, spec.reference)
        if reference is not None:
            out.append((reference, (sources or {}).get(task, spec.reference_source)))
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


def judged(scores: dict[str, np.ndarray], reps: int, seed: int, learnt: dict, lower_is_better=False) -> dict:
    """A score's verdicts: per statistic ("by_statistic") and combined ("equivalence")."""
    by_statistic = stats.judge(scores, BASELINE, reps, seed, learnt=learnt, lower_is_better=lower_is_better)
    return {"by_statistic": by_statistic, "equivalence": stats.equivalence(by_statistic)}


def speed(rows: dict, tasks: list[str], random: list, reference: list, thresholds: dict, seeds: int) -> dict:
    """Each seed's time to its task's threshold (`cells.threshold_times`) as a share of the
    budget ("share", [seeds, tasks] per precision), and per precision and task the seeds
    that reached it, the budget and the threshold in normalised and raw units."""
    share, reached, budgets, levels = {}, {}, [], []
    for i, task in enumerate(tasks):
        level = thresholds.get(task, stats.THRESHOLD)
        levels.append((level, random[i] + level * (reference[i] - random[i])))
        above = lambda curve, i=i, level=level: (curve - random[i]) / (reference[i] - random[i]) >= level  # noqa: E731
        for precision, by_task in rows.items():
            times, hit, budget = cells.threshold_times(by_task[task], above)
            share.setdefault(precision, np.full((seeds, len(tasks)), np.nan))[:, i] = times / budget
            reached.setdefault(precision, []).append(int(hit.sum()))
        budgets.append(budget)
    return {"share": share, "reached": reached, "budgets": budgets, "thresholds": levels}


def analyse(
    raw: dict[str, np.ndarray],
    tasks: list[str],
    randoms: dict[str, float],
    reps: int,
    seed: int = 0,
    auc: dict[str, np.ndarray] | None = None,
    known: dict[str, float | None] | None = None,
    rows: dict[str, dict[str, list[dict]]] | None = None,
    thresholds: dict[str, float] | None = None,
    sources: dict[str, str] | None = None,
) -> dict:
    """Every statistic of the report from the raw score matrices ([seeds, tasks] per
    precision): the final return's; given `auc` (each seed's mean return over the whole
    run, same shape), the area under the learning curve's under "auc", normalised with the
    same random and reference returns and judged with the final return's learned flags;
    given `rows` ({precision: {task: metric rows}}), the time to `thresholds` ({task:
    normalised score}, default `stats.THRESHOLD`) under "speed", as a share of the budget
    (lower is faster). Each score is judged on the paired IQM, mean and CVaR (`judged`)."""
    refs = references(raw, tasks, randoms, known, sources)
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
        **judged(normalised, reps, seed, learned),
        "learned": learned,
        "failures": {p: [stats.failure_rate(m[:, i]) for i in range(len(tasks))] for p, m in normalised.items()},
        "profiles": stats.performance_profiles(normalised, np.linspace(0.0, 1.2, 49), reps, seed),
    }
    if auc is not None:
        auc_normalised = {p: stats.normalise(m, random, reference) for p, m in auc.items()}
        out["auc"] = {
            "normalised": auc_normalised,
            "per_task": stats.per_task(auc_normalised, reps, seed),
            "aggregate": stats.aggregate(auc_normalised, reps, seed),
            **judged(auc_normalised, reps, seed, learned),
            "learned": learned,
        }
    if rows is not None:
        times = speed(rows, tasks, random, reference, thresholds or {}, raw[BASELINE].shape[0])
        out["speed"] = {
            **times,
            "normalised": times["share"],
            "per_task": stats.per_task(times["share"], reps, seed),
            **judged(times["share"], reps, seed, learned, lower_is_better=True),
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
    for by_task in summaries.values():
        for precision, summary in by_task.items():
            by_precision.setdefault(precision, []).append(summary)
    for precision, ran in by_precision.items():
        updates = sum(s["total_updates"] for s in ran)
        skipped = sum(s["skipped_updates"] for s in ran)
        halted = sum(sum(s.get("halted_per_seed", [False])) for s in ran)
        scales = [x for s in ran for x in s.get("loss_scale_per_seed", [s["loss_scale"]])]
        lines.append(
            f"| {precision} | {updates} | {skipped} | {skipped / updates if updates else 0:.4f} | {halted} "
            f"| {min(scales):g} - {max(scales):g} |"
        )
    return lines


# The scores judged, by their key in the analysis ("" the final return's, at the top level).
SCORES = (("", "final"), ("auc", "AUC"), ("speed", "time to threshold"))
NAMES = {"IQM": "IQM", "Mean": "mean", "CVaR": f"CVaR{stats.TAIL:.0%}".replace("%", "")}


def _parts(analysis: dict):
    """(key, name, part) of each score the analysis judged."""
    return [(key, name, analysis[key] if key else analysis) for key, name in SCORES if not key or key in analysis]


def _verdict_cell(analysis: dict, precision: str, task: int, planned: int | None = None) -> str:
    """A verdict and its IQM difference; "did not learn" names the precisions that did not;
    a "not shown" from fewer seeds than the plan asked for says so; where the statistics do
    not all agree, each one's verdict."""
    difference, verdict = analysis["equivalence"][precision][task]
    if verdict == "did not learn":
        names = [p for p in (precision, BASELINE) if not analysis["learned"][p][task]]
        verdict = f"did not learn ({', '.join(names)})"
    seeds = analysis["normalised"][precision].shape[0]
    if verdict == "not shown" and planned is not None and seeds < planned:
        verdict = f"not shown, underpowered ({seeds} of {planned} planned seeds)"
    by_statistic = analysis.get("by_statistic", {}).get(precision, [{}] * (task + 1))[task]
    if len({v for _, v in by_statistic.values()}) > 1:
        each = ", ".join(f"{NAMES[name]} {v}" for name, (_, v) in by_statistic.items())
        return f"{verdict} ({_fmt(difference)}; {each})"
    return f"{verdict} ({_fmt(difference)})"


def verdict_counts(analysis: dict) -> dict[str, dict[str, int]]:
    """Per precision: how many tasks each verdict (its first word: "did not learn", "not
    shown" and "too few seeds" whole) went to, for each score (final, auc, speed)."""
    out = {}
    for key, _, part in _parts(analysis):
        for precision, per_task in part["equivalence"].items():
            counts = out.setdefault(precision, {}).setdefault(key or "final", {})
            for _, verdict in per_task:
                counts[verdict] = counts.get(verdict, 0) + 1
    return out


def verdict_table(analysis: dict, planned: dict[str, int] | None = None) -> list[str]:
    """The verdict table: a row per task and score (final return; AUC and time to
    threshold where measured)."""
    tasks, precisions = analysis["tasks"], [p for p in analysis["aggregate"] if p != BASELINE]
    planned = planned or {}
    lines = ["| task | score | " + " | ".join(precisions) + " |", "|---|---|" + "---|" * len(precisions)]
    for i, task in enumerate(tasks):
        final = "final return" if TASKS[task].score == "return" else "final eval loss"
        for key, name, part in _parts(analysis):
            cells_ = [_verdict_cell(part, p, i, planned.get(task)) for p in precisions]
            lines.append(f"| {task} | {final if not key else name} | " + " | ".join(cells_) + " |")
    return lines


def statistic_table(analysis: dict) -> list[str]:
    """Every statistic's paired difference X - fp32 with its CI and verdict."""
    lines = ["| task | score | precision | " + " | ".join(NAMES.values()) + " |", "|---|---|---|---|---|---|"]
    for i, task in enumerate(analysis["tasks"]):
        for _, name, part in _parts(analysis):
            for precision, per_task in part.get("by_statistic", {}).items():
                each = [f"{v} ({_fmt(e)})" for e, v in per_task[i].values()]
                lines.append(f"| {task} | {name} | {precision} | " + " | ".join(each) + " |")
    return lines


def tail_and_speed_table(analysis: dict) -> list[str]:
    """Per task and precision: the seeds that end below `stats.FAIL_BELOW`, the final
    score's CVaR, and the time to the threshold (IQM share of the budget, seeds reaching it)."""
    lines = [
        f"| task | precision | seeds ending below {stats.FAIL_BELOW:g} (normalised) | {NAMES['CVaR']} final "
        "(raw, 95% CI) | time to threshold: IQM share of the budget (95% CI) | seeds reaching it | threshold "
        "(normalised; raw) |",
        "|---|---|---|---|---|---|---|",
    ]
    times = analysis.get("speed")
    for i, task in enumerate(analysis["tasks"]):
        for p in analysis["aggregate"]:
            failed, seeds = analysis["failures"][p][i]
            row = f"| {task} | {p} | {failed} of {seeds} | {_fmt(analysis['per_task'][p]['CVaR'][i])} |"
            if times is None:
                lines.append(row + " - | - | - |")
                continue
            level, raw = times["thresholds"][i]
            reached, budget = times["reached"][p][i], times["budgets"][i]
            lines.append(
                row + f" {_fmt(times['per_task'][p]['IQM'][i])} of {budget} | {reached} of {seeds} "
                f"| {level:g}; {raw:.3g} |"
            )
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
        f"Each precision X against {BASELINE}, per task, on three scores: the final return; the AUC (each seed's "
        "mean normalised return over the whole run: does X learn as fast, not only to the same end); and the "
        "time to threshold (the first logged step at which a seed's return, in "
        f"{cells.SPEED_POINTS} windows of its run, reaches the threshold, as a share of the budget; lower is "
        "faster; a seed that never reaches it counts as the whole budget, a lower bound on its time). Each "
        f"score is judged on three statistics of its seeds: the IQM, the mean and the {NAMES['CVaR']} (the mean "
        f"of the worst {stats.TAIL:.0%} of the seeds, where a failure on some seeds shows first). Each "
        f"difference X - {BASELINE} (normalised scores; times in shares of the budget) has a 95% paired "
        "bootstrap CI: seed k of every precision starts from the same key, so each resample draws seed "
        f'indices once for all precisions. A statistic is "equivalent" where its whole CI lies within '
        f'+-{stats.MARGIN:g}, "worse"/"better" where it lies below/above 0 (a longer/shorter time) and not '
        'within the margin, "not shown" otherwise. A score is "equivalent" only where all three statistics '
        'are, "worse" where one is (and none is "better"), "better" where every one that is not equivalent '
        "is; the IQM difference is in brackets, and each statistic's verdict where they differ (all of them: "
        '"Verdicts by statistic" below). No verdict where it would say nothing: '
        f'"did not learn" where X or {BASELINE} has an IQM normalised final score below {stats.LEARNED_FROM:g} '
        f"(0 is the random policy; the names in brackets; where {BASELINE} is its own reference, where its "
        "raw IQM's CI does not lie above the random policy's return), "
        f'"too few seeds" below {stats.MIN_SEEDS_FOR_VERDICT} seeds per cell, where the interval is too '
        'narrow to trust; "underpowered" where a cell has fewer seeds than the plan asked for.',
        "",
        *verdict_table(analysis, planned),
    ]
    lines += ["", "## Tail and speed", "", *tail_and_speed_table(analysis)]
    lines += ["", "## Verdicts by statistic (paired differences X - fp32, 95% CIs)", "", *statistic_table(analysis)]
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
