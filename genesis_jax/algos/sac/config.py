"""SAC configuration: defaults learn gymnax Pendulum-v1 within 20 000 environment steps
(CleanRL's and SBX's settings, with RL Zoo's Pendulum learning rate)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from genesis_jax.run.config import RESUMABLE_BASE_FIELDS, MixedPrecisionConfig
from genesis_jax.run.parallel import ParallelConfig

SAC_NETWORKS = ("mlp", "resmlp")


@dataclasses.dataclass(frozen=True)
class SACFields:
    """SAC's own fields (`SACConfig` adds the shared mixed-precision and data-parallel ones).
    Each field's text below is also its `--help` line."""

    env: str = "Pendulum-v1"
    """A gymnax or gymnasium environment id with a continuous (Box) action space."""
    env_backend: Literal["gymnax", "gymnasium"] | None = None
    """None: gymnax where it has the id, else gymnasium (MuJoCo tasks: pip install 'gymnasium[mujoco]')."""
    total_steps: int = 20_000
    """Environment steps in all (over all environments)."""
    num_envs: int = 1
    """Environments stepped in parallel; one gradient iteration follows each step of all of them."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (capped at total-steps: a larger buffer would never fill)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    learning_starts: int = 1_000
    """Environment steps of uniformly random actions before the first gradient iteration."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target critics: target <- (1 - tau) target + tau online, each iteration."""
    critic_lr: float = 1e-3
    """Adam's learning rate for the twin critics."""
    actor_lr: float = 1e-3
    """Adam's learning rate for the actor."""
    alpha_lr: float = 1e-3
    """Adam's learning rate for log(alpha), the entropy temperature."""
    init_alpha: float = 1.0
    """The temperature to start from."""
    target_entropy: float | None = None
    """The temperature's target entropy. None: -(action dimensions)."""
    network: Literal["mlp", "resmlp"] = "mlp"
    """Actor and critic torsos: mlp (ReLU) or resmlp (SimBa's residual LayerNorm MLP)."""
    hidden: tuple[int, ...] = (256, 256)
    """mlp: hidden widths."""
    width: int = 256
    """resmlp: residual stream width."""
    depth: int = 2
    """resmlp: residual blocks."""
    steps_per_row: int = 200
    """Environment steps per metrics row (a multiple of num-envs)."""
    seed: int = 0
    """Seed of the parameters, the environments, the replay samples and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run (gymnax)."""
    vectorization: Literal["sync", "async"] = "sync"
    """gymnasium: sync (in this process) or async (a subprocess per environment)."""
    updates_per_chunk: int | None = None
    """Metrics rows per compiled chunk between progress reports. None: about 25 reports per run."""


@dataclasses.dataclass(frozen=True)
class SACConfig(SACFields, MixedPrecisionConfig, ParallelConfig):
    """A SAC run: `SACFields`, and the shared `MixedPrecisionConfig` and `ParallelConfig`
    fields, as keyword arguments of one flat config. The fault injection (inject-nonfinite,
    inject-loss-spike) acts on the critics' step, counted by the critics' optimizer steps."""

    max_grad_norm: float | None = None  # SAC (CleanRL, SBX) does not clip

    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk", "vectorization")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.hidden, (str, bytes)) or not all(isinstance(h, (int, np.integer)) for h in self.hidden):
            raise ValueError(f"hidden must be a sequence of integers such as (256, 256), got {self.hidden!r}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        positive = ("total_steps", "num_envs", "buffer_size", "batch_size", "width", "depth", "num_seeds")
        for name in positive + ("steps_per_row",):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden sizes must be positive integers, got {self.hidden!r}")
        if self.network not in SAC_NETWORKS:
            raise ValueError(f"unknown network {self.network!r} for SAC; accepted: {', '.join(SAC_NETWORKS)}")
        if self.steps_per_row % self.num_envs:
            raise ValueError(f"steps-per-row {self.steps_per_row} is not a multiple of num-envs {self.num_envs}")
        if self.total_steps % self.steps_per_row:
            raise ValueError(f"total-steps {self.total_steps} is not a multiple of steps-per-row {self.steps_per_row}")
        last_due = self.total_steps - self.num_envs  # the last vector step a gradient step can follow
        if not self.batch_size <= self.learning_starts <= last_due:
            raise ValueError(
                f"learning-starts must lie between batch-size {self.batch_size} and total-steps less one vector "
                f"step ({self.total_steps} - {self.num_envs}) for any gradient step to be taken, "
                f"got {self.learning_starts}"
            )
        for name in ("critic_lr", "actor_lr", "alpha_lr", "init_alpha"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be > 0, got {getattr(self, name)!r}")
        if not (0 <= self.gamma <= 1 and 0 < self.tau <= 1):
            raise ValueError(f"gamma must lie in [0, 1] and tau in (0, 1], got {self.gamma}, {self.tau}")
        if self.updates_per_chunk is not None and self.updates_per_chunk < 1:
            raise ValueError(f"updates-per-chunk must be >= 1, got {self.updates_per_chunk}")
        self.validate_parallel("batch-size", self.batch_size)
        if self.devices > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")

    @property
    def iterations(self) -> int:
        """Environment iterations (each steps all num-envs environments once)."""
        return self.total_steps // self.num_envs

    @property
    def torso(self) -> tuple:
        """The networks' torso: ("mlp", hidden widths) or ("resmlp", width, depth)."""
        return ("mlp", self.hidden) if self.network == "mlp" else ("resmlp", self.width, self.depth)

    @property
    def buffer_capacity(self) -> int:
        """buffer-size, capped at total-steps: a short run allocates no more than it fills."""
        return min(self.buffer_size, self.total_steps)

    def check_resume(self, saved: dict) -> None:
        """An extended run keeps its replay buffer: the capacity follows total-steps only up to
        buffer-size, so a run shorter than its buffer-size is extended with that capacity kept."""
        if not {"buffer_size", "total_steps"} <= set(saved):
            return
        kept = min(saved["buffer_size"], saved["total_steps"])
        if kept != self.buffer_capacity:
            raise ValueError(
                f"this run's replay buffer holds {kept} transitions (buffer-size capped at the total-steps it "
                f"started with), these settings give {self.buffer_capacity} and its checkpoint would not fit: "
                f"to extend it, keep the buffer with --buffer-size {kept} --allow-config-change"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
