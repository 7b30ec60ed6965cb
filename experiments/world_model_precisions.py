"""Side by side: world-model steps/s, activation bytes, compiled temp bytes, peak device
memory and eval loss for several precisions, in one process.

    python experiments/world_model_precisions.py --width 1024 --depth 4 --batch-size 8192 \
        --epochs 3 --num-sequences 640 --out benchmarks/world_model_cpu.md
"""

from __future__ import annotations

import argparse
import platform
import sys

import jax
from _report import description, emit

from genesis_jax.algos.world_model import WorldModelConfig, train
from genesis_jax.run.checkpoint import package_versions

COLUMNS = (
    "precision",
    "steps_per_second",
    "activation_bytes",
    "compiled_temp_bytes",
    "peak_device_bytes",
    "eval_loss",
    "skipped_updates",
    "loss_scale",
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--precisions", default="fp32,bf16,fp16")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--num-sequences", type=int, default=640)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="markdown file for the table")
    args = p.parse_args(argv)
    rows = []
    for precision in args.precisions.split(","):
        config = WorldModelConfig(
            precision=precision,
            width=args.width,
            depth=args.depth,
            batch_size=args.batch_size,
            epochs=args.epochs,
            num_sequences=args.num_sequences,
            seed=args.seed,
        )
        rows.append(train(config, progress=False).summary)
        print(rows[-1], file=sys.stderr, flush=True)
    base = rows[0]
    lines = [
        f"world model width {args.width}, depth {args.depth}, batch {args.batch_size}, {args.epochs} epochs, "
        f"device {base['device']}",
        f"command: python {' '.join(sys.argv)}",
        f"machine: {platform.machine()} {platform.processor() or ''}, {jax.local_device_count()} device(s); "
        f"versions: {package_versions()}",
        "",
        "| " + " | ".join(COLUMNS) + f" | speed vs {base['precision']} | activations vs {base['precision']} |",
        "|" + "---|" * (len(COLUMNS) + 2),
    ]
    for r in rows:
        cells = [r[c] if not isinstance(r[c], float) else f"{r[c]:.4g}" for c in COLUMNS]
        lines.append(
            "| "
            + " | ".join(str(c) for c in cells)
            + f" | {r['steps_per_second'] / base['steps_per_second']:.2f}x"
            + f" | {r['activation_bytes'] / base['activation_bytes']:.2f}x |"
        )
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
