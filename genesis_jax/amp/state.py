"""A drop-in for Flax's `TrainState` that carries a loss scaler, and the one update step.

`TrainState` is `flax.training.train_state.TrainState` plus a `scaler` and a precision name,
both keyword-only, so a subclass may add required fields as with Flax's own. `create` wraps
the optimizer in `skip_nonfinite`, so the skip accounting lives in the optimizer state
alone. `train_step(state, loss_fn, *args)` is the step: scale, differentiate, unscale,
decide, clip, apply or skip, adjust the scaler, count.

>>> import jax, jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> predict = amp.autocast(lambda params, x: x @ params["w"], "fp16")   # the matmul in float16
>>> def loss_fn(params, x, y):
...     return jnp.mean((predict(params, x) - y) ** 2)
>>> state = amp.TrainState.create(params={"w": jnp.full(3, 0.125)}, tx=optax.sgd(0.1), precision="fp16")
>>> step = jax.jit(amp.train_step, static_argnums=1)
>>> state, metrics = step(state, loss_fn, jnp.ones((4, 3)), jnp.zeros(4))
>>> float(metrics["loss"]), int(state.step), float(state.scaler.loss_scale)
(0.140625, 1, 65536.0)

Several optimizers share one scaler as PyTorch's `GradScaler` is shared: create their states
with `shared_scaler=True`, step each with `train_step` (a step uses the scale and leaves it
alone), then call `update_scaler(*states)` once per iteration.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from flax.training import train_state

from genesis_jax.amp._checks import flag, optional_callable, refuse_unless
from genesis_jax.amp.grads import scaled_value_and_grad, split_aux
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.loss_scale import LossScale, NoOpLossScale, check_scaler
from genesis_jax.amp.optim import check_options, find_skip_state, holds_float16, skip_nonfinite, skip_rules
from genesis_jax.amp.policy import Precision, get_precision
from genesis_jax.amp.restore import register_restore_check, rules_of
from genesis_jax.amp.testing import FaultInjection


def _setup(tx, params, precision, scaler, *options, model_params: bool = False):
    """`TrainState.create`'s and `Optimizer`'s arguments, each refused with a sentence naming it
    before any array is made; then (params cast, tx wrapped in `skip_nonfinite`, scaler, precision
    name). `model_params`: an NNX model's, which live in the model: not cast, but refused where
    the precision stores params in another dtype. `options`: max_grad_norm, guard,
    advance_schedule_on_skip and strict, `skip_nonfinite`'s."""
    if isinstance(tx, optax.MultiSteps):  # a class of its own, not a GradientTransformation
        raise TypeError("tx is an optax.MultiSteps: give its tx.gradient_transformation()")
    refuse_unless(isinstance(tx, optax.GradientTransformation), "tx", tx, "an optax GradientTransformation")
    if scaler is not None:
        check_scaler(scaler)
    ok = precision is None or isinstance(precision, (str, Precision))
    refuse_unless(ok, "precision", precision, "a precision name, a Precision or None")
    check_options(*options)
    prec = get_precision(precision) if isinstance(precision, str) else precision
    if prec is not None:
        params = _check_model_param_dtypes(params, prec) if model_params else prec.policy.cast_to_param(params)
    # A copy: states created from one scaler object must not share its buffers (donation refuses that).
    if scaler is None:
        scaler = prec.scaler() if prec is not None else NoOpLossScale()
    else:
        scaler = jax.tree.map(jnp.copy, scaler)
    if find_skip_state(jax.eval_shape(tx.init, params), required=False) is not None:  # already wrapped
        if options != (None, None, False, None):
            raise ValueError("tx is already wrapped in skip_nonfinite: give its options there, not here")
    else:  # strict: None is on exactly where parameters are stored in float16 (fp16-full)
        norm, guard, advance, strict = options
        tx = skip_nonfinite(tx, max_grad_norm=norm, guard=guard, advance_schedule_on_skip=advance, strict=strict)
    if holds_float16(params):
        _refuse_nonfinite_at_rest(tx, params)
    return params, tx, scaler, "fp32" if prec is None else prec.name


def _refuse_nonfinite_at_rest(tx, params) -> None:
    """Refuses an optimizer whose update of a zero gradient is not finite in float16 params and
    moments (fp16-full): Adam's default eps, 1e-8, is 0 in float16, so 0 / (0 + 0) is NaN, every
    step is skipped by the strict checks and the scale falls to 1e-38, silently. One eager update."""
    with jax.ensure_compile_time_eval():  # on zeros of the params' shapes: under jit (a trainer's init) too
        zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.result_type(p)), params)
        try:
            updates, state = tx.update(zeros, tx.init(zeros), zeros, loss_scale=jnp.float32(1.0))  # a guard reads it
        except TypeError:  # an update that needs more than the gradients (reduce_on_plateau's value=): unchecked
            return
        finite = all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))
        finite = finite and not bool(find_skip_state(state).skipped)  # the strict checks skipped it
    if not finite:
        raise ValueError(
            "this optimizer's update of a zero gradient is not finite in float16 params and moments (fp16-full): "
            "a constant below float16's range is 0 there (Adam's eps 1e-8), one above 65504 is inf (a learning rate "
            "of 1e5); give Adam eps >= 1e-5, optax.adam(lr, eps=1e-5)"
        )


def _check_model_param_dtypes(params, prec: Precision):
    """An NNX model's floating params, refused where they are not the precision's param dtype
    (a model built in float16 under "fp16" would silently keep float16 master weights)."""
    want = jnp.dtype(prec.param_dtype)
    found = {jnp.dtype(p.dtype) for p in jax.tree.leaves(params) if jnp.issubdtype(p.dtype, jnp.floating)}
    if found - {want}:
        names = ", ".join(sorted(d.name for d in found - {want}))
        raise ValueError(
            f"precision {prec.name!r} stores params in {want.name}, but the model's nnx.Param are {names}: build "
            f"its layers with param_dtype=jnp.{want.name} (dtype= sets what they compute in)"
            + ("" if want == jnp.float16 else ", or use precision='fp16-full' for float16 params")
        )
    return params


def _keep_if(keep, new, old):
    return jax.tree.map(lambda n, o: jnp.where(keep, n, o).astype(o.dtype), new, old)


def _step_or_skip(update, opt_state, scaler, adjusted=None):
    """The one step of both styles, `TrainState.apply_gradients` and `Optimizer.update`:
    `update(loss_scale=)` runs `skip_nonfinite`'s update from `opt_state`, the body every style
    shares (a pure pytree loop calls it itself), which decides on the gradients as applied, cast
    to the params' dtypes (on the decision given, `scaled_value_and_grad`'s, or on their global
    norm), and applies or skips the step, strict checks included: (updates, new opt_state).

    The scaler follows that decision: `adjusted` (None: `scaler.adjust(True)`) where the step
    was taken, `scaler.adjust(False)` on any skip (non-finite gradients, float32 gradients that
    overflow on the cast, a strict check: torch backs off on every skipped step), the scaler
    itself where halted. The divergence guard sees the scale a skip leads to, the backed-off
    one. NoOp and Static scalers adjust to themselves: no select.

    Returns:
        (updates, new opt_state, the scaler after, skipped (not halted), halted before the step).
    """
    adjusted = scaler.adjust(jnp.asarray(True)) if adjusted is None else adjusted
    backed_off = scaler.adjust(jnp.asarray(False))
    before = find_skip_state(opt_state)
    updates, opt_state = update(loss_scale=backed_off.loss_scale)
    after = find_skip_state(opt_state)
    skipped = ~after.halted & (after.skipped != before.skipped)
    if backed_off is not adjusted:
        adjusted = _keep_if(~after.halted, _keep_if(skipped, backed_off, adjusted), scaler)
    return updates, opt_state, adjusted, skipped, before.halted


def _refuse_unscaled_grads(scaler, grads_finite) -> None:
    """Refuses gradients without `grads_finite` where the scaler scales: they did not come from
    `scaled_value_and_grad` (which always gives it), so the loss was never multiplied by the scale,
    small float16 gradients flushed to zero, and the scale would grow on steps it never scaled."""
    if grads_finite is None and not isinstance(scaler, NoOpLossScale):
        raise ValueError(
            f"this optimizer's {type(scaler).__name__} scales the loss, but the gradients came without grads_finite, "
            "so not from amp.scaled_value_and_grad: the loss was never scaled; take them from amp.train_step or "
            "amp.scaled_value_and_grad(loss_fn)(optimizer, ...) and pass grads_finite= and grad_norm="
        )


def _check_grads_match(grads, params) -> None:
    """Refuses gradients whose tree is not the params' (another optimizer's: the actor's given to
    the critic), in a sentence naming the first difference, not optax's tree error from inside."""
    paths = lambda tree: [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]  # noqa: E731
    got, want = paths(grads), paths(params)
    if got != want:
        first = next(
            (f"{g or 'the root'} where the params have {w or 'the root'}" for g, w in zip(got, want) if g != w), None
        )
        first = first or f"{len(got)} leaves where the params have {len(want)}"
        raise ValueError(f"the gradients' tree is not the params' ({first}): were they taken for another optimizer?")


def _refuse_loss_scale_keyword(kwargs: dict) -> None:
    """0.2's `loss_scale=`, which would otherwise fail naming a field the user never wrote."""
    if "loss_scale" in kwargs:
        raise TypeError("loss_scale= is 0.2's spelling of the scaler, removed in 0.4: pass scaler=")


class TrainState(train_state.TrainState):
    """Flax's `TrainState` with a loss scaler; the optimizer is wrapped in `skip_nonfinite`.

    Fields beyond Flax's, all keyword-only (a subclass may add required fields):
    `scaler` (a loss scaler pytree: `state.scaler.loss_scale` is the scale), `precision` (its
    name, static: checkpoints record it), `shared_scaler` (static: this state shares its
    scaler with other optimizers' states, see `update_scaler`) and `pending_backoff` (a
    shared scaler's: a step since the last `update_scaler` was skipped). `step`
    counts updates attempted while not halted.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from typing import Any
        >>> from genesis_jax import amp
        >>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16")
        >>> type(state.scaler).__name__, state.precision, int(state.skipped), bool(state.halted)
        ('DynamicLossScale', 'fp16', 0, False)
        >>> class RLTrainState(amp.TrainState):   # as CleanRL and SBX subclass Flax's
        ...     target_params: Any
        >>> rl = RLTrainState.create(params={"w": jnp.ones(3)}, target_params={"w": jnp.ones(3)}, tx=optax.sgd(0.1))
        >>> rl.target_params["w"].shape
        (3,)
    """

    scaler: LossScale = struct.field(default_factory=NoOpLossScale, kw_only=True)
    pending_backoff: jax.Array = struct.field(default_factory=lambda: jnp.asarray(False), kw_only=True)
    precision: str = struct.field(pytree_node=False, default="fp32", kw_only=True)
    shared_scaler: bool = struct.field(pytree_node=False, default=False, kw_only=True)

    @classmethod
    def create(
        cls,
        *,
        params,
        tx: optax.GradientTransformation,
        apply_fn: Callable | None = None,
        scaler: LossScale | None = None,
        precision: Precision | str | None = None,
        max_grad_norm: float | None = None,
        guard: DivergenceGuard | None = None,
        advance_schedule_on_skip: bool = False,
        strict: bool | None = None,
        shared_scaler: bool = False,
        **kwargs,
    ) -> "TrainState":
        """A new state; `tx` is wrapped in `skip_nonfinite(tx, max_grad_norm=..., guard=...,
        advance_schedule_on_skip=..., strict=...)` unless it already is one.

        Args:
            params: the parameters (cast to the precision's param dtype when one is given).
            tx: any optax optimizer.
            apply_fn: the network's apply function, as in Flax (None: not used).
            scaler: the loss scaler; None: the precision's own (`DynamicLossScale` for fp16,
                none for fp32 and bf16), or no scaling without a precision.
            precision: a precision name or `Precision`; None: parameters as given, "fp32".
            max_grad_norm: `skip_nonfinite`'s: clip the unscaled global norm (None: no clipping).
            guard: `skip_nonfinite`'s: a `DivergenceGuard` that halts the state (None: none).
            advance_schedule_on_skip: `skip_nonfinite`'s: whether a skipped step advances
                learning-rate schedules.
            strict: `skip_nonfinite`'s post-step checks (no non-finite value is ever written
                to the params or optimizer state); None: on exactly where the parameters
                are stored in float16 (fp16-full), off elsewhere.
            shared_scaler: this optimizer shares one scaler with others (`update_scaler`).
            **kwargs: other fields, as in Flax (a subclass's own fields too).
        """
        _refuse_loss_scale_keyword(kwargs)
        optional_callable("apply_fn", apply_fn)
        flag("shared_scaler", shared_scaler)
        options = (max_grad_norm, guard, advance_schedule_on_skip, strict)
        params, tx, scaler, name = _setup(tx, params, precision, scaler, *options)
        if shared_scaler:
            kwargs["pending_backoff"] = _unstepped_flag(jnp.asarray(False))
        kwargs.update(apply_fn=apply_fn, scaler=scaler, precision=name, shared_scaler=shared_scaler)
        return cls(step=jnp.asarray(0, jnp.int32), params=params, tx=tx, opt_state=tx.init(params), **kwargs)

    def apply_gradients(self, *, grads, grads_finite=None, grad_norm=None, scaler=None, **kwargs):
        """One optimizer step from unscaled gradients; a non-finite one changes nothing but
        the skip counts (and the scaler).

        Args:
            grads: unscaled gradients, cast to the params' dtypes (float16 in fp16-full) and
                decided on as cast: one that overflows there is skipped.
            grads_finite: the decision from `scaled_value_and_grad` (None: from the norm, only
                where the scaler does not scale: fp32, bf16; elsewhere it is refused, as the
                gradients did not come from the scaled loss).
            grad_norm: the unscaled global norm it was taken on: accepted, not needed (the clip
                takes the norm of `grads` themselves).
            scaler: the scaler adjusted for this step (None: `self.scaler` adjusted by the
                step's decision). A step skipped all the same (float32 gradients that overflow
                on the cast to float16 params, a strict check) backs off instead:
                `self.scaler.adjust(False)`, as torch backs off on every skipped step. A halted
                state keeps its scaler. With `shared_scaler` the state keeps its scaler and
                records a skipped step for `update_scaler`; the divergence guard sees the scale
                a skip leads to all the same.
            **kwargs: other fields to replace, as in Flax; a name no field has is given to the
                optimizer's update (`value=loss` for `optax.contrib.reduce_on_plateau`).
        """
        _refuse_loss_scale_keyword(kwargs)
        _refuse_unscaled_grads(self.scaler, grads_finite)
        _check_grads_match(grads, self.params)
        extra = {name: kwargs.pop(name) for name in list(kwargs) if name not in self.__dataclass_fields__}
        skip_args = dict(grads_finite=grads_finite, grad_norm=grad_norm, **extra)
        update = functools.partial(self.tx.update, grads, self.opt_state, self.params, **skip_args)
        try:
            updates, opt_state, scaler, skipped, halted = _step_or_skip(update, self.opt_state, self.scaler, scaler)
        except TypeError as err:  # optax's own words name the argument, not how to give it here
            if "required keyword-only argument" not in str(err):
                raise
            raise TypeError(
                f"this optimizer's update needs more than the gradients ({err}): give it to "
                "state.apply_gradients(grads=..., value=loss, ...) after amp.scaled_value_and_grad; "
                "train_step passes only the gradients"
            ) from None
        if self.shared_scaler:  # update_scaler adjusts the shared scaler once per iteration
            scaler, kwargs["pending_backoff"] = self.scaler, self.pending_backoff | skipped
        step = self.step + (~halted).astype(jnp.int32)
        params = optax.apply_updates(self.params, updates)
        return self.replace(step=step, params=params, opt_state=opt_state, scaler=scaler, **kwargs)

    def __getattr__(self, name):  # only for a name no field or method has
        if name == "loss_scale":
            raise AttributeError("TrainState has no attribute 'loss_scale' (0.2's name, removed): use state.scaler")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def skipped(self) -> jax.Array:
        """Updates skipped: non-finite gradients (or, in strict mode, a non-finite result)."""
        return find_skip_state(self.opt_state).skipped

    @property
    def skip_streak(self) -> jax.Array:
        """Skipped updates in a row, up to now."""
        return find_skip_state(self.opt_state).consecutive_skips

    @property
    def halted(self) -> jax.Array:
        """The divergence guard stopped training; the state no longer changes."""
        return find_skip_state(self.opt_state).halted


def _train_state_rules(state: TrainState, read) -> list:
    """What a run writes into a `TrainState`: its scaler's rules, a step >= 0, then skip
    counts bounded by that step (the train state's restore check)."""
    step = read(state.step)
    rules = rules_of(state.scaler, read, "scaler.") + [("step", step, step >= 0, ">= 0")]
    try:
        skips = find_skip_state(state.opt_state)
    except ValueError:  # an optimizer without skip_nonfinite keeps no counts
        return rules
    return rules + [(f"opt_state.{field}", *rest) for field, *rest in skip_rules(skips, read, step)]


register_restore_check(TrainState, _train_state_rules)


def train_step(
    state: TrainState,
    loss_fn: Callable[..., Any],
    *args,
    has_aux: bool = False,
    axis_name: str | None = None,
    faults: FaultInjection | None = None,
    grad_transform: Callable[[Any, TrainState], Any] | None = None,
) -> tuple[TrainState, dict]:
    """One pure, jit-able update: `scaled_value_and_grad` then `apply_gradients`.

    Args:
        state: a `TrainState`.
        loss_fn: `(params, *args) -> loss`, or `-> (loss, aux)` with `has_aux`; the loss is
            taken in float32. Under a half-precision `state.precision`, a loss whose matmuls
            and convolutions all run in float32 is refused when traced, before any step
            (`scaled_value_and_grad`).
        *args: `loss_fn`'s other arguments (a batch, a key, targets: any number, or none).
        has_aux: whether `loss_fn` returns `(loss, aux)`.
        axis_name: inside `pmap` / `shard_map`, the axis to average gradients over.
        faults: an `amp.testing.FaultInjection`: loss spikes and non-finite gradients, by `state.step`.
        grad_transform: `(scaled_grads, state) -> scaled_grads` before the finite decision.

    Returns:
        (the new state, metrics: loss, aux (None without `has_aux`), grad_norm (unscaled,
        before clipping), grads_finite, loss_scale (the scale after this step), halted).

    Examples:
        >>> import jax, jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> def temperature_loss(log_alpha, entropy):   # no batch, no aux: fine
        ...     return -log_alpha * (entropy + 1.0)
        >>> state = amp.TrainState.create(params=jnp.float32(0.0), tx=optax.sgd(0.1), precision="fp16")
        >>> state, metrics = jax.jit(amp.train_step, static_argnums=1)(state, temperature_loss, jnp.float32(-2.0))
        >>> float(metrics["loss"]), round(float(state.params), 6), bool(metrics["grads_finite"])
        (0.0, -0.1, True)
    """
    refuse_unless(isinstance(state, TrainState), "state", type(state).__name__, "an amp.TrainState")
    refuse_unless(callable(loss_fn), "loss_fn", loss_fn, "callable")
    flag("has_aux", has_aux)
    ok = faults is None or isinstance(faults, FaultInjection)
    refuse_unless(ok, "faults", faults, "an amp.testing.FaultInjection or None")
    optional_callable("grad_transform", grad_transform)

    def loss_with_faults(params, *args):
        loss, aux = split_aux(loss_fn(params, *args), has_aux)
        if faults is not None and faults.loss_spike_steps:
            loss = faults.spike_loss(jnp.asarray(loss, jnp.float32), state.step)
        return loss, aux

    def transform(grads):
        if faults is not None and faults.nonfinite_rate > 0:
            grads = faults.poison_grads(grads, state.step)
        return grads if grad_transform is None else grad_transform(grads, state)

    grad_fn = scaled_value_and_grad(loss_with_faults, has_aux=True, axis_name=axis_name, grad_transform=transform)
    (loss, aux), grads, finite, grad_norm, scaler = grad_fn(state, state.params, *args)
    new = state.apply_gradients(grads=grads, grads_finite=finite, grad_norm=grad_norm, scaler=scaler)
    metrics = dict(loss=loss, aux=aux, grad_norm=grad_norm.astype(jnp.float32), grads_finite=finite)
    return new, {**metrics, "loss_scale": new.scaler.loss_scale, "halted": new.halted}


def _is_train_state(node) -> bool:
    return isinstance(node, TrainState)


# The pending flags update_scaler (or create) wrote, by id, while they live: a state that still
# holds one has not stepped since. A step writes a new flag, eagerly and within one trace.
_UNSTEPPED = weakref.WeakValueDictionary()


def _unstepped_flag(like):
    flag = jnp.zeros_like(like)
    _UNSTEPPED[id(flag)] = flag
    return flag


def _check_shared(nodes) -> None:
    """Refuses a call with no step since the last (or since create) where that can be seen, and
    states holding different scalers: their types always, their values where not traced."""
    if all(_UNSTEPPED.get(id(node.pending_backoff)) is node.pending_backoff for node in nodes):
        raise ValueError(
            "update_scaler was called with no step since its last call (or since create): step the optimizers "
            "(train_step or apply_gradients), then call update_scaler once per iteration"
        )
    scalers = [node.scaler for node in nodes]
    same = all(jax.tree.structure(s) == jax.tree.structure(scalers[0]) for s in scalers)
    pairs = [(a, b) for s in scalers[1:] for a, b in zip(jax.tree.leaves(scalers[0]), jax.tree.leaves(s)) if a is not b]
    if same and pairs and not any(isinstance(x, jax.core.Tracer) for pair in pairs for x in pair):
        same = all(np.array_equal(a, b) for a, b in jax.device_get(pairs))
    if not same:
        shown = ", ".join(type(s).__name__ if isinstance(s.loss_scale, jax.core.Tracer) else repr(s) for s in scalers)
        raise ValueError(
            f"update_scaler adjusts one scaler shared by all its states, but they hold different ones ({shown}): "
            "create each with the same scaler= and shared_scaler=True"
        )


@jax.jit
def _shared_adjust(scaler, pending):
    """The shared scaler after an iteration: one backoff if any optimizer saw a non-finite
    gradient (however many did), growth counted only on iterations clean for all."""
    return scaler.adjust(~functools.reduce(jnp.logical_or, pending))


def update_scaler(*states):
    """The iteration's end for optimizers sharing one scaler: PyTorch's `scaler.update()`.

    Each state was created with `shared_scaler=True` and stepped by `train_step` (or
    `apply_gradients`), which scaled by the shared scale, skipped its own non-finite steps and
    left the scaler alone. This adjusts the scaler once, by whether every step since the last
    call had finite gradients, and gives it to every state. Works eagerly, under `jit` and
    under `vmap`.

    Refused with a ValueError: states holding different scalers (under `jit` or `vmap`, where
    the values are traced, their types alone are compared), and, as torch's `update()` with no
    inf checks recorded, a call with no step by any of its states since the last call or since
    `create`, which would count as a clean iteration and grow the scale. That is seen where a
    state still holds the flag the last call wrote, eagerly or within one traced function;
    one that has since come through a `jit` boundary, a `lax.cond` or `scan` carry or a
    checkpoint restore holds a new flag and counts as stepped, as before.

    Args:
        *states: the `TrainState`s sharing the scaler, or one pytree (dict, tuple) holding them.

    Returns:
        The states, as given: a tuple for several, the pytree for one.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> loss_fn = lambda params, x: jnp.mean(jnp.square(x * params))
        >>> make = lambda: amp.TrainState.create(params=jnp.ones(3), tx=optax.adam(1e-3), precision="fp16",
        ...                                      shared_scaler=True)
        >>> actor, critic = make(), make()
        >>> actor, _ = amp.train_step(actor, loss_fn, jnp.ones(3))
        >>> critic, _ = amp.train_step(critic, loss_fn, jnp.full(3, jnp.inf))   # the critic overflows
        >>> actor, critic = amp.update_scaler(actor, critic)
        >>> int(actor.skipped), int(critic.skipped), float(actor.scaler.loss_scale), int(critic.scaler.backoffs)
        (0, 1, 32768.0, 1)
    """
    tree = states[0] if len(states) == 1 else states
    nodes = [node for node in jax.tree.leaves(tree, is_leaf=_is_train_state) if _is_train_state(node)]
    if not nodes:
        raise TypeError(f"update_scaler takes amp.TrainStates, got {type(tree).__name__}")
    if not all(node.shared_scaler for node in nodes):
        raise ValueError(
            "update_scaler adjusts a scaler shared by several optimizers: create each state with "
            "TrainState.create(..., shared_scaler=True) (a state alone adjusts its own scaler in train_step)"
        )
    _check_shared(nodes)
    scaler = _shared_adjust(nodes[0].scaler, [node.pending_backoff for node in nodes])
    # each its own copy: a state donated to a jitted step (donate_argnums) would delete the others'
    own = lambda: jax.tree.map(jnp.copy, scaler)  # noqa: E731
    new = lambda node: node.replace(scaler=own(), pending_backoff=_unstepped_flag(node.pending_backoff))
    return jax.tree.map(lambda node: new(node) if _is_train_state(node) else node, tree, is_leaf=_is_train_state)


def _count(x) -> int:
    return int(np.sum(np.asarray(x[...] if isinstance(x, nnx.Variable) else x)))


def _optimizer_counts(state) -> dict:
    """steps, skipped, skip_rate and halted of a TrainState, an nnx.Optimizer or an optimizer state."""
    has_steps = _is_stepper(state)
    found = find_skip_state(state.opt_state if has_steps else state, required=False)
    if found is None:
        what = "an amp.TrainState, an nnx.Optimizer or an optimizer state of amp.skip_nonfinite"
        raise TypeError(f"amp.stats reads {what}, got {type(state).__name__}")
    skipped, halted = _count(found.skipped), bool(_count(found.halted))  # halted: any seed's
    if not has_steps:
        return {"skipped": skipped, "halted": halted}
    steps = _count(state.step)
    return {"steps": steps, "skipped": skipped, "skip_rate": skipped / steps if steps else 0.0, "halted": halted}


def _scaler_fields(state) -> dict:
    """scale, backoffs and precision of a TrainState or amp.Optimizer; none for an optimizer state."""
    if not isinstance(state, (TrainState, Optimizer)):
        return {}
    scaler = state.scaler.get_value() if isinstance(state, Optimizer) else state.scaler
    scale, backoffs = float(np.asarray(scaler.loss_scale).mean()), _count(getattr(scaler, "backoffs", 0))
    return {"scale": scale, "backoffs": backoffs, "precision": state.precision}


def _is_stepper(node) -> bool:
    return isinstance(node, (TrainState, nnx.Optimizer))


def _named(states, named_states) -> dict:
    """Each state by name (its keyword, or its position); a dict, list or tuple of states (as
    `update_scaler` takes them) gives each of its own by key. None is left out."""
    named = {}
    for name, s in [*enumerate(states), *named_states.items()]:
        if type(s) in (dict, list, tuple) and any(map(_is_stepper, jax.tree.leaves(s, is_leaf=_is_stepper))):
            named.update({str(k): v for k, v in (s.items() if isinstance(s, dict) else enumerate(s)) if v is not None})
        elif s is not None:
            named[str(name)] = s
    return named


def stats(*states, **named_states) -> dict:
    """Host-side counts of one optimizer, or of several.

    Args:
        *states: `amp.TrainState`s, `amp.Optimizer`s, `nnx.Optimizer`s wrapping `skip_nonfinite`, or
            `skip_nonfinite`'s optimizer states; or one dict, list or tuple of them. Under a seed
            axis the counts are summed over seeds and the scale averaged.
        **named_states: the same, named: `stats(critic=qf_state, actor=actor_state)`; a
            None is left out (`alpha=None`, a temperature that is not learned).

    Returns:
        For one: steps (taken or skipped, while not halted), skipped, skip_rate, halted (the
        divergence guard stopped it: every later update is skipped uncounted) and, for a
        `TrainState` or `amp.Optimizer`, scale, backoffs (times the scaler backed off) and precision. For
        several: `optimizers` (each one's steps, skipped, skip_rate, halted), and the scale, backoffs
        and precision where they hold the same (a shared scaler); where they differ, each
        optimizer's own beside its counts.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from genesis_jax import amp
        >>> amp.stats(amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.sgd(0.1), precision="fp16"))
        ... # doctest: +NORMALIZE_WHITESPACE
        {'steps': 0, 'skipped': 0, 'skip_rate': 0.0, 'halted': False,
         'scale': 65536.0, 'backoffs': 0, 'precision': 'fp16'}
    """
    named = _named(states, named_states)
    if not named:  # alpha=None: no such optimizer
        raise TypeError("amp.stats needs at least one state")
    if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(list(named.values()))):
        raise TypeError(
            "amp.stats reads the counts on the host: call it outside jit (inside, a TrainState's skipped, "
            "skip_streak, halted and scaler.loss_scale)"
        )
    counts = {name: _optimizer_counts(s) for name, s in named.items()}
    scalers = {name: _scaler_fields(s) for name, s in named.items()}
    first = next(iter(scalers.values()))
    if len(named) == 1:
        return {**next(iter(counts.values())), **first}
    if all(fields == first for fields in scalers.values()):
        return {"optimizers": counts, **first}
    return {"optimizers": {name: {**counts[name], **scalers[name]} for name in counts}}


class Optimizer(nnx.Optimizer):
    """Flax NNX's `TrainState`: an `nnx.Optimizer` that owns its loss scaler and skips
    non-finite steps, in one call as `train_step` is for linen.

    `tx` is wrapped in `skip_nonfinite` (as `TrainState.create` does, with the same options);
    the scaler lives in `optimizer.scaler` (an `nnx.Variable`) and `update` adjusts and stores
    it itself: nothing to write back. `amp.scaled_value_and_grad(loss_fn)(optimizer, model,
    ...)` reads the scale from it, so the gradients can only be applied by an optimizer that
    skips: a plain `nnx.Optimizer` is refused there before any step.

    Examples:
        >>> import jax.numpy as jnp, optax
        >>> from flax import nnx
        >>> from genesis_jax import amp
        >>> model = nnx.Linear(3, 1, dtype=jnp.float16, rngs=nnx.Rngs(0))
        >>> optimizer = amp.Optimizer(model, optax.adam(1e-3), precision="fp16")
        >>> loss_fn = lambda model, x: jnp.mean(model(x).astype(jnp.float32) ** 2)
        >>> for x in (jnp.ones((4, 3)), jnp.full((4, 3), jnp.inf)):   # the second overflows: skipped
        ...     loss, grads, finite, norm, _ = amp.scaled_value_and_grad(loss_fn)(optimizer, model, x)
        ...     _ = optimizer.update(model, grads, grads_finite=finite, grad_norm=norm)
        >>> amp.stats(optimizer)  # doctest: +NORMALIZE_WHITESPACE
        {'steps': 2, 'skipped': 1, 'skip_rate': 0.5, 'halted': False,
         'scale': 32768.0, 'backoffs': 1, 'precision': 'fp16'}
    """

    def __init__(
        self,
        model,
        tx: optax.GradientTransformation,
        *,
        wrt=nnx.Param,
        precision: Precision | str | None = None,
        scaler: LossScale | None = None,
        max_grad_norm: float | None = None,
        guard: DivergenceGuard | None = None,
        advance_schedule_on_skip: bool = False,
        strict: bool | None = None,
    ):
        options = (max_grad_norm, guard, advance_schedule_on_skip, strict)
        _, tx, scaler, precision = _setup(tx, nnx.state(model, wrt), precision, scaler, *options, model_params=True)
        super().__init__(model, tx, wrt=wrt)
        self.scaler, self.precision = nnx.Variable(scaler), precision

    def update(self, model, grads, /, **kwargs):
        """`nnx.Optimizer.update` that skips a non-finite step and adjusts the scaler by it, in
        the step `TrainState.apply_gradients` takes (`grads_finite=`, `grad_norm=` as there);
        a halted optimizer's `step` stays, as a halted `TrainState`'s does."""
        _refuse_unscaled_grads(self.scaler.get_value(), kwargs.get("grads_finite"))

        def update(loss_scale):
            updates = super(Optimizer, self).update(model, grads, loss_scale=loss_scale, **kwargs)
            return updates, nnx.as_pure(self.opt_state)

        step = self.step[...]
        updates, _, scaler, _, halted = _step_or_skip(update, nnx.as_pure(self.opt_state), self.scaler.get_value())
        self.step[...] = step + (~halted).astype(step.dtype)
        self.scaler.set_value(scaler)
        return updates
