"""World-model training: epochs of shuffled minibatches in `lax.scan` under jit, through
the shared mixed-precision update step, with per-epoch overflow counts and memory stats.

>>> from genesis_jax.world_model import WorldModelConfig, train
>>> result = train(WorldModelConfig(data="synthetic", precision="fp16", epochs=5))  # doctest: +SKIP
>>> result.summary["eval_loss"], result.summary["noise_floor"]                     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax import runs
from genesis_jax.nets.world_model import WorldModel
from genesis_jax.parallel import ParallelConfig, constrain, on_devices, replicated, start_distributed
from genesis_jax.precision import RESUMABLE_BASE_FIELDS, MixedPrecisionConfig
from genesis_jax.reliability import update_options
from genesis_jax.session import Session
from genesis_jax.update import TrainState, mixed_precision_update
from genesis_jax.world_model import data as wm_data


@dataclasses.dataclass(frozen=True)
class WorldModelFields:
    """The world model's own fields (`WorldModelConfig` adds the shared mixed-precision and
    data-parallel ones). Each field's text below is also its `--help` line."""

    data: str = "synthetic"
    """synthetic | a gymnax or gymnasium env id (random policy) | a .npz written by 'genesis-jax collect'."""
    num_sequences: int = 2048
    """Sequences to generate or collect (not for a .npz)."""
    sequence_length: int = 32
    """Steps per sequence (not for a .npz)."""
    eval_fraction: float = 0.2
    """Share of the sequences held out for the eval loss."""
    epochs: int = 20
    """Passes over the training sequences."""
    batch_size: int = 1024
    """Transitions per update."""
    width: int = 128
    """Hidden width."""
    depth: int = 2
    """Hidden layers."""
    core: Literal["mlp", "gru"] = "mlp"
    """The dynamics core."""
    horizon: int = 1
    """Open-loop steps per sample (> 1: a multi-step loss)."""
    lr: float = 1e-3
    """Adam's learning rate."""
    seed: int = 0
    """Seed of the data, the parameters and the fault injection."""


@dataclasses.dataclass(frozen=True)
class WorldModelConfig(WorldModelFields, MixedPrecisionConfig, ParallelConfig):
    """A world-model run: `WorldModelFields`, and the shared `MixedPrecisionConfig` and
    `ParallelConfig` fields (clipping at norm 1.0 by default), as one flat config."""

    # What a resume may change without changing what the run is (see `train`).
    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("epochs",)

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_sequences", "sequence_length", "epochs", "batch_size", "width", "depth", "horizon"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.core not in ("mlp", "gru"):
            raise ValueError(f"core must be mlp or gru, got {self.core!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        self.validate_parallel("batch-size", self.batch_size)
        if self.horizon > self.sequence_length:
            raise ValueError(f"horizon {self.horizon} is longer than the sequences ({self.sequence_length})")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class WorldModelResult:
    """What `train` returns: the summary (as in summary.json), the final state, the metric rows."""

    summary: dict
    train_state: Any
    metrics: list[dict]


def load_data(config: WorldModelConfig) -> dict:
    if config.data == "synthetic":
        return wm_data.synthetic_dataset(config.num_sequences, config.sequence_length, config.seed)
    if config.data.endswith(".npz"):
        return wm_data.load_dataset(config.data)
    # An environment id (gymnax or gymnasium): random-policy data; unknown ids fail there.
    return wm_data.collect_dataset(config.data, config.num_sequences, config.sequence_length, config.seed)


def windows(data: dict, horizon: int) -> dict:
    """Training samples: open-loop windows of `horizon` steps (one-step transitions for 1),
    sequence by sequence; a known per-step noise floor comes along as `floor`."""
    n, length = data["reward"].shape
    if horizon > length:
        raise ValueError(f"horizon {horizon} is longer than the data's sequences ({length} steps)")
    next_obs = data["next_obs"] if "next_obs" in data else data["obs"][:, 1:]
    starts = np.arange(length - horizon + 1)
    take = lambda x: np.stack([x[:, s : s + horizon] for s in starts], 1).reshape((-1, horizon) + x.shape[2:])  # noqa: E731
    samples = {
        "obs": data["obs"][:, starts].reshape(n * len(starts), -1),
        "action": take(data["action"]),
        "next_obs": take(next_obs),
        "reward": take(data["reward"]),
        "terminated": take(data["terminated"]),
    }
    if "floor" in data:
        samples["floor"] = take(data["floor"])
    return samples


def make_model(config: WorldModelConfig, meta: dict, obs_dim: int, precision) -> WorldModel:
    return WorldModel(
        obs_dim=obs_dim,
        action_dim=int(meta["action_dim"]),
        discrete_actions=bool(meta["discrete_actions"]),
        width=config.width,
        depth=config.depth,
        core=config.core,
        dtype=precision.compute_dtype,
        param_dtype=jnp.float32,
    )


def make_loss_fn(model: WorldModel):
    """Float32 loss: obs MSE (mean over dims) + reward MSE + termination BCE, averaged over steps."""

    def loss_fn(params, batch):
        pred_obs, pred_reward, term_logit = model.apply(params, batch["obs"], batch["action"], method=WorldModel.unroll)
        obs_mse = jnp.mean(jnp.square(pred_obs - batch["next_obs"]), axis=-1)
        reward_mse = jnp.square(pred_reward - batch["reward"])
        bce = optax.sigmoid_binary_cross_entropy(term_logit, batch["terminated"])
        per_sample = obs_mse + reward_mse + bce
        return jnp.mean(per_sample), {
            "obs_mse": jnp.mean(obs_mse),
            "reward_mse": jnp.mean(reward_mse),
            "bce": jnp.mean(bce),
        }

    return loss_fn


def activation_bytes(loss_fn, params, batch) -> int:
    """Bytes the forward pass saves for the backward pass: the residuals of `jax.vjp`."""
    residuals = jax.eval_shape(lambda p, b: jax.vjp(lambda q: loss_fn(q, b)[0], p)[1], params, batch)
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(residuals)))


def train(
    config: WorldModelConfig,
    out_dir: str | None = None,
    *,
    checkpoint_every: int = 0,
    grad_transform=None,
    **run_options,
) -> WorldModelResult:
    """Trains a world model as `config` says; `out_dir` (None: nothing written) gets
    metrics.jsonl, summary.json, world_model.png and checkpoints every `checkpoint_every`
    epochs (0: at the end only). `grad_transform(grads, train_state) -> grads` runs before the
    finite check; `run_options` are `Session`'s (resume, overwrite, progress, max_to_keep,
    allow_config_change, writers). Returns a `WorldModelResult`; a guard stop or a signal
    raises as `Session.finish` says."""
    start_distributed(config)  # before anything touches a device
    session = Session(
        out_dir,
        config,
        kind="world-model",
        total=config.epochs,
        position_key="epoch",
        unit="epoch",
        checkpoint_every=checkpoint_every,
        postfix=lambda row: {
            "train": f"{row['train_loss']:.4f}",
            "eval": f"{row['eval_loss']:.4f}",
            "scale": f"{row['loss_scale']:g}",
            "skipped": row["skipped"],
        },
        **run_options,
    )
    mesh = config.mesh()
    precision = config.train_precision()
    dataset = load_data(config)
    train_seqs, eval_seqs = wm_data.split(dataset, config.eval_fraction)
    train_set = {k: jnp.asarray(v) for k, v in windows(train_seqs, config.horizon).items() if k != "floor"}
    eval_samples = windows(eval_seqs, config.horizon)
    floor = eval_samples.pop("floor", None)
    # Known only for one-step prediction: open-loop errors compound beyond the noise.
    noise_floor = float(np.mean(floor)) if floor is not None and config.horizon == 1 else None
    eval_set = {k: jnp.asarray(v) for k, v in eval_samples.items()}
    num_samples = train_set["obs"].shape[0]
    batches_per_epoch = num_samples // config.batch_size
    if batches_per_epoch < 1:
        raise ValueError(f"batch size {config.batch_size} is larger than the {num_samples} training samples")

    model = make_model(config, dataset["meta"], train_set["obs"].shape[-1], precision)
    loss_fn = make_loss_fn(model)
    init_key, run_key = jax.random.split(jax.random.PRNGKey(config.seed))
    sample = jax.tree.map(lambda x: x[:1], train_set)
    params = model.init(init_key, sample["obs"], sample["action"], method=WorldModel.unroll)
    # Adam's default eps (1e-8) underflows to 0 in float16 moments (fp16-full): use 1e-5 there.
    eps = 1e-5 if jnp.dtype(precision.param_dtype) == jnp.float16 else 1e-8
    state = TrainState.create(params, optax.adam(config.lr, eps=eps), config.make_loss_scale(), run_key, precision)
    # Data parallel: state and data replicated, each minibatch's rows split over the devices.
    state, train_set, eval_set = on_devices((state, train_set, eval_set), mesh, replicated(mesh) if mesh else None)
    step = functools.partial(
        mixed_precision_update, loss_fn=loss_fn, **update_options(config, config.seed, grad_transform)
    )

    def epoch(state: TrainState, data: dict):
        rng, perm_key = jax.random.split(state.rng)
        perm = jax.random.permutation(perm_key, num_samples)[: batches_per_epoch * config.batch_size]
        batches = jax.tree.map(lambda x: x[perm].reshape((batches_per_epoch, config.batch_size) + x.shape[1:]), data)
        batches = constrain(batches, mesh, axis=1)
        skipped_before = state.skipped
        state, metrics = jax.lax.scan(step, state.replace(rng=rng), batches)
        finite = metrics["grads_finite"]
        train_loss = jnp.sum(jnp.where(finite, metrics["loss"], 0.0)) / jnp.maximum(jnp.sum(finite), 1)
        return state, {
            "train_loss": train_loss,
            "skipped": state.skipped - skipped_before,
            "loss_scale": state.loss_scale.loss_scale,
            "halted": state.halted,
        }

    batch0 = jax.tree.map(lambda x: x[: config.batch_size], train_set)
    act_bytes = activation_bytes(loss_fn, state.params, batch0)
    compile_start = time.perf_counter()
    epoch_fn = jax.jit(epoch, donate_argnums=0).lower(state, train_set).compile()
    eval_fn = jax.jit(lambda p, b: loss_fn(p, b)[0]).lower(state.params, eval_set).compile()
    compile_seconds = time.perf_counter() - compile_start
    memory = epoch_fn.memory_analysis()
    temp_bytes = int(getattr(memory, "temp_size_in_bytes", 0)) if memory is not None else None
    step_bytes = runs.step_memory_bytes(epoch_fn)
    flops_per_step = runs.matmul_flops(step, state, batch0)  # one optimizer step, for the achieved FLOP/s
    param_bytes = int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)))

    # Only now, with the data and model known to be good, is the output directory touched.
    with session:
        state = session.restore(state)

        def run_epoch(state):
            state, m = epoch_fn(state, train_set)
            return state, {**m, "eval_loss": eval_fn(state.params, eval_set)}

        last_row_time = [time.perf_counter()]

        def to_rows(m, done: int) -> list[dict]:
            now = time.perf_counter()
            elapsed, last_row_time[0] = now - last_row_time[0], now
            return [
                {
                    "epoch": done + 1,
                    "train_loss": float(m["train_loss"]),
                    "eval_loss": float(m["eval_loss"]),
                    "loss_scale": float(m["loss_scale"]),
                    "skipped": int(m["skipped"]),
                    "steps_per_second": batches_per_epoch / elapsed,
                    "halted": bool(m["halted"]),
                }
            ]

        state = session.run(state, run_epoch, to_rows)
        rows = session.rows
        total_updates = int(state.step)
        summary = {
            "data": dataset["meta"]["source"],
            "precision": precision.name,
            "seed": config.seed,
            "width": config.width,
            "depth": config.depth,
            "batch_size": config.batch_size,
            "horizon": config.horizon,
            "final_train_loss": rows[-1]["train_loss"],
            "eval_loss": rows[-1]["eval_loss"],
            "noise_floor": noise_floor,
            "epochs": len(rows),
            "steps_per_second": session.steps_per_second(batches_per_epoch),
            "compile_seconds": compile_seconds,
            "wall_seconds": session.elapsed(),
            "loss_scale": float(state.loss_scale.loss_scale),
            "skipped_updates": int(state.skipped),
            "total_updates": total_updates,
            "overflow_rate": int(state.skipped) / total_updates if total_updates else 0.0,
            "injected_nonfinite": config.fault_injection(config.seed).count_nonfinite(total_updates),
            "activation_bytes": act_bytes,
            "compiled_temp_bytes": temp_bytes,
            "train_step_bytes": step_bytes,
            "flops_per_step": flops_per_step,
            "param_bytes": param_bytes,
            "peak_device_bytes": runs.peak_device_bytes(),
            "device": runs.device_name(),
        }
        plot = lambda rows, path: runs.plot_curves(  # noqa: E731
            rows,
            "epoch",
            ("train_loss", "eval_loss"),
            path / "world_model.png",
            title=f"world model ({precision.name})",
            floor=noise_floor,
        )
        summary = session.finish(summary, state, plot=plot)
    return WorldModelResult(summary=summary, train_state=state, metrics=rows)
