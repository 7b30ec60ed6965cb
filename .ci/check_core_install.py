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

# Every command of the core install ends in one line that names the rl extra, never a traceback.
import os  # noqa: E402
import subprocess  # noqa: E402

command = [os.path.join(os.path.dirname(sys.executable), "genesis-jax"), "train", "ppo", "--help"]
done = subprocess.run(command, capture_output=True, text=True)
expected = "pip install 'genesis-jax[rl]'"
if done.returncode != 2 or done.stdout or len(done.stderr.splitlines()) != 1 or expected not in done.stderr:
    sys.exit(f"`genesis-jax train ppo --help` in the core install: rc {done.returncode}, stderr:\n{done.stderr}")
print(f"core install: `genesis-jax train ppo --help` says, with rc 2: {done.stderr.strip()}")
