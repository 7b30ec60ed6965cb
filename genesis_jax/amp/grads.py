"""The gradient side of mixed precision: scale the loss, differentiate, unscale in float32,
decide whether every gradient is finite, adjust the loss scaler (`scaled_value_and_grad`);
and `autocast`, for networks without a `dtype` field.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> def loss_fn(params, x):   # the matmul in the compute dtype, the loss in float32
...     return jnp.mean(jnp.square((x @ params["w"]).astype(jnp.float32)))
>>> params, x = {"w": jnp.ones((3, 1))}, jnp.full((8, 3), 0.1)
>>> grad_fn = jax.jit(amp.scaled_value_and_grad(loss_fn, policy="fp16"))   # params and x cast to float16
>>> tx = amp.skip_nonfinite(optax.adam(1e-3), max_grad_norm=1.0)
>>> opt_state, scaler = tx.init(params), amp.DynamicLossScale()
>>> loss, grads, finite, norm, scaler = grad_fn(scaler, params, x)
>>> updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
>>> params = optax.apply_updates(params, updates)
>>> bool(finite), round(float(loss), 3), float(scaler.loss_scale)
(True, 0.09, 65536.0)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import jmp
from flax import nnx

from genesis_jax.amp.loss_scale import LossScale, check_scaler
from genesis_jax.amp.optim import global_norm
from genesis_jax.amp.policy import Precision, get_precision

AxisName = str | tuple[str, ...] | None


class ScaledGrads(NamedTuple):
    """What `scaled_value_and_grad`'s function returns.

    value: the unscaled float32 loss, or `(loss, aux)` with `has_aux`.
    grads: the unscaled float32 gradients (non-finite where `grads_finite` is False).
    grads_finite: a scalar bool, the same on every replica of `axis_name`: take the step or not.
    grad_norm: the unscaled gradients' float32 global norm, the one scalar the decision was
        taken on; give it to `skip_nonfinite`'s update, which clips with it.
    scaler: the scaler adjusted by `grads_finite`, for the next step.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> grad_fn = amp.scaled_value_and_grad(lambda w, x: jnp.sum(w * x))
        >>> out = grad_fn(amp.DynamicLossScale(), jnp.float32(2.0), jnp.float32(3.0))
        >>> float(out.value), float(out.grads), bool(out.grads_finite), float(out.grad_norm)
        (6.0, 3.0, True, 3.0)
        >>> loss, grads, finite, norm, scaler = out   # or unpack it
    """

    value: Any
    grads: Any
    grads_finite: jax.Array
    grad_norm: jax.Array
    scaler: LossScale


def _check_loss_fn(loss_fn, has_aux) -> None:
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {loss_fn!r}")
    if not isinstance(has_aux, bool):
        raise TypeError(f"has_aux must be True or False, got {has_aux!r}")


def _check_grad_args(axis_name, accumulate, grad_transform) -> None:
    """`scaled_value_and_grad`'s other arguments: one sentence naming the bad value."""
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
        >>> resolve_policy("bf16").compute_dtype.dtype
        dtype(bfloat16)
        >>> resolve_policy(amp.get_precision("fp16")).compute_dtype.dtype
        dtype('float16')
        >>> resolve_policy(None) is None   # no casting
        True
    """
    if policy is None or isinstance(policy, jmp.Policy):
        return policy
    if isinstance(policy, Precision):
        return policy.policy
    if isinstance(policy, str):
        return get_precision(policy).policy
    raise TypeError(f"policy must be a jmp.Policy, a Precision, a precision name or None, got {policy!r}")


def autocast(fn, policy):
    """`fn` run in `policy`'s compute dtype, as `torch.autocast` runs a forward pass: floating
    params and inputs are cast to it, floating outputs to its output dtype (float32 in every
    named precision). The one way to run a network that has no `dtype` field in half
    precision: the master params stay float32, and so does what the loss reads.

    `fn` is a function (`module.apply`, your own `forward(params, x)`), or a Flax linen
    `Module`: then a module whose `init` is the original's (float32 params) and whose `apply`
    is autocast, so `qf = amp.autocast(QNetwork(), "fp16")` changes nothing else in a loop.
    Wrap the network, not the loss: the loss then reads float32 outputs and stays float32.

    Examples:
        >>> import jax, jax.numpy as jnp, flax.linen as nn
        >>> from genesis_jax import amp
        >>> apply = amp.autocast(lambda params, x: x @ params["w"], "fp16")
        >>> apply({"w": jnp.ones((3, 2))}, jnp.ones((4, 3))).dtype   # computed in float16
        dtype('float32')
        >>> net = amp.autocast(nn.Dense(2), "fp16")   # nn.Dense without dtype=
        >>> variables = net.init(jax.random.PRNGKey(0), jnp.ones((1, 3)))
        >>> variables["params"]["kernel"].dtype, net.apply(variables, jnp.ones((1, 3))).dtype
        (dtype('float32'), dtype('float32'))
    """
    policy = resolve_policy(policy)
    if policy is None:
        raise ValueError("autocast needs a policy, such as 'fp16'")
    if isinstance(fn, nn.Module):
        return AutocastModule(fn, policy)
    if not callable(fn):
        raise TypeError(f"autocast wraps a callable or a Flax linen Module, got {fn!r}")

    def cast_fn(*args, **kwargs):
        return policy.cast_to_output(fn(*policy.cast_to_compute(args), **policy.cast_to_compute(kwargs)))

    return cast_fn


class AutocastModule:
    """A Flax linen module seen through `autocast`: `init` as the module's, `apply` (and
    calling it) in the policy's compute dtype; any other attribute is the module's."""

    def __init__(self, module: nn.Module, policy: jmp.Policy):
        self.module, self.policy = module, policy
        self.apply = autocast(module.apply, policy)

    def init(self, *args, **kwargs):
        return self.module.init(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.module, name)

    def __repr__(self):
        return f"autocast({self.module!r}, compute={jnp.dtype(self.policy.compute_dtype).name})"


def scaled_loss_grad(loss_fn: Callable, *, has_aux: bool = False, policy=None) -> Callable:
    """`fn(loss_scale, params, *args) -> (scaled gradients, (float32 loss, aux))`.

    With a `policy`, params and every floating argument are cast to its compute dtype
    before `loss_fn` (for plain functions; Flax modules built with `dtype=` cast at each
    matmul and need none). The loss is cast to float32 before it is scaled, so the
    scaled loss never rounds through half precision. `value_and_grad` builds on it.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> grad_fn = scaled_loss_grad(lambda w, x: w * x)
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
        check_scaler(loss_scale, "loss_scale")
        return jax.grad(scaled, has_aux=True)(params, loss_scale, args)

    return fn


def float32_loss(loss) -> jax.Array:
    """The loss as float32, with a warning (at trace time) when it was computed in float16:
    its gradient starts as the loss scale itself, which overflows float16 above 65504, so
    every step with a scale of 2^16 would be skipped. Cast before the reduction instead.

    Examples:
        >>> import jax.numpy as jnp
        >>> from genesis_jax import amp
        >>> float32_loss(jnp.bfloat16(0.5)).dtype   # a float16 loss would warn too
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
        >>> grads, norm, finite = unscale(scaled, amp.StaticLossScale(1024.0))
        >>> grads["w"], float(norm), bool(finite)
        (Array([3., 4.], dtype=float32), 5.0, True)
    """
    check_scaler(loss_scale, "loss_scale")
    grads = loss_scale.unscale(scaled_grads)
    norm, finite = global_norm(grads)
    return grads, norm, finite


def _split_micro_batches(args, num: int):
    def split(x):
        if x.shape[0] % num:
            raise ValueError(f"a batch of {x.shape[0]} does not split into {num} micro-batches")
        return x.reshape(num, x.shape[0] // num, *x.shape[1:])

    return jax.tree.map(split, args)


def _is_nnx_module(x) -> bool:
    return isinstance(x, nnx.Module)


def _differentiate(scaled, has_aux: bool, argnums, first_arg):
    """`jax.value_and_grad`, or `nnx.value_and_grad` for a Flax NNX module (its `nnx.Param`
    state is what is differentiated, as `nnx.Optimizer(wrt=nnx.Param)` expects)."""
    if _is_nnx_module(first_arg):
        return nnx.value_and_grad(scaled, argnums=argnums, has_aux=has_aux)
    return jax.value_and_grad(scaled, argnums=argnums, has_aux=has_aux)


def scaled_value_and_grad(
    loss_fn: Callable,
    *,
    has_aux: bool = False,
    argnums: int = 0,
    policy=None,
    axis_name: AxisName = None,
    accumulate: int = 1,
    grad_transform: Callable[[Any], Any] | None = None,
) -> Callable[..., ScaledGrads]:
    """`jax.value_and_grad` with a loss scaler: scale, differentiate, unscale, decide.

    `fn = scaled_value_and_grad(loss_fn)` takes the scaler first, then `loss_fn`'s own
    arguments, any of them: `fn(scaler, *args, **kwargs) -> ScaledGrads(value, grads,
    grads_finite, grad_norm, scaler)`. The loss is taken in float32 and multiplied by the
    scale, the gradients (with respect to argument `argnums`: a params pytree, or a Flax NNX
    module, whose `nnx.Param` state is differentiated) are unscaled in float32, and one scalar,
    their global norm, decides whether all are finite. The scaler comes back adjusted.

    Args:
        loss_fn: `(*args, **kwargs) -> loss`, or `-> (loss, aux)` with `has_aux`.
        has_aux: whether `loss_fn` returns `(loss, aux)`.
        argnums: which positional argument of `loss_fn` to differentiate (an int).
        policy: cast the differentiated argument and every floating positional argument to
            its compute dtype first (a precision name, `Precision` or `jmp.Policy`; for plain
            functions); None leaves casting to the network (Flax modules with `dtype=`).
        axis_name: inside `pmap` / `shard_map` over that axis (or axes), the scaled
            gradients and the loss are averaged over replicas before unscaling, so every
            replica takes the same decision. Under plain `jit` with sharded arrays the
            gradients are already global and none is needed.
        accumulate: k > 1 splits every positional argument's leading axis (the
            differentiated one excepted) into k micro-batches whose gradients are averaged
            with the same scale in a `lax.scan`: one decision and one adjustment for the k.
            The loss is their mean; aux is stacked [k, ...].
        grad_transform: `scaled_grads -> scaled_grads`, applied after any all-reduce and
            before the decision (fault injection, custom gradient surgery).

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> def loss_fn(params, x):   # the matmul in float16, the loss in float32
        ...     y = x.astype(jnp.float16) @ params["w"].astype(jnp.float16)
        ...     return jnp.mean(jnp.square(y.astype(jnp.float32)))
        >>> params, x = {"w": jnp.ones((3, 1))}, jnp.full((8, 3), 0.1)
        >>> grad_fn = jax.jit(amp.scaled_value_and_grad(loss_fn))
        >>> tx = amp.skip_nonfinite(optax.adam(1e-3))
        >>> opt_state, scaler = tx.init(params), amp.DynamicLossScale()
        >>> loss, grads, finite, norm, scaler = grad_fn(scaler, params, x)
        >>> updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
        >>> bool(finite), round(float(loss), 3), float(scaler.loss_scale)
        (True, 0.09, 65536.0)
        >>> loss, grads, finite, norm, scaler = grad_fn(scaler, params, x * 1e4)   # float16 overflows
        >>> updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
        >>> bool(finite), float(scaler.loss_scale), int(amp.stats(opt_state)["skipped"])   # skipped, backed off
        (False, 32768.0, 1)
    """
    _check_loss_fn(loss_fn, has_aux)
    _check_grad_args(axis_name, accumulate, grad_transform)
    if isinstance(argnums, bool) or not isinstance(argnums, int) or argnums < 0:
        raise TypeError(f"argnums must be a non-negative int (one differentiated argument), got {argnums!r}")
    policy = resolve_policy(policy)

    def scaled_loss(scaler, args, kwargs):
        def scaled(*args):
            out = loss_fn(*args, **kwargs)
            loss, aux = out if has_aux else (out, None)
            loss = float32_loss(loss)
            return scaler.scale(loss), (loss, aux)

        return scaled

    def scaled_grads(scaler, args, kwargs):
        if policy is not None:
            if _is_nnx_module(args[argnums]):
                raise ValueError("policy= casts plain pytrees; give an NNX module its dtype= and param_dtype= instead")
            args = policy.cast_to_compute(args)
        grad_fn = _differentiate(scaled_loss(scaler, args, kwargs), True, argnums, args[argnums])
        (_, (loss, aux)), grads = grad_fn(*args)
        return grads, loss, aux

    def accumulated(scaler, args, kwargs):
        batched = tuple(i for i in range(len(args)) if i != argnums)
        micro = _split_micro_batches(tuple(args[i] for i in batched), accumulate)

        def micro_step(total, micro_args):
            whole = list(args)
            for i, x in zip(batched, micro_args):
                whole[i] = x
            grads, loss, aux = scaled_grads(scaler, tuple(whole), kwargs)
            return jax.tree.map(jnp.add, total, grads), (loss, aux)

        zeros = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.promote_types(g.dtype, jnp.float32)), args[argnums])
        total, (losses, aux) = jax.lax.scan(micro_step, zeros, micro)
        return jax.tree.map(lambda g: g / accumulate, total), jnp.mean(losses), aux

    def fn(scaler, *args, **kwargs) -> ScaledGrads:
        check_scaler(scaler)
        if accumulate > 1 and _is_nnx_module(args[argnums] if len(args) > argnums else None):
            raise ValueError("accumulate > 1 takes a params pytree; for an NNX module, split the batch yourself")
        if len(args) <= argnums:
            raise TypeError(f"loss_fn's argument {argnums} (argnums) is missing: got {len(args)} positional arguments")
        if accumulate == 1:
            grads, loss, aux = scaled_grads(scaler, args, kwargs)
        else:
            grads, loss, aux = accumulated(scaler, args, kwargs)
        if axis_name is not None:
            grads, loss = jax.lax.pmean((grads, loss), axis_name)
        if grad_transform is not None:
            grads = grad_transform(grads)
        grads, norm, finite = unscale(grads, scaler)
        value = (loss, aux) if has_aux else loss
        return ScaledGrads(value, grads, finite, norm, scaler.adjust(finite))

    return fn


def value_and_grad(loss_fn: Callable, *, has_aux: bool = False, **options) -> Callable:
    """Deprecated (0.3): `scaled_value_and_grad`, whose result also carries the global norm
    (`.grad_norm`, for `skip_nonfinite`), replaces it and its `.with_norm`."""
    new = scaled_value_and_grad(loss_fn, has_aux=has_aux, **options)

    def with_norm(loss_scale, params, *args):
        out = new(loss_scale, params, *args)
        return ScaledGradients(out.value, out.grads, out.grads_finite, out.scaler), out.grad_norm

    def fn(loss_scale, params, *args):
        return with_norm(loss_scale, params, *args)[0]

    fn.with_norm = with_norm
    return fn


class ScaledGradients(NamedTuple):
    """Deprecated (0.3): the old `value_and_grad`'s result; `ScaledGrads` replaces it."""

    value: Any
    grads: Any
    grads_finite: jax.Array
    loss_scale: LossScale
