"""World-model training on the algorithm template: epochs of shuffled minibatches in
`lax.scan` under jit, through `amp.train_step`, with per-epoch overflow counts, the eval
loss against the data's noise floor, and memory statistics.

>>> from genesis_jax.algos.world_model import WorldModelConfig, train
>>> result = train(WorldModelConfig(data="synthetic", precision="fp16", epochs=5))  # doctest: +SKIP
>>> result.summary["eval_loss"], result.summary["noise_floor"]                     # doctest: +SKIP
"""

from __future__ import annotations

import difflib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from genesis_jax.algos.base import Algorithm, BenchWorkload, Presets, StudyTask
from genesis_jax.algos.world_model import data as wm_data
from genesis_jax.algos.world_model.config import WorldModelConfig
from genesis_jax.amp import TrainState
from genesis_jax.data import trajectories
from genesis_jax.envs.registry import resolve_env
from genesis_jax.nets.world_model import WorldModel
from genesis_jax.run import probes
from genesis_jax.run.checkpoint import state_digest
from genesis_jax.run.config import INT32_MAX
from genesis_jax.run.parallel import constrain


class WorldModelState(struct.PyTreeNode):
    train_state: TrainState
    rng: jax.Array  # the minibatch shuffles'


SYNTHETIC = {
    "synthetic": wm_data.synthetic_dataset,
    "synthetic-small": wm_data.small_units_dataset,
    "synthetic-wide": wm_data.wide_dataset,
}


def load_data(config: WorldModelConfig, precision) -> dict:
    """The run's dataset, checked (`trajectories.validate_dataset`) against what a run in `precision`
    can train on, before anything is compiled."""
    size = (config.num_sequences, config.sequence_length, config.seed)
    if config.data in SYNTHETIC:
        data = SYNTHETIC[config.data](*size)
    elif config.data.endswith(".npz"):
        data = trajectories.load_dataset(config.data)
    else:  # an environment id (gymnax or gymnasium): random-policy data
        try:
            spec = resolve_env(config.data)
        except ValueError as err:
            near = difflib.get_close_matches(config.data, list(SYNTHETIC), n=1)
            kinds = f"{', '.join(SYNTHETIC)}, an environment id or a file ending in .npz"
            raise ValueError(f"--data takes {kinds}: {err}" + (f" (or {near[0]}?)" if near else "")) from None
        if len(spec.obs_shape) != 1:  # refused now, not once the whole dataset is collected
            raise ValueError(f"the world model takes vector observations; {config.data}'s are {list(spec.obs_shape)}")
        data = trajectories.collect_dataset(config.data, *size)
    trajectories.validate_dataset(data, config.data, precision.compute_dtype, precision.name)
    return data


def windows(data: dict, horizon: int) -> dict:
    """Training samples: open-loop windows of `horizon` steps (one-step transitions for 1),
    sequence by sequence; a known per-step noise floor comes along as `floor`. `valid` marks
    each window's steps up to its episode's end: a step whose `next_obs` is not the following
    observation ended its episode (the environment reset), and the window's later steps are
    another episode's, which no open-loop prediction from its start can reach."""
    n, length = data["reward"].shape
    if horizon > length:
        raise ValueError(f"horizon {horizon} is longer than the data's sequences ({length} steps)")
    next_obs = data["next_obs"] if "next_obs" in data else data["obs"][:, 1:]
    ended = ~np.isclose(next_obs, data["obs"][:, 1:], rtol=1e-5, atol=1e-6).all(-1)  # pre-reset != reset obs
    starts = np.arange(length - horizon + 1)
    take = lambda x: np.stack([x[:, s : s + horizon] for s in starts], 1).reshape((-1, horizon) + x.shape[2:])
    samples = {k: take(data[k]) for k in ("action", "reward", "terminated", "floor") if k in data}
    ends = take(ended)  # per window step: its episode ended there
    valid = np.cumsum(ends, 1) - ends == 0  # no episode ended before the step
    obs = data["obs"][:, starts].reshape(n * len(starts), -1)
    return {"obs": obs, "next_obs": take(next_obs), "valid": valid, **samples}


def make_loss_fn(model: WorldModel, weight: float = 1.0):
    """Float32 loss: obs MSE (mean over dims) + reward MSE + termination BCE, averaged over the
    batch's `valid` steps (all where it has none), times `weight` (the aux dict's terms unweighted)."""

    def loss_fn(params, batch):
        pred_obs, pred_reward, term_logit = model.apply(params, batch["obs"], batch["action"], method=WorldModel.unroll)
        obs_mse = jnp.mean(jnp.square(pred_obs - batch["next_obs"]), axis=-1)
        reward_mse = jnp.square(pred_reward - batch["reward"])
        bce = optax.sigmoid_binary_cross_entropy(term_logit, batch["terminated"])
        terms = {"obs_mse": obs_mse, "reward_mse": reward_mse, "bce": bce}  # per sample; the aux holds their means
        mean = lambda x: jnp.mean(x, where=batch.get("valid"))  # noqa: E731
        return weight * mean(obs_mse + reward_mse + bce), {k: mean(v) for k, v in terms.items()}

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
_WM_TASKS = {data: {"data": data} for data in ("synthetic", "synthetic-small", "synthetic-wide")}
_WM_TASKS["small-loss"] = {"data": "synthetic-wide", "loss_weight": 1e-3}
STUDY = {
    f"wm:{task}": StudyTask({**settings, "num_sequences": 1024}, _WM_EPOCHS, None, _NOISE_FLOOR, score="loss")
    for task, settings in _WM_TASKS.items()
}


class WorldModelTrainer(Algorithm):
    name, config_class, row_key, budget_field = "world-model", WorldModelConfig, "epoch", "epochs"
    # Each seed's eval loss; optimizer steps per second; and the opt-in underflow telemetry.
    metrics = {"eval_loss": "mean per seed", "steps_per_second": "rate", "underflow": "mean"}
    presets = Presets(
        tiny=dict(epochs=1, num_sequences=32, sequence_length=8, batch_size=64, width=16, depth=1),
        bench=BENCH,
        study=STUDY,
    )

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
        self.model = self.model_in(self.precision)
        self.loss_fn = make_loss_fn(self.model)  # the loss reported and evaluated
        self.train_loss_fn = self.loss_of(self.precision)

    def model_in(self, precision) -> WorldModel:
        """The model for the dataset's observations and actions, its hidden layers in `precision`."""
        c, meta, obs_dim = self.config, self.dataset["meta"], self.data[0]["obs"].shape[-1]
        shape = dict(width=c.width, depth=c.depth, core=c.core, dtype=precision.compute_dtype)
        return WorldModel(obs_dim, int(meta["action_dim"]), bool(meta["discrete_actions"]), **shape)

    def loss_of(self, precision):
        """The loss trained on (times loss-weight), the model in `precision` (the telemetry's too)."""
        return make_loss_fn(self.model_in(precision), self.config.loss_weight)

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
        shape = (self.batches_per_epoch, config.batch_size)
        perm = jax.random.permutation(perm_key, self.num_samples)[: shape[0] * shape[1]]
        batches = constrain(jax.tree.map(lambda x: x[perm].reshape(shape + x.shape[1:]), train_set), mesh, axis=1)
        underflow = self.underflow(self.loss_of, state.train_state, jax.tree.map(lambda x: x[0], batches))  # 1st batch
        ts, metrics = jax.lax.scan(lambda s, b: self.train_step(s, self.train_loss_fn, b), state.train_state, batches)
        finite = metrics["grads_finite"]
        return WorldModelState(ts, rng), {
            "train_loss": jnp.mean(metrics["loss"], where=finite) / config.loss_weight,  # unweighted; NaN: none applied
            "eval_loss": self.loss_fn(ts.params, eval_set)[0],
            "steps_per_second": jnp.int32(self.batches_per_epoch),  # optimizer steps, "rate": per second
            **underflow,
        }

    def summary(self, rows: list[dict], state: WorldModelState) -> dict:
        c, seeds, last = self.config, state.train_state, rows[-1]
        ts = jax.tree.map(lambda x: x[0], seeds) if self.num_seeds > 1 else seeds  # the probes take one seed's
        batch0 = jax.tree.map(lambda x: x[: c.batch_size], self.data[0])
        step = lambda s, b: self.train_step(s, self.train_loss_fn, b)
        return {
            "data": self.dataset["meta"]["source"],
            **{k: getattr(c, k) for k in ("width", "depth", "batch_size", "horizon")},
            "final_train_loss": last["train_loss"],
            "eval_loss": last["eval_loss"],
            "eval_loss_per_seed": last.get("eval_loss_per_seed", [last["eval_loss"]]),
            "noise_floor": self.noise_floor,
            "epochs": len(rows),
            "applied_updates": int(np.sum(np.asarray(seeds.step)) - np.sum(np.asarray(seeds.skipped))),
            "steps_per_second": self.session.steps_per_second(self.batches_per_epoch * self.num_seeds),
            "activation_bytes": activation_bytes(self.loss_fn, ts.params, batch0),
            "flops_per_step": probes.matmul_flops(step, ts, batch0),  # one optimizer step, for the achieved FLOP/s
            "param_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(ts.params))),
        }


ALGORITHM = WorldModelTrainer
train = WorldModelTrainer.train
