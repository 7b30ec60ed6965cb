"""Per-module precision rules: run chosen Flax modules in float32 (or any dtype) without
editing their source, by intercepting their calls (`flax.linen.intercept_methods`).

A rule matches a module by class (`nn.LayerNorm`) or by a name pattern (`"*head"`, matched
with `fnmatch` against the module's name and against its path, "critic/head"). A matched
module's floating inputs are cast to the rule's dtype and its `dtype` attribute (the compute
dtype every Flax layer reads) is set to it for the call, so its arithmetic runs in that
dtype; its outputs stay in it. The first matching rule wins.

Name patterns need names: Flax names unnamed layers by class (`Dense_0`, `Dense_1`, ...),
which no pattern of `FLOAT32_RULES` matches. When modules were called inside a
`precision_rules` block (or a method decorated with it) and none matched any rule, a
warning says so once per use, at trace time: name the heads (`name="actor_head"`) or match
by class (`PrecisionRule(nn.Dense)`).

Why these defaults (`FLOAT32_RULES`): normalisation statistics (a mean and variance over
many half-precision terms) and the logits, log-probs and values that the losses consume
lose precision first. DreamerV3, XLand-MiniGrid and MaxText keep norms and logits in
float32 for that reason; so do genesis-jax's own networks, through these rules.

>>> import jax, jax.numpy as jnp, flax.linen as nn
>>> from genesis_jax.amp.rules import FLOAT32_RULES, precision_rules
>>> class Net(nn.Module):
...     @nn.compact
...     def __call__(self, x):
...         x = nn.Dense(8, dtype=jnp.float16)(x)
...         x = nn.LayerNorm(dtype=jnp.float16)(x)
...         return nn.Dense(2, dtype=jnp.float16, name="value_head")(x)
>>> net, x = Net(), jnp.ones((1, 4))
>>> params = net.init(jax.random.PRNGKey(0), x)
>>> net.apply(params, x).dtype
dtype('float16')
>>> with precision_rules(FLOAT32_RULES):
...     net.apply(params, x).dtype
dtype('float32')
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import warnings
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from genesis_jax.amp._checks import refuse_unless


@dataclasses.dataclass(frozen=True)
class PrecisionRule:
    """Modules matching `match` (a Module class, a tuple of them, or a name pattern)
    compute in `dtype`.

    Examples:
        >>> import flax.linen as nn, jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> rule = amp.PrecisionRule(nn.Dense)   # by class; "*head" or "critic/*" match by name
        >>> rule.matches(nn.Dense(1)), rule.matches(nn.LayerNorm()), rule.dtype is jnp.float32
        (True, False, True)
    """

    match: type | tuple[type, ...] | str
    dtype: jnp.dtype = jnp.float32

    def __post_init__(self):  # a name pattern or Flax Module classes; an integer dtype would truncate the inputs
        classes = self.match if isinstance(self.match, tuple) else (self.match,)
        is_class = lambda c: isinstance(c, type) and issubclass(c, nn.Module)  # noqa: E731
        ok = (isinstance(self.match, str) and self.match) or (classes and all(map(is_class, classes)))
        accepted = "a name pattern such as '*head', a Flax Module class or a tuple of them"
        refuse_unless(ok, "a precision rule's match", self.match, accepted)
        try:
            floating = jnp.issubdtype(jnp.dtype(self.dtype), jnp.floating)
        except TypeError:
            floating = False
        refuse_unless(floating, "a precision rule's dtype", self.dtype, "a floating dtype such as jnp.float32")

    def matches(self, module: nn.Module) -> bool:
        if isinstance(self.match, str):
            path = "/".join(str(p) for p in getattr(module, "path", ()) or ())
            return any(fnmatch.fnmatchcase(name, self.match) for name in (module.name or "", path))
        return isinstance(module, self.match)


# Norms, and the heads whose outputs the losses read (logits, values), in float32.
FLOAT32_RULES: tuple[PrecisionRule, ...] = (
    PrecisionRule((nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.BatchNorm)),
    PrecisionRule("*head"),
    PrecisionRule("*logits"),
    PrecisionRule(nn.Embed),
)
"""The default rules: norms (LayerNorm, RMSNorm, GroupNorm, BatchNorm), embeddings and
modules named `*head` or `*logits` compute in float32."""


def _describe(rule: PrecisionRule) -> str:
    classes = rule.match if isinstance(rule.match, tuple) else (rule.match,)
    return repr(rule.match) if isinstance(rule.match, str) else "/".join(c.__name__ for c in classes)


@contextlib.contextmanager
def _rules_block(rules: Sequence[PrecisionRule], where: str = "", stacklevel: int = 3):
    """The rules applied within (each module call intercepted); a warning, once, where modules
    were called but none matched."""
    seen = {"called": False, "matched": False}

    def intercept(next_fun, args, kwargs, context):
        module = context.module
        rule = next((r for r in rules if r.matches(module)), None) if context.method_name == "__call__" else None
        seen["called"] |= context.method_name == "__call__"
        if rule is None:
            return next_fun(*args, **kwargs)
        seen["matched"] = True
        cast = lambda x: x.astype(rule.dtype) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) else x  # noqa: E731
        args, kwargs = jax.tree.map(cast, (args, kwargs))
        if not hasattr(module, "dtype"):
            return next_fun(*args, **kwargs)
        before = module.dtype  # Flax modules are frozen dataclasses: the dtype is set for this call only
        object.__setattr__(module, "dtype", rule.dtype)
        try:
            return next_fun(*args, **kwargs)
        finally:
            object.__setattr__(module, "dtype", before)

    with nn.intercept_methods(intercept):
        yield
    if seen["called"] and not seen["matched"]:
        warnings.warn(
            f"precision_rules{where}: Flax modules were called but none matched a rule "
            f"({', '.join(map(_describe, rules))}), so nothing ran in the rules' dtypes. "
            "Auto-named layers (Dense_0, Dense_1, ...) match no name pattern: name the heads "
            '(e.g. nn.Dense(n, name="actor_head")) or match by class (PrecisionRule(nn.Dense)).',
            stacklevel=stacklevel,
        )


class _PrecisionRules:
    """`precision_rules`' value: a context manager, and a decorator whose every call is one block."""

    def __init__(self, rules: tuple[PrecisionRule, ...]):
        self.rules, self._blocks = rules, []

    def __enter__(self):
        self._blocks.append(_rules_block(self.rules, stacklevel=4))
        return self._blocks[-1].__enter__()

    def __exit__(self, *exc):
        return self._blocks.pop().__exit__(*exc)

    def __call__(self, method):
        refuse_unless(callable(method), "what precision_rules() decorates", method, "a Module method")

        @functools.wraps(method)
        def wrapped(*args, **kwargs):
            with _rules_block(self.rules, f" on {method.__qualname__}"):
                return method(*args, **kwargs)

        return wrapped


def precision_rules(rules: Sequence[PrecisionRule] = FLOAT32_RULES):
    """Within the block, every Flax module call matching one of `rules` runs in its dtype.
    As a decorator of a Module method (`@amp.precision_rules()`), its body and every
    submodule it calls run under the rules, however the module is applied.

    Warns (once per block, at trace time) when modules were called in it but none matched.

    Examples:
        >>> import jax, jax.numpy as jnp, flax.linen as nn
        >>> from genesis_jax import amp
        >>> net, x = nn.Dense(2, dtype=jnp.float16), jnp.ones((1, 3))
        >>> params = net.init(jax.random.PRNGKey(0), x)
        >>> with amp.precision_rules([amp.PrecisionRule(nn.Dense)]):   # every Dense in float32
        ...     net.apply(params, x).dtype
        dtype('float32')
        >>> class Policy(nn.Module):
        ...     @amp.precision_rules()   # FLOAT32_RULES: "*head" computes in float32
        ...     @nn.compact
        ...     def __call__(self, x):
        ...         return nn.Dense(2, dtype=jnp.float16, name="actor_head")(nn.Dense(4, dtype=jnp.float16)(x))
        >>> Policy().apply(Policy().init(jax.random.PRNGKey(0), x), x).dtype
        dtype('float32')
    """
    ok = not isinstance(rules, (PrecisionRule, str)) and hasattr(rules, "__iter__")  # not one rule, nor a string
    refuse_unless(ok, "precision rules", rules, "a sequence of PrecisionRule objects")
    for rule in (rules := tuple(rules)):
        refuse_unless(isinstance(rule, PrecisionRule), "precision rules", rule, "PrecisionRule objects")
    return _PrecisionRules(rules)
