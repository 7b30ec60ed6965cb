"""PPO steps/s (compilation excluded) for several configurations, run in turn and repeated,
medians reported: e.g. the cost of the loss-scaling machinery (fp32 with a dynamic scaler
forced on vs off).

    python experiments/ppo_speed.py --repeats 3 --total-steps 500000 \
        --variant fp32:none --variant fp32:dynamic --variant fp16:dynamic
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _report import description, emit

from genesis_jax.algos.ppo import PPOConfig, train


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--env-backend", default=None)
    p.add_argument("--total-steps", type=int, default=500_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", action="append", default=None, help="PRECISION:LOSS_SCALING, repeatable")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    variants = args.variant or ["fp32:none", "fp32:dynamic"]
    results = {v: [] for v in variants}
    finals = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:  # interleaved, so drift in machine speed hits every variant alike
            precision, scaling = v.split(":")
            s = train(
                PPOConfig(
                    env=args.env,
                    env_backend=args.env_backend,
                    precision=precision,
                    loss_scaling=scaling,
                    total_steps=args.total_steps,
                ),
                progress=False,
            ).summary
            results[v].append(s["steps_per_second"])
            finals[v].append(s["final_return"])
            print(v, round(s["steps_per_second"]), round(s["final_return"], 1), file=sys.stderr, flush=True)
    base = statistics.median(results[variants[0]])
    lines = [
        f"{args.env}, {args.total_steps} steps, {args.repeats} interleaved repeats; "
        f"command: python {' '.join(sys.argv)}",
        "",
        "| precision:loss scaling | median steps/s | min | max | vs first | final returns |",
        "|---|---|---|---|---|---|",
    ]
    for v in variants:
        med = statistics.median(results[v])
        lines.append(
            f"| {v} | {med:.0f} | {min(results[v]):.0f} | {max(results[v]):.0f} | {med / base:.3f}x | "
            f"{', '.join(f'{r:.1f}' for r in finals[v])} |"
        )
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
