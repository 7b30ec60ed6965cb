"""One process of a 2-process run joined by jax.distributed on localhost (2 CPU devices each,
gloo collectives): three update steps on a 4-device mesh where only process 1's rows hold an
inf, at the second step. Prints what this process saw as JSON; tests/run/test_parallel_faults.py
starts both processes and compares them."""

import json
import sys

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from genesis_jax import DynamicLossScale, TrainState, train_step
from genesis_jax.run.parallel import DATA_AXIS, host_array, initialize_distributed, make_mesh, replicated
from tests.support.helpers import mlp_loss, regression_problem


def main() -> dict:
    mesh = make_mesh(4)
    rows = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    x, y = (np.asarray(a) for a in regression_problem(n=256))
    mine = slice(128 * jax.process_index(), 128 * (jax.process_index() + 1))  # this process's half of the batch
    model, loss_fn = mlp_loss(np.float16)
    state = TrainState.create(
        params=model.init(jax.random.PRNGKey(1), x[:1]),
        tx=optax.adam(1e-3),
        scaler=DynamicLossScale(),
        precision="fp16",
        max_grad_norm=1.0,
    )
    state = jax.device_put(state, replicated(mesh))
    step = jax.jit(lambda state, batch: train_step(state, loss_fn, batch, has_aux=True))
    seen = []
    for i in range(3):
        local_x = x[mine].copy()
        if i == 1 and jax.process_index() == 1:
            local_x[5] = np.inf
        batch = tuple(jax.make_array_from_process_local_data(rows, a) for a in (local_x, y[mine]))
        state, metrics = step(state, batch)
        seen.append(
            {
                "grads_finite": bool(host_array(metrics["grads_finite"])),
                "skipped": int(host_array(state.skipped)),
                "scale": float(host_array(state.scaler.loss_scale)),
            }
        )
    params = [host_array(p) for p in jax.tree.leaves(state.params)]
    return {
        "process": jax.process_index(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "steps": seen,
        "params": [float(np.sum(p.astype(np.float64) * (k + 1))) for k, p in enumerate(params)],
    }


if __name__ == "__main__":
    initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))  # before anything touches a device
    print("RESULT " + json.dumps(main()), flush=True)
