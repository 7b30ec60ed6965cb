"""The rollout x learner precision grid (fp32, bf16, fp16) on CartPole-v1 and Pendulum-v1:
mismatch KL v1 / v2, max |delta p| and final return, as a table and heat maps.

    python experiments/mismatch.py --out benchmarks/mismatch-cpu
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from _report import description

from genesis_jax.cli.mismatch import grid_configs, mismatch_grid, plot_heatmaps, table
from genesis_jax.run import probes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1")
    p.add_argument("--total-steps", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out, envs = pathlib.Path(args.out), list(dict.fromkeys(args.envs.split(",")))  # an env named twice runs once
    try:  # every env's grid is checked before the first cell trains, not after the envs before it
        for env in envs:
            grid_configs(env, args.total_steps, seed=args.seed)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file; it takes a directory for mismatch.md, .json and .png")
        out.mkdir(parents=True, exist_ok=True)
    except (ValueError, OSError, ImportError) as err:  # ImportError: an Atari env without ale-py, say
        p.error(str(err))
    cells = []
    header = [
        f"Mismatch grid, {args.total_steps} steps per cell, seed {args.seed}, device {probes.device_name()}; "
        f"command: python experiments/mismatch.py {' '.join(sys.argv[1:])}",
        "",
    ]
    for env in envs:  # the tables after each env's grid: a later env's failure keeps the grids done
        cells += mismatch_grid(env, args.total_steps, seed=args.seed)
        (out / "mismatch.md").write_text("\n".join(header + table(cells)) + "\n")
        (out / "mismatch.json").write_text(json.dumps(cells, indent=1))
    plot_heatmaps(cells, out / "mismatch.png")
    print("\n".join(table(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
