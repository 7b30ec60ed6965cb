"""`python -m genesis_jax.cli ...`: the `genesis-jax` command, as the tests and `launch` start it."""

import sys

from genesis_jax.cli import main

if __name__ == "__main__":  # importing it (pkgutil.walk_packages does) runs nothing
    sys.exit(main())
