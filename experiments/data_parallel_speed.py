"""PPO and world-model steps/s on 1 and N devices with the same global batch; each run in
its own process, where XLA_FLAGS=--xla_force_host_platform_device_count=N gives a CPU N
host devices (on a GPU machine the real devices are used and the flag is left out).

    python experiments/data_parallel_speed.py --devices 4 --repeats 3 --out benchmarks/data_parallel_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from _report import description, emit

from genesis_jax.run.probes import versions_line

RUNS = {
    "ppo": ["train", "ppo", "--precision", "fp16", "--num-envs", "16", "--total-steps", "409600"],
    "world-model": [
        "train",
        "world-model",
        "--precision",
        "fp16",
        "--width",
        "512",
        "--depth",
        "3",
        "--batch-size",
        "4096",
        "--epochs",
        "4",
        "--num-sequences",
        "1024",
    ],
}


def run(workload: str, devices: int, force_cpu_devices: int | None) -> dict:
    env = dict(os.environ)
    if force_cpu_devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={force_cpu_devices}"
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "genesis_jax.cli",
            *RUNS[workload],
            "--devices",
            str(devices),
            "--out",
            f"{tmp}/run",
            "--no-progress",
        ]
        subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
        with open(f"{tmp}/run/summary.json") as f:
            return json.load(f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gpu", action="store_true", help="use the machine's real devices (no forced CPU devices)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    force = None if args.gpu else args.devices
    lines = [
        f"Data-parallel steps/s, median of {args.repeats} alternating runs (quality from the first); "
        f"versions: {versions_line()}; command: "
        f"python experiments/data_parallel_speed.py {' '.join(sys.argv[1:])}",
        "",
        "| workload | devices | device | steps/s | final return / eval loss | skipped |",
        "|---|---|---|---|---|---|",
    ]
    for workload in RUNS:
        results = {1: [], args.devices: []}
        for _ in range(args.repeats):
            for devices in results:
                results[devices].append(run(workload, devices, force))
        for devices, summaries in results.items():
            speed = statistics.median(s["steps_per_second"] for s in summaries)
            s = summaries[0]
            quality = s.get("final_return", s.get("eval_loss"))
            lines.append(
                f"| {workload} | {devices} | {s['device']} | {speed:.1f} | {quality:.4g} | "
                f"{s['skipped_updates']}/{s['total_updates']} |"
            )
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
