"""The torture test as a benchmark: one training command killed N times at random moments with
SIGKILL, SIGTERM and SIGINT, resumed each time, then compared with the same command run once
without a stop (metric rows, every leaf of the final checkpoint, the summary, leftovers).

    python experiments/torture.py --algo ppo --kills 25 --seed 0 --out benchmarks/torture-cpu.md
    python experiments/torture.py --algo world-model --kills 25 --seed 0 --out benchmarks/torture-cpu.md --append
    python experiments/torture.py --algo dqn --kills 25 --seed 0 --out benchmarks/torture-cpu.md --append
    python experiments/torture.py --algo sac --kills 25 --seed 0 --out benchmarks/torture-cpu.md --append

Bigger runs: --total-steps (PPO, DQN, SAC) or --epochs (world model), --width. A failing schedule
replays with the same --seed (the same moments, signals and fractions; the instants depend
on the machine). Exit status 1 when the tortured run is not the uninterrupted one.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # the driver: tests/support

from _report import description  # noqa: E402

from genesis_jax.algos.base import MEASURED  # noqa: E402
from tests.support import torture  # noqa: E402


def command(args, workdir: str) -> tuple[list[str], int]:
    """The training command's arguments (without --out) and the positions it runs."""
    common = ["--precision", args.precision, "--seed", str(args.run_seed), "--no-progress"]
    if args.algo == "ppo":
        per_update = args.num_envs * args.num_steps
        every = per_update * args.checkpoint_every
        sizes = ["--total-steps", str(args.total_steps), "--num-envs", str(args.num_envs)]
        sizes += ["--num-steps", str(args.num_steps), "--checkpoint-every", str(every)]
        return ["train", "ppo", *sizes, *common], args.total_steps // per_update
    if args.algo in torture.OFF_POLICY:
        sizes, row_steps = torture.OFF_POLICY[args.algo]
        rows = args.total_steps // row_steps
        every = ["--checkpoint-every", str(row_steps * args.checkpoint_every)]
        return ["train", args.algo, "--total-steps", str(args.total_steps), *sizes, *every, *common], rows
    from genesis_jax.data.trajectories import collect_dataset, save_dataset

    data = os.path.join(workdir, "cartpole.npz")
    save_dataset(collect_dataset("CartPole-v1", args.num_sequences, 32, seed=0), data)
    sizes = ["--data", data, "--epochs", str(args.epochs), "--batch-size", "256", "--width", str(args.width)]
    sizes += ["--init-loss-scale", "1024", "--checkpoint-every", str(args.checkpoint_every)]
    return ["train", "world-model", *sizes, *common], args.epochs


def shown(argv: list[str]) -> list[str]:
    """The script's arguments without --workdir (a path of this machine's)."""
    skip = {i for i, a in enumerate(argv) if a == "--workdir"}
    return [a for i, a in enumerate(argv) if i not in skip and i - 1 not in skip]


def report(args, argv, result: torture.Torture, total: int, problems: list[str], seconds: float, load) -> list[str]:
    restarts = result.restart_seconds
    moments = {m: sum(k.moment == m for k in result.kills) for m in torture.MOMENTS}
    signals = {s: sum(k.signal == s for k in result.kills) for s in ("SIGKILL", "SIGTERM", "SIGINT")}
    return [
        f"## {args.algo}: {len(result.kills)} kills, schedule seed {args.seed}",
        "",
        f"command: `python experiments/torture.py {' '.join(shown(argv))}`",
        f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, shared with other work while measured "
        f"(load average {load[0]:.1f} at the start, {load[1]:.1f} at the end); JAX on CPU; persistent compilation "
        f"cache {'on' if not args.no_cache else 'off'}",
        f"run: `genesis-jax {' '.join(os.path.basename(a) for a in result.command)}` ({total} positions)",
        "",
        *torture.table(result),
        "",
        f"moments observed: {moments}; signals: {signals}",
        f"wall time: uninterrupted run {result.straight_seconds:.1f} s; {len(restarts)} tortured processes "
        f"{sum(restarts):.1f} s (median {sorted(restarts)[len(restarts) // 2]:.1f} s each); all {seconds:.1f} s",
        f"CPU time (user + system, all cores): uninterrupted run {result.straight_cpu:.1f} s; tortured processes "
        f"{result.restart_cpu:.1f} s ({result.restart_cpu / len(restarts):.1f} s each)",
        "",
        "verdict: "
        + (
            "identical to the uninterrupted run (metric rows, every leaf of the final checkpoint, the summary; "
            "no lock or temporary files left)"
            if not problems
            else "DIFFERENT: " + "; ".join(problems)
        ),
        "",
    ]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--algo", choices=("ppo", "world-model", "dqn", "sac"), default="ppo")
    p.add_argument("--kills", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="the kill schedule's seed")
    p.add_argument("--run-seed", type=int, default=3, help="the training run's --seed")
    p.add_argument("--precision", default="fp16")
    p.add_argument("--total-steps", type=int, default=None, help="PPO (16384), DQN (4000), SAC (320)")
    p.add_argument("--num-envs", type=int, default=4, help="PPO")
    p.add_argument("--num-steps", type=int, default=64, help="PPO")
    p.add_argument("--epochs", type=int, default=40, help="world model")
    p.add_argument("--width", type=int, default=32, help="world model")
    p.add_argument("--num-sequences", type=int, default=64, help="world model: collected CartPole sequences")
    p.add_argument("--checkpoint-every", type=int, default=0, help="positions between checkpoints (0: 1 WM, else 2)")
    p.add_argument("--no-cache", action="store_true", help="no persistent compilation cache: every restart compiles")
    p.add_argument(
        "--workdir",
        default=None,
        help="keep the run directories here (default: a temporary one, removed unless the run fails)",
    )
    p.add_argument("--out", default=None, help="markdown file for the report")
    p.add_argument("--append", action="store_true", help="append to --out instead of replacing it")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error(f"--kills must be a positive integer, got {args.kills}")
    args.checkpoint_every = args.checkpoint_every or (1 if args.algo == "world-model" else 2)
    args.total_steps = args.total_steps or {"ppo": 16384, "dqn": 4000, "sac": 320}.get(args.algo)
    workdir = args.workdir or tempfile.mkdtemp(prefix="torture-")
    os.makedirs(workdir, exist_ok=True)
    problems = None  # until the run and its verdict are done
    try:
        problems = run(args, argv, workdir)
    finally:  # a temporary workdir goes after a passing run; after a failing one it is kept for inspection
        if args.workdir is None and problems == []:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.workdir is None:
            print(f"the run directories are kept in {workdir}", file=sys.stderr)
    return 1 if problems else 0


def run(args, argv: list[str], workdir: str) -> list[str]:
    """The tortured run and its report (printed, and written to --out); the problems found."""
    began, load_start = time.perf_counter(), os.getloadavg()[0]
    cli_args, total = command(args, workdir)

    def log(kill: torture.Kill) -> None:
        print(
            f"{kill.planned:>8} -> {kill.moment:<8} {kill.signal:<8} at {kill.at:6.2f} s: exit {kill.status}, "
            f"rows {kill.rows_at_kill} -> {kill.rows_at_exit}, resumes from {kill.resume_from}",
            file=sys.stderr,
            flush=True,
        )

    result = torture.torture(cli_args, workdir, args.kills, args.seed, cache=not args.no_cache, log=log)
    problems = torture.verdict(result, total, MEASURED)
    if len(result.kills) < args.kills:
        problems.insert(0, f"the run finished after {len(result.kills)} of {args.kills} kills")
    load = (load_start, os.getloadavg()[0])
    lines = report(args, argv, result, total, problems, time.perf_counter() - began, load)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(text)
    return problems


if __name__ == "__main__":
    sys.exit(main())
