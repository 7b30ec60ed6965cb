"""The search for a task where loss scaling matters: the world model on the synthetic system
in small units (`--data synthetic-small`, and other unit scales) or seen through many
observation dimensions (`--data synthetic-wide`, other widths), fp32, fp16 with
dynamic loss scaling and fp16 without, at the same settings and seeds. Prints one JSON line per
precision: each seed's final log10 eval loss, the mean log10 eval loss at mid-run, the noise
floor (log10) and the skips.

    python experiments/scaling_search.py --scale 0.01 --lr 1e-3 --width 128 --epochs 20 --num-sequences 1024 --seeds 1

`--scale 0.01` (its default) is the data `--data synthetic-small` trains on; another scale
replaces it (`genesis_jax.algos.world_model.data.small_units_dataset(scale=...)`). `--obs-dim`
and `--scale` (default 1, the system's own units) do the same for `synthetic-wide`
(`wide_dataset(obs_dim=..., scale=...)`).

    python experiments/scaling_search.py --data synthetic-wide --scale 0.01 --obs-dim 256 --seeds 2 --telemetry

`--loss-weight W` trains on W x the loss instead of the loss (`WorldModelConfig.loss_weight`;
the eval loss is reported unweighted): a small loss *coefficient* (an auxiliary or value loss's
weight) with targets in units the model learns, instead of small units (`--scale 1`: the
system's own). The study's `wm:small-loss` task is `--data synthetic-wide --scale 1
--loss-weight 1e-3`.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from _report import description

from genesis_jax.algos.world_model import data as wm_data
from genesis_jax.algos.world_model import train
from genesis_jax.algos.world_model.config import WorldModelConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--data", choices=("synthetic-small", "synthetic-wide"), default="synthetic-small")
    parser.add_argument("--scale", type=float, help="the data's units (synthetic-small's 0.01, synthetic-wide's 1)")
    parser.add_argument("--obs-dim", type=int, default=wm_data.WIDE_OBS_DIM)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--num-sequences", type=int, default=1024)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--telemetry", action="store_true", help="the underflow telemetry (a second backward)")
    parser.add_argument("--loss-weight", type=float, default=1.0, help="train on this times the loss")
    args = parser.parse_args()
    if args.scale is None:  # each data's own default
        args.scale = wm_data.SMALL_UNITS if args.data == "synthetic-small" else 1.0
    if args.data == "synthetic-small":
        small = wm_data.small_units_dataset
        wm_data.small_units_dataset = lambda n, length, seed: small(n, length, seed, scale=args.scale)
    else:
        wide = wm_data.wide_dataset
        wm_data.wide_dataset = lambda n, length, seed: wide(n, length, seed, obs_dim=args.obs_dim, scale=args.scale)
    for precision, scaling in (("fp32", None), ("fp16", None), ("fp16", "none")):
        config = WorldModelConfig(
            data=args.data,
            batch_size=args.batch_size,
            precision=precision,
            loss_scaling=scaling,
            epochs=args.epochs,
            num_sequences=args.num_sequences,
            width=args.width,
            lr=args.lr,
            num_seeds=args.seeds,
            underflow_telemetry=args.telemetry,
            loss_weight=args.loss_weight,
        )
        result = train(config, progress=False)
        s = result.summary
        mid = result.metrics[args.epochs // 2 - 1]
        line = {
            **vars(args),
            "precision": precision + ("-unscaled" if scaling == "none" else ""),
            "final_log10_per_seed": np.round(np.log10(s["eval_loss_per_seed"]), 2).tolist(),
            "mid_log10": round(float(np.log10(mid["eval_loss"])), 2),
            "floor_log10": round(float(np.log10(s["noise_floor"])), 2),
            "skipped": s["skipped_updates"],
            **{k: s[k] for k in ("underflow_mean", "flushed_mean") if k in s},
            "wall_s": round(s["wall_seconds"], 1),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
