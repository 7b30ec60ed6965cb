"""genesis_jax.amp: mixed precision for JAX training loops, usable alone.

It imports nothing else from genesis_jax, and installs with jax, flax, optax, jmp and chex
alone (`pip install genesis-jax`). One surface serves every style of loop: Flax linen with
`TrainState`, Flax NNX with `nnx.Optimizer`, pure pytrees with optax (PureJaxRL, Equinox),
and several optimizers in separately jitted updates (CleanRL, SBX).

- precision: `get_precision("fp16")` gives a `Precision` (jmp policy: params, compute and
  output dtypes; its default loss scaling) for fp32, bf16, fp16, fp16-full or a jmp policy
  string; `PRECISION_NAMES` lists the names;
- loss scalers with PyTorch `GradScaler`'s rule, as pytrees: `DynamicLossScale`,
  `StaticLossScale`, `NoOpLossScale` (`LossScale`: any of them); `scaler.loss_scale` is the scale;
- `scaled_value_and_grad`: `jax.value_and_grad` with a scaler: scale, differentiate,
  unscale, decide "all finite" on the global norm, adjust the scaler;
- `skip_nonfinite`: an optax wrapper that skips non-finite steps (PyTorch's rule), clips,
  counts skips, and halts on divergence (`DivergenceGuard`);
- `TrainState` (Flax's, with a scaler; subclassable), `train_step` (the whole update) and,
  for several optimizers sharing a scaler, `update_scaler` once per iteration; `stats`;
- `autocast`: a network without a `dtype` field in half precision, float32 outputs;
  `precision_rules` / `FLOAT32_RULES` / `PrecisionRule`: chosen Flax modules in float32;
- `amp.testing.FaultInjection`: seeded non-finite gradients and loss spikes for tests.

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16")
>>> type(state.scaler).__name__, float(state.scaler.loss_scale), int(state.skipped)
('DynamicLossScale', 65536.0, 0)
"""

import importlib
import warnings

from genesis_jax.amp import testing
from genesis_jax.amp.grads import autocast, scaled_value_and_grad
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.loss_scale import DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale
from genesis_jax.amp.optim import skip_nonfinite
from genesis_jax.amp.policy import PRECISION_NAMES, Precision, get_precision
from genesis_jax.amp.rules import FLOAT32_RULES, PrecisionRule, precision_rules
from genesis_jax.amp.state import TrainState, stats, train_step, update_scaler

__all__ = [
    # precision
    "PRECISION_NAMES",
    "Precision",
    "get_precision",
    # loss scalers
    "DynamicLossScale",
    "LossScale",
    "NoOpLossScale",
    "StaticLossScale",
    # gradients
    "scaled_value_and_grad",
    # the optimizer
    "DivergenceGuard",
    "skip_nonfinite",
    # the train state, its step, a shared scaler, counts
    "TrainState",
    "stats",
    "train_step",
    "update_scaler",
    # networks: half precision without a dtype field, float32 islands
    "FLOAT32_RULES",
    "PrecisionRule",
    "autocast",
    "precision_rules",
    # test helpers (amp.testing.FaultInjection)
    "testing",
]

# 0.2's names: each still works until 0.4, with a DeprecationWarning naming its 0.3 spelling.
# name: (module, attribute, the 0.3 spelling)
_DEPRECATED = {
    "value_and_grad": ("grads", "value_and_grad", "amp.scaled_value_and_grad (its result carries .grad_norm)"),
    "ScaledGradients": ("grads", "ScaledGradients", "amp.scaled_value_and_grad's result, ScaledGrads"),
    "scaled_loss_grad": ("grads", "scaled_loss_grad", "amp.scaled_value_and_grad"),
    "unscale": ("grads", "unscale", "scaler.unscale(grads), or amp.scaled_value_and_grad"),
    "float32_loss": ("grads", "float32_loss", "loss.astype(jnp.float32) (scaled_value_and_grad casts it)"),
    "resolve_policy": ("grads", "resolve_policy", "amp.get_precision(name).policy"),
    "get_policy": ("policy", "get_policy", "amp.get_precision(name).policy"),
    "resolve_precision_name": (
        "policy",
        "resolve_precision_name",
        "genesis_jax.amp.policy.resolve_precision_name (the CLI's environment variables)",
    ),
    "DEFAULT_INIT_SCALE": ("loss_scale", "DEFAULT_INIT_SCALE", "amp.DynamicLossScale().loss_scale (2^16)"),
    "DEFAULT_GROWTH_INTERVAL": ("loss_scale", "DEFAULT_GROWTH_INTERVAL", "amp.DynamicLossScale().growth_interval"),
    "all_finite": ("loss_scale", "all_finite", "amp.scaled_value_and_grad's grads_finite"),
    "make_loss_scale": ("loss_scale", "make_loss_scale", "amp.DynamicLossScale / StaticLossScale / NoOpLossScale"),
    "SkipNonFiniteState": ("optim", "SkipNonFiniteState", "amp.stats(opt_state)"),
    "skip_state": ("optim", "skip_state", "amp.stats(opt_state)"),
    "advance_schedules": ("optim", "advance_schedules", "skip_nonfinite(advance_schedule_on_skip=True)"),
    "step_if_finite": ("optim", "step_if_finite", "amp.skip_nonfinite"),
    "shared_scale_step": ("multi", "shared_scale_step", "TrainState.create(shared_scaler=True) and amp.train_step"),
    "update_shared_scale": ("multi", "update_shared_scale", "amp.update_scaler(*states)"),
    "share_scale": ("multi", "share_scale", "amp.update_scaler(*states)"),
    "with_precision_rules": ("rules", "with_precision_rules", "@amp.precision_rules() on the method"),
    "FaultInjection": ("guard", "FaultInjection", "amp.testing.FaultInjection"),
    "DEFAULT_GUARD_MIN_SCALE": ("guard", "DEFAULT_GUARD_MIN_SCALE", "amp.DivergenceGuard().min_scale"),
    "DEFAULT_MAX_CONSECUTIVE_SKIPS": (
        "guard",
        "DEFAULT_MAX_CONSECUTIVE_SKIPS",
        "amp.DivergenceGuard().max_consecutive_skips",
    ),
}


def __getattr__(name):
    if name not in _DEPRECATED:
        raise AttributeError(f"module 'genesis_jax.amp' has no attribute {name!r}")
    module, attribute, new = _DEPRECATED[name]
    warnings.warn(
        f"amp.{name} is deprecated since genesis-jax 0.3 and goes in 0.4: use {new}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(f"genesis_jax.amp.{module}"), attribute)
