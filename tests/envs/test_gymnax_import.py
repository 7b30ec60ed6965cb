"""gymnax is imported without its renderers' modules (seaborn, matplotlib.pyplot): they load on
their first use, and then work as if imported normally."""

import json

from tests.support.processes import run_python

PROBE = """
import json, sys
from genesis_jax.envs import gymnax_env
import gymnax
before = [m for m in ("seaborn.relational", "scipy.stats", "matplotlib.figure") if m in sys.modules]
env, params = gymnax.make("Pong-misc")  # a gymnax module that imported both at its top
import seaborn, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
colours = len(seaborn.color_palette("cubehelix", 3))
figure = type(plt.figure()).__name__
after = [m for m in ("seaborn.relational", "matplotlib.figure") if m in sys.modules]
print(json.dumps({"before": before, "colours": colours, "figure": figure, "after": after}))
"""


def test_seaborn_and_pyplot_load_on_first_use_not_with_gymnax():
    proc = run_python(["-c", PROBE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen == {
        "before": [],
        "colours": 3,
        "figure": "Figure",
        "after": ["seaborn.relational", "matplotlib.figure"],
    }
