"""Several seeds in one program with `jax.vmap`: each seed has its own parameters, its own
loss scaler and its own skip counts, so an overflow in one seed skips that seed's step only.

The network is a plain function without a `dtype` field, so `amp.autocast` runs it in
float16 (float32 outputs, so the loss stays float32). At step `bad_step` the batch of seed
`bad_seed` overflows float16: that seed skips the step and halves its scale; the others
step as if nothing happened. Under `vmap` the skip is a select, not a branch: every seed
computes the optimizer step and the skipped ones discard it (the cost of one step).
Every seed also skips its first step: at the default initial scale of 2^16 the first
backward pass overflows float16 and the scale backs off to 2^15 (see the README on
`init_scale`).

Usage: python examples/vmap_seeds.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax import amp


def mlp(params, x):  # no dtype field: autocast decides the compute dtype
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


apply = amp.autocast(mlp, "fp16")


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean((apply(params, x)[:, 0] - y) ** 2), None


def init(seed):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(k1, (8, 32)) / jnp.sqrt(8.0), "w2": jax.random.normal(k2, (32, 1)) / 32}
    return amp.TrainState.create(params=params, tx=optax.adam(1e-2), precision="fp16")


def make_batch(seed, step, overflow):
    x = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(1000 + seed), step), (64, 8))
    y = jnp.sin(x).sum(-1)
    return x * jnp.where(overflow, 1e5, 1.0), y  # 1e5 is above float16's largest number, 65504


def run(num_seeds=4, steps=20, bad_seed=1, bad_step=5):
    """Trains `num_seeds` seeds side by side; returns per-seed arrays: skipped steps, final
    loss scale, final loss and final params (`bad_seed=None`: no overflow anywhere)."""
    seeds = jnp.arange(num_seeds)
    states = jax.vmap(init)(seeds)
    step_fn = jax.jit(jax.vmap(lambda state, batch: amp.train_step(state, loss_fn, batch, has_aux=True)))
    is_bad = seeds == (-1 if bad_seed is None else bad_seed)
    for step in range(steps):
        batches = jax.vmap(make_batch, in_axes=(0, None, 0))(seeds, step, is_bad & (step == bad_step))
        states, metrics = step_fn(states, batches)
    return {
        "skipped": np.asarray(states.skipped),
        "loss_scale": np.asarray(states.scaler.loss_scale),
        "loss": np.asarray(metrics["loss"]),
        "params": jax.tree.map(np.asarray, states.params),
        "steps": np.asarray(states.step),
    }


if __name__ == "__main__":
    out = run()
    for seed in range(len(out["skipped"])):
        print(
            f"seed {seed}: skipped {out['skipped'][seed]}  loss scale {out['loss_scale'][seed]:g}  "
            f"final loss {out['loss'][seed]:.4f}"
        )
