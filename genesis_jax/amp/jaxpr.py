"""What a traced function computes in, read from its jaxpr: `dtype_report`; and `cast_per_op`,
which runs a function with `torch.autocast`'s rule per operation (matmuls and convolutions in
half precision; exp, log, pow, squares, sums and cumulative sums in float32), for `amp.autocast`.

>>> import jax.numpy as jnp
>>> from genesis_jax import amp
>>> report = amp.dtype_report(lambda w, x: jnp.sum(amp.autocast(lambda w, x: x @ w, "fp16")(w, x)),
...                           jnp.ones((3, 2)), jnp.ones((4, 3)))
>>> report.dtypes("matmul"), report.dtypes("reduction"), report.outputs
({'float16': 1}, {'float32': 1}, ('float32',))
"""

from __future__ import annotations

import collections
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

KINDS = {"dot_general": "matmul", "conv_general_dilated": "conv"}
KINDS.update({op: "reduction" for op in ("argmax", "argmin", "cumlogsumexp", "cummax", "cummin", "cumprod", "cumsum")})
KINDS.update({f"reduce_{op}": "reduction" for op in ("sum", "max", "min", "prod", "and", "or")})
KINDS.update({op: "exp/log" for op in "exp exp2 expm1 log log1p logistic pow integer_pow square".split()})
# torch.autocast's float32 list, as JAX primitives (softmax and logsumexp are made of them)
FLOAT32_OPS = frozenset(
    "exp exp2 expm1 log log1p pow integer_pow square rsqrt erf_inv lgamma digamma tan sinh cosh acos asin "
    "reduce_sum reduce_prod cumsum cumprod cumlogsumexp".split()
)
_INLINED = frozenset({"jit", "pjit"})  # inlined: a jitted function's ops are cast too


class OpDtype(NamedTuple):
    """One operation: its kind ("matmul", "conv", "reduction" or "exp/log"), its primitive,
    its operands' dtypes, its output dtype, and where it sits ("jit(relu)/scan": the calls
    and loops around it; "" at the top)."""

    kind: str
    op: str
    inputs: tuple[str, ...]
    output: str
    where: str


class DtypeReport(NamedTuple):
    """`dtype_report`'s result: `ops` in trace order, and the dtypes of the outputs."""

    ops: tuple[OpDtype, ...]
    outputs: tuple[str, ...]

    def dtypes(self, kind: str) -> dict[str, int]:
        """How many ops of `kind` compute in each dtype (their first operand's): for
        `assert report.dtypes("matmul") == {"float16": 4}`."""
        return dict(collections.Counter(op.inputs[0] for op in self.ops if op.kind == kind))

    def __str__(self) -> str:
        rows = [f"{o.kind:<10} {o.op:<21} {' x '.join(o.inputs):<20} -> {o.output:<9} {o.where}" for o in self.ops]
        counts = ", ".join(f"{k} {self.dtypes(k)}" for k in dict.fromkeys(o.kind for o in self.ops))
        return "\n".join([*rows, f"{counts}; outputs {dict(collections.Counter(self.outputs))}"])


def _ops(jaxpr, where: str):
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in KINDS:
            dtypes = tuple(str(v.aval.dtype) for v in eqn.invars)
            yield OpDtype(KINDS[name], name, dtypes, str(eqn.outvars[0].aval.dtype), where)
        inner = f"{where}/{name}" + (f"({eqn.params['name']})" if isinstance(eqn.params.get("name"), str) else "")
        for sub in core.jaxprs_in_params(eqn.params):
            yield from _ops(sub, inner.lstrip("/"))


def dtype_report(fn, *args, **kwargs) -> DtypeReport:
    """Which dtype every matmul, convolution, reduction, exp and log of `fn(*args, **kwargs)`
    computes in, read from its jaxpr (`jax.make_jaxpr`) through jit, scan, cond, while, remat
    and custom_jvp/vjp calls; gradients too when `fn` takes them. Nothing runs.

    Print it for a table; assert on it in a test, e.g. that a whole training step's matmuls
    run in float16 (a Flax module without `dtype=` leaves them in float32, whatever the
    `TrainState`'s precision) and its loss in float32:

    Examples:
        >>> import jax, jax.numpy as jnp, flax.linen as nn
        >>> from genesis_jax import amp
        >>> net, x = nn.Dense(2), jnp.ones((4, 3))
        >>> params = net.init(jax.random.PRNGKey(0), x)
        >>> amp.dtype_report(net.apply, params, x).dtypes("matmul")   # no dtype=: float32
        {'float32': 1}
        >>> amp.dtype_report(amp.autocast(net, "fp16").apply, params, x).dtypes("matmul")
        {'float16': 1}
    """
    closed, shapes, _ = _trace(fn, args, kwargs)
    outputs = tuple(str(s.dtype) for s in jax.tree.leaves(shapes))
    return DtypeReport(tuple(_ops(closed.jaxpr, "")), outputs)


def refuse_mismatched_compute(declared, backward, fn, *args, **kwargs) -> None:
    """Refuses `fn(*args, **kwargs)` whose matmuls and convolutions disagree with the precision
    `declared` (a `Precision`, or None where none is): where it computes in half precision and
    they all run wider (the network ignores it: no `dtype=`, or it casts up), so nothing runs in
    half precision; and, where nothing scales the loss, any float16 one that gradients flow back
    through, whose small gradients flush to zero (a float16 network under fp32, bf16 or no
    precision: forgetting `GradScaler`). `backward`: None where the loss is scaled, else `fn`'s
    gradient function, whose float16 matmuls beyond the forward's are the backward's (a frozen
    float16 network's, behind `stop_gradient`, have none). A function with no matmul or
    convolution passes."""
    report = dtype_report(fn, *args, **kwargs)
    ops = [(kind, d, n) for kind in ("matmul", "conv") for d, n in report.dtypes(kind).items()]
    shown = ", ".join(f"{n} {kind}(s) in {d}" for kind, d, n in ops)
    float16 = lambda report: sum(report.dtypes(k).get("float16", 0) for k in ("matmul", "conv"))  # noqa: E731
    if backward is not None and float16(report) and float16(dtype_report(backward, *args)) > float16(report):
        name = "none" if declared is None else declared.name
        raise ValueError(
            f"loss_fn runs {shown}, and nothing scales the loss (precision {name!r}, "
            "no loss scaler): float16 gradients below 6e-8 flush to zero; give TrainState.create or amp.Optimizer "
            "precision='fp16' (its DynamicLossScale), or pass (amp.DynamicLossScale(), opt_state); "
            "amp.StaticLossScale(1.0) trains in float16 unscaled on purpose"
        )
    half = jnp.dtype(declared.compute_dtype) if declared is not None and declared.is_half else None
    if half is None or not ops or any(jnp.dtype(d).itemsize <= half.itemsize for _, d, n in ops):
        return
    raise ValueError(
        f"precision {declared.name!r} computes nothing in {half.name}: loss_fn runs "
        f"{shown}: give the network's layers dtype=jnp.{half.name} (Flax "
        f"linen or NNX), or wrap the network in amp.autocast(network, {declared.name!r}) (a function, a linen or "
        "Equinox module); amp.dtype_report(loss_fn, ...) shows what runs in what"
    )


def _dtype(x):
    return x.dtype if hasattr(x, "dtype") else np.result_type(x)


def _floating(x) -> bool:
    return jnp.issubdtype(_dtype(x), jnp.floating)


def _cast(x, dtype):
    return jax.lax.convert_element_type(x, dtype) if _floating(x) and _dtype(x) != dtype else x


def _eval(closed, args, half):
    """`jax.core.eval_jaxpr` of a closed jaxpr, casting each op's operands by torch.autocast's rule."""
    env = dict(zip(closed.constvars, closed.consts)) | dict(zip(closed.invars, args))
    read = lambda v: v.val if isinstance(v, core.Literal) else env[v]  # noqa: E731
    for eqn in closed.eqns:
        name, values, params = eqn.primitive.name, [read(v) for v in eqn.invars], dict(eqn.params)
        if name in _INLINED:
            env.update(zip(eqn.outvars, _eval(params["jaxpr"], values, half)))
            continue
        if name in ("dot_general", "conv_general_dilated") and all(map(_floating, values)):
            values = [_cast(x, half) for x in values]
            if params.get("preferred_element_type") == jnp.result_type(*(v.aval.dtype for v in eqn.invars)):
                params["preferred_element_type"] = half
        elif name in FLOAT32_OPS or (name == "mul" and eqn.invars[0] is eqn.invars[1]):  # x * x: a square
            values = [_cast(x, jnp.promote_types(_dtype(x), jnp.float32)) if _floating(x) else x for x in values]
        elif any(core.jaxprs_in_params(params)) or "callback" in name or name == "bitcast_convert_type":
            values = _like(values, eqn.invars)  # as traced
            if name in _BODIES_CAST:
                outs = _BODIES_CAST[name](params, values, half)
                env.update(zip(eqn.outvars, _like(outs, eqn.outvars)))
                continue
        else:  # the widest floating operand's dtype, weak-typed constants aside (as jnp promotes)
            strong = [_dtype(x) for x, v in zip(values, eqn.invars) if _floating(x) and not v.aval.weak_type]
            if strong:
                widest = jnp.result_type(*strong)
                values = [_cast(x, widest) for x in values]
        with eqn.ctx.manager:
            outs = eqn.primitive.bind(*values, **eqn.primitive.get_bind_params(params))
        env.update(zip(eqn.outvars, outs if eqn.primitive.multiple_results else [outs]))
    return [read(v) for v in closed.outvars]


def _scan(params, values, half):
    n_consts, n_carry = params["num_consts"], params["num_carry"]
    consts, init, xs = values[:n_consts], values[n_consts : n_consts + n_carry], values[n_consts + n_carry :]

    def body(carry, x):
        outs = _eval(params["jaxpr"], [*consts, *carry, *x], half)
        return _like(outs[:n_carry], carry), outs[n_carry:]

    carry, ys = jax.lax.scan(body, init, xs, params["length"], reverse=params["reverse"], unroll=params["unroll"])
    return [*carry, *ys]


def _while(params, values, half):
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts, init = values[:n_cond], values[n_cond : n_cond + n_body], values[n_cond + n_body :]
    go_on = lambda carry: _eval(params["cond_jaxpr"], [*cond_consts, *carry], half)[0]  # noqa: E731
    body = lambda carry: _like(_eval(params["body_jaxpr"], [*body_consts, *carry], half), carry)  # noqa: E731
    return jax.lax.while_loop(go_on, body, init)


def _cond(params, values, half):
    index, operands = values[0], values[1:]
    outs = lambda closed: lambda *ops: _like(_eval(closed, ops, half), closed.out_avals)  # noqa: E731  # branches agree
    return jax.lax.switch(index, [outs(closed) for closed in params["branches"]], *operands)


def _remat(params, values, half):
    closed = core.ClosedJaxpr(params["jaxpr"], ())
    body = lambda *args: _like(_eval(closed, args, half), closed.outvars)  # noqa: E731
    return jax.checkpoint(body, prevent_cse=params["prevent_cse"], policy=params["policy"])(*values)


def _like(values, like):
    """`values` cast to the dtypes of `like` (values, avals or jaxpr variables): a loop's carry
    and a branch's outputs keep their types."""
    return [_cast(x, getattr(x_like, "aval", x_like).dtype) for x, x_like in zip(values, like)]


# Re-run with their bodies cast by the rule; their inputs and outputs keep their traced dtypes.
_BODIES_CAST = {"scan": _scan, "while": _while, "cond": _cond, "remat2": _remat}


def _trace(fn, args, kwargs):
    """`fn(*args, **kwargs)`'s closed jaxpr, output shapes and inputs: the arrays among the
    leaves of `fn` (an Equinox module's, say) and its arguments; other leaves are static."""
    leaves, tree = jax.tree.flatten((fn, args, kwargs))
    is_array = [isinstance(x, (jax.Array, np.ndarray)) for x in leaves]

    def flat(*arrays):
        it = iter(arrays)
        fn, args, kwargs = tree.unflatten([next(it) if a else x for x, a in zip(leaves, is_array)])
        return fn(*args, **kwargs)

    arrays = [x for x, a in zip(leaves, is_array) if a]
    return *jax.make_jaxpr(flat, return_shape=True)(*arrays), arrays


def cast_per_op(fn, half, *args, **kwargs):
    """`fn(*args, **kwargs)`, with every matmul and convolution in `half` and the ops of
    `FLOAT32_OPS` in float32, whatever dtypes it was written with; its outputs as computed."""
    closed, shapes, arrays = _trace(fn, args, kwargs)
    return jax.tree.unflatten(jax.tree.structure(shapes), _eval(closed, arrays, half))
