"""Data parallelism with JAX's own sharding: a 1-D `Mesh` with a "data" axis.

Environments (PPO) or batch rows (world model) are sharded along the axis; parameters,
optimizer state and the loss scaler are replicated. The train step stays the ordinary
jitted program: XLA's SPMD partitioner inserts the gradient all-reduce, so every device
sees the same averaged gradients, takes the same finite decision and keeps the same scale.
A 4-device run therefore computes what a 1-device run with the same global batch does, up
to float32 reduction order.

Multi-host: call `initialize_distributed` (the CLI's --coordinator-address, --num-processes,
--process-id) before anything touches a device; the mesh then spans every host's devices.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DATA_AXIS = "data"


# A process that stops sending heartbeats for this long is declared dead and every other
# process exits (JAX's coordination service), instead of waiting in a collective forever.
HEARTBEAT_TIMEOUT_SECONDS = 30
AUTO = "auto"  # coordinator address: JAX's cluster auto-detection


def check_distributed_args(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Refuses an incomplete set of multi-process arguments: all three, `auto` alone, or none."""
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
    if coordinator_address == AUTO:
        if any(given[1:]):
            raise ValueError(
                "coordinator-address auto reads num-processes and process-id from the cluster; leave them out"
            )
    elif any(given) and not all(given):
        raise ValueError("multi-host runs need all of coordinator-address, num-processes and process-id")


def initialize_distributed(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_SECONDS,
) -> None:
    """`jax.distributed.initialize` with the given arguments; a no-op when none is given.
    `coordinator_address="auto"` (alone) lets JAX read them from the cluster's environment
    (SLURM, Open MPI, Kubernetes...). On CPU the processes' collectives go through gloo (XLA's
    CPU backend has no other cross-process implementation)."""
    if coordinator_address is None and num_processes is None and process_id is None:
        return
    check_distributed_args(coordinator_address, num_processes, process_id)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if coordinator_address == AUTO:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout)
        return
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"process-id must lie in [0, num-processes), got {process_id} of {num_processes}")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=heartbeat_timeout,
    )


def is_primary() -> bool:
    """Whether this is process 0, the one that writes files and prints progress."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reached the barrier `name` (nothing to wait for in one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
    """Whether `flag` holds in any process: one decision all processes take together (a signal
    that reached only some of them still stops all, at the same step)."""
    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag, np.int32))))


def host_array(array) -> np.ndarray:
    """The whole of a (possibly multi-process, sharded) array on this host: a collective
    when other processes hold parts of it, so every process must call it."""
    if not isinstance(array, jax.Array) or array.is_fully_addressable:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def make_mesh(num_devices: int) -> Mesh:
    """A mesh over the first `num_devices` devices (of all hosts) with one "data" axis."""
    available = jax.device_count()
    if num_devices > available:
        raise ValueError(
            f"devices {num_devices} asked for but only {available} {jax.default_backend()} device(s) are visible"
            " (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)"
        )
    return Mesh(np.asarray(jax.devices()[:num_devices]), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def sharded(mesh: Mesh, axis: int = 0) -> NamedSharding:
    """Split along array axis `axis` over the mesh's data axis."""
    return NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA_AXIS))


def constrain(tree, mesh: Mesh | None, axis: int = 0):
    """Inside jit: keep every leaf of `tree` split along `axis` (a no-op without a mesh)."""
    if mesh is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, sharded(mesh, axis))


def on_devices(tree, mesh: Mesh | None, shardings):
    """`jax.device_put` of `tree` with `shardings` (a sharding or a matching tree) when
    there is a mesh."""
    return tree if mesh is None else jax.device_put(tree, shardings)


def replicas_agree(array) -> bool:
    """Whether every device's copy of a replicated array holds the same values."""
    shards = [np.asarray(s.data) for s in array.addressable_shards]
    return all(np.array_equal(shards[0], s, equal_nan=True) for s in shards[1:])


def start_distributed(config) -> None:
    """Joins this process to a multi-process run as a config's distributed fields say, once
    (a no-op for a single process, and when the CLI already did it)."""
    if config.coordinator_address is not None and not jax.distributed.is_initialized():
        initialize_distributed(
            config.coordinator_address, config.num_processes, config.process_id, config.heartbeat_timeout
        )


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Fields and checks shared by trainer configs (a dataclass base): `devices` for the
    data axis, and the multi-host arguments of `jax.distributed.initialize`."""

    devices: int = 1
    """Devices on the data axis; the environments (PPO) or batch rows (world model) are split over them."""
    coordinator_address: str | None = None
    """Several processes: host:port of process 0, or auto (read from SLURM, Open MPI, Kubernetes...)."""
    num_processes: int | None = None
    """Several processes: how many."""
    process_id: int | None = None
    """Several processes: this process's index."""
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_SECONDS
    """Several processes: seconds of silence after which a process is declared dead and the others exit."""

    def validate_parallel(self, split_name: str, split_size: int) -> None:
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError(f"devices must be a positive integer, got {self.devices!r}")
        if split_size % self.devices:
            raise ValueError(f"{split_name} {split_size} cannot be split evenly over {self.devices} devices")
        if not isinstance(self.heartbeat_timeout, int) or self.heartbeat_timeout < 1:
            raise ValueError(f"heartbeat-timeout must be a positive integer (seconds), got {self.heartbeat_timeout!r}")
        check_distributed_args(self.coordinator_address, self.num_processes, self.process_id)

    def mesh(self) -> Mesh | None:
        """The data-parallel mesh, or None for a single device."""
        return make_mesh(self.devices) if self.devices > 1 else None
