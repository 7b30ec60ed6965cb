"""0.2's spellings: each works until 0.4, with one DeprecationWarning naming its 0.3 spelling.

0.4 deletes this module whole, and with it the lines that call it (`grep -n _deprecated`):
`amp.__getattr__`, and in state.py `TrainState.create(loss_scale=)`,
`apply_gradients(loss_scale=)`, `TrainState.loss_scale`, the `train_step(state, batch,
loss_fn)` form and `amp.stats`' old keys. No other module of genesis_jax uses a name from
here (tests/amp/test_own_surface.py).
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Iterator
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax.amp.grads import _float32_loss, scaled_value_and_grad
from genesis_jax.amp.loss_scale import (
    DynamicLossScale,
    LossScale,
    NoOpLossScale,
    StaticLossScale,
    check_loss_scale_args,
    check_scaler,
    is_bool_flag,
)
from genesis_jax.amp.optim import DECISION, _advance_schedules, _scalar, _stays_finite, find_skip_state, global_norm
from genesis_jax.amp.optim import step_or_skip as _step_or_skip
from genesis_jax.amp.policy import as_policy, get_precision
from genesis_jax.amp.rules import FLOAT32_RULES, PrecisionRule, precision_rules


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    """One DeprecationWarning naming the 0.3 spelling (the old one goes in 0.4)."""
    warnings.warn(
        f"{old} is deprecated since genesis-jax 0.3 and goes in 0.4: use {new}", DeprecationWarning, stacklevel
    )


# name: (module, attribute, the 0.3 spelling). Most live here; three are only read from
# amp under an old name, their objects current where the 0.3 spelling names them.
NAMES = {
    "value_and_grad": ("_deprecated", "value_and_grad", "amp.scaled_value_and_grad (its result carries .grad_norm)"),
    "ScaledGradients": ("_deprecated", "ScaledGradients", "amp.scaled_value_and_grad's result, ScaledGrads"),
    "scaled_loss_grad": ("_deprecated", "scaled_loss_grad", "amp.scaled_value_and_grad"),
    "unscale": ("_deprecated", "unscale", "scaler.unscale(grads), or amp.scaled_value_and_grad"),
    "float32_loss": ("_deprecated", "float32_loss", "loss.astype(jnp.float32) (scaled_value_and_grad casts it)"),
    "resolve_policy": ("_deprecated", "resolve_policy", "amp.get_precision(name).policy"),
    "get_policy": ("_deprecated", "get_policy", "amp.get_precision(name).policy"),
    "resolve_precision_name": (
        "policy",
        "resolve_precision_name",
        "genesis_jax.amp.policy.resolve_precision_name (the CLI's environment variables)",
    ),
    "DEFAULT_INIT_SCALE": ("_deprecated", "DEFAULT_INIT_SCALE", "amp.DynamicLossScale().loss_scale (2^16)"),
    "DEFAULT_GROWTH_INTERVAL": (
        "_deprecated",
        "DEFAULT_GROWTH_INTERVAL",
        "amp.DynamicLossScale().growth_interval",
    ),
    "all_finite": ("_deprecated", "all_finite", "amp.scaled_value_and_grad's grads_finite"),
    "make_loss_scale": ("_deprecated", "make_loss_scale", "amp.DynamicLossScale / StaticLossScale / NoOpLossScale"),
    "SkipNonFiniteState": ("optim", "SkipNonFiniteState", "amp.stats(opt_state)"),
    "skip_state": ("_deprecated", "skip_state", "amp.stats(opt_state)"),
    "advance_schedules": ("_deprecated", "advance_schedules", "skip_nonfinite(advance_schedule_on_skip=True)"),
    "step_if_finite": ("_deprecated", "step_if_finite", "amp.skip_nonfinite"),
    "shared_scale_step": (
        "_deprecated",
        "shared_scale_step",
        "TrainState.create(shared_scaler=True) and amp.train_step",
    ),
    "update_shared_scale": ("_deprecated", "update_shared_scale", "amp.update_scaler(*states)"),
    "share_scale": ("_deprecated", "share_scale", "amp.update_scaler(*states)"),
    "with_precision_rules": ("_deprecated", "with_precision_rules", "@amp.precision_rules() on the method"),
    "FaultInjection": ("testing", "FaultInjection", "amp.testing.FaultInjection"),
    "DEFAULT_GUARD_MIN_SCALE": ("_deprecated", "DEFAULT_GUARD_MIN_SCALE", "amp.DivergenceGuard().min_scale"),
    "DEFAULT_MAX_CONSECUTIVE_SKIPS": (
        "_deprecated",
        "DEFAULT_MAX_CONSECUTIVE_SKIPS",
        "amp.DivergenceGuard().max_consecutive_skips",
    ),
}


def attribute(name: str):
    """`amp.<name>` for a 0.2 name, with its warning; an AttributeError for any other."""
    if name not in NAMES:
        raise AttributeError(f"module 'genesis_jax.amp' has no attribute {name!r}")
    module, attribute_name, new = NAMES[name]
    warn(f"amp.{name}", new, stacklevel=4)
    return getattr(importlib.import_module(f"genesis_jax.amp.{module}"), attribute_name)


# -- hooks in state.py ------------------------------------------------------------------------


def loss_scale_argument(where: str, loss_scale, scaler):
    """`where(loss_scale=...)`, 0.2's spelling of `scaler=`."""
    if loss_scale is None:
        return scaler
    warn(f"{where}(loss_scale=...)", f"{where}(scaler=...)", stacklevel=4)
    return loss_scale if scaler is None else scaler


@property
def loss_scale_property(self):
    """Deprecated spelling of `scaler`."""
    warn("TrainState.loss_scale", "TrainState.scaler")
    return self.scaler


def train_step_arguments(loss_fn, args, has_aux):
    """0.2's `train_step(state, batch, loss_fn)`: the batch came second and loss_fn returned
    `(loss, aux)`. Returns the 0.3 spelling's (loss_fn, args, has_aux)."""
    if not callable(loss_fn) and len(args) == 1 and callable(args[0]):
        warn("train_step(state, batch, loss_fn)", "train_step(state, loss_fn, batch, has_aux=True)", stacklevel=4)
        return args[0], (loss_fn,), True
    return loss_fn, args, has_aux


class Stats(dict):
    """`stats`' dict; 0.2's keys still read, with a DeprecationWarning naming the new one."""

    RENAMED = {
        "training_steps": "steps",
        "overflow_steps": "skipped",
        "overflow_rate": "skip_rate",
        "current_scale": "scale",
    }

    def __missing__(self, key):
        if key in self.RENAMED and self.RENAMED[key] in self:
            warn(f"amp.stats(...)[{key!r}]", f"amp.stats(...)[{self.RENAMED[key]!r}]")
            return self[self.RENAMED[key]]
        raise KeyError(key)


# -- 0.2's names --------------------------------------------------------------------------------

DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_INTERVAL = 2000
DEFAULT_GUARD_MIN_SCALE = 2.0**-14
DEFAULT_MAX_CONSECUTIVE_SKIPS = 100
resolve_policy = as_policy
all_finite = _stays_finite
skip_state = find_skip_state
advance_schedules = _advance_schedules
float32_loss = _float32_loss


def get_policy(name: str):
    """The `jmp.Policy` for a precision name or jmp policy string."""
    return get_precision(name).policy


def make_loss_scale(kind: str, init_scale=DEFAULT_INIT_SCALE, growth_interval=DEFAULT_GROWTH_INTERVAL, min_scale=None):
    """A scaler by kind: 'dynamic', 'static' (fixed at init_scale) or 'none'."""
    check_loss_scale_args(kind, init_scale, growth_interval, min_scale)
    if kind == "dynamic":
        return DynamicLossScale(init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale)
    return StaticLossScale(init_scale) if kind == "static" else NoOpLossScale()


class ScaledGradients(NamedTuple):
    """The old `value_and_grad`'s result; `ScaledGrads` replaces it."""

    value: Any
    grads: Any
    grads_finite: jax.Array
    loss_scale: LossScale


def value_and_grad(loss_fn: Callable, *, has_aux: bool = False, **options) -> Callable:
    """`scaled_value_and_grad`, whose result also carries the global norm, replaces it and its `.with_norm`."""
    new = scaled_value_and_grad(loss_fn, has_aux=has_aux, **options)

    def with_norm(loss_scale, params, *args):
        out = new(loss_scale, params, *args)
        return ScaledGradients(out.value, out.grads, out.grads_finite, out.scaler), out.grad_norm

    def fn(loss_scale, params, *args):
        return with_norm(loss_scale, params, *args)[0]

    fn.with_norm = with_norm
    return fn


def scaled_loss_grad(loss_fn: Callable, *, has_aux: bool = False, policy=None) -> Callable:
    """`fn(loss_scale, params, *args) -> (scaled gradients, (float32 loss, aux))`."""
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"has_aux must be True or False, got {has_aux!r}")
    policy = as_policy(policy)

    def scaled(params, loss_scale, args):
        if policy is not None:
            params, args = policy.cast_to_compute((params, args))
        out = loss_fn(params, *args)
        loss, aux = out if has_aux else (out, None)
        loss = _float32_loss(loss)
        return loss_scale.scale(loss), (loss, aux)

    def fn(loss_scale, params, *args):
        check_scaler(loss_scale, "loss_scale")
        return jax.grad(scaled, has_aux=True)(params, loss_scale, args)

    return fn


def unscale(scaled_grads, loss_scale: LossScale):
    """(float32 unscaled gradients, their global norm, all finite) in one pass."""
    check_scaler(loss_scale, "loss_scale")
    grads = loss_scale.unscale(scaled_grads)
    norm, finite = global_norm(grads)
    return grads, norm, finite


def step_if_finite(inner: optax.GradientTransformation, grads, inner_state, params, finite, **extra_args):
    """(updates, new inner state): the inner optimizer's step where `finite`, else updates of -0.0."""
    if not isinstance(inner, optax.GradientTransformation):
        raise TypeError(f"the optimizer must be an optax GradientTransformation, got {inner!r}")
    if finite is None:
        raise TypeError("finite must be a scalar bool (such as value_and_grad's grads_finite), got None")
    take = _scalar("finite", finite, (jnp.bool_,), DECISION, bool)
    return _step_or_skip(inner, grads, inner_state, params, take, **extra_args)[:2]


def with_precision_rules(method=None, *, rules: Sequence[PrecisionRule] = FLOAT32_RULES):
    """`@amp.precision_rules()` (or `@amp.precision_rules(rules)`) replaces it."""
    decorate = precision_rules(rules)
    if method is None:
        return functools.partial(with_precision_rules, rules=rules)
    if not callable(method):
        raise TypeError(f"with_precision_rules decorates a Module method, got {method!r}")
    return decorate(method)


# -- 0.2's three functions for several optimizers: TrainState.create(shared_scaler=True) and
# one amp.update_scaler(*states) per iteration replace them.


def _train_states():
    """amp's surface (TrainState, train_step), read at call time: state.py imports this module."""
    from genesis_jax import amp

    return amp


def shared_scale_step(state, batch, loss_fn, loss_scale, *, axis_name=None, faults=None, grad_transform=None):
    """One optimizer's step under the iteration's shared scaler, which it leaves alone."""
    warn("amp.shared_scale_step", "TrainState.create(..., shared_scaler=True) and amp.train_step")
    states = _train_states()
    if not isinstance(state, states.TrainState):
        raise TypeError(f"state must be an amp.TrainState, got {type(state).__name__}")
    check_scaler(loss_scale, "loss_scale")
    stepped, metrics = states.train_step(
        state.replace(scaler=loss_scale),
        loss_fn,
        batch,
        has_aux=True,
        axis_name=axis_name,
        faults=faults,
        grad_transform=grad_transform,
    )
    return stepped.replace(scaler=state.scaler), {**metrics, "loss_scale": loss_scale.loss_scale}


def update_shared_scale(loss_scale: LossScale, grads_finite: Sequence[jax.Array]) -> LossScale:
    """`loss_scale.adjust(all(grads_finite))`: torch's one `scaler.update()` per iteration."""
    warn("amp.update_shared_scale", "amp.update_scaler(*states)")
    check_scaler(loss_scale, "loss_scale")
    if isinstance(grads_finite, Iterator):  # a generator is no pytree: take its flags once
        grads_finite = list(grads_finite)
    flags = jax.tree.leaves(grads_finite)
    if not flags:
        raise ValueError(f"grads_finite must hold each optimizer's finite decision, got none: {grads_finite!r}")
    for flag in flags:
        if not is_bool_flag(flag) or np.shape(flag) != ():
            raise ValueError(
                "grads_finite must hold scalar bools (each shared_scale_step's metrics['grads_finite']), "
                f"got {type(flag).__name__} of shape {np.shape(flag)} and dtype {getattr(flag, 'dtype', None)}"
            )
    return loss_scale.adjust(jnp.all(jnp.stack([jnp.asarray(flag) for flag in flags])))


def share_scale(states, loss_scale: LossScale):
    """`states` with every `TrainState` in it carrying `loss_scale`."""
    warn("amp.share_scale", "amp.update_scaler(*states)")
    check_scaler(loss_scale, "loss_scale")
    is_state = functools.partial(lambda cls, node: isinstance(node, cls), _train_states().TrainState)
    if not any(is_state(node) for node in jax.tree.leaves(states, is_leaf=is_state)):
        raise ValueError(f"states must hold at least one amp.TrainState, got {type(states).__name__}")
    return jax.tree.map(lambda n: n.replace(scaler=loss_scale) if is_state(n) else n, states, is_leaf=is_state)
