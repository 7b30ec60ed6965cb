"""`python -m genesis_jax.cli ...`: the `genesis-jax` command, as the tests and `launch` start it."""

import sys

from genesis_jax.cli import main

sys.exit(main())
