"""The mixed-precision settings every algorithm's config shares (a dataclass base), and how
they become the amp pieces: the scaler, the divergence guard and the fault injection."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Mapping

from genesis_jax.amp.guard import (
    DEFAULT_GUARD_MIN_SCALE,
    DEFAULT_MAX_CONSECUTIVE_SKIPS,
    DivergenceGuard,
    FaultInjection,
)
from genesis_jax.amp.loss_scale import (
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    check_loss_scale_args,
    make_loss_scale,
)
from genesis_jax.amp.policy import Precision, check_precision, get_precision, resolve_precision_name
from genesis_jax.amp.state import TrainState

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

        >>> from genesis_jax.algos.ppo import PPOConfig
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

    def faults(self, seed: int) -> FaultInjection | None:
        """The fault injection for `train_step`, or None when none is asked for."""
        faults = self.fault_injection(seed)
        return faults if faults.active else None

    def create_train_state(self, params, tx, apply_fn=None) -> TrainState:
        """An `amp.TrainState` as this config says: the precision, its loss scaler, clipping
        and the divergence guard on `tx` (wrapped in `skip_nonfinite`)."""
        return TrainState.create(
            params=params,
            tx=tx,
            apply_fn=apply_fn,
            loss_scale=self.make_loss_scale(),
            precision=self.train_precision(),
            max_grad_norm=self.max_grad_norm,
            guard=self.divergence_guard(),
        )
