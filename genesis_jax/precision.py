"""Named precision policies and their resolution from arguments and the environment.

A precision is a `jmp.Policy` (param / compute / output dtypes) plus the kind of loss
scaling it needs by default:

>>> from genesis_jax.precision import get_precision
>>> p = get_precision("fp16")
>>> p.policy.compute_dtype.dtype, p.loss_scaling
(dtype('float16'), 'dynamic')

Only the CLI and the config constructors call `resolve_precision_name`, which reads
`GENESIS_PRECISION` / `ENABLE_FP16_TRAINING`; everything below them takes values.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import warnings
from typing import Literal, Mapping

import jax
import jax.numpy as jnp
import jmp

from genesis_jax.loss_scale import DEFAULT_GROWTH_INTERVAL, DEFAULT_INIT_SCALE, check_loss_scale_args, make_loss_scale
from genesis_jax.reliability import (
    DEFAULT_GUARD_MIN_SCALE,
    DEFAULT_MAX_CONSECUTIVE_SKIPS,
    DivergenceGuard,
    FaultInjection,
)

logger = logging.getLogger("genesis_jax")

LOSS_SCALINGS = ("dynamic", "static", "none")

_NAMED_POLICIES = {
    "fp32": ("params=float32,compute=float32,output=float32", "none"),
    "bf16": ("params=float32,compute=bfloat16,output=float32", "none"),
    "fp16": ("params=float32,compute=float16,output=float32", "dynamic"),
    # The whole model stored and run in half precision (the ".half()" mode).
    "fp16-full": ("params=float16,compute=float16,output=float32", "dynamic"),
}
PRECISION_NAMES = tuple(_NAMED_POLICIES) + ("auto",)

_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")


@dataclasses.dataclass(frozen=True)
class Precision:
    """A resolved precision: its name, the jmp policy and the default loss scaling."""

    name: str
    policy: jmp.Policy
    loss_scaling: str

    @property
    def compute_dtype(self):
        return self.policy.compute_dtype

    @property
    def param_dtype(self):
        return self.policy.param_dtype

    @property
    def is_half(self) -> bool:
        return jnp.dtype(self.policy.compute_dtype).itemsize == 2


def _accepted() -> str:
    return (
        ", ".join(PRECISION_NAMES) + " or a jmp policy string such as 'params=float32,compute=float16,output=float32'"
    )


def _auto_name() -> str:
    chosen = "fp16" if jax.default_backend() == "gpu" else "fp32"
    logger.info("precision 'auto' chose %s on backend %s", chosen, jax.default_backend())
    return chosen


def check_precision(name: str, loss_scaling: str | None = None) -> str:
    """`get_precision`'s checks without asking JAX for its backend ('auto' stays unresolved),
    so a config can make them before JAX has started.

    Returns:
        The loss scaling the precision will use (for 'auto' without one: dynamic, the
        strictest to check its settings against).
    """
    if isinstance(name, str) and name.strip().lower() == "auto":
        return _checked_loss_scaling(loss_scaling or "dynamic", loss_scaling)
    return get_precision(name, loss_scaling).loss_scaling


def get_precision(name: str, loss_scaling: str | None = None) -> Precision:
    """The `Precision` for a name or jmp policy string.

    Args:
        name: fp32, bf16, fp16, fp16-full, auto, or a jmp policy string
            ("params=float32,compute=float16,output=float32").
        loss_scaling: dynamic, static or none; None: dynamic for float16 compute, else none.

    Returns:
        A `Precision`: the name, the `jmp.Policy` and the loss scaling.

    Raises:
        ValueError: for anything else, naming the accepted values.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"precision must be a non-empty string, got {name!r}; accepted: {_accepted()}")
    key = name.strip().lower()
    if key == "auto":
        key = _auto_name()
    if key in _NAMED_POLICIES:
        policy_string, default_scaling = _NAMED_POLICIES[key]
        policy = jmp.get_policy(policy_string)
        if key == "fp16-full":
            warnings.warn(
                "precision 'fp16-full' stores parameters and optimizer moments in float16; "
                "it is less stable than 'fp16' (float32 master weights)",
                stacklevel=2,
            )
    elif "=" in key:
        try:
            policy = jmp.get_policy(key)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unknown precision {name!r} ({err}); accepted: {_accepted()}") from None
        default_scaling = "dynamic" if jnp.dtype(policy.compute_dtype) == jnp.float16 else "none"
    else:
        raise ValueError(f"unknown precision {name!r}; accepted: {_accepted()}")
    scaling = _checked_loss_scaling(default_scaling if loss_scaling is None else loss_scaling, loss_scaling)
    return Precision(name=key, policy=policy, loss_scaling=scaling)


def _checked_loss_scaling(scaling: str, given: str | None) -> str:
    """`scaling` if it is one of LOSS_SCALINGS; else an error naming the value `given`."""
    if scaling not in LOSS_SCALINGS:
        raise ValueError(f"unknown loss scaling {given!r}; accepted: {', '.join(LOSS_SCALINGS)}")
    return scaling


def get_policy(name: str) -> jmp.Policy:
    """The `jmp.Policy` for a precision name or jmp policy string."""
    return get_precision(name).policy


def resolve_precision_name(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Chooses the precision name: explicit argument > GENESIS_PRECISION > ENABLE_FP16_TRAINING > fp32."""
    if explicit is not None:
        return explicit
    env = os.environ if environ is None else environ
    named = env.get("GENESIS_PRECISION")
    if named is not None and named.strip():
        return named.strip()
    flag = env.get("ENABLE_FP16_TRAINING")
    if flag is None or not flag.strip():
        return "fp32"
    word = flag.strip().lower()
    if word in _TRUE_WORDS:
        return "fp16"
    if word in _FALSE_WORDS:
        return "fp32"
    raise ValueError(
        f"ENABLE_FP16_TRAINING={flag!r} is not understood; use one of "
        f"{', '.join(_TRUE_WORDS)} (fp16) or {', '.join(_FALSE_WORDS)} (fp32)"
    )


# Config fields a resumed run may change (how it runs, not what it computes): the device
# layout, and the divergence guard's limits.
RESUMABLE_BASE_FIELDS = (
    "devices",
    "coordinator_address",
    "num_processes",
    "process_id",
    "heartbeat_timeout",
    "guard_min_scale",
    "max_consecutive_skips",
)


@dataclasses.dataclass(frozen=True)
class MixedPrecisionConfig:
    """The mixed-precision fields every trainer config shares (a dataclass base): the
    policy, the loss scaler, gradient clipping, the divergence guard and fault injection.
    `precision=None` means fp32: a config never reads the environment itself; `from_env`
    (and the CLI) resolve GENESIS_PRECISION / ENABLE_FP16_TRAINING, once, where the run is
    set up. Each field's text below is also its `--help` line."""

    precision: str | None = None
    """fp32 | bf16 | fp16 | fp16-full | auto | a jmp policy string. Default on the command
    line: $GENESIS_PRECISION, else $ENABLE_FP16_TRAINING, else fp32."""
    loss_scaling: Literal["dynamic", "static", "none"] | None = None
    """None: the precision's own (dynamic for fp16, none for fp32 and bf16)."""
    init_loss_scale: float = DEFAULT_INIT_SCALE
    """The loss scale to start from (static scaling: the scale)."""
    growth_interval: int = DEFAULT_GROWTH_INTERVAL
    """Finite steps in a row after which a dynamic scale doubles."""
    min_loss_scale: float | None = None
    """A floor for the dynamic scale. None: no floor."""
    max_grad_norm: float | None = 1.0
    """Clip the unscaled gradients' global norm to this. None: no clipping."""
    guard_min_scale: float | None = DEFAULT_GUARD_MIN_SCALE
    """Stop the run when a skip would bring the loss scale below this. None: no floor."""
    max_consecutive_skips: int | None = DEFAULT_MAX_CONSECUTIVE_SKIPS
    """Stop the run after more than this many skipped updates in a row. None: no limit."""
    inject_nonfinite: float = 0.0
    """Fault injection: make the gradients non-finite on this fraction of updates (seeded)."""
    inject_loss_spike: tuple[int, ...] = ()
    """Fault injection: optimizer steps whose loss is multiplied by loss-spike-factor."""
    loss_spike_factor: float = 1e6
    """Fault injection: the factor of inject-loss-spike."""

    def __post_init__(self):
        for field in dataclasses.fields(self):  # every trainer config's floats, its subclass's too
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{field.name.replace('_', '-')} must be a finite number, got {value!r}")
        object.__setattr__(self, "precision", "fp32" if self.precision is None else self.precision)
        object.__setattr__(self, "inject_loss_spike", tuple(self.inject_loss_spike))
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max-grad-norm must be > 0 (None: no clipping), got {self.max_grad_norm!r}")
        # Fail now on an unknown name or bad scaler, guard or fault settings; without touching
        # a device, which would start JAX before the CLI joins other processes.
        scaling = check_precision(self.precision, self.loss_scaling)
        check_loss_scale_args(scaling, self.init_loss_scale, self.growth_interval, self.min_loss_scale)
        self.divergence_guard()
        self.fault_injection(0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields):
        """The config with `fields`, its precision (unless given) from GENESIS_PRECISION /
        ENABLE_FP16_TRAINING in `environ` (default: `os.environ`).

        >>> from genesis_jax.ppo import PPOConfig
        >>> PPOConfig.from_env({"ENABLE_FP16_TRAINING": "true"}, total_steps=1024).precision
        'fp16'
        """
        return cls(**{**fields, "precision": resolve_precision_name(fields.get("precision"), environ)})

    def train_precision(self) -> Precision:
        return get_precision(self.precision, self.loss_scaling)

    def make_loss_scale(self):
        return make_loss_scale(
            self.train_precision().loss_scaling, self.init_loss_scale, self.growth_interval, self.min_loss_scale
        )

    def divergence_guard(self):
        return DivergenceGuard(self.guard_min_scale, self.max_consecutive_skips)

    def fault_injection(self, seed: int):
        return FaultInjection(self.inject_nonfinite, self.inject_loss_spike, self.loss_spike_factor, seed)
