"""The optimizer side of mixed precision: skip non-finite steps, count them, clip, stop.

`skip_nonfinite(optimizer)` wraps any optax optimizer. Its state, `SkipNonFiniteState`, is
the one owner of the skip accounting: steps skipped, the current streak of skips, and the
divergence guard's halted flag. `find_skip_state(opt_state)` finds it anywhere in a state tree.
Its concerns compose as optax's do: the decision (`global_norm`), clipping (`clip_by_norm`),
one body that applies or skips a step (`step_or_skip`, strict checks included), then the
counts, the guard and the schedules (`_counted`).

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> tx = amp.skip_nonfinite(optax.sgd(0.1), max_grad_norm=1.0)
>>> params = {"w": jnp.ones(2)}
>>> state = tx.init(params)
>>> updates, state = tx.update({"w": jnp.array([jnp.inf, 0.0])}, state, params)
>>> updates["w"], int(state.skipped)   # a skipped step changes nothing
(Array([-0., -0.], dtype=float32), 1)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax.amp._checks import finite_above, flag, number, refuse_unless
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.restore import register_restore_check


class SkipNonFiniteState(NamedTuple):
    """`inner_state`: the wrapped optimizer's state, unchanged by a skipped step.
    `skipped`: steps skipped so far. `consecutive_skips`: skips since the last step taken.
    `halted`: the divergence guard stopped training; every later update is skipped uncounted.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> state = amp.skip_nonfinite(optax.sgd(0.1)).init({"w": jnp.ones(2)})
        >>> int(state.skipped), int(state.consecutive_skips), bool(state.halted)
        (0, 0, False)
    """

    inner_state: Any
    skipped: jax.Array
    consecutive_skips: jax.Array
    halted: jax.Array

    def __getattr__(self, name):  # only for a name no field has: the wrapped optimizer's, say
        hint = "" if name.startswith("__") else f": the wrapped optimizer's state is .inner_state (.inner_state.{name})"
        raise AttributeError(f"'SkipNonFiniteState' object has no attribute {name!r}{hint}")


def skip_rules(state: SkipNonFiniteState, read, steps=None) -> list:
    """What a run writes into the skip counts: no more skips than updates attempted (`steps`,
    where known), no longer a streak. Registered as the skip state's restore check."""
    skipped, streak = read(state.skipped), read(state.consecutive_skips)
    bound, text = (np.inf, ">= 0") if steps is None else (steps, "from 0 to step (the updates attempted)")
    return [
        ("skipped", skipped, (skipped >= 0) & (skipped <= bound), text),
        ("consecutive_skips", streak, (streak >= 0) & (streak <= skipped), "from 0 to skipped"),
    ]


register_restore_check(SkipNonFiniteState, skip_rules)


def find_skip_state(opt_state, required: bool = True) -> SkipNonFiniteState | None:
    """The `SkipNonFiniteState` that decides for the whole optimizer in `opt_state`: the state
    itself, or inside `inject_hyperparams` (which only passes hyperparameters in), or last in an
    `optax.chain` after stateless transformations (weight decay, clipping: nothing a skipped
    step could change). Where there is none: a ValueError, or None where not `required`.

    One that decides for a part of the optimizer only is refused, naming the fix: a skipped step
    would still change the params or the state around it (inside `optax.MultiSteps` it is given
    the mean of micro-batches its decision never saw; in one group of `multi_transform` the other
    groups step; a transformation after it, such as AdamW's weight decay, still applies; a
    stateful one before it takes the non-finite gradients into its state).

    Raises:
        ValueError: when there is none and it is `required` (the optimizer was not wrapped in
            `skip_nonfinite`), or when one decides for a part of the optimizer only.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> opt = optax.chain(optax.add_decayed_weights(1e-4), amp.skip_nonfinite(optax.adam(1e-3)))
        >>> int(find_skip_state(opt.init({"w": jnp.ones(2)})).skipped)
        0
    """
    node = opt_state
    while not isinstance(node, SkipNonFiniteState):
        if isinstance(node, (optax.InjectHyperparamsState, optax.InjectStatefulHyperparamsState)):
            node = node.inner_state
        elif type(node) is tuple and node and not jax.tree.leaves(node[:-1]):  # a chain, stateless before the last
            node = node[-1]
        else:
            break
    if isinstance(node, SkipNonFiniteState):
        return node
    is_skip = lambda n: isinstance(n, SkipNonFiniteState)  # noqa: E731
    if any(is_skip(n) for n in jax.tree.leaves(opt_state, is_leaf=is_skip)):
        raise ValueError(
            f"amp.skip_nonfinite decides for a part of this optimizer only (it sits inside a {type(node).__name__}), "
            "so a skipped step would still change the params or the optimizer state: wrap the whole optimizer, "
            "amp.skip_nonfinite(optax.chain(...)) or amp.skip_nonfinite(optax.MultiSteps(...)), or give "
            "TrainState.create or amp.Optimizer the bare optimizer, which they wrap"
        )
    if required:
        raise ValueError("no skip_nonfinite state in this optimizer state: wrap the optimizer in amp.skip_nonfinite")
    return None


def _advance_schedules(opt_state):
    """`opt_state` with the count of every learning-rate schedule in it (optax's
    `scale_by_schedule`, `inject_hyperparams`) advanced by one, and nothing else changed:
    what a skipped step does to PyTorch's LR schedulers, which step once per iteration
    while a skipped `optimizer.step()` leaves Adam's own step count alone."""

    # A MultiSteps' inner schedules are left alone: a skipped micro-batch is waited out, and they
    # step with the optimizer steps that are taken (advanced here, they moved once per micro-batch).
    is_schedule = lambda n: isinstance(n, _SCHEDULE_STATES)  # noqa: E731
    stop = lambda n: is_schedule(n) or isinstance(n, optax.MultiStepsState)  # noqa: E731
    advance = lambda n: n._replace(count=optax.safe_increment(n.count)) if is_schedule(n) else n  # noqa: E731
    return jax.tree.map(advance, opt_state, is_leaf=stop)


# optax's states that count a schedule's steps; `add_decayed_weights`' with a schedule (adamw's
# `weight_decay=`) is not exported, so it is found where optax defines it.
_SCHEDULE_STATES = (optax.ScaleByScheduleState, optax.InjectStatefulHyperparamsState)
try:
    from optax.transforms._adding import WeightDecaySchedule as _WeightDecaySchedule

    _SCHEDULE_STATES += (_WeightDecaySchedule,)
except ImportError:  # another optax layout: that count is left where it is
    pass


def step_or_skip(inner, grads, inner_state, params, take, *, strict: bool = False, **extra_args):
    """The one body that decides and applies a skip: (updates, new inner state, applied).

    Where `take`, the inner optimizer's step; else updates of -0.0 and `inner_state` itself
    (adding -0.0 leaves every float bit-identical, so `optax.apply_updates` keeps the params).
    `strict` also refuses a step taken whose updates, new params (`params + updates`) or new
    state would hold a non-finite value where there was none (an fp16 parameter or Adam
    moment overflowing): it is not applied either, updates -0.0 and the state kept bit for
    bit. Under `jit` the skipped branch does no optimizer work and the taken one pays no
    select (`lax.cond`); under `vmap` a batched `take` makes it a select.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> sgd, params = optax.sgd(0.5), {"w": jnp.ones(2)}
        >>> updates, _, applied = step_or_skip(sgd, params, sgd.init(params), params, jnp.array(False))
        >>> updates["w"], bool(applied)
        (Array([-0., -0.], dtype=float32), False)
    """

    def step():
        updates, new_state = inner.update(grads, inner_state, params, **extra_args)
        if not strict:
            return updates, new_state, jnp.asarray(True)
        safe = _stays_finite(updates) & _stays_finite(new_state, inner_state)
        if params is not None:
            safe = safe & _stays_finite(optax.apply_updates(params, updates), params)
        updates = jax.tree.map(lambda u: jnp.where(safe, u, jnp.full(u.shape, -0.0, u.dtype)), updates)
        return updates, jax.tree.map(lambda n, o: jnp.where(safe, n, o), new_state, inner_state), safe

    zeros = jax.tree.map(lambda s: jnp.full(s.shape, -0.0, s.dtype), jax.eval_shape(step)[0])  # at trace time only
    return jax.lax.cond(take, step, lambda: (zeros, inner_state, jnp.asarray(False)))


def clip_by_norm(grads, norm, max_norm):
    """`grads` times torch `clip_grad_norm_`'s factor, max_norm / (norm + 1e-6) capped at 1, in
    float32. Below 2^-126 (a norm above 2^126 * max_norm) that factor is a denormal, which XLA's
    CPU backend flushes to 0; there it is applied as 2^-k, then factor * 2^k: neither flushes."""
    norm = jnp.asarray(norm, jnp.float32)
    factor = jnp.minimum(1.0, jnp.float32(max_norm) / (norm + 1e-6))
    split = factor < np.finfo(np.float32).tiny
    down = _power_of_two(jnp.where(split, -_exponent(norm), 0))
    factor = jnp.where(split, jnp.float32(max_norm) / ((norm + 1e-6) * down), factor)
    return jax.tree.map(lambda g: g * down.astype(g.dtype) * factor.astype(g.dtype), grads)


def global_norm(tree) -> tuple[jax.Array, jax.Array]:
    """(the float32 global norm of `tree`, whether every element is finite), in one pass.

    Half-precision leaves are squared in float32. An inf or NaN anywhere makes the sum of
    squares non-finite; so can finite values above ~1.8e19, whose squares overflow float32,
    and below 2^-64 it may have lost squares that flushed to 0. Only then a second pass
    (`lax.cond`: skipped at run time otherwise) tells the two apart and takes the norm scaled
    by an exact power of two, 2^k * sqrt(sum((g * 2^-k)^2)) with max|g| * 2^-k in [1, 4):
    no factor is a denormal that flushes to 0 (as 1 / max|g| does above 2^126), so finite
    gradients are never taken for non-finite ones and the norm keeps float32's precision.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax.amp.optim import global_norm
        >>> norm, finite = global_norm({"a": jnp.array([3e20, 4e20]), "b": jnp.zeros(2)})
        >>> f"{float(norm):.6g}", bool(finite)   # the plain sum of squares overflows float32
        ('5e+20', True)
        >>> norm, finite = global_norm({"a": jnp.array([3.0, jnp.nan])})
        >>> bool(finite)
        False
    """
    leaves = [jnp.asarray(leaf) for leaf in jax.tree.leaves(tree)]
    leaves = [leaf.astype(jnp.promote_types(leaf.dtype, jnp.float32)) for leaf in leaves]
    if not leaves:
        return jnp.asarray(0.0, jnp.float32), jnp.asarray(True)
    sum_of_squares = sum(jnp.sum(jnp.square(leaf)) for leaf in leaves)
    norm = jnp.sqrt(sum_of_squares)

    def scaled():
        largest = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf), initial=0.0) for leaf in leaves]))
        finite = jnp.isfinite(largest)  # NaN propagates through max, inf is the max
        k = _exponent(largest)
        down = _power_of_two(-k)
        # A leaf XLA sees as a constant (an unused parameter's zeros) must stay apart: it would
        # fold (g * 2^-k)^2 into g^2 * 2^-2k, which overflows or flushes (0 * inf: NaN).
        opaque = jax.lax.optimization_barrier(leaves)
        rescaled = jnp.sqrt(sum(jnp.sum(jnp.square(leaf * down)) for leaf in opaque)) * _power_of_two(k)
        return jnp.where(finite, rescaled, jnp.asarray(jnp.nan, rescaled.dtype)), finite

    fast = lambda: (norm, jnp.asarray(True))  # noqa: E731
    return jax.lax.cond(jnp.isfinite(sum_of_squares) & (sum_of_squares >= 2.0**-64), fast, scaled)


def _exponent(x):
    """The binary exponent of a float32 `x` >= 0, clipped to [-126, 126]: 2^k and 2^-k are normal."""
    return jnp.clip((jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32) >> 23) - 127, -126, 126)


def _power_of_two(k):
    """2^k as a float32, exactly, for an int32 `k` in [-126, 127]: built from its exponent bits."""
    return jax.lax.bitcast_convert_type((k + 127) << 23, jnp.float32)


def holds_float16(params) -> bool:
    """Whether `params` hold a float16 leaf: a finite gradient's update can overflow them, which
    only the strict checks catch (and Adam's default eps is 0 there)."""
    return any(jnp.result_type(p) == jnp.float16 for p in jax.tree.leaves(params))


def check_options(max_grad_norm, guard, advance_schedule_on_skip, strict) -> None:
    """`skip_nonfinite`'s options (`TrainState.create`'s and `Optimizer`'s too; a `strict` of
    None decides by the params' dtype), each refused in a sentence naming it. A clipping norm
    that is NaN or inf would make every update non-finite after the finite check, 0 or less would
    stop or reverse every step: it is checked as the float32 it is used as (1e-50 is 0 there)."""
    if max_grad_norm is not None:
        number("max_grad_norm", max_grad_norm, "finite and > 0 (None: no clipping)", finite_above(0))
    refuse_unless(guard is None or isinstance(guard, DivergenceGuard), "guard", guard, "a DivergenceGuard or None")
    flag("advance_schedule_on_skip", advance_schedule_on_skip)
    flag("strict", strict, none=True)


def _scalar(name: str, value, kinds, accepted: str, dtype):
    """`value` as a scalar array of `dtype`, refusing anything but a scalar of `kinds` (traced
    too): a float NaN given as a decision would read as True. None stays None."""
    if value is None:
        return None
    ok = isinstance(value, (bool, int, float, np.generic, np.ndarray, jax.Array)) and jnp.shape(value) == ()
    refuse_unless(ok and any(jnp.issubdtype(jnp.result_type(value), kind) for kind in kinds), name, value, accepted)
    return jnp.asarray(value, dtype)


def _stays_finite(new, old=None) -> jax.Array:
    """True when no leaf of `new` is non-finite where the same leaf of `old` was finite (a value
    that was already inf, such as a best-loss-so-far, may stay inf); no `old`: all finite."""
    news = jax.tree.leaves(new)
    olds = [0.0] * len(news) if old is None else jax.tree.leaves(old)
    flags = [jnp.all(jnp.isfinite(n) | ~jnp.isfinite(o)) for n, o in zip(news, olds)]
    return jnp.stack(flags).all() if flags else jnp.asarray(True)


def _counted(state, inner_state, skipped_now, loss_scale, guard, advance_schedule_on_skip) -> SkipNonFiniteState:
    """The skip state after a step: the counts, the guard's halt (only a skip trips it, at the
    scale `loss_scale` already adjusted) and, where asked, the schedules advanced on a skip."""
    active = ~state.halted
    streak = jnp.where(skipped_now, state.consecutive_skips + 1, jnp.where(active, 0, state.consecutive_skips))
    tripped = jnp.asarray(False)
    if guard is not None:
        tripped = skipped_now & guard.tripped(jnp.inf if loss_scale is None else loss_scale, streak)
    if advance_schedule_on_skip:
        inner_state = jax.lax.cond(skipped_now, _advance_schedules, lambda s: s, inner_state)
    skipped = state.skipped + skipped_now.astype(jnp.int32)
    return SkipNonFiniteState(inner_state, skipped, streak.astype(jnp.int32), state.halted | tripped)


def skip_nonfinite(inner, *, max_grad_norm=None, advance_schedule_on_skip=False, guard=None, strict=None):
    """Wraps an optax optimizer so that a step whose gradients are not all finite changes
    nothing, PyTorch `GradScaler`'s rule: the params (its updates are -0.0) and the inner
    state stay bit-identical, and the step is counted as skipped.

    The decision comes from one scalar: the gradients' global norm, which clipping needs
    anyway (an inf or NaN anywhere makes it non-finite; finite gradients whose squares
    overflow float32 never count as non-finite, see `global_norm`). Under `jit` the skipped
    branch does no optimizer work and the taken one pays no select (`lax.cond`).

    `strict=True` adds the post-step checks, and with them a second promise: no non-finite
    value is ever written to the params or the optimizer state. A step taken on finite
    gradients whose updates, new params (`params + updates`, when `params` is given) or new
    inner state would hold a non-finite value where there was none (an fp16 parameter or
    Adam moment overflowing) is skipped and counted too. It costs extra passes over the
    params, updates and state each step; by default (`strict=None`) it is on where the params
    given to `update` are stored in float16 (fp16-full, or params loaded in half), where such
    overflows happen.

    `update(grads, state, params=None, *, grads_finite=None, grad_norm=None, loss_scale=None,
    **extra_args)`: `grads_finite` is the decision (from `scaled_value_and_grad`; pass it so
    every replica and the scaler agree); without it the wrapper decides from `grads`. `grad_norm`,
    the unscaled global norm the decision came from, is accepted and checked, not used: the clip
    takes the norm of the gradients given (after a loop's `pmean`, of NNX's `wrt=` part), which
    XLA computes once where they are the gradients it was taken on. A decision given is
    checked against that norm of the gradients given: a step whose gradients hold an inf or NaN
    is skipped whatever it says (one taken before a `pmean` the loop adds, or another
    optimizer's). Where `params` are given, `grads` are cast to their dtypes first, as
    `TrainState` and `amp.Optimizer` apply them, and decided on as cast (float32 gradients cast
    to fp16-full's float16 params overflow above 65504). Unlike
    `optax.apply_if_finite`, a non-finite update is never applied, however many come in a
    row. Any optax optimizer works inside, an `optax.chain(clip, adam)` too.

    Args:
        inner: the optax optimizer to run on finite steps.
        max_grad_norm: clip the (unscaled) global norm first, with torch `clip_grad_norm_`'s
            coefficient max_norm / (norm + 1e-6) (`clip_by_norm`); None: no clipping.
        advance_schedule_on_skip: False (default): a skipped step leaves learning-rate
            schedules where they were (optax's schedules count inside the optimizer state,
            which is kept, as `optax.apply_if_finite` and Flax's `DynamicScale` do). True:
            every schedule count in the inner state advances on a skip too, as PyTorch's
            `scheduler.step()` does each iteration (Adam's bias-correction count stays, as
            torch's Adam `step` does); inside `optax.MultiSteps` a skipped micro-batch is
            waited out and its schedules step with the optimizer steps taken.
        guard: a `DivergenceGuard`: when a skip would take the loss scale (the `loss_scale`
            passed to `update`, already adjusted: an update without it is refused where the
            guard has a `min_scale`) below its floor, or the skips in a row exceed its limit,
            the state halts: this and every later update is skipped and no longer counted, so
            params stay at the last good values.
        strict: also skip (and count) a step whose result would hold a non-finite value; None:
            where the params given to `update` hold a float16 leaf.

    Returns:
        An optax `GradientTransformationExtraArgs` whose state is a `SkipNonFiniteState`.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> params, grads = {"w": jnp.ones(2)}, {"w": jnp.array([3.0, 4.0])}
        >>> tx = amp.skip_nonfinite(optax.sgd(1.0), max_grad_norm=1.0)
        >>> state = tx.init(params)
        >>> updates, state = tx.update(grads, state, params)   # clipped to norm 1
        >>> [round(float(u), 3) for u in updates["w"]]
        [-0.6, -0.8]
        >>> updates, state = tx.update(grads, state, params, grads_finite=jnp.array(False))
        >>> updates["w"], int(state.skipped), int(state.consecutive_skips)
        (Array([-0., -0.], dtype=float32), 1, 1)
        >>> strict = amp.skip_nonfinite(optax.sgd(1e38), strict=True)   # finite grads, params overflow
        >>> updates, state = strict.update({"w": jnp.full(2, -4.0)}, strict.init(params), params)
        >>> updates["w"], int(state.skipped)
        (Array([-0., -0.], dtype=float32), 1)
    """
    is_optax = isinstance(inner, optax.GradientTransformation)
    refuse_unless(is_optax, "the optimizer to wrap", inner, "an optax GradientTransformation")
    check_options(max_grad_norm, guard, advance_schedule_on_skip, strict)
    inner = optax.with_extra_args_support(inner)

    def init(params):
        # Separate arrays, not one zero twice: a donated state may not hold a buffer twice.
        return SkipNonFiniteState(inner.init(params), *(jnp.zeros((), dtype) for dtype in (jnp.int32, jnp.int32, bool)))

    def update(grads, state, params=None, *, grads_finite=None, grad_norm=None, loss_scale=None, **extra_args):
        finite = _scalar("grads_finite", grads_finite, (jnp.bool_,), "a scalar bool (True: all finite)", bool)
        _scalar("grad_norm", grad_norm, (jnp.floating,), "a scalar float (the global norm)", jnp.float32)  # unused
        loss_scale = _scalar("loss_scale", loss_scale, (jnp.floating, jnp.integer), "a scalar float", jnp.float32)
        if guard is not None and guard.min_scale is not None and loss_scale is None:
            raise ValueError(
                f"the guard's min_scale ({guard.min_scale}) reads the loss scale, which this update was not given: "
                "pass loss_scale=scaler.loss_scale (the scaler scaled_value_and_grad returned), or "
                "DivergenceGuard(min_scale=None) where nothing scales the loss"
            )
        if params is not None:  # decided on as applied: in the params' dtypes
            grads = jax.tree.map(lambda g, p: jnp.asarray(g, jnp.result_type(p)), grads, params)
        # A decision given is also the gradients' own, as applied: one taken on other gradients (before a
        # pmean, another optimizer's) lets no inf through. The clip takes the norm of the gradients given, not
        # the one passed: a loop that averages them over replicas after taking it (`lax.pmean`) or updates only
        # some of them (NNX's `wrt=`) passes another. Where they are the gradients `scaled_value_and_grad`
        # took its norm on, XLA computes that norm once (the compiled step is smaller than with a check apart).
        norm, own = global_norm(grads)
        finite = own if finite is None else finite & own
        if max_grad_norm is not None:
            # Where the norm is not finite the step is skipped; a finite factor keeps the
            # skipped branch's shapes and dtypes without a NaN.
            grads = clip_by_norm(grads, jnp.where(finite, norm, 0.0), max_grad_norm)
        active = ~state.halted
        strict_now = strict if strict is not None else params is not None and holds_float16(params)
        updates, inner_state, applied = step_or_skip(
            inner, grads, state.inner_state, params, finite & active, strict=strict_now, **extra_args
        )
        return updates, _counted(state, inner_state, active & ~applied, loss_scale, guard, advance_schedule_on_skip)

    return optax.GradientTransformationExtraArgs(init, update)
