"""Your own training loop under genesis-jax's `Session`: a run directory with metrics.jsonl,
summary.json, checkpoints and (with --tensorboard) TensorBoard event files; --resume after a
stop; Ctrl-C or SIGTERM saves a checkpoint first; the divergence guard stops a run that only
overflows. The loop here is a float16 regression with loss scaling; the Session does not
care what the compiled chunk computes.

Usage: python examples/session_loop.py OUT_DIR [--resume] [--tensorboard] [--chunks N]
"""

import argparse
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from genesis_jax import DynamicLossScale, TrainState, train_step
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.run.session import Session


@dataclasses.dataclass(frozen=True)
class Config:
    chunks: int = 50  # compiled chunks of 100 updates each
    lr: float = 3e-3
    RESUMABLE_FIELDS = ("chunks",)  # what a --resume may change

    def to_dict(self):
        return dataclasses.asdict(self)

    def divergence_guard(self):
        return DivergenceGuard()


def make_chunk(config: Config):
    x = jax.random.normal(jax.random.PRNGKey(0), (1024, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    model = nn.Sequential([nn.Dense(256, dtype=jnp.float16), nn.relu, nn.Dense(1, dtype=jnp.float16)])

    def loss_fn(params, x, y):
        pred = model.apply(params, x).astype(jnp.float32)  # the loss in float32
        return jnp.mean((pred - y) ** 2)

    state = TrainState.create(  # wraps adam in amp.skip_nonfinite: clipping, skip counts, the guard
        params=model.init(jax.random.PRNGKey(1), x[:1]),
        tx=optax.adam(config.lr),
        scaler=DynamicLossScale(),
        precision="fp16",
        max_grad_norm=1.0,
        guard=config.divergence_guard(),
    )

    @jax.jit
    def chunk(state):  # 100 updates in one compiled call: state -> (state, metrics)
        state, m = jax.lax.scan(lambda s, _: train_step(s, loss_fn, x, y), state, None, 100)
        return state, {"loss": m["loss"][-1], "loss_scale": state.scaler.loss_scale, "halted": state.halted}

    def to_rows(m, done):  # the chunk's metric rows: one per chunk here
        return [{"chunk": done + 1, "loss": float(m["loss"]), "loss_scale": float(m["loss_scale"])}]

    return state, chunk, to_rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--tensorboard", action="store_true")
    p.add_argument("--chunks", type=int, default=Config.chunks)
    args = p.parse_args()
    config = Config(chunks=args.chunks)
    state, chunk, to_rows = make_chunk(config)
    with Session(
        args.out,
        config,
        name="regression",
        num_rows=config.chunks,
        row_key="chunk",
        unit="chunk",
        checkpoint_every=10,
        resume=args.resume,
        writers=("tensorboard",) if args.tensorboard else (),
    ) as session:
        state = session.restore(state)
        state = session.run(state, chunk, to_rows)
        summary = session.finish({"final_loss": session.rows[-1]["loss"], "skipped": int(state.skipped)}, state)
    print(summary)


if __name__ == "__main__":
    main()
