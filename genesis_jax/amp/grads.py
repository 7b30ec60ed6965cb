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
>>> loss, grads, finite, norm, scaler = grad_fn((scaler, opt_state), params, x)
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

from genesis_jax.amp._checks import config_number, flag, optional_callable, refuse_unless
from genesis_jax.amp.jaxpr import cast_per_op, refuse_mismatched_compute
from genesis_jax.amp.loss_scale import LossScale, NoOpLossScale, check_scaler
from genesis_jax.amp.optim import find_skip_state, global_norm
from genesis_jax.amp.policy import Precision, as_policy, get_precision


class ScaledGrads(NamedTuple):
    """What `scaled_value_and_grad`'s function returns.

    value: the unscaled float32 loss, or `(loss, aux)` with `has_aux`.
    grads: the unscaled float32 gradients (non-finite where `grads_finite` is False).
    grads_finite: a scalar bool, the same on every replica of `axis_name`: take the step or not.
    grad_norm: the unscaled gradients' float32 global norm, the one scalar the decision was
        taken on; give it to `skip_nonfinite`'s update, which clips with it.
    scaler: the scaler adjusted by `grads_finite`, for the next step.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> grad_fn = amp.scaled_value_and_grad(lambda w, x: jnp.sum(w * x))
        >>> opt_state = amp.skip_nonfinite(optax.sgd(0.1)).init(jnp.float32(2.0))
        >>> out = grad_fn((amp.DynamicLossScale(), opt_state), jnp.float32(2.0), jnp.float32(3.0))
        >>> float(out.value), float(out.grads), bool(out.grads_finite), float(out.grad_norm)
        (6.0, 3.0, True, 3.0)
        >>> loss, grads, finite, norm, scaler = out   # or unpack it
    """

    value: Any
    grads: Any
    grads_finite: jax.Array
    grad_norm: jax.Array
    scaler: LossScale


def autocast(fn, policy):
    """`fn` run in `policy`'s compute dtype, as `torch.autocast` runs a forward pass, its
    floating outputs cast to the policy's output dtype (float32 in every named precision).
    The one way to run a network that has no `dtype` field in half precision: the master
    params stay float32, and so does what the loss reads.

    As torch does, it decides per operation, reading `fn`'s jaxpr; nothing is cast on the way
    in. Every matmul and convolution runs in the compute dtype (its operands cast), even on
    weights `fn` closes over or casts to float32 itself (a `precision_rules` module keeps its
    norms and outputs in float32, not its matmuls); exp, log, pow, squares, sums and
    cumulative sums run in float32 (their operands are cast up: logsumexp, softmax, variances
    and norms are made of them); other ops in their operands' widest dtype, so what `fn` does
    to its float32 inputs before a matmul (normalising observations) stays float32. The same
    holds inside scan, while, cond and remat bodies (a carry keeps its dtype); custom_jvp/vjp
    calls run in their traced dtypes. Tracing costs a little more than casting by hand.

    `fn` is a function (`module.apply`, your own `forward(params, x)`), an Equinox module
    (the result is a pytree holding it, so `eqx.filter_grad` reaches its arrays), or a Flax
    linen `Module`: then a module whose `init` is the original's (float32 params) and whose
    `apply` is autocast, so `qf = amp.autocast(QNetwork(), "fp16")` changes nothing else in a
    loop. A loss inside it computes as under torch's: its targets read as given, its
    subtractions, squares and means in float32 (0.4 refused it: it cast the targets to float16).
    `amp.dtype_report` shows what ran in what.

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
    policy = as_policy(policy)
    if policy is None:
        raise ValueError("autocast needs a policy, such as 'fp16'")
    if isinstance(fn, nn.Module):
        return AutocastModule(fn, policy)
    if isinstance(fn, nnx.Module):  # it would run on a copy: BatchNorm's updates would be lost
        raise TypeError("autocast takes no NNX module: give its layers dtype=jnp.float16, param_dtype=jnp.float32")
    if not callable(fn):
        raise TypeError(f"autocast wraps a callable or a Flax linen Module, got {fn!r}")

    def cast_fn(fn, *args, **kwargs):  # fn's own arrays (an Equinox module's) are params too
        return policy.cast_to_output(cast_per_op(fn, policy.compute_dtype, *args, **kwargs))

    return jax.tree_util.Partial(cast_fn, fn)


class AutocastModule:
    """A Flax linen module seen through `autocast`: `init` as the module's, `apply` in the
    policy's compute dtype; any other attribute is the module's, but `bind` and calling it,
    which would run the module uncast, are refused."""

    def __init__(self, module: nn.Module, policy: jmp.Policy):
        self.module, self.policy, self.apply = module, policy, autocast(module.apply, policy)

    def __getattr__(self, name):
        return getattr(self.module, name)

    def __call__(self, *args, **kwargs):
        raise TypeError(
            "an autocast module runs through .apply(variables, ...); as a submodule of another, give the "
            "layers dtype= instead (or autocast the outer module)"
        )

    def bind(self, *args, **kwargs):
        raise TypeError("an autocast module runs through .apply(variables, ...): bound, it would compute uncast")

    def __repr__(self):
        return f"autocast({self.module!r}, compute={jnp.dtype(self.policy.compute_dtype).name})"


def split_aux(out, has_aux: bool):
    """(loss, aux) of what `loss_fn` returned, refusing a return that does not fit `has_aux` or
    a loss that is not one number, each in a sentence (JAX's own errors come from deep inside)."""
    if has_aux and not (isinstance(out, tuple) and len(out) == 2):
        got = f"an array of shape {jnp.shape(out)}" if hasattr(out, "shape") else type(out).__name__
        raise TypeError(f"with has_aux=True, loss_fn must return (loss, aux), got {got}")
    loss, aux = out if has_aux else (out, None)
    if isinstance(loss, (tuple, list, dict)) or jnp.shape(loss) != ():
        fix = "; with aux, return (loss, aux) and pass has_aux=True" if isinstance(out, tuple) and not has_aux else ""
        shown = type(loss).__name__ if isinstance(loss, (tuple, list, dict)) else f"shape {jnp.shape(loss)}"
        raise TypeError(f"loss_fn must return one number, the loss (a scalar), got {shown}{fix}")
    return loss, aux


def _float32_loss(loss) -> jax.Array:
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


SKIPPING = (
    "scaled_value_and_grad takes the optimizer that applies the gradients: an amp.Optimizer (NNX), an amp.TrainState, "
    "or (scaler, opt_state) of an optimizer wrapped in amp.skip_nonfinite"
)


def _scaler_of(source):
    """The scaler of what applies the gradients, refusing anything that would apply a non-finite
    step (optax ignores `grads_finite=`): an `amp.Optimizer`, an `amp.TrainState`, or `(scaler,
    opt_state)` whose state holds `skip_nonfinite`'s. A bare scaler is refused too: it does not
    show the optimizer."""
    if isinstance(source, nnx.Optimizer):
        if not isinstance(getattr(source, "scaler", None), nnx.Variable) or not hasattr(source, "precision"):
            raise TypeError(f"{SKIPPING}: a plain nnx.Optimizer would apply a non-finite step")
        return source.scaler.get_value()
    if hasattr(source, "opt_state") and hasattr(source, "scaler"):  # an amp.TrainState, which always skips
        source = (source.scaler, source.opt_state)
    if not isinstance(source, tuple) or len(source) != 2:
        raise TypeError(f"{SKIPPING}; got {source!r:.60}, which does not show whether its optimizer skips")
    if find_skip_state(source[1], required=False) is None:
        if find_skip_state(source[0], required=False) is not None:
            raise TypeError(f"{SKIPPING}: (scaler, opt_state) in that order, got (opt_state, scaler)")
        raise TypeError(f"{SKIPPING}: a plain optax optimizer would apply a non-finite step")
    check_scaler(source[0])
    return source[0]


def _declared_precision(source, policy) -> Precision | None:
    """`policy=`, else the precision of what applies the gradients (an `amp.TrainState`'s, an
    `amp.Optimizer`'s); None where none is declared (`(scaler, opt_state)` without `policy=`)."""
    policy = getattr(source, "precision", None) if policy is None else policy
    if isinstance(policy, jmp.Policy):
        policy = str(policy)  # jmp's own spelling ("p=full,c=f16,o=full"), which get_precision reads
    if isinstance(policy, str):
        policy = get_precision(policy)
    return policy if isinstance(policy, Precision) else None


def _check_arrays(tree, argnums: int) -> None:
    """Refuses a differentiated argument holding a leaf JAX cannot differentiate (a function, an
    object: a whole Equinox module), before JAX's generic TypeError, naming the fix."""
    for leaf in jax.tree.leaves(tree):
        if not hasattr(leaf, "dtype") and not isinstance(leaf, (int, float, complex)):
            raise TypeError(
                f"loss_fn's argument {argnums} holds a {type(leaf).__name__}, not an array (an Equinox module?): "
                "differentiate its arrays, params, static = eqx.partition(model, eqx.is_inexact_array), "
                "and rebuild the model in loss_fn with eqx.combine(params, static)"
            )


def scaled_value_and_grad(
    loss_fn: Callable,
    *,
    has_aux: bool = False,
    argnums: int = 0,
    policy=None,
    axis_name: str | tuple[str, ...] | None = None,
    accumulate: int = 1,
    grad_transform: Callable[[Any], Any] | None = None,
) -> Callable[..., ScaledGrads]:
    """`jax.value_and_grad` with a loss scaler: scale, differentiate, unscale, decide.

    `fn = scaled_value_and_grad(loss_fn)` takes what applies the gradients first, then
    `loss_fn`'s own arguments, any of them: `fn(optimizer, *args, **kwargs) -> ScaledGrads(value,
    grads, grads_finite, grad_norm, scaler)`. `optimizer` holds the scale and must skip a
    non-finite step, as PyTorch's `scaler.step(optimizer)` does: an `amp.Optimizer` (NNX), an
    `amp.TrainState`, or `(scaler, opt_state)` for an optax optimizer wrapped in
    `amp.skip_nonfinite` (pure pytrees, Equinox). A plain `nnx.Optimizer` or optax state, which
    would apply a non-finite step, is refused before any step, and so is a bare scaler. The
    loss is taken in float32 and multiplied by the scale, the gradients (with respect to
    argument `argnums`: a params pytree, or a Flax NNX module, whose `nnx.Param` state is
    differentiated) are unscaled in float32, and one scalar, their global norm, decides
    whether all are finite. The scaler comes back adjusted.

    The loss is traced once more, to read what it computes in (`amp.dtype_report`), where
    `policy=` or the optimizer's precision (an `amp.TrainState`'s, an `amp.Optimizer`'s)
    computes in half precision, or nothing scales the loss. Refused with a ValueError naming
    the fix, before any step: under a half precision, a loss whose matmuls and convolutions
    all run in float32 (a network without `dtype=`); with no scaler (`NoOpLossScale`: fp32,
    bf16, no precision), one that runs any in float16, whose small gradients flush to zero
    (precision "fp16" with `loss_scaling="none"` declares that on purpose, and so does a
    `StaticLossScale(1.0)`; float16 matmuls no gradient flows through, a frozen network's, pass).
    A loss with no matmul passes. A `loss_fn` wrapped in `autocast` is refused: it would cast the
    targets too; wrap the network.

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
        >>> loss, grads, finite, norm, scaler = grad_fn((scaler, opt_state), params, x)
        >>> updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
        >>> bool(finite), round(float(loss), 3), float(scaler.loss_scale)
        (True, 0.09, 65536.0)
        >>> loss, grads, finite, norm, scaler = grad_fn((scaler, opt_state), params, x * 1e4)   # float16 overflows
        >>> updates, opt_state = tx.update(grads, opt_state, params, grads_finite=finite, grad_norm=norm)
        >>> bool(finite), float(scaler.loss_scale), int(amp.stats(opt_state)["skipped"])   # skipped, backed off
        (False, 32768.0, 1)
    """
    refuse_unless(callable(loss_fn), "loss_fn", loss_fn, "callable")
    flag("has_aux", has_aux)
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    ok = axis_name is None or (names and all(isinstance(n, str) for n in names))
    refuse_unless(ok, "axis_name", axis_name, "None, an axis name or a tuple of axis names")
    traced = isinstance(accumulate, jax.core.Tracer)  # a number of micro-batches shapes the program: never traced
    refuse_unless(not traced, "accumulate", accumulate, "an integer >= 1", ValueError)
    accumulate = config_number("accumulate", accumulate, "an integer >= 1", lambda k: k >= 1, integer=True)
    optional_callable("grad_transform", grad_transform)
    ok = isinstance(argnums, int) and not isinstance(argnums, bool) and argnums >= 0
    refuse_unless(ok, "argnums", argnums, "a non-negative int (one differentiated argument)")
    named_policy, policy = policy, as_policy(policy)

    def scaled_grads(scaler, args, kwargs, declared):  # (scaled gradients, the float32 loss, aux)
        def scaled(*args):
            loss, aux = split_aux(loss_fn(*args, **kwargs), has_aux)
            loss = _float32_loss(loss)
            return scaler.scale(loss), (loss, aux)

        if policy is not None:
            if isinstance(args[argnums], nnx.Module):
                raise ValueError("policy= casts plain pytrees; give an NNX module its dtype= and param_dtype= instead")
            args = policy.cast_to_compute(args)
        unscaled = isinstance(scaler, NoOpLossScale) and (declared is None or declared.compute_dtype != jnp.float16)
        backward = None
        if unscaled:  # its float16 matmuls beyond the forward's (traced only where the forward has some)
            loss_only = lambda *args: jnp.asarray(split_aux(loss_fn(*args, **kwargs), has_aux)[0], jnp.float32)  # noqa: E731
            backward = (nnx.grad if isinstance(args[argnums], nnx.Module) else jax.grad)(loss_only, argnums=argnums)
        if unscaled or (declared is not None and declared.is_half):  # at trace time: one more trace of the loss
            refuse_mismatched_compute(declared, backward, loss_fn, *args, **kwargs)
        # an NNX module: its nnx.Param state is differentiated, as nnx.Optimizer(wrt=nnx.Param) expects
        value_and_grad = nnx.value_and_grad if isinstance(args[argnums], nnx.Module) else jax.value_and_grad
        (_, (loss, aux)), grads = value_and_grad(scaled, argnums=argnums, has_aux=True)(*args)
        return grads, loss, aux

    def split(x):
        is_key = jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key)
        if jnp.ndim(x) == 0 or is_key:
            raise ValueError(
                f"accumulate={accumulate} splits the leading axis of every positional argument but the "
                f"differentiated one, and one holds a {'key' if is_key else 'scalar'}: give loss_fn "
                "what is not a batch (a scalar, a key, target params) as a keyword argument, which is not split"
            )
        if x.shape[0] % accumulate:
            raise ValueError(f"a batch of {x.shape[0]} does not split into {accumulate} micro-batches")
        return x.reshape(accumulate, x.shape[0] // accumulate, *x.shape[1:])

    def accumulated(scaler, args, kwargs, declared):  # the differentiated argument whole, the others split
        def micro_step(total, micro_args):
            micro_args[argnums] = args[argnums]
            grads, loss, aux = scaled_grads(scaler, tuple(micro_args), kwargs, declared)
            return jax.tree.map(jnp.add, total, grads), (loss, aux)

        micro = jax.tree.map(split, [None if i == argnums else x for i, x in enumerate(args)])
        if not jax.tree.leaves(micro):  # keywords are not split
            raise ValueError(
                f"accumulate={accumulate} splits loss_fn's positional arguments: pass the batch positionally"
            )
        zeros = jax.tree.map(lambda g: jnp.zeros(g.shape, jnp.promote_types(g.dtype, jnp.float32)), args[argnums])
        total, (losses, aux) = jax.lax.scan(micro_step, zeros, micro)
        return jax.tree.map(lambda g: g / accumulate, total), jnp.mean(losses), aux

    def fn(source, *args, **kwargs) -> ScaledGrads:
        scaler, declared = _scaler_of(source), _declared_precision(source, named_policy)
        if len(args) <= argnums:
            raise TypeError(f"loss_fn's argument {argnums} (argnums) is missing: got {len(args)} positional arguments")
        if isinstance(args[argnums], nnx.Module) and accumulate > 1:
            raise ValueError("accumulate > 1 takes a params pytree; for an NNX module, split the batch yourself")
        if not isinstance(args[argnums], nnx.Module):
            _check_arrays(args[argnums], argnums)
        grads, loss, aux = (scaled_grads if accumulate == 1 else accumulated)(scaler, args, kwargs, declared)
        if axis_name is not None:
            grads, loss = jax.lax.pmean((grads, loss), axis_name)
        if grad_transform is not None:
            grads = grad_transform(grads)
        grads = scaler.unscale(grads)  # in float32; one scalar, the global norm, decides
        norm, finite = global_norm(grads)
        return ScaledGrads((loss, aux) if has_aux else loss, grads, finite, norm, scaler.adjust(finite))

    return fn
