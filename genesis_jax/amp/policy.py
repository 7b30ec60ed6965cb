"""Named precision policies.

A precision is a `jmp.Policy` (param / compute / output dtypes) plus the kind of loss
scaling it needs by default:

>>> from genesis_jax.amp.policy import get_precision
>>> p = get_precision("fp16")
>>> p.policy.compute_dtype.dtype, p.loss_scaling
(dtype('float16'), 'dynamic')

The environment variables `GENESIS_PRECISION` / `ENABLE_FP16_TRAINING` are the front ends'
(`genesis_jax.run.config.resolve_precision_name`): amp takes values.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import jax
import jax.numpy as jnp
import jmp

from genesis_jax.amp._checks import refuse_unless
from genesis_jax.amp.loss_scale import DynamicLossScale, NoOpLossScale, StaticLossScale, check_loss_scale_args

logger = logging.getLogger("genesis_jax")

_NAMED_POLICIES = {
    "fp32": "params=float32,compute=float32,output=float32",
    "bf16": "params=float32,compute=bfloat16,output=float32",
    "fp16": "params=float32,compute=float16,output=float32",
    # The whole model stored and run in half precision (the ".half()" mode).
    "fp16-full": "params=float16,compute=float16,output=float32",
}
PRECISION_NAMES = ("fp32", "bf16", "fp16", "fp16-full", "auto")  # spelled out: the API page shows the value
"""The precision names `get_precision` accepts: fp32, bf16, fp16, fp16-full and auto (fp16 on a
GPU, fp32 elsewhere); a jmp policy string is accepted too."""


@dataclasses.dataclass(frozen=True)
class Precision:
    """A resolved precision: its name, the jmp policy and the default loss scaling.

    Examples:
        >>> from genesis_jax import amp
        >>> p = amp.get_precision("bf16")
        >>> p.name, p.compute_dtype.dtype, p.param_dtype.dtype, p.loss_scaling, p.is_half
        ('bf16', dtype(bfloat16), dtype('float32'), 'none', True)
    """

    name: str
    policy: jmp.Policy
    loss_scaling: str

    def __post_init__(self):
        refuse_unless(isinstance(self.name, str) and self.name, "a Precision's name", self.name, "a non-empty string")
        refuse_unless(isinstance(self.policy, jmp.Policy), "a Precision's policy", self.policy, "a jmp.Policy")
        check_loss_scale_args(self.loss_scaling)

    @property
    def compute_dtype(self):
        return self.policy.compute_dtype

    @property
    def param_dtype(self):
        return self.policy.param_dtype

    @property
    def is_half(self) -> bool:
        return jnp.dtype(self.policy.compute_dtype).itemsize == 2

    def scaler(self, init_scale: float = 2.0**16, growth_interval: int = 2000, min_scale: float | None = None):
        """A new loss scaler of this precision's kind: `DynamicLossScale` (with these
        settings), `StaticLossScale(init_scale)` or `NoOpLossScale`.

        Examples:
            >>> from genesis_jax import amp
            >>> amp.get_precision("fp16").scaler(init_scale=1024.0).loss_scale
            Array(1024., dtype=float32)
            >>> type(amp.get_precision("bf16").scaler()).__name__
            'NoOpLossScale'
        """
        check_loss_scale_args(self.loss_scaling, init_scale, growth_interval, min_scale)
        if self.loss_scaling == "dynamic":
            return DynamicLossScale(init_scale=init_scale, growth_interval=growth_interval, min_scale=min_scale)
        return StaticLossScale(init_scale) if self.loss_scaling == "static" else NoOpLossScale()


def as_policy(policy) -> jmp.Policy | None:
    """A `jmp.Policy` from one, a `Precision`, a precision name or jmp policy string, or None."""
    refuse_unless(isinstance(policy, (type(None), jmp.Policy, Precision, str)), "policy", policy, ACCEPTED_POLICIES)
    policy = get_precision(policy) if isinstance(policy, str) else policy
    return policy.policy if isinstance(policy, Precision) else policy


ACCEPTED_POLICIES = "a jmp.Policy, a Precision, a precision name or None"
_ACCEPTED = (
    ", ".join(PRECISION_NAMES) + " or a jmp policy string such as 'params=float32,compute=float16,output=float32'"
)


def recorded_spelling(name):
    """How runs record a precision: a name lower-cased ("FP16" as "fp16"), a jmp policy string
    lower-cased without spaces, anything else as given (for its check to refuse)."""
    if not isinstance(name, str):
        return name
    key = name.strip().lower()
    if "=" in key:
        return "".join(key.split())
    return key if key in PRECISION_NAMES else name


def check_precision(name: str, loss_scaling: str | None = None) -> str:
    """`get_precision`'s checks without asking JAX for its backend ('auto' stays unresolved),
    so a config can make them before JAX has started.

    Returns:
        The loss scaling the precision will use (for 'auto' without one: dynamic, the
        strictest to check its settings against).
    """
    if isinstance(name, str) and name.strip().lower() == "auto":
        check_loss_scale_args(loss_scaling or "dynamic")
        return loss_scaling or "dynamic"
    return get_precision(name, loss_scaling).loss_scaling


# The fp16-full warning's own registry, and one place it is issued from: under Python's default
# filter it is shown once per process, however many callers resolve 'fp16-full' (a run resolves
# it several times); a filter such as "always" (pytest.warns) still sees every one.
_FP16_FULL_REGISTRY: dict = {}


def _warn_fp16_full(name: str) -> None:
    text = f"precision {name!r} stores parameters and optimizer moments in float16; it is less stable than 'fp16'"
    line, registry = _warn_fp16_full.__code__.co_firstlineno, _FP16_FULL_REGISTRY
    warnings.warn_explicit(f"{text} (float32 master weights)", UserWarning, __file__, line, __name__, registry)


def _check_policy_dtypes(name: str, policy: jmp.Policy) -> None:
    """Refuses a policy string asking for a dtype amp does not train in: float64 runs as float32
    unless JAX's x64 mode is on (JAX truncates it, while the run would record float64)."""
    kinds = {"params": policy.param_dtype, "compute": policy.compute_dtype, "output": policy.output_dtype}
    allowed = {jnp.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32)}
    allowed |= {jnp.dtype(jnp.float64)} if jax.config.jax_enable_x64 else set()
    for kind, dtype in kinds.items():
        if jnp.dtype(dtype) not in allowed:
            raise ValueError(
                f"precision {name!r} asks for {kind}={jnp.dtype(dtype).name}, which JAX computes as float32 here "
                f"(jax_enable_x64 is off): give float16, bfloat16 or float32; accepted: {_ACCEPTED}"
            )


def get_precision(name: str, loss_scaling: str | None = None) -> Precision:
    """The `Precision` for a name or jmp policy string.

    Args:
        name: fp32, bf16, fp16, fp16-full, auto, or a jmp policy string
            ("params=float32,compute=float16,output=float32").
        loss_scaling: dynamic, static or none; None: dynamic for float16 compute or params, else none.

    Returns:
        A `Precision`: the name, the `jmp.Policy` and the loss scaling.

    Raises:
        ValueError: for anything else, naming the accepted values.

    Examples:
        >>> from genesis_jax import amp
        >>> p = amp.get_precision("fp16")
        >>> p.compute_dtype.dtype, p.loss_scaling
        (dtype('float16'), 'dynamic')
        >>> amp.get_precision("params=float32,compute=bfloat16,output=float32").loss_scaling
        'none'
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"precision must be a non-empty string, got {name!r}; accepted: {_ACCEPTED}")
    key = recorded_spelling(name)
    if key == "auto":
        key = "fp16" if jax.default_backend() == "gpu" else "fp32"
        logger.info("precision 'auto' chose %s on backend %s", key, jax.default_backend())
    if key in _NAMED_POLICIES:
        policy = jmp.get_policy(_NAMED_POLICIES[key])
    elif "=" in key:  # "params=float32, compute=float16": spaces say nothing in a policy string
        try:
            policy = jmp.get_policy(key)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unknown precision {name!r} ({err}); accepted: {_ACCEPTED}") from None
        _check_policy_dtypes(name, policy)
    else:
        raise ValueError(f"unknown precision {name!r}; accepted: {_ACCEPTED}")
    if jnp.dtype(policy.param_dtype) == jnp.float16:  # fp16-full, by name or spelled out
        _warn_fp16_full(key)
    if loss_scaling is None:  # float16 needs loss scaling: its range ends at 6e-8, bfloat16's at float32's
        # float16 params too: their gradients are float16 whatever the compute
        half = jnp.dtype(jnp.float16) in (jnp.dtype(policy.compute_dtype), jnp.dtype(policy.param_dtype))
        loss_scaling = "dynamic" if half else "none"
    return Precision(name=key, policy=policy, loss_scaling=loss_scaling)
