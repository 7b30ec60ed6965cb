"""Restore checks, registered by the type they protect (as Flax's serialization registry is).

A restored checkpoint is untrusted input: its checksum can match values no run writes (a
scale of 0, a growth tracker past its interval, more skips than steps). Each amp type that
has such invariants registers a check here, next to its definition; a run layer walks a
restored tree with `restore_rules` and refuses the first value that breaks one, without
knowing any type's fields.

A check is `check(node, read) -> [(field, values, good, accepted)]`: `read(leaf)` gives a
leaf's values on the host, `good` says which values a run can have written, `accepted` says
which in words ("an integer >= 1"), and a bound comes before what it bounds.

>>> import numpy as np
>>> from genesis_jax import amp
>>> [(where, field) for where, (field, *_) in restore_rules({"s": amp.StaticLossScale(8.0)}, np.asarray)]
[('s.', 'loss_scale')]
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import jax
import numpy as np

Rule = tuple[str, np.ndarray, np.ndarray, str]
_CHECKS: dict[type, Callable[[Any, Callable], list[Rule]]] = {}


def register_restore_check(cls: type, check: Callable[[Any, Callable], list[Rule]]) -> None:
    """`check(node, read)` is run on every restored `cls` or subclass of it (a subclass may register its own)."""
    _CHECKS[cls] = check


def _check_of(node):
    return next((_CHECKS[cls] for cls in type(node).__mro__ if cls in _CHECKS), None)


def rules_of(node, read: Callable, prefix: str = "") -> list[Rule]:
    """The rules `node`'s type registered, their fields after `prefix`; none for other types."""
    check = _check_of(node)
    return [] if check is None else [(prefix + field, *rest) for field, *rest in check(node, read)]


def restore_rules(tree, read: Callable) -> Iterator[tuple[str, Rule]]:
    """(where, rule) for every node of `tree` whose type registered a check, in order; a
    registered node's check answers for what it holds (a train state for its scaler)."""
    is_checked = lambda node: _check_of(node) is not None  # noqa: E731
    for path, node in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_checked)[0]:
        where = "".join(f"{key_name(key)}." for key in path)
        yield from ((where, rule) for rule in rules_of(node, read))


def key_name(key) -> str:
    """A path key's name: an attribute's, a dict key, a sequence index."""
    return jax.tree_util.keystr((key,), simple=True, separator="")
