"""How often the study's verdict rule says "worse" or "better" where the precisions are alike.

Scores of fp32 and X are drawn from the same distribution, paired (seed k of each correlated
by rho, as seeds sharing a key are), and judged by the study's own functions (`stats.judge`,
then `stats.equivalence`: "worse" where any of the IQM, mean and CVaR25 is worse). Each
statistic's 95% CI alone would say "worse" in about 2.5% of trials; three of them, and the
small-sample bootstrap of the mean and the tail, say it more often.

    python experiments/study_false_alarms.py --trials 400 --out benchmarks/study-false-alarms-cpu.md
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from genesis_jax.cli.study import stats  # noqa: E402
from genesis_jax.run import probes  # noqa: E402


def verdict_rates(num_seeds: int, rho: float, trials: int, reps: int, skewed: bool, seed: int = 0) -> dict:
    """The share of `trials` studies of alike precisions judged "worse", and "better"."""
    rng, counts = np.random.default_rng(seed), {"worse": 0, "better": 0}
    for trial in range(trials):
        a, b = rng.normal(size=(2, num_seeds))
        b = rho * a + np.sqrt(1 - rho**2) * b
        if skewed:  # a long lower tail, as runs that fail on some seeds give
            a, b = -np.exp(a), -np.exp(b)
        scores = {"fp32": (0.7 + 0.1 * a)[:, None], "X": (0.7 + 0.1 * b)[:, None]}
        judged = stats.judge(scores, "fp32", reps=reps, seed=trial, learnt={"fp32": [True], "X": [True]})
        verdict = stats.equivalence(judged)["X"][0][1]
        counts[verdict] = counts.get(verdict, 0) + 1
    return {k: counts[k] / trials for k in ("worse", "better")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--reps", type=int, default=1000)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    start, rows = time.perf_counter(), []
    for skewed in (False, True):
        for rho in (0.0, 0.5, 0.9):
            for n in (8, 32):
                rates = verdict_rates(n, rho, args.trials, args.reps, skewed)
                kind = "skewed" if skewed else "normal"
                rows.append(f"| {kind} | {rho} | {n} | {rates['worse']:.1%} | {rates['better']:.1%} |")
                print(rows[-1], flush=True)
    lines = [
        "# False alarms of the study's verdict rule",
        "",
        f"command: `python experiments/study_false_alarms.py --trials {args.trials} --reps {args.reps} "
        f"--out {args.out}`; machine: {probes.machine_name()}; {time.perf_counter() - start:.0f} s",
        "",
        "fp32 and X alike (scores from one distribution, seed k of each correlated by rho); the share of studies "
        f"of {args.trials} whose combined verdict (IQM, mean and CVaR25; `stats.equivalence`) is worse, or better:",
        "",
        "| scores | rho | seeds | worse | better |",
        "| --- | --- | --- | --- | --- |",
        *rows,
    ]
    out = pathlib.Path(args.out)
    out.write_text("\n".join(lines) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
