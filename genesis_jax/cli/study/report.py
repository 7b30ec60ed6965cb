"""The study's report: the statistics of `stats` over the cells' scores, drawn with rliable's
plots, and a markdown page that puts the verdicts, the pictures, the overflow counts, the
underflow telemetry and the cost of a seed together."""

from __future__ import annotations

import json
import pathlib

# pyplot in the backend the process has (rliable's plots draw through it), each figure closed once
# saved: a `matplotlib.use("Agg")` here switched a notebook importing the study to Agg, and its
# own plots stopped showing. The command's process picks Agg itself (`genesis_jax.cli.main`).
import matplotlib.pyplot as plt
import numpy as np

from genesis_jax.cli.study import stats
from genesis_jax.cli.study.cells import BASELINE, SPEED_POINTS, TASKS, threshold_times


def _fmt(e: stats.Estimate, digits: int = 2) -> str:
    return f"{e.point:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def references(raw, tasks: list[str], known=None, sources=None) -> list[tuple[float, str]]:
    """Each task's reference score and its source: `known` ({task: score}, default the
    published returns of `TASKS`; `sources`: {task: where it came from} where not the
    task's own), else the study's fp32 IQM (said so in its source)."""
    known, sources, fp32_iqm = known or {}, sources or {}, lambda i: stats.iqm(raw[BASELINE][:, [i]])
    refs = [(known.get(t, TASKS[t].reference), sources.get(t, TASKS[t].reference_source)) for t in tasks]
    return [
        (fp32_iqm(i), TASKS[t].reference_source) if r is None else (r, s)
        for i, (t, (r, s)) in enumerate(zip(tasks, refs))
    ]


def learned_flags(normalised: dict, per_task: dict, tasks: list[str], random: list[float]) -> dict[str, list[bool]]:
    """Which precision learned which task (`stats.learned` on normalised scores). Where fp32
    is its own reference (no published return: its normalised IQM is 1 by construction) it is
    judged against the random policy's floor instead: it learned where the lower end of the
    95% CI of its raw IQM lies above the random policy's return."""
    flags = stats.learned(normalised)
    for i, task in enumerate(tasks):
        if TASKS[task].reference is None and TASKS[task].score == "return" and BASELINE in per_task:
            flags[BASELINE][i] = bool(per_task[BASELINE]["IQM"][i].low > random[i])
    return flags


def speed(rows: dict, tasks: list[str], random: list, reference: list, thresholds: dict, seeds: int) -> dict:
    """Each seed's time to its task's threshold (`cells.threshold_times`) as a share of the
    budget ("share", [seeds, tasks] per precision), and per precision and task the seeds
    that reached it, the cell's budget and the windows it was timed in ("windows": the
    time's resolution is 1/windows of the budget); per task the threshold in normalised and
    raw units."""
    share, reached, budgets, windows, levels = {}, {}, {}, {}, []
    for i, task in enumerate(tasks):
        level = thresholds.get(task, stats.THRESHOLD)
        levels.append((level, random[i] + level * (reference[i] - random[i])))
        above = lambda curve: (curve - random[i]) / (reference[i] - random[i]) >= level
        for precision, by_task in rows.items():
            times, hit, budget = threshold_times(by_task[task], above)
            share.setdefault(precision, np.full((seeds, len(tasks)), np.nan))[:, i] = times / budget
            reached.setdefault(precision, []).append(int(hit.sum()))
            budgets.setdefault(precision, []).append(budget)
            windows.setdefault(precision, []).append(min(SPEED_POINTS, len(by_task[task])))
    return {"share": share, "reached": reached, "budgets": budgets, "windows": windows, "thresholds": levels}


def time_verdict(verdict: str, reached: int, base_reached: int, seeds: int, windows: int) -> str:
    """A statistic's verdict on the time to threshold, where a seed that never reached it
    counts as the budget (a lower bound on its time): "not reached" where no seed of either
    precision reached it; "equivalent" only where every seed of both did, "worse" (slower)
    only where every fp32 seed did, "better" only where every seed of X did, else "not shown
    (censored ...)"; no "equivalent" where the time's resolution (1/`windows` of the budget)
    is no finer than the margin.

    >>> time_verdict("equivalent", 0, 0, 5, 48)
    'not reached (0 of 5 / 0 of 5)'
    >>> time_verdict("worse", 2, 5, 5, 48)
    'worse'
    """
    counts = f"{reached} of {seeds} / {base_reached} of {seeds}"
    if reached == base_reached == 0:
        return f"not reached ({counts})"
    needs = {"equivalent": reached == base_reached == seeds, "worse": base_reached == seeds, "better": reached == seeds}
    if not needs.get(verdict, True):
        return f"not shown (censored: {counts} reached)"
    if verdict == "equivalent" and 1 / windows >= stats.MARGIN:
        return f"not shown (timed in {windows} rows: 1/{windows} of the budget, no finer than the margin)"
    return verdict


def _score(scores: dict, reps: int, seed: int, learned: dict, lower_is_better=False, per_task=None, **more) -> dict:
    """A score's part of the analysis: its matrices, per-task estimates (`per_task`, default the
    scores'), `more`, its verdicts per statistic ("by_statistic") and combined ("equivalence")
    and the learned flags they were judged with."""
    per_task = stats.per_task(scores, reps, seed) if per_task is None else per_task
    by_statistic = stats.judge(scores, BASELINE, reps, seed, learnt=learned, lower_is_better=lower_is_better)
    more = {"normalised": scores, "per_task": per_task, **more, "by_statistic": by_statistic}
    return {**more, "equivalence": stats.equivalence(by_statistic), "learned": learned}


def analyse(raw, tasks, randoms, reps, seed=0, auc=None, known=None, rows=None, thresholds=None, sources=None) -> dict:
    """Every statistic of the report from the raw score matrices ([seeds, tasks] per
    precision): the final return's; given `auc` (each seed's mean return over the whole
    run, same shape), the area under the learning curve's under "auc", normalised with the
    same random and reference returns and judged with the final return's learned flags;
    given `rows` ({precision: {task: metric rows}}), the time to `thresholds` ({task:
    normalised score}, default `stats.THRESHOLD`) under "speed", as a share of the budget
    (lower is faster). Each score is judged on the paired IQM, mean and CVaR (`_score`)."""
    refs = references(raw, tasks, known, sources)
    random, reference = [randoms[t] for t in tasks], [r for r, _ in refs]
    normalise = lambda scores: {p: stats.normalise(m, random, reference) for p, m in scores.items()}
    normalised, per_task = normalise(raw), stats.per_task(raw, reps, seed)
    learned = learned_flags(normalised, per_task, tasks, random)
    aggregate = stats.aggregate(normalised, reps, seed)
    improvement = stats.probability_of_improvement(normalised, BASELINE, reps, seed)
    final = _score(normalised, reps, seed, learned, per_task=per_task, aggregate=aggregate, improvement=improvement)
    out = dict(tasks=tasks, references=refs, random=random, **final)
    out.update(failures={p: [stats.failure_rate(m[:, i]) for i in range(len(tasks))] for p, m in normalised.items()})
    out.update(profiles=stats.performance_profiles(normalised, np.linspace(0.0, 1.2, 49), reps, seed))
    if auc is not None:  # "auc": normalised like the final score, judged with its learned flags
        auc = normalise(auc)
        out["auc"] = _score(auc, reps, seed, learned, aggregate=stats.aggregate(auc, reps, seed))
    if rows is not None:  # "speed": lower is faster, judged by `time_verdict`
        seeds = raw[BASELINE].shape[0]
        times = speed(rows, tasks, random, reference, thresholds or {}, seeds)
        every = {p: [True] * len(tasks) for p in times["share"]}
        out["speed"] = part = {**times, **_score(times["share"], reps, seed, every, lower_is_better=True)}
        for p, per_task in part["by_statistic"].items():
            n, base = times["reached"][p], times["reached"][BASELINE]
            for i, judged_task in enumerate(per_task):
                for name, (e, v) in judged_task.items():
                    judged_task[name] = (e, time_verdict(v, n[i], base[i], seeds, times["windows"][p][i]))
        part["equivalence"] = stats.equivalence(part["by_statistic"])
    return out


def _save(fig, path: pathlib.Path, **options) -> str:
    fig.savefig(path, dpi=100, **options)
    plt.close(fig)
    return path.name


def plot_curves(curves: dict[str, dict[str, tuple]], out: pathlib.Path, reps: int) -> list[str]:
    """One PNG per task: the IQM over seeds of the return (a loss task: log10 of the eval
    loss, by epoch) along training, a CI band, one line per precision."""
    files = []
    for task, by_precision in curves.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        estimates = stats.curves({p: returns for p, (_, returns) in by_precision.items()}, reps=reps)
        for precision, (steps, _) in by_precision.items():
            point, low, high = np.array(estimates[precision]).T
            ax.plot(steps, point, label=precision)
            ax.fill_between(steps, low, high, alpha=0.2)
        loss = TASKS[task].score == "loss"
        ylabel = f"{'log10 eval loss' if loss else 'episode return'} (IQM over seeds, 95% CI)"
        ax.set(xlabel="epochs" if loss else "environment steps", ylabel=ylabel, title=task)
        ax.legend()
        fig.tight_layout()
        files.append(_save(fig, out / f"curves_{task.replace(':', '_')}.png"))
    return files


def plot_summary(analysis: dict, out: pathlib.Path) -> list[str]:
    """rliable's aggregate-interval, probability-of-improvement and profile plots."""
    from rliable import plot_utils

    aggregate = {p: np.array(list(e.values())) for p, e in analysis["aggregate"].items()}  # [statistics, 3]
    points, intervals = {p: e[:, 0] for p, e in aggregate.items()}, {p: e[:, 1:].T for p, e in aggregate.items()}
    fig, _ = plot_utils.plot_interval_estimates(
        points, intervals, metric_names=list(stats.AGGREGATES), algorithms=list(aggregate), xlabel="normalised score"
    )
    files = [_save(fig, out / "aggregate.png", bbox_inches="tight")]
    pairs = {f"{p},{BASELINE}": np.array(e) for p, e in analysis["improvement"].items()}
    points, intervals = {k: e[:1] for k, e in pairs.items()}, {k: e[1:, None] for k, e in pairs.items()}
    ax = plot_utils.plot_probability_of_improvement(points, intervals)
    files.append(_save(ax.figure, out / "improvement.png", bbox_inches="tight"))
    profiles, profile_cis = analysis["profiles"]
    fig, ax = plt.subplots(figsize=(6, 4))
    taus, label = np.linspace(0.0, 1.2, 49), r"normalised score $\tau$"
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=profile_cis, xlabel=label, ax=ax)
    ax.legend(list(profiles))
    return [*files, _save(fig, out / "profiles.png", bbox_inches="tight")]


def overflow_table(summaries: dict[str, dict[str, dict]]) -> list[str]:
    """Per precision, over all its cells: updates, skipped updates, overflow rate, halted seeds."""
    rows = []
    for precision in next(iter(summaries.values())):
        ran = [by_precision[precision] for by_precision in summaries.values()]
        updates, skipped = sum(s["total_updates"] for s in ran), sum(s["skipped_updates"] for s in ran)
        halted = sum(sum(s.get("halted_per_seed", [False])) for s in ran)
        scales = [x for s in ran for x in s.get("loss_scale_per_seed", [s["loss_scale"]])]
        rate, scales = f"{skipped / updates if updates else 0:.4f}", f"{min(scales):g} - {max(scales):g}"
        rows.append((precision, updates, skipped, rate, halted, scales))
    head = "precision | updates (all seeds) | skipped | overflow rate | seeds halted | final scales (min-max)"
    return table(head, rows)


def underflow_section(out: pathlib.Path, rows: dict[str, dict[str, list[dict]]]) -> list[str]:
    """The report's underflow section, from the cells that recorded the opt-in telemetry
    (`genesis_jax.amp.telemetry`; the study turns it on in its `cells.TELEMETRY_PRECISIONS`
    cells; `rows`: {precision: {task: metric rows}}): per task and precision the run's mean
    fractions (each row: means over seeds) and the layer that lost most; a plot per task."""
    table_rows, pictures = [], []
    for task in next(iter(rows.values())):
        recorded = {p: by[task] for p, by in rows.items() if by[task] and "underflow" in by[task][0]}
        for precision, run in recorded.items():
            mean = lambda key: f"{np.mean([r[key] for r in run]):.4f}"
            layers = sorted(k.split("/", 1)[1] for k in run[0] if k.startswith("underflow/"))
            worst = max(layers, key=lambda layer: float(np.mean([r[f"flushed/{layer}"] for r in run])))
            worst = f"{worst} ({mean(f'flushed/{worst}')})"
            table_rows.append((task, precision, mean("underflow"), mean("flushed"), worst))
        if recorded:  # underflow_TASK.png: below normal (solid) and flushed to 0 (dashed), per precision
            fig, ax = plt.subplots(figsize=(6, 4))
            for i, (precision, run) in enumerate(recorded.items()):
                x_key = "step" if "step" in run[0] else "epoch"
                for kind, style, what in (("underflow", "-", "below normal"), ("flushed", "--", "flushed to 0")):
                    xs, ys, label = [r[x_key] for r in run], [r[kind] for r in run], f"{precision}: {what}"
                    ax.plot(xs, ys, color=f"C{i}", linestyle=style, label=label)
            ax.set(xlabel=x_key, ylabel="fraction of non-zero gradient entries", ylim=(-0.02, 1.02), title=task)
            ax.legend(fontsize=8)
            fig.tight_layout()
            pictures.append(_save(fig, out / f"underflow_{task.replace(':', '_')}.png"))
    if not pictures:
        return ["No cell of this study recorded the underflow telemetry."]
    text = (
        "Per task, over the whole run (each update's first minibatch; means over seeds): of the gradient entries "
        "that are non-zero in a float32 backward, the share a float16 backward at the cell's loss scale leaves "
        "below float16's smallest normal (2^-14; fewer significant bits) or flushes to 0 (lost). "
        "`genesis_jax.amp.telemetry`; `--underflow-telemetry` on `train ppo` and `train world-model`."
    )
    head = "task | precision | below normal | flushed to 0 | layer losing most (flushed)"
    return [text, "", *table(head, table_rows), "", *[f"![{name}]({name})" for name in pictures]]


# The scores judged, by their key in the analysis ("" the final return's, at the top level).
SCORES = (("", "final"), ("auc", "AUC"), ("speed", "time to threshold"))
NAMES = {"IQM": "IQM", "Mean": "mean", "CVaR": f"CVaR{stats.TAIL:.0%}".replace("%", "")}


def _verdict_cell(analysis: dict, precision: str, task: int, planned: int | None = None) -> str:
    """A verdict and its IQM difference; "did not learn" names the precisions that did not;
    a "not shown" from fewer seeds than the plan asked for says so; where the statistics do
    not all agree, each one's verdict."""
    difference, verdict = analysis["equivalence"][precision][task]
    if verdict == "did not learn":
        verdict += f" ({', '.join(p for p in (precision, BASELINE) if not analysis['learned'][p][task])})"
    seeds = analysis["normalised"][precision].shape[0]
    if verdict == "not shown" and planned is not None and seeds < planned:
        verdict = f"not shown, underpowered ({seeds} of {planned} planned seeds)"
    by_statistic = analysis["by_statistic"][precision][task]
    each = ", ".join(f"{NAMES[name]} {v}" for name, (_, v) in by_statistic.items())
    agree = len({v for _, v in by_statistic.values()}) == 1
    return f"{verdict} ({_fmt(difference)}{'' if agree else '; ' + each})"


def table(head: str, rows) -> list[str]:
    """A markdown table's lines: its column names (`head`, "a | b"), then each row's cells."""
    rule = "|" + "---|" * (head.count(" | ") + 1)
    return [f"| {head} |", rule, *(f"| {' | '.join(map(str, row))} |" for row in rows)]


def _per_task_table(per_task: dict, tasks: list[str]) -> list[str]:
    cells = lambda e, i: (_fmt(e["Mean"][i]), _fmt(e["Median"][i]), _fmt(e["IQM"][i]))
    rows = [(t, p, *cells(e, i)) for i, t in enumerate(tasks) for p, e in per_task.items()]
    return table("task | precision | mean | median | IQM", rows)


def _tail_and_speed(analysis: dict, i: int, task: str, p: str) -> tuple:
    """A row of the tail-and-speed table: the seeds that end below `stats.FAIL_BELOW`, the final
    score's CVaR, and the time to the threshold (IQM share of the budget, seeds reaching it)."""
    failed, seeds = analysis["failures"][p][i]
    row, times = (task, p, f"{failed} of {seeds}", _fmt(analysis["per_task"][p]["CVaR"][i])), analysis.get("speed")
    if times is None:
        return (*row, "-", "-", "-")
    (level, raw), speed_iqm = times["thresholds"][i], _fmt(times["per_task"][p]["IQM"][i])
    reached = f"{times['reached'][p][i]} of {seeds}"
    return (*row, f"{speed_iqm} of {times['budgets'][p][i]}", reached, f"{level:g}; {raw:.3g}")


# What the verdict table says: how each score is judged and what is not judged.
VERDICTS = (
    f"Each precision X against {BASELINE}, per task, on three scores: the final return; the AUC (each seed's mean "
    "normalised return over the whole run: does X learn as fast, not only to the same end); and the time to "
    f"threshold (the first logged step at which a seed's return, in {SPEED_POINTS} windows of its run, reaches the "
    "threshold, as a share of the budget; lower is faster; a seed that never reaches it counts as the whole budget, "
    'a lower bound on its time: so a time is "equivalent" only where every seed of both precisions reached it, '
    f'"worse" only where every {BASELINE} seed did, "better" only where every seed of X did, "not shown '
    '(censored)" otherwise, "not reached" where no seed of either did, and not "equivalent" where the run logged '
    "too few rows to time it finer than the margin). Each score is judged on three statistics of its seeds: the "
    "IQM, the mean and the "
    f"{NAMES['CVaR']} (the mean of the worst {stats.TAIL:.0%} of the seeds, where a failure on some seeds shows "
    f"first). Each difference X - {BASELINE} (normalised scores; times in shares of the budget) has a 95% paired "
    "bootstrap CI: seed k of every precision starts from the same key, so each resample draws seed indices once for "
    f'all precisions. A statistic is "equivalent" where its whole CI lies within +-{stats.MARGIN:g}, '
    '"worse"/"better" where it lies below/above 0 (a longer/shorter time) and not within the margin, "not shown" '
    'otherwise. A score is "equivalent" only where all three statistics are, "worse" where one is (and none is '
    '"better"), "better" where every one that is not equivalent is; the IQM difference is in brackets, and each '
    'statistic\'s verdict where they differ (all of them: "Verdicts by statistic" below). No verdict where it would '
    f'say nothing: "did not learn" where X or {BASELINE} has an IQM normalised final score below '
    f"{stats.LEARNED_FROM:g} (0 is the random policy; the names in brackets; where {BASELINE} is its own reference, "
    "where its raw IQM's CI does not lie above the random policy's return), \"too few seeds\" below "
    f'{stats.MIN_SEEDS_FOR_VERDICT} seeds per cell, where the interval is too narrow to trust; "underpowered" where '
    "a cell has fewer seeds than the plan asked for."
)
TAIL_HEAD = (
    f"task | precision | seeds ending below {stats.FAIL_BELOW:g} (normalised) | {NAMES['CVaR']} final (raw, 95% CI) "
    "| time to threshold: IQM share of the budget (95% CI) | seeds reaching it | threshold (normalised; raw)"
)


def write_report(out, analysis, summaries, curve_files, plot_files, header, cost, planned=None, sections=()):
    """Writes report.md (and stats.json, the same numbers for programs) in `out`, from `analysis`
    (`analyse`), the cells' `summaries` ({task: {precision: summary}}), the names of the
    plots, the `header` and `cost` lines. `planned`: the seeds per cell the plan asked for,
    per task; `sections`: (title, lines) added before the cost."""
    tasks, precisions, planned = analysis["tasks"], list(analysis["aggregate"]), planned or {}
    others, auc = [p for p in precisions if p != BASELINE], analysis.get("auc")
    # (key, name, part) of each score the analysis judged
    parts = [(key, name, analysis[key] if key else analysis) for key, name in SCORES if not key or key in analysis]
    lines = ["# Precision study", "", *header, ""]
    add = lambda title, *body: lines.extend([f"## {title}", "", *body, ""])
    final = lambda task: "final return" if TASKS[task].score == "return" else "final eval loss"
    verdicts = [
        (task, name if key else final(task), *(_verdict_cell(part, p, i, planned.get(task)) for p in others))
        for i, task in enumerate(tasks)
        for key, name, part in parts
    ]
    head = " | ".join(["task | score", *others])
    add("Verdicts: each precision against fp32, per task", VERDICTS, "", *table(head, verdicts))
    tail = [_tail_and_speed(analysis, i, t, p) for i, t in enumerate(tasks) for p in precisions]
    add("Tail and speed", *table(TAIL_HEAD, tail))
    by_statistic = [
        (task, name, precision, *(f"{v} ({_fmt(e)})" for e, v in per_task[i].values()))
        for i, task in enumerate(tasks)
        for _, name, part in parts
        for precision, per_task in part.get("by_statistic", {}).items()
    ]
    head = " | ".join(["task | score | precision", *NAMES.values()])
    add("Verdicts by statistic (paired differences X - fp32, 95% CIs)", *table(head, by_statistic))
    improvement = lambda p: _fmt(analysis["improvement"][p]) if p in analysis["improvement"] else "-"
    aggregate = [("final", p, *map(_fmt, analysis["aggregate"][p].values()), improvement(p)) for p in precisions]
    aggregate += [("AUC", p, *map(_fmt, auc["aggregate"][p].values()), "-") for p in precisions if auc]
    head = " | ".join(["score | precision", *stats.AGGREGATES, f"P(X > {BASELINE})"])
    pictures = [f"![{name}]({name})" for name in plot_files]
    add("Aggregate over tasks (normalised scores, 95% CIs)", *table(head, aggregate), "", *pictures)
    raw = "final score (a loss task's: log10 of its final eval loss)"
    raw = raw if any(TASKS[t].score == "loss" for t in tasks) else "final return"
    add(f"Per task: {raw} over seeds (raw, 95% CIs)", *_per_task_table(analysis["per_task"], tasks))
    if auc:
        add("Per task: AUC over seeds (normalised, 95% CIs)", *_per_task_table(auc["per_task"], tasks))
    references = zip(tasks, analysis["random"], analysis["references"])
    head = "task | random policy (measured; a loss task: an untrained model) | reference | source"
    add("Normalisation", *table(head, [(t, f"{r:.2f}", f"{ref:.2f}", source) for t, r, (ref, source) in references]))
    add("Learning curves", *[f"![{name}]({name})" for name in curve_files])
    add("Overflows and skips", *overflow_table(summaries))
    for title, body in [*sections, ("Cost of a seed", cost)]:
        add(title, *body)
    (out / "report.md").write_text("\n".join(lines))
    # stats.json: an Estimate (a named tuple) as [point, low, high], numpy's values as lists and numbers
    (out / "stats.json").write_text(json.dumps(analysis, indent=1, default=lambda v: v.tolist()))
    return out / "report.md"
