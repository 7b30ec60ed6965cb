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
- `scaled_value_and_grad`: `jax.value_and_grad` given what applies the gradients (an
  `Optimizer`, a `TrainState` or `(scaler, opt_state)`: it must skip, as `scaler.step` does):
  scale, differentiate, unscale, decide "all finite" on the global norm, adjust the scaler;
- `skip_nonfinite`: an optax wrapper that skips non-finite steps (PyTorch's rule), clips,
  counts skips, and halts on divergence (`DivergenceGuard`);
- `TrainState` (Flax's, with a scaler; subclassable), `train_step` (the whole update), its NNX
  twin `Optimizer` (an `nnx.Optimizer` that owns its scaler and skips), and,
  for several optimizers sharing a scaler, `update_scaler` once per iteration; `stats`;
- `autocast`: any function or module (linen, Equinox) in half precision per operation, read
  from its jaxpr as `torch.autocast` decides (matmuls and convolutions in half; exp, log and
  sums in float32), float32 outputs; `dtype_report`: which dtype each matmul, convolution and
  reduction of a traced step computes in; `precision_rules` / `FLOAT32_RULES` /
  `PrecisionRule`: chosen Flax modules in float32;
- `amp.testing.FaultInjection`: seeded non-finite gradients and loss spikes for tests.

>>> import jax.numpy as jnp, optax
>>> from genesis_jax import amp
>>> state = amp.TrainState.create(params={"w": jnp.ones(3)}, tx=optax.adam(1e-3), precision="fp16")
>>> type(state.scaler).__name__, float(state.scaler.loss_scale), int(state.skipped)
('DynamicLossScale', 65536.0, 0)
"""

from genesis_jax.amp import testing  # noqa: F401  (amp.testing, a submodule)
from genesis_jax.amp.grads import autocast, scaled_value_and_grad
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.jaxpr import dtype_report
from genesis_jax.amp.loss_scale import DynamicLossScale, LossScale, NoOpLossScale, StaticLossScale
from genesis_jax.amp.optim import skip_nonfinite
from genesis_jax.amp.policy import PRECISION_NAMES, Precision, get_precision
from genesis_jax.amp.rules import FLOAT32_RULES, PrecisionRule, precision_rules
from genesis_jax.amp.state import Optimizer, TrainState, stats, train_step, update_scaler

# One concern a line: precision; loss scalers; gradients; the optimizer; the train state, its
# step, a shared scaler, counts; networks in half precision without a dtype field, float32 islands.
__all__ = ["PRECISION_NAMES", "Precision", "get_precision"]
__all__ += ["DynamicLossScale", "LossScale", "NoOpLossScale", "StaticLossScale"]
__all__ += ["scaled_value_and_grad"]
__all__ += ["DivergenceGuard", "skip_nonfinite"]
__all__ += ["TrainState", "Optimizer", "stats", "train_step", "update_scaler"]
__all__ += ["FLOAT32_RULES", "PrecisionRule", "autocast", "dtype_report", "precision_rules"]
# amp.testing (FaultInjection) is a submodule, read as amp.testing: not a name of the surface.


# 0.2's names, removed: what to write instead (docs/migrating.md has the whole table).
_REMOVED = {
    "value_and_grad": "amp.scaled_value_and_grad (its result carries .grad_norm)",
    "ScaledGradients": "amp.scaled_value_and_grad's result, ScaledGrads",
    "scaled_loss_grad": "amp.scaled_value_and_grad",
    "unscale": "scaler.unscale(grads), or amp.scaled_value_and_grad",
    "float32_loss": "loss.astype(jnp.float32) (scaled_value_and_grad casts it)",
    "all_finite": "amp.scaled_value_and_grad's grads_finite",
    "resolve_policy": "amp.get_precision(name).policy",
    "get_policy": "amp.get_precision(name).policy",
    "resolve_precision_name": "genesis_jax.run.config.resolve_precision_name (the front ends' environment variables)",
    "make_loss_scale": "amp.DynamicLossScale / StaticLossScale / NoOpLossScale",
    "DEFAULT_INIT_SCALE": "amp.DynamicLossScale().loss_scale (2^16)",
    "DEFAULT_GROWTH_INTERVAL": "amp.DynamicLossScale().growth_interval",
    "SkipNonFiniteState": "amp.stats(opt_state)",
    "skip_state": "amp.stats(opt_state)",
    "advance_schedules": "amp.skip_nonfinite(tx, advance_schedule_on_skip=True)",
    "step_if_finite": "amp.skip_nonfinite",
    "shared_scale_step": "TrainState.create(shared_scaler=True) and amp.train_step",
    "update_shared_scale": "amp.update_scaler(*states)",
    "share_scale": "amp.update_scaler(*states)",
    "with_precision_rules": "@amp.precision_rules() on the method",
    "FaultInjection": "amp.testing.FaultInjection",
    "DEFAULT_GUARD_MIN_SCALE": "amp.DivergenceGuard().min_scale",
    "DEFAULT_MAX_CONSECUTIVE_SKIPS": "amp.DivergenceGuard().max_consecutive_skips",
}


def __getattr__(name):
    removed = f" (0.2's name, removed): use {_REMOVED[name]}" if name in _REMOVED else ""
    raise AttributeError(f"module 'genesis_jax.amp' has no attribute {name!r}{removed}")
