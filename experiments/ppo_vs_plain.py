"""Our PPO (fp32, CLI defaults: chunks, per-update metrics, mismatch, loss-scaling machinery,
truncation bootstrapping) against a plain whole-loop-jitted PureJaxRL-style PPO on gymnax
CartPole-v1, 500k steps, run alternately in one process so that drift in machine speed hits
both alike. Ours is `train()` as users call it (its steps/s, compilation excluded); the
plain one is compiled once and timed around the whole call.

    python experiments/ppo_vs_plain.py --repeats 10 --out benchmarks/ppo_vs_plain_cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
from _report import description, emit
from plain_ppo_baseline import compiled_plain

from genesis_jax.algos.ppo import PPOConfig, train
from genesis_jax.run import probes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    plain_fn, steps = compiled_plain()
    speeds = {"plain": [], "ours": []}
    for i in range(args.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(plain_fn(jax.random.PRNGKey(i)))
        speeds["plain"].append(steps / (time.perf_counter() - t0))
        summary = train(PPOConfig(precision="fp32", total_steps=500_000, seed=i), progress=False).summary
        speeds["ours"].append(summary["steps_per_second"])
        print(f"repeat {i}: plain {speeds['plain'][-1]:.0f}, ours {speeds['ours'][-1]:.0f} steps/s", file=sys.stderr)
    lines = [
        f"PPO CartPole-v1 fp32, 500k steps, {args.repeats} alternating repeats, device {probes.device_name()}; "
        f"command: python experiments/ppo_vs_plain.py {' '.join(sys.argv[1:])}",
        "",
        "| | median steps/s | min | max |",
        "|---|---|---|---|",
    ]
    for name, label in (("plain", "plain whole-loop jit"), ("ours", "genesis-jax train()")):
        v = speeds[name]
        lines.append(f"| {label} | {statistics.median(v):.0f} | {min(v):.0f} | {max(v):.0f} |")
    ratios = [o / q for o, q in zip(speeds["ours"], speeds["plain"])]
    lines += [
        "",
        f"ours/plain per repeat: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}x",
    ]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
