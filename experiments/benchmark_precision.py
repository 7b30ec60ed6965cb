"""The precision benchmark (fp32, bf16, fp16, fp16-full on PPO and the world model): this script
forwards its arguments to `genesis-jax bench` (`genesis_jax/cli/bench.py`), whose options and
help are its own.

    python experiments/benchmark_precision.py --quick --out benchmarks/precision-quick-cpu
    python experiments/benchmark_precision.py --out benchmarks/precision-gpu      # on a GPU
"""

import sys

from _report import description

from genesis_jax.cli import main

if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(description(__doc__).replace("\n", " ") + "\n")
    sys.exit(main(["bench", *sys.argv[1:]]))
