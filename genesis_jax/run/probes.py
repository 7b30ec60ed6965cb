"""What a run or benchmark reports about where it ran and what it cost: the device, memory
(the device's peak, one compiled step's need), the matmul FLOPs of a step, package versions."""

from __future__ import annotations

import contextlib
import math

import jax


def device_name(used: int | None = None) -> str:
    """'gpu:NVIDIA H100 x1': the platform, the kind, and the devices `used` (None: all visible)."""
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", "") or device.platform
    return f"{device.platform}:{kind} x{jax.device_count() if used is None else used}"


def machine_name() -> str:
    """The accelerator (`device_name`) and the host's CPU model and core count, for benchmark
    reports: the same CPU family can hide or show a per-step cost."""
    import os
    import platform

    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return f"{device_name()}; host CPU {model}, {os.cpu_count()} cores"


def peak_device_bytes() -> int | None:
    """Peak memory of this process's first device so far, where the backend reports it (GPUs
    do, CPUs not)."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def step_memory_bytes(compiled) -> int | None:
    """Device bytes one call of a compiled training step needs at its peak, from XLA's own
    accounting: its arguments, outputs (less those aliasing donated arguments) and
    temporaries. Unlike the device's peak so far, it counts this step alone (no eval
    pass, no earlier run in the process), and CPUs report it too."""
    memory = compiled.memory_analysis()
    if memory is None:
        return None
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    total = sum(int(getattr(memory, name, 0)) for name in fields)
    return total - int(getattr(memory, "alias_size_in_bytes", 0))


def _matmul_flops(jaxpr) -> float:
    total = 0.0
    for eqn in jaxpr.eqns:
        out = eqn.outvars[0].aval.shape
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(out) * math.prod(lhs[d] for d in lhs_contract)
        elif eqn.primitive.name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape  # kernel; out features counted in `out`
            spec = eqn.params["dimension_numbers"].rhs_spec  # (out features, in features, *spatial)
            per_output = math.prod(rhs[d] for d in spec[1:])
            total += 2.0 * math.prod(out) * per_output / eqn.params["feature_group_count"]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            total += _matmul_flops(sub)
    return total


def matmul_flops(fn, *args) -> float:
    """Floating-point operations of the matrix products and convolutions in one call of
    `fn(*args)` (2 per multiply-add), counted from its jaxpr, forward and backward alike:
    the work a device's matmul units do, the same on every backend. Elementwise work is
    not counted. (Ops inside loops count once per loop, so pass a single step.)"""
    return _matmul_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def versions_line() -> str:
    from genesis_jax.run.checkpoint import package_versions

    return ", ".join(f"{k} {v}" for k, v in package_versions().items())
