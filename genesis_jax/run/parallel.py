"""Data parallelism with JAX's own sharding: a 1-D `Mesh` with a "data" axis.

What each algorithm splits (PPO's environments, replay or batch rows) is sharded along the axis; parameters,
optimizer state and the loss scaler are replicated. The train step stays the ordinary
jitted program: XLA's SPMD partitioner inserts the gradient all-reduce, so every device
sees the same averaged gradients, takes the same finite decision and keeps the same scale.
A 4-device run therefore computes what a 1-device run with the same global batch does, up
to float32 reduction order.

Multi-host: call `initialize_distributed` (the CLI's --coordinator-address, --num-processes,
--process-id) before anything touches a device; the mesh then spans every host's devices.
No process waits forever for the others: `barrier` ends with `PeerFailed` once another
process has exited or the wait passes its timeout, and SIGINT / SIGTERM end the wait (and
the wait in `jax.distributed.initialize`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import threading
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from genesis_jax.run.launch import check_port_free, exit_with_launcher, parse_coordinator_address
from genesis_jax.run.signals import EXIT_PEER, TrainingInterrupted, first_line, handling_signals

DATA_AXIS = "data"


# A process that stops sending heartbeats for this long is declared dead and every other
# process exits (JAX's coordination service), instead of waiting in a collective forever.
HEARTBEAT_TIMEOUT_SECONDS = 30
# How long a process waits for the others to join (`jax.distributed.initialize`) and to reach
# a `barrier`: the others may still be importing, or building their environments.
AGREEMENT_TIMEOUT_SECONDS = 300
AUTO = "auto"  # coordinator address: JAX's cluster auto-detection
_EXITED = "genesis/exited/"  # key prefix: a process that ended says so (see `_leave`)
# A process that left a barrier alone waits this long at exit for JAX's shutdown barrier (which
# the others, still busy, may never reach) before it ends anyway.
LEAVE_ALONE_SECONDS = 5.0
_barrier_rounds: dict[str, int] = {}
_left_alone_status: list[int] = []  # the exit status of a process that left a barrier alone


class PeerFailed(RuntimeError):
    """Of several processes, another one ended (or never came) while this one waited for it:
    this one stops too. The other's own message says why."""


def check_distributed_args(coordinator_address: str | None, num_processes: int | None, process_id: int | None) -> None:
    """Refuses an incomplete set of multi-process arguments (all three, `auto` alone, or
    none), a process id out of range and a coordinator address that is not a resolvable
    host:port, each in one sentence (ValueError)."""
    given = [v is not None for v in (coordinator_address, num_processes, process_id)]
    if coordinator_address == AUTO:
        if any(given[1:]):
            raise ValueError(
                "coordinator-address auto reads num-processes and process-id from the cluster; leave them out"
            )
    elif any(given) and not all(given):
        raise ValueError("multi-host runs need all of coordinator-address, num-processes and process-id")
    elif all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError(f"process-id must lie in [0, num-processes), got {process_id} of {num_processes}")
        parse_coordinator_address(coordinator_address)


def initialize_distributed(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_SECONDS,
    initialization_timeout: int = AGREEMENT_TIMEOUT_SECONDS,
) -> None:
    """`jax.distributed.initialize` with the given arguments; a no-op when none is given.
    `coordinator_address="auto"` (alone) lets JAX read them from the cluster's environment
    (SLURM, Open MPI, Kubernetes...). On CPU the processes' collectives go through gloo (XLA's
    CPU backend has no other cross-process implementation).

    Bad arguments, and a coordinator port already in use on process 0, raise ValueError
    before anything starts; a coordinator that does not answer within `initialization_timeout`
    seconds raises ConnectionError (the other processes not joining in that time: JAX ends
    the process itself). SIGINT / SIGTERM end the process while it waits."""
    if coordinator_address is None and num_processes is None and process_id is None:
        return
    check_distributed_args(coordinator_address, num_processes, process_id)
    exit_with_launcher()
    given = {}
    if coordinator_address != AUTO:
        given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
        host, port = parse_coordinator_address(coordinator_address)
        if process_id == 0:  # process 0 serves the coordinator on its port
            check_port_free(port, "choose another with --coordinator-address host:port")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # JAX's preemption service takes SIGTERM for itself (as a preemption notice) and the
    # process goes on; without it a SIGTERM stops the run as it stops a single process.
    jax.config.update("jax_enable_preemption_service", False)
    with handling_signals(signal.SIG_DFL):
        if coordinator_address != AUTO and process_id != 0:
            _wait_for_coordinator(host, port, initialization_timeout)
        try:
            jax.distributed.initialize(
                **given, heartbeat_timeout_seconds=heartbeat_timeout, initialization_timeout=initialization_timeout
            )
        except ValueError as err:  # `auto` on no cluster JAX knows: it read no address, count or index
            raise ValueError(
                f"coordinator-address {coordinator_address}: {first_line(err)} (no SLURM, Open MPI, Kubernetes... "
                "cluster found); give host:port with --num-processes and --process-id"
            ) from None
        except Exception as err:  # the runtime's own error (DEADLINE_EXCEEDED, UNAVAILABLE...), in one line
            raise ConnectionError(
                f"could not join the other processes through the coordinator at {coordinator_address} "
                f"within {initialization_timeout} s: {first_line(err)}"
            ) from None
    atexit.register(_leave)


def _wait_for_coordinator(host: str, port: int, timeout: float) -> None:
    """Waits until something accepts connections at host:port; raises ConnectionError after
    `timeout` seconds (JAX's own wait for a coordinator that never comes ends the process
    with a fatal error and a stack trace)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise ConnectionError(
                    f"no coordinator answered at {host}:{port} within {timeout:g} s; "
                    "start process 0 there, or check --coordinator-address"
                ) from None
            time.sleep(0.2)


def _leave() -> None:
    """At exit: tells the other processes that this one ended, so that none waits for it in a
    barrier. A process that left a barrier alone (a signal, a timeout, a peer gone) gives
    JAX's shutdown barrier `LEAVE_ALONE_SECONDS`, then ends with the status it would have had:
    the others may never reach that barrier, and it would hold this process for minutes."""
    from jax._src.distributed import global_state

    with contextlib.suppress(Exception):  # the coordinator is gone already: nobody is left to tell
        global_state.client.key_value_set(f"{_EXITED}{global_state.process_id}", "1", allow_overwrite=True)
    if not _left_alone_status:
        return
    shutdown = threading.Thread(target=jax.distributed.shutdown, name="genesis-shutdown", daemon=True)
    shutdown.start()
    shutdown.join(LEAVE_ALONE_SECONDS)
    if shutdown.is_alive():
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(_left_alone_status[0])


def is_primary() -> bool:
    """Whether this is process 0, the one that writes files and prints progress."""
    return jax.process_index() == 0


def barrier(name: str, timeout: float = AGREEMENT_TIMEOUT_SECONDS) -> None:
    """Waits until every process reached the barrier `name` (nothing to wait for in one process).

    Never forever: raises PeerFailed once another process has ended without reaching it, or
    after `timeout` seconds, and TrainingInterrupted when SIGINT / SIGTERM arrives meanwhile.
    The processes meet in the coordination service's key-value store, polled from Python so
    that signal handlers run."""
    from jax._src.distributed import global_state  # not jax.process_count(): no backend needed to wait

    if global_state.client is None or global_state.num_processes <= 1:
        return
    client, me = global_state.client, global_state.process_id
    rounds = _barrier_rounds[name] = _barrier_rounds.get(name, 0) + 1  # the same name may come again
    prefix = f"genesis/barrier/{name}/{rounds}/"
    everyone = set(range(global_state.num_processes))
    deadline = time.monotonic() + timeout
    received: list[int] = []  # SIGINT / SIGTERM are only recorded meanwhile: the wait decides how to stop
    with handling_signals(lambda signum, frame: received.append(signum), only_python_handled=True):
        try:
            client.key_value_set(f"{prefix}{me}", "1")
            while True:
                missing = everyone - _processes_under(client, prefix)
                if not missing:
                    return
                ended = sorted(missing & _processes_under(client, _EXITED))
                if ended:
                    raise PeerFailed(f"process {ended[0]} ended before reaching {name!r}; its own message says why")
                if received:
                    signum = received[0]
                    raise TrainingInterrupted(
                        f"stopped by {signal.Signals(signum).name} while waiting for the other processes ({name!r})",
                        signum,
                    )
                if time.monotonic() > deadline:
                    raise PeerFailed(
                        f"process(es) {', '.join(map(str, sorted(missing)))} did not reach {name!r} "
                        f"within {timeout:g} s"
                    )
                time.sleep(0.05)
        except (PeerFailed, TrainingInterrupted) as stop:
            _left_alone_status.append(128 + stop.signum if isinstance(stop, TrainingInterrupted) else EXIT_PEER)
            raise
        except Exception as err:  # the coordinator (process 0) is gone
            _left_alone_status.append(EXIT_PEER)
            raise PeerFailed(f"lost the coordinator while waiting at {name!r}: {str(err).strip()[:200]}") from None


def _processes_under(client, prefix: str) -> set[int]:
    """The process indices stored as keys under `prefix`."""
    return {int(key.rsplit("/", 1)[-1]) for key, _ in client.key_value_dir_get(prefix)}


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
            + (
                " (of several processes: genesis-jax launch --local-devices N gives each N)"
                if jax.process_count() > 1
                else " (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)"
            )
        )
    devices = jax.devices()[:num_devices]
    missing = sorted(set(range(jax.process_count())) - {d.process_index for d in devices})
    if missing:  # they would wait for ever for a computation they have no part in
        # the fewest devices that give every process one: up to the first device of the last process to get one
        least = 1 + max(min(i for i, d in enumerate(jax.devices()) if d.process_index == p) for p in missing)
        raise ValueError(
            f"devices {num_devices} are the first {num_devices} of the {available} of {jax.process_count()} processes, "
            f"and process(es) {', '.join(map(str, missing))} would hold none: give devices from {least} to {available}"
        )
    return Mesh(np.asarray(devices), (DATA_AXIS,))


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
    """Devices on the data axis; what each algorithm splits over them: PPO's environments, PQN's
    minibatches, the replay batches of DQN and SAC, the world model's batch rows."""
    coordinator_address: str | None = None
    """Several processes: host:port of process 0, or auto (read from SLURM, Open MPI, Kubernetes...)."""
    num_processes: int | None = None
    """Several processes: how many."""
    process_id: int | None = None
    """Several processes: this process's index."""
    heartbeat_timeout: int = HEARTBEAT_TIMEOUT_SECONDS
    """Several processes: seconds of silence after which a process is declared dead and the others exit."""

    def validate_parallel(self, split_name: str, split_size: int) -> None:
        """The relations the field table cannot state (`run.config.FIELD_BOUNDS` checks each
        field's own type and range first): `split_size` of `split_name` splits evenly over the
        devices, and the multi-process arguments fit together."""
        if split_size % self.devices:
            raise ValueError(f"{split_name} {split_size} cannot be split evenly over {self.devices} devices")
        check_distributed_args(self.coordinator_address, self.num_processes, self.process_id)
        if self.num_processes is not None and self.devices < self.num_processes:  # each would train alone
            raise ValueError(
                f"devices {self.devices} with {self.num_processes} processes: the data axis spans that many devices "
                f"and every process must hold one, so devices must be at least {self.num_processes}"
            )

    def mesh(self) -> Mesh | None:
        """The data-parallel mesh, or None for a single device."""
        return make_mesh(self.devices) if self.devices > 1 else None
