"""The core install (`pip install genesis-jax`) pulls none of the RL stack, and amp imports without it."""

import importlib.util
import sys

# Not orbax: flax itself requires orbax-checkpoint, so any flax install has it.
HEAVY = ("gymnasium", "gymnax", "tyro", "flashbax", "matplotlib", "torch", "tqdm", "rliable")

pulled = [name for name in HEAVY if importlib.util.find_spec(name) is not None]
if pulled:
    sys.exit(f"the core install pulled {', '.join(pulled)}: move them to an extra")

from genesis_jax import amp  # noqa: E402

print(f"core install: amp imports with {len(amp.__all__)} public names and none of {', '.join(HEAVY)}")
