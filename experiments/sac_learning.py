"""SAC on gymnax Pendulum-v1 in fp32 and fp16: final return, per-optimizer skips and speed.

Each precision trains its seeds together under vmap (one compiled run, `num_seeds`); seed k
is the run `--seed k` would make alone. final_return is the mean return of the episodes that
ended in the last 10% of the environment steps (10 episodes per seed at 20k steps), per seed.

    python experiments/sac_learning.py --seeds 3 --total-steps 20000 --out benchmarks/sac-pendulum-cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _report import description, emit

from genesis_jax.algos.sac import SACConfig, train
from genesis_jax.run import probes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--total-steps", type=int, default=20_000, help="a multiple of 200, >= 1200")
    p.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    try:
        configs = [
            SACConfig(
                precision=precision, total_steps=args.total_steps, num_seeds=args.seeds, hidden=tuple(args.hidden)
            )
            for precision in args.precisions
        ]
    except ValueError as err:
        p.error(str(err))
    lines = [
        f"SAC gymnax Pendulum-v1, {args.total_steps} steps, seeds 0..{args.seeds - 1} under vmap, "
        f"hidden {tuple(args.hidden)}, other settings the defaults; device {probes.device_name()}; "
        f"command: python experiments/sac_learning.py {' '.join(sys.argv[1:])}",
        "",
        "final_return: mean return of the episodes that ended in the last 10% of each seed's steps.",
        "",
        "| precision | final_return per seed | mean | critic / actor / alpha skips | scale | steps/s | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for precision, config in zip(args.precisions, configs):
        s = train(config, progress=False).summary
        per_seed = s["final_return_per_seed"]
        skips = f"{s['critic_skipped']} / {s['actor_skipped']} / {s['alpha_skipped']}"
        lines.append(
            f"| {precision} | {', '.join(f'{r:.1f}' for r in per_seed)} | {statistics.mean(per_seed):.1f} | {skips} "
            f"| {s['loss_scale']:g} | {s['steps_per_second']:.0f} | {s['compile_seconds']:.1f} |"
        )
        print(lines[-1], file=sys.stderr)
    lines += ["", "steps/s counts every seed's environment steps; the machine's other load slows both precisions."]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
