"""DQN learning in fp32 and fp16 (dynamic loss scaling): CartPole-v1 with PureJaxRL's settings
over 5e5 steps, and the four gymnax MinAtar games (the `minatar` settings, CNN torso) at equal steps. The
seeds of one precision train together under vmap (one compiled run, each seed its own loss
scale). final_return: as the run's summary defines it (its `final_return_is`, printed with the
table), per seed; training episodes, epsilon-greedy.

Usage: python experiments/dqn_learning.py TASK [--steps N] [--seeds 3] [--out FILE]
(TASK: cartpole, breakout, asterix, freeway or spaceinvaders)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import description, emit  # noqa: E402

from genesis_jax.algos.dqn import DQNConfig, minatar, train  # noqa: E402
from genesis_jax.run.probes import device_name, versions_line  # noqa: E402


def minatar_task(env: str):
    # epsilon falls over the first 10% of the steps: `minatar`'s epsilon_fraction (500k of 5M), as CleanRL's Atari DQN
    def config(steps, **kw):
        return minatar(env, total_steps=steps or 5_000_000, **kw)

    return config


TASKS = {
    "cartpole": lambda steps, **kw: DQNConfig(total_steps=steps or 500_000, **kw),
    **{game.lower(): minatar_task(f"{game}-MinAtar") for game in ("Breakout", "Asterix", "Freeway", "SpaceInvaders")},
}


def run(task: str, steps: int | None, seeds: int, precision: str) -> dict:
    config = TASKS[task](steps, precision=precision, num_seeds=seeds, seed=0)
    start = time.perf_counter()
    result = train(config, progress=False)
    s = result.summary
    return {
        "precision": precision,
        "total_steps": s["total_steps"],
        "final_return_per_seed": s["final_return_per_seed"],
        "final_return_is": s["final_return_is"],
        "skipped_updates": s["skipped_updates"],
        "total_updates": s["total_updates"],
        "loss_scale": s["loss_scale"],
        "steps_per_second": s["steps_per_second"],
        "buffer_bytes": s["buffer_bytes"],
        "wall_seconds": time.perf_counter() - start,
        "curve": [(r["step"], r["episode_return"]) for r in result.metrics],
    }


def table(task: str, results: list[dict], threshold: float | None) -> list[str]:
    lines = [
        "| precision | steps | final_return per seed | mean | std | seeds >= threshold | skipped / updates | "
        "final loss scale | steps/s (all seeds) | buffer bytes (all seeds) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        returns = np.asarray(r["final_return_per_seed"], float)
        passed = f"{int(np.sum(returns >= threshold))}/{len(returns)}" if threshold else "-"
        lines.append(
            f"| {r['precision']} | {r['total_steps']} | {', '.join(f'{x:.1f}' for x in returns)} | "
            f"{np.nanmean(returns):.1f} | {np.nanstd(returns):.1f} | {passed} | "
            f"{r['skipped_updates']} / {r['total_updates']} | {r['loss_scale']:g} | {r['steps_per_second']:.0f} | "
            f"{r['buffer_bytes']} |"
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="environment steps per seed (default: the task's; at least 15000 for cartpole, 40000 for MinAtar)",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", default=None, help="markdown file to write")
    args = parser.parse_args(argv)
    try:
        TASKS[args.task](args.steps, num_seeds=args.seeds)
    except ValueError as err:
        parser.error(str(err))
    results = [run(args.task, args.steps, args.seeds, p) for p in ("fp32", "fp16")]
    threshold = 475.0 if args.task == "cartpole" else None
    command = " ".join(["python", "experiments/dqn_learning.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        f"# DQN {args.task}: fp32 vs fp16 (dynamic loss scaling)",
        "",
        f"`{command}` on {device_name()} ({versions_line()}).",
        f"Load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: "
        "steps/s are speed measurements only on an otherwise idle machine.",
        f"final_return: {results[0]['final_return_is']}, per seed (training episodes, epsilon-greedy).",
        "",
        *table(args.task, results, threshold),
        "",
        "Curves (step, the mean return of the episodes that ended in the row, all seeds pooled):",
        "",
        "```json",
        json.dumps({r["precision"]: r["curve"] for r in results}),
        "```",
    ]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
