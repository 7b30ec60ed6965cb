"""The gradient side of mixed precision: scale the loss, differentiate, unscale in float32,
decide whether every gradient is finite, adjust the loss scaler.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> def loss_fn(params, x):   # the matmul in the compute dtype, the loss in float32
...     return jnp.mean(jnp.square((x @ params["w"]).astype(jnp.float32)))
>>> params, x = {"w": jnp.ones((3, 1))}, jnp.full((8, 3), 0.1)
>>> grad_fn = jax.jit(amp.value_and_grad(loss_fn, policy="fp16"))
>>> opt = amp.skip_nonfinite(optax.adam(1e-3), max_grad_norm=1.0)
>>> opt_state, scaler = opt.init(params), amp.DynamicLossScale()
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

from genesis_jax.amp.loss_scale import LossScale, check_scaler
from genesis_jax.amp.optim import global_norm
from genesis_jax.amp.policy import Precision, get_precision

AxisName = str | tuple[str, ...] | None


class ScaledGradients(NamedTuple):
    """What `value_and_grad`'s function returns.

    value: the unscaled float32 loss, or `(loss, aux)` with `has_aux`.
    grads: the unscaled float32 gradients (non-finite where `grads_finite` is False).
    grads_finite: a scalar bool, the same on every replica of `axis_name`.
    loss_scale: the scaler adjusted by `grads_finite`, for the next step.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> grad_fn = amp.value_and_grad(lambda w, x: jnp.sum(w * x))
        >>> out = grad_fn(amp.DynamicLossScale(), jnp.float32(2.0), jnp.float32(3.0))
        >>> float(out.value), float(out.grads), bool(out.grads_finite), float(out.loss_scale.loss_scale)
        (6.0, 3.0, True, 65536.0)
        >>> loss, grads, finite, scaler = out   # or unpack it
    """

    value: Any
    grads: Any
    grads_finite: jax.Array
    loss_scale: LossScale


def _check_loss_fn(loss_fn, has_aux) -> None:
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"has_aux must be True or False, got {has_aux!r}")


def _check_grad_args(axis_name, accumulate, grad_transform) -> None:
    """`value_and_grad`'s other arguments: one sentence naming the bad value."""
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if axis_name is not None and not (names and all(isinstance(n, str) for n in names)):
        raise TypeError(f"axis_name must be None, an axis name or a tuple of axis names, got {axis_name!r}")
    if isinstance(accumulate, bool) or not (isinstance(accumulate, int) and accumulate >= 1):
        raise ValueError(f"accumulate must be an integer >= 1, got {accumulate!r}")
    if grad_transform is not None and not callable(grad_transform):
        raise TypeError(f"grad_transform must be callable or None, got {grad_transform!r}")


def resolve_policy(policy) -> jmp.Policy | None:
    """A `jmp.Policy` from one, a `Precision`, a precision name ('fp16', ...), a jmp policy
    string ('params=float32,compute=float16,output=float32'), or None (no casting).

    Examples:
        >>> from genesis_jax import amp
        >>> amp.resolve_policy("bf16").compute_dtype.dtype
        dtype(bfloat16)
        >>> amp.resolve_policy(amp.get_precision("fp16")).compute_dtype.dtype
        dtype('float16')
        >>> amp.resolve_policy(None) is None   # no casting
        True
    """
    if policy is None or isinstance(policy, jmp.Policy):
        return policy
    if isinstance(policy, Precision):
        return policy.policy
    if isinstance(policy, str):
        return get_precision(policy).policy
    raise TypeError(f"policy must be a jmp.Policy, a Precision, a precision name or None, got {policy!r}")


def autocast(fn: Callable, policy) -> Callable:
    """`fn` run in `policy`'s compute dtype: floating params and inputs are cast to it, the
    floating outputs to its output dtype (float32 in every named precision), as
    `torch.autocast` does around a forward pass. For networks without a `dtype` field:

    >>> import jax.numpy as jnp
    >>> from genesis_jax import amp
    >>> apply = amp.autocast(lambda params, x: x @ params["w"], "fp16")
    >>> apply({"w": jnp.ones((3, 2))}, jnp.ones((4, 3))).dtype   # computed in float16
    dtype('float32')

    Wrap the network's apply, not the loss: the loss then reads float32 outputs and stays
    float32, which `value_and_grad` needs (its `policy=` casts every loss argument instead).
    """
    if not callable(fn):
        raise TypeError(f"autocast wraps a callable, got {fn!r}")
    policy = resolve_policy(policy)
    if policy is None:
        raise ValueError("autocast needs a policy, such as 'fp16'")

    def cast_fn(*args, **kwargs):
        return policy.cast_to_output(fn(*policy.cast_to_compute(args), **policy.cast_to_compute(kwargs)))

    return cast_fn


def scaled_loss_grad(loss_fn: Callable, *, has_aux: bool = False, policy=None) -> Callable:
    """`fn(loss_scale, params, *args) -> (scaled gradients, (float32 loss, aux))`.

    With a `policy`, params and every floating argument are cast to its compute dtype
    before `loss_fn` (for plain functions; Flax modules built with `dtype=` cast at each
    matmul and need none). The loss is cast to float32 before it is scaled, so the
    scaled loss never rounds through half precision. `value_and_grad` builds on it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> grad_fn = amp.scaled_loss_grad(lambda w, x: w * x)
        >>> scaled_grads, (loss, aux) = grad_fn(amp.StaticLossScale(8.0), jnp.float32(2.0), jnp.float32(3.0))
        >>> float(scaled_grads), float(loss), aux   # the gradient is still multiplied by the scale
        (24.0, 6.0, None)
    """
    _check_loss_fn(loss_fn, has_aux)
    policy = resolve_policy(policy)

    def scaled(params, loss_scale, args):
        if policy is not None:
            params, args = policy.cast_to_compute((params, args))
        out = loss_fn(params, *args)
        loss, aux = out if has_aux else (out, None)
        loss = float32_loss(loss)
        return loss_scale.scale(loss), (loss, aux)

    def fn(loss_scale, params, *args):
        check_scaler(loss_scale)
        return jax.grad(scaled, has_aux=True)(params, loss_scale, args)

    return fn


def float32_loss(loss) -> jax.Array:
    """The loss as float32, with a warning (at trace time) when it was computed in float16:
    its gradient starts as the loss scale itself, which overflows float16 above 65504, so
    every step with a scale of 2^16 would be skipped. Cast before the reduction instead.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> amp.float32_loss(jnp.bfloat16(0.5)).dtype   # a float16 loss would warn too
        dtype('float32')
    """
    loss = jnp.asarray(loss)
    if loss.dtype == jnp.float16:
        warnings.warn(
            "the loss is float16: its gradient (the loss scale, 2^16 by default) overflows float16; "
            "compute the loss in float32, casting before the mean or sum",
            stacklevel=3,
        )
    return loss.astype(jnp.float32)


def unscale(scaled_grads, loss_scale: LossScale):
    """(float32 unscaled gradients, their global norm, all finite) in one pass.

    Every gradient is multiplied by 1/scale in float32, as `GradScaler.unscale_` does (with
    `NoOpLossScale`, fp32 and bf16, nothing is multiplied: the compiled step has no scale in
    it). The decision is `global_norm`'s: an inf or NaN anywhere makes the norm non-finite,
    so one scalar decides for all gradients, and finite gradients whose squares overflow
    float32 still count as finite. Clipping belongs to the optimizer:
    `skip_nonfinite(max_grad_norm=...)`, which reuses this norm.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> scaled = {"w": jnp.array([3.0, 4.0]) * 1024}
        >>> grads, norm, finite = amp.unscale(scaled, amp.StaticLossScale(1024.0))
        >>> grads["w"], float(norm), bool(finite)
        (Array([3., 4.], dtype=float32), 5.0, True)
    """
    check_scaler(loss_scale)
    grads = loss_scale.unscale(scaled_grads)
    norm, finite = global_norm(grads)
    return grads, norm, finite


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
    grad_transform: Callable[[Any], Any] | None = None,
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
        grad_transform: `scaled_grads -> scaled_grads`, applied after any all-reduce and
            before the finite decision (fault injection, custom gradient surgery).

    Returns:
        `fn(loss_scale, params, *args) -> (value, grads, grads_finite, loss_scale)`: the
        value (`(loss, aux)` with `has_aux`), float32 unscaled gradients, the finite decision
        and the scaler already adjusted for the next step. `fn.with_norm(...)` returns
        `(that, the unscaled gradients' global norm)`: the norm the decision was taken on.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> def loss_fn(w, x):   # float32 loss
        ...     return jnp.mean(jnp.square(x * w))
        >>> grad_fn = jax.jit(amp.value_and_grad(loss_fn))
        >>> loss, grads, finite, scaler = grad_fn(amp.DynamicLossScale(), jnp.float32(1.0), jnp.arange(4.0))
        >>> float(loss), float(grads), bool(finite), float(scaler.loss_scale)
        (3.5, 7.0, True, 65536.0)
        >>> loss, grads, finite, scaler = grad_fn(scaler, jnp.float32(1.0), jnp.full(4, 1e30))   # overflows
        >>> bool(finite), float(scaler.loss_scale)   # skip this step; the scale backs off
        (False, 32768.0)
    """
    _check_loss_fn(loss_fn, has_aux)
    _check_grad_args(axis_name, accumulate, grad_transform)
    grad_fn = scaled_loss_grad(loss_fn, has_aux=has_aux, policy=policy)

    def accumulated(loss_scale, params, args):
        def micro_step(total, micro_args):
            grads, (loss, aux) = grad_fn(loss_scale, params, *micro_args)
            return jax.tree.map(jnp.add, total, grads), (loss, aux)

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), params)
        total, (losses, aux) = jax.lax.scan(micro_step, zeros, _split_micro_batches(args, accumulate))
        return jax.tree.map(lambda g: g / accumulate, total), (jnp.mean(losses), aux)

    def with_norm(loss_scale, params, *args) -> tuple[ScaledGradients, jax.Array]:
        check_scaler(loss_scale)
        if accumulate == 1:
            scaled_grads, (loss, aux) = grad_fn(loss_scale, params, *args)
        else:
            scaled_grads, (loss, aux) = accumulated(loss_scale, params, args)
        if axis_name is not None:
            scaled_grads, loss = jax.lax.pmean((scaled_grads, loss), axis_name)
        if grad_transform is not None:
            scaled_grads = grad_transform(scaled_grads)
        grads, norm, finite = unscale(scaled_grads, loss_scale)
        value = (loss, aux) if has_aux else loss
        return ScaledGradients(value, grads, finite, loss_scale.adjust(finite)), norm

    def fn(loss_scale, params, *args) -> ScaledGradients:
        return with_norm(loss_scale, params, *args)[0]

    fn.with_norm = with_norm  # the same, plus the unscaled global norm it computed (for logging)
    return fn
