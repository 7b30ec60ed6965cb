"""The argument checks every amp constructor shares: each refuses a value that would break its
promise in one sentence that names the argument, what it accepts and the value given.

>>> number("growth_factor", 2, "finite and > 1", lambda x: x > 1)
2.0
>>> number("growth_interval", 2.5, "an integer from 1 to 2^31-1", integer=True)
Traceback (most recent call last):
TypeError: growth_interval must be an integer from 1 to 2^31-1, got 2.5
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

INT32_MAX = 2**31 - 1  # JAX's default integer: step and skip counters, scan lengths


def refuse_unless(ok, name: str, value, accepted: str, error: type = TypeError) -> None:
    """`error("<name> must be <accepted>, got <value>")` unless `ok`."""
    if not ok:
        raise error(f"{name} must be {accepted}, got {value!r}")


def is_int(value) -> bool:
    """Whether `value` is an integer, Python's or numpy's (a bool is none)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def number(name, value, accepted, ok=lambda x: True, *, integer=False, type_error=TypeError):
    """`value` as the int, or the float32 (inf where it overflows, 0 where it underflows), it is
    used as, refused unless it is such a number (Python, numpy or a 0-d array; a bool is
    neither) and `ok(it)`; None where it is traced (unchecked)."""
    if isinstance(value, jax.core.Tracer):
        return None
    x = value.item() if isinstance(value, (np.ndarray, jax.Array)) and value.shape == () else value
    refuse_unless(is_int(x) or (isinstance(x, (float, np.floating)) and not integer), name, value, accepted, type_error)
    with np.errstate(over="ignore", under="ignore"):
        x = int(x) if integer else float(np.float32(x))
    refuse_unless(ok(x), name, value, accepted, ValueError)
    return x


# A setting's number (a config field's, a command-line flag's): refused with a ValueError whatever is wrong.
config_number = functools.partial(number, type_error=ValueError)


def finite_above(low: float, or_equal: bool = False):
    """A predicate: finite and > `low` (>= with `or_equal`)."""
    return lambda x: math.isfinite(x) and (x >= low if or_equal else x > low)


def flag(name, value, none: bool = False) -> None:
    """Refuses anything but True or False (and None where `none`)."""
    ok = isinstance(value, (bool, np.bool_)) or (none and value is None)
    refuse_unless(ok, name, value, "True, False or None" if none else "True or False")


def optional_callable(name, value) -> None:
    refuse_unless(value is None or callable(value), name, value, "callable or None")
