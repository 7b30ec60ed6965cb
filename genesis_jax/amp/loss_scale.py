"""Loss scaling with exactly PyTorch `torch.amp.GradScaler` semantics.

All three scalers share jmp's interface (`scale`, `unscale`, `adjust`) and are pytrees
whose every field, configuration included, is a leaf: they pass through `jit`,
`tree_map` and a checkpoint round trip unchanged.

>>> import jax.numpy as jnp
>>> from genesis_jax import DynamicLossScale
>>> s = DynamicLossScale(init_scale=4.0, growth_interval=2)
>>> s = s.adjust(jnp.array(False))   # overflow: back off
>>> float(s.loss_scale), int(s.growth_tracker)
(2.0, 0)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from genesis_jax.amp._checks import INT32_MAX, config_number, finite_above, number, refuse_unless
from genesis_jax.amp.restore import register_restore_check

LARGEST_NORMAL_RECIPROCAL = 2.0**126  # the largest scale whose reciprocal is a normal float32


def _scale_tree(tree, *factors):
    """Every leaf in float32 (or wider), times each factor in turn: a scaled float32 loss never
    rounds through half, and no factor is folded into another (see `unscale`)."""
    return jax.tree.map(
        lambda x: functools.reduce(jnp.multiply, factors, x.astype(jnp.promote_types(x.dtype, jnp.float32))), tree
    )


def checked_finite_flag(grads_finite):
    """The "all gradients finite" flag as a bool array, or a TypeError for anything else.

    Only booleans (Python, numpy or JAX, of any shape) are taken: a float such as PyTorch's
    `found_inf` (1.0 on overflow, the opposite sense), nan, or a string would otherwise
    convert to True and count as finite."""
    if not isinstance(grads_finite, (bool, np.bool_)) and getattr(grads_finite, "dtype", None) != jnp.bool_:
        shown = f"dtype {grads_finite.dtype}" if hasattr(grads_finite, "dtype") else type(grads_finite).__name__
        raise TypeError(
            f"adjust takes the step's 'all gradients finite' flag as a bool, got {shown} {grads_finite!r:.40}; "
            "from PyTorch's found_inf (1.0 on overflow) pass found_inf == 0"
        )
    return jnp.asarray(grads_finite)


class _LossScaleBase:
    """Shared pytree plumbing: every field listed in `_fields` is a leaf."""

    _fields: tuple[str, ...] = ()

    def tree_flatten(self):
        return tuple(getattr(self, f) for f in self._fields), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)  # skip validation: leaves may be tracers or shape structs
        obj.__dict__.update(zip(cls._fields, children))
        return obj

    def _replace(self, **changes):
        return self.tree_unflatten(None, [changes.get(f, getattr(self, f)) for f in self._fields])

    def _state_dict(self) -> dict:
        return {f: getattr(self, f) for f in self._fields}

    def _from_state_dict(self, state: dict):
        if set(state) != set(self._fields):  # another kind of scaler: it would be read as this one
            raise ValueError(
                f"a {type(self).__name__} cannot be restored from a saved scaler with fields "
                f"{', '.join(sorted(state))}: restore into a state created with the precision (and scaler) "
                "the checkpoint was saved with"
            )
        restored = self._replace(**{f: jnp.asarray(state[f], getattr(self, f).dtype) for f in self._fields})
        # A static scale and no scaling hold one field alike: one would be read as the other. A
        # template scaling by 0, which no scaler does, is a shape to restore into (`load`'s zeros).
        fixed = not isinstance(self, DynamicLossScale) and bool(jnp.any(self.loss_scale != 0))
        if fixed and not bool(jnp.all(restored.loss_scale == self.loss_scale)):
            raise ValueError(
                f"a {type(self).__name__} scaling by {_scale_text(self.loss_scale)} cannot be restored from a saved "
                f"scaler scaling by {_scale_text(restored.loss_scale)} (another fixed scale, or none): restore into a "
                "state created with the precision (and scaler) the checkpoint was saved with"
            )
        return restored

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)}' for f in self._fields)})"

    def unscale(self, tree):
        """Divides every leaf by the scale, in float32, as `x * (1 / scale)` like PyTorch.

        Above 2^126, 1 / scale is a denormal, which XLA's CPU backend flushes to 0 (a division
        by the scale too: XLA rewrites it so): every gradient would unscale to 0, count as
        finite, and training would stall unseen. There the factor is split, x * 2^-2 * (2^2 /
        scale): the same value, no denormal factor. (A scale XLA sees as a constant, one closed
        over rather than passed in, may be folded back into one factor.)"""
        split = self.loss_scale > LARGEST_NORMAL_RECIPROCAL
        first = jnp.where(split, jnp.float32(0.25), jnp.float32(1.0))
        second = jnp.where(split, jnp.float32(4.0), jnp.float32(1.0)) / self.loss_scale
        return _scale_tree(tree, first, second)

    def scale(self, tree):
        """Multiplies every leaf by the scale (in float32 for half-precision leaves)."""
        return _scale_tree(tree, self.loss_scale)

    def adjust(self, grads_finite):
        """The scaler after one step whose gradients were (not) all finite: a fixed one, itself."""
        checked_finite_flag(grads_finite)
        return self


@jax.tree_util.register_pytree_node_class
class NoOpLossScale(_LossScaleBase):
    """No scaling: the scale is 1 and `adjust` changes nothing (fp32, bf16).

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> s = amp.NoOpLossScale()
        >>> float(s.loss_scale), s.unscale(jnp.float16(3.0)).dtype   # unscale still gives float32
        (1.0, dtype('float32'))
    """

    _fields = ("loss_scale",)

    def __init__(self):
        self.loss_scale = jnp.asarray(1.0, jnp.float32)

    def scale(self, tree):
        return tree

    def unscale(self, tree):
        return _scale_tree(tree)  # float32, no multiply


@jax.tree_util.register_pytree_node_class
class StaticLossScale(_LossScaleBase):
    """A fixed scale; non-finite steps are still skipped by the update step.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> s = amp.StaticLossScale(128.0)
        >>> float(s.scale(jnp.float32(2.0))), float(s.adjust(jnp.array(False)).loss_scale)
        (256.0, 128.0)
    """

    _fields = ("loss_scale",)

    def __init__(self, loss_scale: float):
        _check_scale("loss_scale", loss_scale)
        self.loss_scale = jnp.asarray(loss_scale, jnp.float32)


SMALLEST_SCALE = float(np.finfo(np.float32).tiny)  # 2^-126, float32's smallest normal number


@jax.tree_util.register_pytree_node_class
class DynamicLossScale(_LossScaleBase):
    """PyTorch `GradScaler`'s dynamic scale, as a pytree.

    Rule (torch `_amp_update_scale_`): on a non-finite step the scale is multiplied by
    `backoff_factor` and the tracker reset; on a finite step the tracker is incremented
    and, when it reaches `growth_interval`, the scale is multiplied by `growth_factor`
    unless that overflows to inf, and the tracker reset. `min_scale` (optional, not in
    PyTorch) floors the scale after a backoff; it is stored as 0.0 when absent. `backoffs`
    counts the backoffs so far (one per `adjust(False)`, however many optimizers share it).

    Unlike PyTorch, a backoff never goes below `SMALLEST_SCALE`, float32's smallest normal
    number (2^-126): XLA's CPU backend flushes denormals to zero, and a scale of 0 would
    make every later step 0/0 and skip it forever. For every scale of at least 2^-126 the
    trajectory is GradScaler's, step for step.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> s = amp.DynamicLossScale(init_scale=8.0, growth_interval=2)
        >>> s = s.adjust(jnp.array(True)).adjust(jnp.array(True))   # 2 finite steps: grow x2
        >>> float(s.loss_scale)
        16.0
        >>> s = s.adjust(jnp.array(False))                           # an overflow: back off x0.5
        >>> float(s.loss_scale), int(s.growth_tracker)
        (8.0, 0)
    """

    _fields = ("loss_scale", "growth_tracker", "growth_factor", "backoff_factor", "growth_interval", "min_scale")
    _fields += ("backoffs",)

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000, min_scale=None):
        """PyTorch GradScaler's defaults. Refused: a scale that could leave [max(min_scale, 2^-126),
        float32's largest], or a scaler that could not back off or grow (each value checked as the
        float32 or int32 it is stored as; traced values, under `jit`, are left alone)."""
        check_loss_scale_args("dynamic", init_scale, growth_interval, min_scale, growth_factor, backoff_factor)
        self.loss_scale = jnp.asarray(init_scale, jnp.float32)
        self.growth_tracker = jnp.asarray(0, jnp.int32)
        self.growth_factor = jnp.asarray(growth_factor, jnp.float32)
        self.backoff_factor = jnp.asarray(backoff_factor, jnp.float32)
        self.growth_interval = jnp.asarray(growth_interval, jnp.int32)
        self.min_scale = jnp.asarray(0.0 if min_scale is None else min_scale, jnp.float32)
        self.backoffs = jnp.asarray(0, jnp.int32)

    def adjust(self, grads_finite) -> "DynamicLossScale":
        """The scaler after one step whose gradients were (not) all finite."""
        grads_finite = checked_finite_flag(grads_finite)
        backed_off = jnp.maximum(self.loss_scale * self.backoff_factor, jnp.maximum(self.min_scale, SMALLEST_SCALE))
        grows, grown = self.growth_tracker + 1 == self.growth_interval, self.loss_scale * self.growth_factor
        finite_scale = jnp.where(grows & jnp.isfinite(grown), grown, self.loss_scale)  # a grown inf is not taken
        finite_tracker = jnp.where(grows, 0, self.growth_tracker + 1)
        return self._replace(
            loss_scale=jnp.where(grads_finite, finite_scale, backed_off).astype(jnp.float32),
            growth_tracker=jnp.where(grads_finite, finite_tracker, 0).astype(jnp.int32),
            backoffs=(self.backoffs + (~grads_finite).astype(jnp.int32)).astype(jnp.int32),
        )


def _check_scale(name: str, value) -> float | None:
    """A loss scale: finite in float32 and a normal number, >= 2^-126 (XLA's CPU backend
    flushes denormals to 0, and a scale of 0 would make every later step 0/0)."""
    accepted = "finite and >= 2^-126 (float32's smallest normal), at most 3.403e+38 (float32's largest)"
    return number(name, value, accepted, finite_above(SMALLEST_SCALE, or_equal=True))


LossScale = NoOpLossScale | StaticLossScale | DynamicLossScale
"""Any of the three scalers (a type alias, for annotations)."""


def _scale_text(scale) -> str:
    return "/".join(f"{v:g}" for v in np.unique(np.asarray(scale)))  # one value per seed, each once


def _dynamic_rules(s, read) -> list:
    """What a run writes into a `DynamicLossScale` (a bound before what it bounds)."""
    interval, tracker, backoffs = (read(x) for x in (s.growth_interval, s.growth_tracker, s.backoffs))
    fields = (s.loss_scale, s.growth_factor, s.backoff_factor, s.min_scale)
    scale, growth, backoff, floor = (read(x).astype(np.float64) for x in fields)
    above_floor, above_smallest = scale >= np.maximum(floor, SMALLEST_SCALE), "finite, >= 2^-126 and >= min_scale"
    return [
        ("growth_interval", interval, interval >= 1, "an integer >= 1"),
        ("growth_factor", growth, np.isfinite(growth) & (growth > 1), "finite and > 1"),
        ("backoff_factor", backoff, (backoff > 0) & (backoff < 1), "in (0, 1)"),
        ("min_scale", floor, np.isfinite(floor) & (floor >= 0), "finite and >= 0 (0: no floor)"),
        ("loss_scale", scale, np.isfinite(scale) & above_floor, above_smallest),
        ("growth_tracker", tracker, (tracker >= 0) & (tracker < interval), "in [0, growth_interval)"),
        ("backoffs", backoffs, backoffs >= 0, ">= 0"),
    ]


def _fixed_rules(s, read) -> list:
    scale = read(s.loss_scale).astype(np.float64)
    if isinstance(s, NoOpLossScale):
        return [("loss_scale", scale, scale == 1, "1 (no loss scaling)")]
    return [("loss_scale", scale, np.isfinite(scale) & (scale >= SMALLEST_SCALE), "finite and >= 2^-126")]


# Flax serialization (`serialization.to_bytes`, `to_state_dict`) of a state holding a scaler,
# such as a `TrainState` or a subclass of it: each scaler is a dict of its fields. And what a
# restored one must hold.
for _cls in (DynamicLossScale, StaticLossScale, NoOpLossScale):
    serialization.register_serialization_state(_cls, _cls._state_dict, _cls._from_state_dict, override=True)
    register_restore_check(_cls, _dynamic_rules if _cls is DynamicLossScale else _fixed_rules)


def _under_rule_of(old, new):
    """`old`'s progress under `new`'s rule: a dynamic scale keeps its scale (at or above the new
    floor), growth tracker (below the new interval) and backoffs; a fixed one is the new one."""
    if not isinstance(new, DynamicLossScale):
        return new
    return new._replace(
        loss_scale=jnp.maximum(old.loss_scale, new.min_scale),
        growth_tracker=jnp.minimum(old.growth_tracker, new.growth_interval - 1),
        backoffs=old.backoffs,
    )


def with_rules_of(restored, template):
    """`restored` (a checkpoint restored into `template`: its scalers hold the saved run's
    settings, as every field of a scaler is a leaf) with each scaler under `template`'s rule:
    a run resumed with another growth interval, factor, floor or static scale runs with it."""
    is_scaler = lambda node: isinstance(node, _LossScaleBase)  # noqa: E731
    under = jax.jit(_under_rule_of)  # the arrays may span processes: not eagerly
    return jax.tree.map(
        lambda old, new: under(old, new) if is_scaler(old) else old, restored, template, is_leaf=is_scaler
    )


def any_fixed_scale(template):
    """`template` with each fixed scaler (static, or none) scaling by 0: a shape that takes any
    saved scale. For a restore whose caller checks the scaler's kind itself (a run's checkpoint
    meta) and may change a static scale on purpose (`with_rules_of`)."""
    fixed = lambda node: isinstance(node, (StaticLossScale, NoOpLossScale))  # noqa: E731
    unset = lambda node: node._replace(loss_scale=jnp.zeros_like(node.loss_scale)) if fixed(node) else node  # noqa: E731
    return jax.tree.map(unset, template, is_leaf=fixed)


def check_scaler(scaler) -> None:
    """Refuses anything but a loss scaler (these three or one with their interface, such as
    jmp's): a bare number would fail later with an AttributeError, far from the cause."""
    ok = all(hasattr(scaler, attr) for attr in ("loss_scale", "scale", "unscale", "adjust"))
    refuse_unless(ok, "scaler", scaler, "a loss scaler such as amp.DynamicLossScale() (not a number)")


def check_loss_scale_args(kind, init_scale=2.0**16, growth_interval=2000, min_scale=None, growth=2.0, backoff=0.5):
    """`Precision.scaler`'s checks without building a scaler: no arrays, so a config can
    call it before JAX has started (or joined other processes). Every argument is checked
    whatever the kind; only a dynamic scale must start above its floor.

    Raises:
        ValueError: naming the bad argument and what is accepted.
    """
    if not isinstance(kind, str) or kind not in ("dynamic", "static", "none"):
        raise ValueError(f"unknown loss scaling {kind!r}; accepted: dynamic, static, none")
    init = _check_scale("init_scale", init_scale)
    number("growth_factor", growth, "finite and > 1 (as a float32)", finite_above(1))
    number("backoff_factor", backoff, "in (0, 1) (as a float32)", lambda x: 0 < x < 1)
    interval_ok, accepted = lambda x: 1 <= x <= INT32_MAX, "an integer from 1 to 2^31-1"
    config_number("growth_interval", growth_interval, accepted, interval_ok, integer=True)
    floor_ok = lambda x: finite_above(0)(x) and (kind != "dynamic" or init is None or x <= init)
    if min_scale is not None:
        number("min_scale", min_scale, "finite, > 0 and <= init_scale (None: no floor)", floor_ok)
