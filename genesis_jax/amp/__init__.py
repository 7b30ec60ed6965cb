"""genesis_jax.amp: mixed precision for JAX training loops, usable alone.

It imports nothing else from genesis_jax. A loop of your own needs this and nothing more:

- precisions: `get_precision("fp16")` / `get_policy` (jmp policies: params, compute,
  output dtypes) for fp32, bf16, fp16 and fp16-full, `resolve_precision_name` for the
  GENESIS_PRECISION / ENABLE_FP16_TRAINING variables, `autocast` for networks without a
  `dtype` field;
- loss scalers with PyTorch `GradScaler`'s rule, as pytrees: `DynamicLossScale`,
  `StaticLossScale`, `NoOpLossScale`;
- `value_and_grad`: scale, differentiate, unscale, decide "all finite", adjust the scaler;
- `skip_nonfinite`: an optax wrapper that skips non-finite steps, clips, counts skips and
  halts on divergence (`DivergenceGuard`); `skip_state` finds its counts in any state;
- `TrainState`: Flax's `TrainState` with a loss scaler; `train_step` composes the two;
- several optimizers under one scaler, as PyTorch shares a `GradScaler`: `shared_scale_step`
  per optimizer, then one `update_shared_scale` and `share_scale` per iteration;
- `precision_rules` / `FLOAT32_RULES`: chosen Flax modules (norms, heads) in float32;
- `FaultInjection`: seeded non-finite gradients and loss spikes for tests.

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16")
>>> type(state.loss_scale).__name__, float(state.loss_scale.loss_scale), int(state.skipped)
('DynamicLossScale', 65536.0, 0)
"""

from genesis_jax.amp.grads import (
    ScaledGradients,
    autocast,
    float32_loss,
    resolve_policy,
    scaled_loss_grad,
    unscale,
    value_and_grad,
)
from genesis_jax.amp.guard import (
    DEFAULT_GUARD_MIN_SCALE,
    DEFAULT_MAX_CONSECUTIVE_SKIPS,
    DivergenceGuard,
    FaultInjection,
)
from genesis_jax.amp.loss_scale import (
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    DynamicLossScale,
    LossScale,
    NoOpLossScale,
    StaticLossScale,
    all_finite,
    make_loss_scale,
)
from genesis_jax.amp.multi import share_scale, shared_scale_step, update_shared_scale
from genesis_jax.amp.optim import (
    SkipNonFiniteState,
    advance_schedules,
    skip_nonfinite,
    skip_state,
    step_if_finite,
)
from genesis_jax.amp.policy import (
    PRECISION_NAMES,
    Precision,
    get_policy,
    get_precision,
    resolve_precision_name,
)
from genesis_jax.amp.rules import FLOAT32_RULES, PrecisionRule, precision_rules, with_precision_rules
from genesis_jax.amp.state import TrainState, stats, train_step

__all__ = [
    # precisions
    "PRECISION_NAMES",
    "Precision",
    "autocast",
    "get_policy",
    "get_precision",
    "resolve_policy",
    "resolve_precision_name",
    # loss scalers
    "DEFAULT_GROWTH_INTERVAL",
    "DEFAULT_INIT_SCALE",
    "DynamicLossScale",
    "LossScale",
    "NoOpLossScale",
    "StaticLossScale",
    "all_finite",
    "make_loss_scale",
    # gradients
    "ScaledGradients",
    "float32_loss",
    "scaled_loss_grad",
    "unscale",
    "value_and_grad",
    # the optimizer side
    "SkipNonFiniteState",
    "advance_schedules",
    "skip_nonfinite",
    "skip_state",
    "step_if_finite",
    # the train state and the update step
    "TrainState",
    "stats",
    "train_step",
    # several optimizers under one loss scaler
    "share_scale",
    "shared_scale_step",
    "update_shared_scale",
    # float32 islands
    "FLOAT32_RULES",
    "PrecisionRule",
    "precision_rules",
    "with_precision_rules",
    # divergence and faults
    "DEFAULT_GUARD_MIN_SCALE",
    "DEFAULT_MAX_CONSECUTIVE_SKIPS",
    "DivergenceGuard",
    "FaultInjection",
]
