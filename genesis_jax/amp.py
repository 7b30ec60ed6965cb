"""Mixed precision for your own JAX training loop: composable pieces, optax-style.

Three pieces, usable without genesis-jax's `TrainState`:

- `value_and_grad(loss_fn)`: scales the float32 loss, differentiates, unscales in float32
  and decides whether every gradient is finite (agreed across replicas with `axis_name`);
  it returns the adjusted loss scaler too. `accumulate` splits the batch into micro-batches
  and makes one decision and one scaler adjustment for all of them;
- `skip_nonfinite(optimizer)`: an optax transformation that takes that decision
  (`grads_finite=`), runs the inner optimizer on finite steps only, keeps its state
  bit-identical on the others, counts the skips, and optionally clips the global norm
  as torch's `clip_grad_norm_` does after `GradScaler.unscale_`;
- the scalers of `genesis_jax.loss_scale` (GradScaler's rule, as pytrees);
- per-module precision rules (`precision_rules`, `with_precision_rules`, from
  `genesis_jax.nets.rules`): norms and heads in float32 without editing the modules.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> from genesis_jax.loss_scale import DynamicLossScale
>>> def loss_fn(params, x):   # the matmul in the compute dtype, the loss in float32
...     return jnp.mean(jnp.square((x @ params["w"]).astype(jnp.float32)))
>>> params, x = {"w": jnp.ones((3, 1))}, jnp.full((8, 3), 0.1)
>>> grad_fn = jax.jit(amp.value_and_grad(loss_fn, policy="fp16"))
>>> opt = amp.skip_nonfinite(optax.adam(1e-3), max_grad_norm=1.0)
>>> opt_state, scaler = opt.init(params), DynamicLossScale()
>>> loss, grads, finite, scaler = grad_fn(scaler, params, x)
>>> updates, opt_state = opt.update(grads, opt_state, params, grads_finite=finite)
>>> params = optax.apply_updates(params, updates)
>>> bool(finite), round(float(loss), 3), int(opt_state.skipped), float(scaler.loss_scale)
(True, 0.09, 0, 65536.0)
>>> loss, grads, finite, scaler = grad_fn(scaler, params, x * 1e4)   # float16 overflows
>>> updates, opt_state = opt.update(grads, opt_state, params, grads_finite=finite)
>>> bool(finite), int(opt_state.skipped), float(scaler.loss_scale)  # skipped, scale backed off
(False, 1, 32768.0)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import jmp
import optax

from genesis_jax.loss_scale import LossScale
from genesis_jax.nets.rules import FLOAT32_RULES, PrecisionRule, precision_rules, with_precision_rules

__all__ = [
    "value_and_grad",
    "scaled_loss_grad",
    "unscale",
    "ScaledGradients",
    "skip_nonfinite",
    "SkipNonFiniteState",
    "step_if_finite",
    "advance_schedules",
    "resolve_policy",
    # per-module precision rules, from genesis_jax.nets.rules
    "PrecisionRule",
    "FLOAT32_RULES",
    "precision_rules",
    "with_precision_rules",
]

AxisName = str | tuple[str, ...] | None


class ScaledGradients(NamedTuple):
    """What `value_and_grad`'s function returns.

    value: the unscaled float32 loss, or `(loss, aux)` with `has_aux`.
    grads: the unscaled float32 gradients (non-finite where `grads_finite` is False).
    grads_finite: a scalar bool, the same on every replica of `axis_name`.
    loss_scale: the scaler adjusted by `grads_finite`, for the next step.
    """

    value: Any
    grads: Any
    grads_finite: jax.Array
    loss_scale: LossScale


def resolve_policy(policy) -> jmp.Policy | None:
    """A `jmp.Policy` from one, a `Precision`, a precision name ('fp16', ...), a jmp policy
    string ('params=float32,compute=float16,output=float32'), or None (no casting)."""
    from genesis_jax.precision import Precision, get_precision

    if policy is None or isinstance(policy, jmp.Policy):
        return policy
    if isinstance(policy, Precision):
        return policy.policy
    if isinstance(policy, str):
        return get_precision(policy).policy
    raise TypeError(f"policy must be a jmp.Policy, a Precision, a precision name or None, got {policy!r}")


def scaled_loss_grad(loss_fn: Callable, *, has_aux: bool = False, policy=None) -> Callable:
    """`fn(loss_scale, params, *args) -> (scaled gradients, (float32 loss, aux))`.

    With a `policy`, params and every floating argument are cast to its compute dtype
    before `loss_fn` (for plain functions; Flax modules built with `dtype=` cast at each
    matmul and need none). The loss is cast to float32 before it is scaled, so the
    scaled loss never rounds through half precision.
    """
    policy = resolve_policy(policy)

    def scaled(params, loss_scale, args):
        if policy is not None:
            params, args = policy.cast_to_compute((params, args))
        out = loss_fn(params, *args)
        loss, aux = out if has_aux else (out, None)
        loss = float32_loss(loss)
        return loss_scale.scale(loss), (loss, aux)

    def fn(loss_scale, params, *args):
        return jax.grad(scaled, has_aux=True)(params, loss_scale, args)

    return fn


def float32_loss(loss) -> jax.Array:
    """The loss as float32, with a warning (at trace time) when it was computed in float16:
    its gradient starts as the loss scale itself, which overflows float16 above 65504, so
    every step with a scale of 2^16 would be skipped. Cast before the reduction instead."""
    loss = jnp.asarray(loss)
    if loss.dtype == jnp.float16:
        warnings.warn(
            "the loss is float16: its gradient (the loss scale, 2^16 by default) overflows float16; "
            "compute the loss in float32, casting before the mean or sum",
            stacklevel=3,
        )
    return loss.astype(jnp.float32)


def unscale(scaled_grads, loss_scale: LossScale, max_norm: float | None = None):
    """(float32 unscaled gradients, their global norm, all finite) in one pass.

    With `max_norm`, the gradients are also clipped as torch's `clip_grad_norm_` does
    (coefficient max_norm / (norm + 1e-6), at most 1), each multiplied once by
    coefficient x 1/scale. An inf or NaN anywhere makes the norm non-finite, so one scalar
    decides for all gradients (finite gradients whose norm overflows float32, above
    ~1e19, count as non-finite too).
    """
    inv_scale = jnp.reciprocal(loss_scale.loss_scale)
    grads = jax.tree.map(lambda g: g.astype(jnp.promote_types(g.dtype, jnp.float32)), scaled_grads)
    norm = optax.tree.norm(grads) * inv_scale
    factor = inv_scale if max_norm is None else inv_scale * _clip_coefficient(norm, max_norm)
    return jax.tree.map(lambda g: g * factor, grads), norm, jnp.isfinite(norm)


def _clip_coefficient(norm, max_norm):
    return jnp.minimum(1.0, max_norm / (norm + 1e-6))


def _split_micro_batches(args, num: int):
    def split(x):
        if x.shape[0] % num:
            raise ValueError(f"a batch of {x.shape[0]} does not split into {num} micro-batches")
        return x.reshape(num, x.shape[0] // num, *x.shape[1:])

    return jax.tree.map(split, args)


def value_and_grad(
    loss_fn: Callable,
    *,
    has_aux: bool = False,
    policy=None,
    axis_name: AxisName = None,
    accumulate: int = 1,
) -> Callable[..., ScaledGradients]:
    """Wraps `loss_fn(params, *args)` into `fn(loss_scale, params, *args) -> ScaledGradients`.

    Args:
        loss_fn: `(params, *args) -> loss`, or `-> (loss, aux)` with `has_aux`.
        has_aux: whether `loss_fn` returns `(loss, aux)`.
        policy: cast params and floating args to its compute dtype first (see
            `scaled_loss_grad`); None leaves casting to the network.
        axis_name: inside `pmap` / `shard_map` over that axis (or axes), the scaled
            gradients and the loss are averaged over replicas before unscaling, so every
            replica sees the same gradients and takes the same finite decision. Under plain
            `jit` with sharded arrays the gradients are already global and none is needed.
        accumulate: k > 1 splits every argument's leading axis into k micro-batches whose
            gradients are averaged (with the same scale) in a `lax.scan`; one finite decision
            and one scaler adjustment cover the k of them, so a non-finite micro-batch skips
            the whole step. The loss is the mean of the micro-batch losses; aux is stacked [k, ...].

    Returns:
        `fn(loss_scale, params, *args) -> (value, grads, grads_finite, loss_scale)`: the
        value (`(loss, aux)` with `has_aux`), float32 unscaled gradients, the finite decision
        and the scaler already adjusted for the next step.
    """
    if not (isinstance(accumulate, int) and accumulate >= 1):
        raise ValueError(f"accumulate must be an integer >= 1, got {accumulate!r}")
    grad_fn = scaled_loss_grad(loss_fn, has_aux=has_aux, policy=policy)

    def accumulated(loss_scale, params, args):
        def micro_step(total, micro_args):
            grads, (loss, aux) = grad_fn(loss_scale, params, *micro_args)
            return jax.tree.map(jnp.add, total, grads), (loss, aux)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
        total, (losses, aux) = jax.lax.scan(micro_step, zeros, _split_micro_batches(args, accumulate))
        return jax.tree.map(lambda g: g / accumulate, total), (jnp.mean(losses), aux)

    def fn(loss_scale, params, *args) -> ScaledGradients:
        if accumulate == 1:
            scaled_grads, (loss, aux) = grad_fn(loss_scale, params, *args)
        else:
            scaled_grads, (loss, aux) = accumulated(loss_scale, params, args)
        if axis_name is not None:
            scaled_grads, loss = jax.lax.pmean((scaled_grads, loss), axis_name)
        grads, _, finite = unscale(scaled_grads, loss_scale)
        return ScaledGradients((loss, aux) if has_aux else loss, grads, finite, loss_scale.adjust(finite))

    return fn


# ---------------------------------------------------------------------------------------
# The optimizer side: skip non-finite steps.


class SkipNonFiniteState(NamedTuple):
    """`inner_state`: the wrapped optimizer's state, unchanged by a skipped step.
    `skipped`: steps skipped so far. `consecutive_skips`: skips since the last step taken."""

    inner_state: Any
    skipped: jax.Array
    consecutive_skips: jax.Array


_SCHEDULE_STATES = (optax.ScaleByScheduleState, optax.InjectStatefulHyperparamsState)


def advance_schedules(opt_state):
    """`opt_state` with the count of every learning-rate schedule in it (optax's
    `scale_by_schedule`, `inject_hyperparams`) advanced by one, and nothing else changed:
    what a skipped step does to PyTorch's LR schedulers, which step once per iteration
    while a skipped `optimizer.step()` leaves Adam's own step count alone."""

    def advance(node):
        if isinstance(node, _SCHEDULE_STATES):
            return node._replace(count=optax.safe_increment(node.count))
        return node

    return jax.tree.map(advance, opt_state, is_leaf=lambda n: isinstance(n, _SCHEDULE_STATES))


def step_if_finite(inner: optax.GradientTransformation, grads, inner_state, params, finite, **extra_args):
    """(updates, new inner state): the inner optimizer's step where `finite`, else updates
    of -0.0 and `inner_state` itself. Adding -0.0 leaves every float bit-identical, +0.0
    and -0.0 included, so `optax.apply_updates` keeps the params too. (`lax.cond`, not a
    select of both results: the skip path then costs no optimizer work and no copies.)"""

    def step():
        return inner.update(grads, inner_state, params, **extra_args)

    updates_shape, _ = jax.eval_shape(step)

    def skip():
        return jax.tree.map(lambda s: jnp.full(s.shape, -0.0, s.dtype), updates_shape), inner_state

    return jax.lax.cond(finite, step, skip)


def skip_nonfinite(
    inner: optax.GradientTransformation,
    *,
    max_grad_norm: float | None = None,
    advance_schedule_on_skip: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Wraps an optax optimizer so that a step whose gradients are not all finite changes
    nothing: the params (its updates are -0.0) and the inner state stay bit-identical.

    `update(grads, state, params=None, *, grads_finite=None, **extra_args)`:
    `grads_finite` is the decision (from `value_and_grad`; pass it so every replica and
    the scaler agree); without it the wrapper decides from the gradients' global norm.
    Unlike `optax.apply_if_finite`, a non-finite update is never applied, however many
    come in a row: the divergence decision belongs to the caller (`consecutive_skips`).

    Args:
        inner: the optax optimizer to run on finite steps.
        max_grad_norm: clip the (unscaled) global norm first, with torch `clip_grad_norm_`'s
            coefficient max_norm / (norm + 1e-6); None: no clipping.
        advance_schedule_on_skip: False (default): a skipped step leaves learning-rate
            schedules where they were (optax's schedules count inside the optimizer state,
            which is kept, as `optax.apply_if_finite` and Flax's `DynamicScale` do). True:
            every schedule count in the inner state advances on a skip too, as PyTorch's
            `scheduler.step()` does each iteration (Adam's bias-correction count stays, as
            torch's Adam `step` does).

    Returns:
        An optax `GradientTransformationExtraArgs` whose state is a `SkipNonFiniteState`
        (the inner state, `skipped`, `consecutive_skips`).
    """
    inner = optax.with_extra_args_support(inner)

    def init(params):
        zero = jnp.asarray(0, jnp.int32)
        return SkipNonFiniteState(inner.init(params), zero, zero)

    def update(grads, state, params=None, *, grads_finite=None, **extra_args):
        norm = optax.tree.norm(grads) if grads_finite is None or max_grad_norm is not None else None
        finite = jnp.isfinite(norm) if grads_finite is None else jnp.asarray(grads_finite, bool)
        if max_grad_norm is not None:
            grads = jax.tree.map(lambda g: g * _clip_coefficient(norm, max_grad_norm).astype(g.dtype), grads)
        updates, inner_state = step_if_finite(inner, grads, state.inner_state, params, finite, **extra_args)
        if advance_schedule_on_skip:
            inner_state = jax.lax.cond(finite, lambda s: s, advance_schedules, inner_state)
        skipped = (~finite).astype(jnp.int32)
        return updates, SkipNonFiniteState(
            inner_state, state.skipped + skipped, jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32)
        )

    return optax.GradientTransformationExtraArgs(init, update)
