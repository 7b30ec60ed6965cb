"""The precision benchmark (fp32, bf16, fp16, fp16-full on PPO and the world model); the
same as `genesis-jax bench`, see `genesis_jax/cli/bench.py`.

    python experiments/benchmark_precision.py --quick --out benchmarks/precision-quick-cpu
    python experiments/benchmark_precision.py --out benchmarks/precision-gpu      # on a GPU
"""

import sys

from genesis_jax.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
