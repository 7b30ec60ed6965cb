"""How often the study's whole verdict rule says "equivalent" for the final score at N seeds
per cell, where the precisions are alike: a power simulation from a study's own cells.

The cells of a study directory (`DIR/cells`, or the pilot's `DIR/plan/cells` with --pilot) give
per task the paired final scores (fp32 seed k, X seed k), normalised as the report does
(`cells.seed_scores`, `stats.normalise` with the plan's random and reference scores, else
stats.json's); pairs with a non-finite score are left out. Each simulated study draws N pairs
with replacement from an "alike" population made of the observed pairs and judges them with
the package's paired verdict (`stats.judge`, then `stats.equivalence`: "equivalent" only where
the 95% paired-bootstrap CIs of the IQM, the mean and the CVaR25 all lie within +-`stats.MARGIN`),
with --reps bootstrap replications (default 500, the study's 2000), the bootstrap's seed
indices drawn anew for every simulated study, and "did not learn" by `stats.learned` of the
simulated study's own scores (the report's rule, less its case of fp32 as its own reference).

How the population is made alike (--centre):
  swap (default): the 2n pairs (f_k, x_k) and (x_k, f_k). Drawing from it is drawing seed k
      and swapping its two arms with probability 1/2: the pair is exchangeable, so both arms
      have the same distribution (the pooled fp32 and X scores) and every statistic's
      difference is exactly 0 in the population, while the seeds' pairing (their correlation)
      is kept. The paired differences are the observed ones with a random sign.
  shift: fp32 as observed, X as fp32 plus the paired residuals centred to mean zero, i.e.
      x_k - mean(x - f). Only the mean's difference is 0: where X's scores have another shape
      (fewer failed seeds, say) the population's IQM and CVaR differ, so this is not "alike".
  none: the observed pairs as they are: the chance of "equivalent" at the observed differences
      (not a power where the precisions are alike; a check that a real difference is caught).

    python experiments/study_power.py benchmarks/study-long-cpu --sims 200 --reps 500

Limits: the observed seeds stand for the population (a bootstrap: the tail of 159 seeds is
all the tail it knows); N larger than the observed seeds resamples them many times over.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from genesis_jax.cli.study import cells, plan, stats  # noqa: E402
from genesis_jax.cli.study.cells import BASELINE  # noqa: E402

CENTRES = ("swap", "shift", "none")


def load(study: pathlib.Path, pilot: bool = False) -> tuple[dict, dict]:
    """({task: {precision: normalised final scores [seeds]}}, {task: the plan's seeds per cell,
    else the cells' seeds}) of the finished cells of `study` (its pilot's with `pilot`)."""
    root, saved = study / "plan" / "cells" if pilot else study / "cells", plan.read(study)
    fixed = json.loads((study / "stats.json").read_text()) if saved is None else None
    scores, planned = {}, {}
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        task = task_dir.name
        if saved is not None:
            random, reference = saved["tasks"][task]["random"], saved["tasks"][task]["reference"]
        else:
            i = fixed["tasks"].index(task)
            random, reference = fixed["random"][i], fixed["references"][i][0]
        summaries = {p.name: cells.read_summary(p) for p in sorted(task_dir.iterdir()) if p.is_dir()}
        raw = {p: cells.seed_scores(s) for p, s in summaries.items() if s is not None}
        scores[task] = {p: stats.normalise(r, [random], [reference]) for p, r in raw.items()}
        seeds = saved["tasks"][task]["seeds"] if saved is not None else len(raw[BASELINE])
        planned[task] = seeds
    return scores, planned


def alike(base, other, centre: str = "swap") -> tuple[np.ndarray, np.ndarray]:
    """The population of pairs (fp32 arm, X arm) in which the precisions are alike (module
    docstring), from the observed paired scores; pairs with a non-finite score left out."""
    base, other = np.asarray(base, np.float64), np.asarray(other, np.float64)
    keep = np.isfinite(base) & np.isfinite(other)
    base, other = base[keep], other[keep]
    if centre == "swap":
        return np.concatenate([base, other]), np.concatenate([other, base])
    if centre == "shift":
        return base, other - np.mean(other - base)
    if centre == "none":
        return base, other
    raise ValueError(f"unknown centre {centre!r}; accepted: {', '.join(CENTRES)}")


def power(base, other, n: int, sims: int, reps=500, seed=0, centre="swap", margin=stats.MARGIN) -> dict:
    """The share of `sims` simulated studies of `n` pairs drawn from `alike`'s population that
    each statistic's verdict, and the combined verdict ("all"), call "equivalent" (at `margin`)."""
    a, b = alike(base, other, centre)
    rng, counts = np.random.default_rng(seed), dict.fromkeys([*stats.STATISTICS, "all"], 0)
    for _ in range(sims):
        draw = rng.integers(0, len(a), n)
        scores = {BASELINE: a[draw][:, None], "X": b[draw][:, None]}
        judged = stats.judge(scores, BASELINE, reps, int(rng.integers(2**31)), margin)
        for name, (_, verdict) in judged["X"][0].items():
            counts[name] += verdict == "equivalent"
        counts["all"] += stats.equivalence(judged)["X"][0][1] == "equivalent"
    return {name: count / sims for name, count in counts.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", type=pathlib.Path, help="a study directory (its cells/, or plan/cells/ with --pilot)")
    p.add_argument("--pilot", action="store_true", help="the pilot's cells (plan/cells/) instead of the study's")
    p.add_argument("--seeds", help="seeds per cell N, comma-separated (default: the plan's N x 1, 2, 3, 4)")
    p.add_argument("--sims", type=int, default=200, help="simulated studies per N")
    p.add_argument("--reps", type=int, default=500, help="bootstrap replications per verdict")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--centre", choices=CENTRES, default="swap")
    args = p.parse_args(argv)
    start, (scores, planned) = time.perf_counter(), load(args.study, args.pilot)
    print(f"{args.study}{' (pilot)' if args.pilot else ''}: sims {args.sims}, reps {args.reps}, centre {args.centre}")
    print("| task | precision | observed pairs | N | IQM | mean | CVaR25 | all three |\n" + "|---" * 8 + "|")
    for task, by_precision in scores.items():
        ns = [int(s) for s in args.seeds.split(",")] if args.seeds else [planned[task] * k for k in (1, 2, 3, 4)]
        for precision, other in by_precision.items():
            if precision == BASELINE:
                continue
            base = by_precision[BASELINE]
            pairs = int(np.sum(np.isfinite(base) & np.isfinite(other)))
            for n in ns:
                share = power(base, other, n, args.sims, args.reps, args.seed, args.centre)
                row = [f"{share[k]:.0%}" for k in (*stats.STATISTICS, "all")]
                print(f"| {task} | {precision} | {pairs} | {n} | {' | '.join(row)} |", flush=True)
    print(f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
