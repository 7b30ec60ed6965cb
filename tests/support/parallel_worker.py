"""Runs data-parallel scenarios on 4 forced CPU devices and prints their raw results as
JSON, every scenario in one process (one start of Python and JAX for all); tests/run/test_parallel.py
starts it in a separate process (XLA_FLAGS must be set before JAX starts) and makes the assertions."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax import DynamicLossScale, TrainState, train_step
from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.algos.ppo import train as train_ppo
from genesis_jax.algos.world_model import WorldModelConfig
from genesis_jax.algos.world_model import train as train_wm
from genesis_jax.run.parallel import make_mesh, replicas_agree, replicated, sharded
from tests.support.helpers import mlp_loss, regression_problem


def all_agree(tree) -> bool:
    return all(replicas_agree(x) for x in jax.tree.leaves(tree))


def checksum(tree) -> float:
    return float(sum(np.sum(np.asarray(x, np.float64) * (i + 1)) for i, x in enumerate(jax.tree.leaves(tree))))


# 8 updates of 512 steps, a checkpoint after the 4th and the 8th (tests/run/test_parallel.py runs the same).
PPO = dict(precision="fp16", total_steps=4096, num_envs=8, num_steps=64, seed=1)
PPO_CHECKPOINT_EVERY = 2048


def ppo(out_dir=None):
    runs = {}
    for devices in (1, 4):
        config = PPOConfig(**PPO, devices=devices)
        result = train_ppo(
            config, out_dir=out_dir if devices == 4 else None, progress=False, checkpoint_every=PPO_CHECKPOINT_EVERY
        )
        runs[devices] = {
            "losses": [r["loss"] for r in result.metrics],
            "returns": [r["return_sum"] for r in result.metrics],
            "replicas_agree": all_agree(result.train_state),
            "param_sharding": str(jax.tree.leaves(result.train_state.params)[0].sharding),
            "param_checksum": checksum(result.train_state.params),
            "device": result.summary["device"],
        }
    return runs


def world_model():
    runs = {}
    for devices in (1, 4):
        config = WorldModelConfig(
            precision="fp16", epochs=3, batch_size=256, num_sequences=128, width=32, devices=devices
        )
        result = train_wm(config, progress=False)
        runs[devices] = {
            "losses": [r["train_loss"] for r in result.metrics],
            "eval": [r["eval_loss"] for r in result.metrics],
            "replicas_agree": all_agree(result.train_state),
        }
    return runs


def inject_one_shard():
    """An inf in the rows that live on device 2 only: every replica must skip the step."""
    mesh = make_mesh(4)
    x, y = regression_problem(n=256)
    x = x.at[128:130].set(jnp.inf)  # rows 128..191 live on device 2
    model, loss_fn = mlp_loss(jnp.float16)
    params = model.init(jax.random.PRNGKey(1), x[:1])
    state = TrainState.create(
        params=params, tx=optax.adam(1e-3), scaler=DynamicLossScale(), precision="fp16", max_grad_norm=1.0
    )
    state = jax.device_put(state, replicated(mesh))
    batch = jax.device_put((x, y), sharded(mesh))
    holder = [i for i, s in enumerate(batch[0].addressable_shards) if not np.all(np.isfinite(np.asarray(s.data)))]
    step = jax.jit(lambda state, batch: train_step(state, loss_fn, batch, has_aux=True))
    new, metrics = step(state, batch)
    clean, clean_metrics = step(new, jax.device_put((jnp.nan_to_num(x, posinf=0.0), y), sharded(mesh)))
    same = jax.tree.leaves(
        jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), state.params, new.params)
    )
    return {
        "shards_holding_inf": holder,
        "grads_finite": bool(metrics["grads_finite"]),
        "skipped": int(new.skipped),
        "step": int(new.step),
        "params_unchanged": all(same),
        "replicas_agree": all_agree(new),
        "scale": float(new.scaler.loss_scale),
        "scale_replicas_agree": replicas_agree(new.scaler.loss_scale),
        "next_step_finite": bool(clean_metrics["grads_finite"]),
        "skipped_after_clean_step": int(clean.skipped),
    }


if __name__ == "__main__":
    # python -m tests.support.parallel_worker PPO_OUT_DIR: every scenario, the PPO run's checkpoints in PPO_OUT_DIR
    result = {"ppo": ppo(sys.argv[1]), "world_model": world_model(), "inject": inject_one_shard()}
    print("RESULT " + json.dumps({"device_count": jax.device_count(), **result}))
