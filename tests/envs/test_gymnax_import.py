"""gymnax is imported without its renderers' modules (seaborn, matplotlib.pyplot): they load on
their first use, and then work as if imported normally."""

import json

from tests.support.processes import run_python

PROBE = """
import json, sys
from genesis_jax.envs import gymnax_env
gymnax = gymnax_env.import_gymnax()  # as the package imports it, when an environment is first made
before = [m for m in ("seaborn.relational", "scipy.stats", "matplotlib.figure") if m in sys.modules]
env, params = gymnax.make("Pong-misc")  # a gymnax module that imported both at its top
import importlib.util, seaborn, matplotlib
found = importlib.util.find_spec("seaborn").name  # "is it installed?" checks still answer
matplotlib.use("Agg")
import matplotlib.pyplot
figure = type(matplotlib.pyplot.figure()).__name__
colours = len(seaborn.color_palette("cubehelix", 3))
after = [m for m in ("seaborn.relational", "matplotlib.figure") if m in sys.modules]
same = sys.modules["seaborn"] is seaborn and sys.modules["matplotlib.pyplot"] is matplotlib.pyplot
print(json.dumps(dict(before=before, found=found, colours=colours, figure=figure, after=after, same=same)))
"""


def test_seaborn_and_pyplot_load_on_first_use_not_with_gymnax():
    proc = run_python(["-c", PROBE])
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen == {
        "before": [],
        "found": "seaborn",
        "colours": 3,
        "figure": "Figure",
        "after": ["seaborn.relational", "matplotlib.figure"],
        "same": True,  # the module objects gymnax holds are the real ones, run in place
    }
