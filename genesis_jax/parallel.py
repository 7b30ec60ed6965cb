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


def initialize_distributed(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """`jax.distributed.initialize` with the given arguments; a no-op when none is given."""
    if coordinator_address is None and num_processes is None and process_id is None:
        return
    if coordinator_address is None or num_processes is None or process_id is None:
        raise ValueError("multi-host runs need all of coordinator-address, num-processes and process-id")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"process-id must lie in [0, num-processes), got {process_id} of {num_processes}")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id)


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


_distributed_started = False


def start_distributed(config) -> None:
    """Initializes multi-host JAX once per process from a config's distributed fields."""
    global _distributed_started
    if not _distributed_started:
        initialize_distributed(config.coordinator_address, config.num_processes, config.process_id)
        _distributed_started = config.coordinator_address is not None


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Fields and checks shared by trainer configs (a dataclass base): `devices` for the
    data axis, and the multi-host arguments of `jax.distributed.initialize`."""

    devices: int = 1
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def validate_parallel(self, split_name: str, split_size: int) -> None:
        if not isinstance(self.devices, int) or self.devices < 1:
            raise ValueError(f"devices must be a positive integer, got {self.devices!r}")
        if split_size % self.devices:
            raise ValueError(f"{split_name} {split_size} cannot be split evenly over {self.devices} devices")
        given = [v is not None for v in (self.coordinator_address, self.num_processes, self.process_id)]
        if any(given) and not all(given):
            raise ValueError("multi-host runs need all of coordinator-address, num-processes and process-id")

    def mesh(self) -> Mesh | None:
        """The data-parallel mesh, or None for a single device."""
        return make_mesh(self.devices) if self.devices > 1 else None
