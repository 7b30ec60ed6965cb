"""World-model training on the algorithm template: epochs of shuffled minibatches in
`lax.scan` under jit, through `amp.train_step`, with per-epoch overflow counts, the eval
loss against the data's noise floor, and memory statistics.

>>> from genesis_jax.algos.world_model import WorldModelConfig, train
>>> result = train(WorldModelConfig(data="synthetic", precision="fp16", epochs=5))  # doctest: +SKIP
>>> result.summary["eval_loss"], result.summary["noise_floor"]                     # doctest: +SKIP
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from genesis_jax.algos.base import Algorithm, BenchWorkload, StudyTask
from genesis_jax.algos.world_model import data as wm_data
from genesis_jax.algos.world_model.config import WorldModelConfig
from genesis_jax.amp import TrainState
from genesis_jax.amp.policy import get_precision
from genesis_jax.amp.telemetry import underflow_metrics
from genesis_jax.data import trajectories
from genesis_jax.nets.world_model import WorldModel
from genesis_jax.run import probes
from genesis_jax.run.checkpoint import state_digest
from genesis_jax.run.config import INT32_MAX
from genesis_jax.run.parallel import constrain


class WorldModelState(struct.PyTreeNode):
    train_state: TrainState
    rng: jax.Array  # the minibatch shuffles'


def load_data(config: WorldModelConfig, precision=None) -> dict:
    """The run's dataset, checked (`trajectories.validate_dataset`) against what a run in `precision`
    (default: the config's) can train on, before anything is compiled."""
    precision = precision or config.train_precision()
    if config.data == "synthetic":
        data = wm_data.synthetic_dataset(config.num_sequences, config.sequence_length, config.seed)
    elif config.data == "synthetic-small":
        data = wm_data.small_units_dataset(config.num_sequences, config.sequence_length, config.seed)
    elif config.data == "synthetic-wide":
        data = wm_data.wide_dataset(config.num_sequences, config.sequence_length, config.seed)
    elif config.data.endswith(".npz"):
        data = trajectories.load_dataset(config.data)
    else:  # an environment id (gymnax or gymnasium): random-policy data; unknown ids fail there
        data = trajectories.collect_dataset(config.data, config.num_sequences, config.sequence_length, config.seed)
    trajectories.validate_dataset(data, config.data, precision.compute_dtype, precision.name)
    return data


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


def make_loss_fn(model: WorldModel, weight: float = 1.0):
    """Float32 loss: obs MSE (mean over dims) + reward MSE + termination BCE, averaged over steps,
    times `weight` (the terms in the aux dict stay unweighted)."""

    def loss_fn(params, batch):
        pred_obs, pred_reward, term_logit = model.apply(params, batch["obs"], batch["action"], method=WorldModel.unroll)
        obs_mse = jnp.mean(jnp.square(pred_obs - batch["next_obs"]), axis=-1)
        reward_mse = jnp.square(pred_reward - batch["reward"])
        bce = optax.sigmoid_binary_cross_entropy(term_logit, batch["terminated"])
        per_sample = obs_mse + reward_mse + bce
        return weight * jnp.mean(per_sample), {
            "obs_mse": jnp.mean(obs_mse),
            "reward_mse": jnp.mean(reward_mse),
            "bce": jnp.mean(bce),
        }

    return loss_fn


def activation_bytes(loss_fn, params, batch) -> int:
    """Bytes the forward pass saves for the backward pass: the residuals of `jax.vjp`."""
    residuals = jax.eval_shape(lambda p, b: jax.vjp(lambda q: loss_fn(q, b)[0], p)[1], params, batch)
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(residuals)))


BENCH = tuple(
    BenchWorkload(name, {"width": w, "depth": d, "batch_size": b, "epochs": e, "num_sequences": n}, quick)
    for name, w, d, b, e, n, quick in (
        ("wm-small", 64, 2, 512, 3, 256, True),
        ("wm-wide", 512, 3, 1024, 2, 256, True),
        ("wm-1024", 1024, 4, 8192, 10, 4096, False),
        ("wm-2048", 2048, 4, 8192, 10, 4096, False),
    )
)
# The eval loss, scored in decades: log10(loss), normalised from an untrained model's (0) to the
# data's noise floor (1). synthetic-small is the same system in units 100x smaller, a small loss
# that Adam does not learn in any precision (docs/study.md). wm:small-loss is where loss scaling
# matters: synthetic-wide, in its own units, trained on 1e-3 x its loss (a small loss coefficient,
# as an auxiliary loss's), whose gradients a float16 backward without scaling flushes to zero.
_NOISE_FLOOR = "the data's noise floor (the true model's expected loss), as log10; 0: an untrained model's"
_WM_EPOCHS = 20
STUDY = {
    **{
        f"wm:{data}": StudyTask({"data": data, "num_sequences": 1024}, _WM_EPOCHS, None, _NOISE_FLOOR, score="loss")
        for data in ("synthetic", "synthetic-small", "synthetic-wide")
    },
    "wm:small-loss": StudyTask(
        {"data": "synthetic-wide", "num_sequences": 1024, "loss_weight": 1e-3}, _WM_EPOCHS, None, _NOISE_FLOOR, "loss"
    ),
}


class WorldModelTrainer(Algorithm):
    name, config_class, row_key, score = "world-model", WorldModelConfig, "epoch", "eval_loss"
    # Each seed's eval loss; optimizer steps per second; and the opt-in underflow telemetry.
    metrics = {"eval_loss": "mean per seed", "steps_per_second": "rate", "underflow": "mean"}
    tiny = dict(epochs=1, num_sequences=32, sequence_length=8, batch_size=64, width=16, depth=1)
    budget_field, bench_workloads, study_tasks = "epochs", BENCH, STUDY

    def setup(self) -> None:
        config = self.config
        self.precision = config.train_precision()
        self.dataset = load_data(config, self.precision)
        train_seqs, eval_seqs = trajectories.split(self.dataset, config.eval_fraction)
        train_set = {k: jnp.asarray(v) for k, v in windows(train_seqs, config.horizon).items() if k != "floor"}
        eval_samples = windows(eval_seqs, config.horizon)
        floor = eval_samples.pop("floor", None)
        # Known only for one-step prediction: open-loop errors compound beyond the noise.
        self.noise_floor = float(np.mean(floor)) if floor is not None and config.horizon == 1 else None
        self.data = (train_set, {k: jnp.asarray(v) for k, v in eval_samples.items()})
        self.num_samples = train_set["obs"].shape[0]
        self.batches_per_epoch = self.num_samples // config.batch_size
        if self.batches_per_epoch < 1:
            raise ValueError(f"batch size {config.batch_size} is larger than the {self.num_samples} training samples")
        if config.epochs * self.batches_per_epoch > INT32_MAX:  # optax and TrainState count steps in int32
            raise ValueError(
                f"epochs {config.epochs} x {self.batches_per_epoch} batches per epoch is more optimizer steps than "
                f"the int32 step counters hold; at most {INT32_MAX // self.batches_per_epoch} epochs with this data"
            )
        self.model = make_model(config, self.dataset["meta"], train_set["obs"].shape[-1], self.precision)
        self.loss_fn = make_loss_fn(self.model)  # the loss reported and evaluated
        self.train_loss_fn = make_loss_fn(self.model, config.loss_weight)  # the loss trained on
        obs_dim, meta = train_set["obs"].shape[-1], self.dataset["meta"]
        self.loss32, self.loss16 = (  # the telemetry's: the gradients of the loss trained on
            make_loss_fn(make_model(config, meta, obs_dim, get_precision(p)), config.loss_weight)
            for p in ("fp32", "fp16")
        )

    def inputs(self) -> dict[str, str]:
        """The dataset's identity, as its source, size and digest: the same path (a .npz) may hold other data."""
        n, length = self.dataset["reward"].shape
        digest = state_digest({k: v for k, v in self.dataset.items() if k != "meta"})[:16]
        return {"dataset": f"{self.dataset['meta']['source']}: {n} sequences x {length} steps, sha256 {digest}"}

    def init(self, key) -> WorldModelState:
        init_key, run_key = jax.random.split(key)
        sample = jax.tree.map(lambda x: x[:1], self.data[0])
        params = self.model.init(init_key, sample["obs"], sample["action"], method=WorldModel.unroll)
        return WorldModelState(self.config.create_train_state(params, self.config.adam(self.config.lr)), run_key)

    def update(self, state: WorldModelState, data):
        """One epoch: shuffled minibatches (rows split over the devices), then the eval loss."""
        train_set, eval_set = data
        config, mesh = self.config, self.config.mesh()
        rng, perm_key = jax.random.split(state.rng)
        perm = jax.random.permutation(perm_key, self.num_samples)[: self.batches_per_epoch * config.batch_size]
        batches = jax.tree.map(
            lambda x: x[perm].reshape((self.batches_per_epoch, config.batch_size) + x.shape[1:]), train_set
        )
        batches = constrain(batches, mesh, axis=1)
        ts = state.train_state
        skipped_before = ts.skipped
        underflow = {}
        if config.underflow_telemetry:  # the epoch's first batch, float32 and float16 backward, at the scale
            first = jax.tree.map(lambda x: x[0], batches)
            reference = jax.grad(lambda p: self.loss32(p, first)[0])(ts.params)
            half = jax.grad(lambda p: self.loss16(p, first)[0] * ts.scaler.loss_scale)(ts.params)
            underflow = underflow_metrics(reference, half)
        ts, metrics = jax.lax.scan(lambda s, b: self.train_step(s, self.train_loss_fn, b), ts, batches)
        finite = metrics["grads_finite"]
        applied = jnp.sum(finite)
        applied_loss = jnp.sum(jnp.where(finite, metrics["loss"], 0.0)) / config.loss_weight
        return WorldModelState(ts, rng), {
            # The mean (unweighted) loss of the steps applied; NaN (null in metrics.jsonl) for an epoch with none.
            "train_loss": jnp.where(applied > 0, applied_loss / jnp.maximum(applied, 1), jnp.nan),
            "eval_loss": self.loss_fn(ts.params, eval_set)[0],
            "skipped": ts.skipped - skipped_before,
            "loss_scale": ts.scaler.loss_scale,
            "halted": ts.halted,
            "steps_per_second": jnp.int32(self.batches_per_epoch),  # optimizer steps, "rate": per second
            **underflow,
        }

    def summary(self, rows: list[dict], state: WorldModelState) -> dict:
        config, ts = self.config, state.train_state
        seeds_ts = ts
        if self.num_seeds > 1:  # the probes below take one seed's state
            ts = jax.tree.map(lambda x: x[0], ts)
        batch0 = jax.tree.map(lambda x: x[: config.batch_size], self.data[0])
        step = lambda s, b: self.train_step(s, self.train_loss_fn, b)  # noqa: E731
        return {
            "data": self.dataset["meta"]["source"],
            "width": config.width,
            "depth": config.depth,
            "batch_size": config.batch_size,
            "horizon": config.horizon,
            "final_train_loss": rows[-1]["train_loss"],
            "eval_loss": rows[-1]["eval_loss"],
            "eval_loss_per_seed": rows[-1].get("eval_loss_per_seed", [rows[-1]["eval_loss"]]),
            "noise_floor": self.noise_floor,
            "epochs": len(rows),
            "applied_updates": int(np.sum(np.asarray(seeds_ts.step)) - np.sum(np.asarray(seeds_ts.skipped))),
            "steps_per_second": self.session.steps_per_second(self.batches_per_epoch * self.num_seeds),
            "activation_bytes": activation_bytes(self.loss_fn, ts.params, batch0),
            "flops_per_step": probes.matmul_flops(step, ts, batch0),  # one optimizer step, for the achieved FLOP/s
            "param_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(ts.params))),
        }


ALGORITHM = WorldModelTrainer
train = WorldModelTrainer.train
