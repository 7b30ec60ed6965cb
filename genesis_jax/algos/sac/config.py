"""SAC configuration: defaults learn gymnax Pendulum-v1 within 20 000 environment steps
(CleanRL's and SBX's settings, with RL Zoo's Pendulum learning rate)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.algos.base import ActingFields, Config
from genesis_jax.run.config import INT32_STEPS, POSITIVE, POSITIVE_INT, RATE, ReplayFields, ResMLPFields


@dataclasses.dataclass(frozen=True)
class SACFields(ResMLPFields, ReplayFields, ActingFields):
    """SAC's fields: the shared groups it composes (environments, run, seeds, replay, network)
    and its own (`SACConfig` adds the shared mixed-precision and data-parallel ones). Each
    field's text is also its `--help` line."""

    env: str = "Pendulum-v1"
    """A gymnax or gymnasium environment id with a continuous (Box) action space (Pendulum-v1, HalfCheetah-v5, ...)."""
    env_backend: Literal["gymnax", "gymnasium"] | None = None  # no envpool: its games have discrete actions
    """None: gymnax where it has the id, else gymnasium (extra: gymnasium[mujoco])."""
    total_steps: int = 20_000
    num_envs: int = 1
    """Environments stepped in parallel; one gradient iteration follows each step of all of them
    (4 environments: a quarter of the gradient iterations per environment step of 1)."""
    buffer_size: int = 1_000_000
    """Transitions the replay buffer holds, per seed (capped at total-steps: a larger buffer would never fill)."""
    learning_starts: int = 1_000
    """Environment steps of uniformly random actions before the first gradient step."""
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
    steps_per_row: int = 200
    """Environment steps per metrics row (a multiple of num-envs)."""


@dataclasses.dataclass(frozen=True)
class SACConfig(SACFields, Config):
    """A SAC run: `SACFields`, and the shared `Config` fields, as keyword arguments of one flat
    config. The fault injection (inject-nonfinite, inject-loss-spike) acts on the critics' step,
    counted by the critics' optimizer steps."""

    max_grad_norm: float | None = None  # SAC (CleanRL, SBX) does not clip

    FIELD_BOUNDS = {n: POSITIVE for n in ("critic_lr", "actor_lr", "alpha_lr", "init_alpha")}
    FIELD_BOUNDS |= {"steps_per_row": POSITIVE_INT, "tau": RATE, "total_steps": INT32_STEPS}
    FIELD_MULTIPLES = {"steps_per_row": "num_envs", "total_steps": "steps_per_row"}  # rows of whole vector steps

    def check(self):
        # At total-steps, one gradient step follows the run's last vector step: no action ever comes of it.
        last_acted_on = self.total_steps - self.num_envs
        if not self.batch_size <= self.learning_starts <= last_acted_on:
            raise ValueError(
                f"learning-starts must lie between batch-size {self.batch_size} and total-steps less one vector "
                f"step ({self.total_steps} - {self.num_envs}) for a gradient step to be taken before the run's last "
                f"vector step, got {self.learning_starts}"
            )
        self.validate_parallel("batch-size", self.batch_size)

    @property
    def torso(self) -> tuple:
        """The networks' torso: ("mlp", hidden widths) or ("resmlp", width, depth)."""
        return ("mlp", self.hidden) if self.network == "mlp" else ("resmlp", self.width, self.depth)

    @property
    def buffer_capacity(self) -> int:
        """buffer-size, capped at total-steps: a short run allocates no more than it fills."""
        return min(self.buffer_size, self.total_steps)

    @staticmethod
    def saved_capacity(saved: dict) -> int | None:
        """The replay capacity of the run whose config is `saved` (a dict; None where it does not say)."""
        known = {"buffer_size", "total_steps"} <= set(saved)
        return min(saved["buffer_size"], saved["total_steps"]) if known else None

    def check_resume(self, saved: dict) -> None:
        """An extended run's replay buffer grows to the longer run's capacity (`SAC.from_checkpoint`),
        its transitions kept in order; it does not shrink."""
        kept = self.saved_capacity(saved)
        if kept is not None and kept > self.buffer_capacity:
            raise ValueError(
                f"this run's replay buffer holds {kept} transitions, these settings give it {self.buffer_capacity}: "
                f"a buffer grows on resume but does not shrink; keep it with --buffer-size {kept}"
            )
