"""SAC speed on a GPU, fp16 against fp32, with SimBa's residual torso 1024 wide (actor and
twin critics): the learner's matmuls dominate there, which is where half precision pays.
The target is fp16 >= 1.5x fp32's steps/s. Pendulum-v1 (gymnax: the environment costs next
to nothing), one environment, the run's steps/s with compilation excluded, precisions run
alternately so that drift in the machine's speed hits both alike.

    python experiments/sac_gpu_speed.py --repeats 3 --out benchmarks/sac-gpu-speed-h100.md
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from _report import description, emit

from genesis_jax.algos.sac import SACConfig, train
from genesis_jax.run import probes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--total-steps", type=int, default=20_000, help="default 20000; a multiple of 200, >= 1200")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    try:
        base = SACConfig(
            total_steps=args.total_steps,
            network="resmlp",
            width=args.width,
            depth=args.depth,
            batch_size=args.batch_size,
        )
    except ValueError as err:
        p.error(str(err))
    speeds: dict[str, list[float]] = {"fp32": [], "fp16": []}
    final = {}
    for i in range(args.repeats):
        for precision in speeds:
            config = dataclasses.replace(base, precision=precision, seed=i)
            final[precision] = train(config, progress=False).summary
            speeds[precision].append(final[precision]["steps_per_second"])
            print(f"repeat {i} {precision}: {speeds[precision][-1]:.0f} steps/s", file=sys.stderr)
    ratios = [h / f for h, f in zip(speeds["fp16"], speeds["fp32"])]
    lines = [
        f"SAC Pendulum-v1, resmlp width {args.width} depth {args.depth}, batch {args.batch_size}, "
        f"{args.total_steps} steps, {args.repeats} alternating repeats, device {probes.device_name()}; "
        f"command: python experiments/sac_gpu_speed.py {' '.join(sys.argv[1:])}",
        "",
        "| precision | median steps/s | min | max | train-step bytes | final return (last repeat) |",
        "|---|---|---|---|---|---|",
    ]
    for precision, v in speeds.items():
        s = final[precision]
        lines.append(
            f"| {precision} | {statistics.median(v):.0f} | {min(v):.0f} | {max(v):.0f} | {s['train_step_bytes']} "
            f"| {s['final_return']:.1f} |"
        )
    median = statistics.median(ratios)
    lines += [
        "",
        f"fp16 / fp32 steps/s, per repeat: {', '.join(f'{r:.2f}' for r in ratios)}; median {median:.2f} "
        f"(target >= 1.5: {'met' if median >= 1.5 else 'not met'})",
    ]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
