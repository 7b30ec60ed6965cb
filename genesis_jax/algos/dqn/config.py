"""DQN configuration: defaults are PureJaxRL's (CleanRL's) CartPole settings, but for the target
(Double DQN: --no-double-q for theirs); `minatar` gives the MinAtar ones."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Literal

from genesis_jax.algos.base import ActingFields, Config
from genesis_jax.algos.explore import EpsilonGreedyFields
from genesis_jax.run.config import POSITIVE, POSITIVE_INT, RATE, ReplayFields


@dataclasses.dataclass(frozen=True)
class DQNFields(EpsilonGreedyFields, ReplayFields, ActingFields):
    """DQN's fields: the shared groups it composes (environments, run, seeds, network, replay,
    epsilon-greedy exploration) and its own (`DQNConfig` adds the shared mixed-precision and
    data-parallel ones). Each field's text is also its `--help` line."""

    num_envs: int = 10
    buffer_size: int = 10_000
    batch_size: int = 128
    lr: float = 2.5e-4
    """Adam's learning rate."""
    train_frequency: int = 10
    """Environment steps (all environments together) per gradient step; a multiple of num-envs."""
    target_update_interval: int = 500
    """Environment steps between target-network updates; a multiple of train-frequency."""
    tau: float = 1.0
    """Target update: target <- tau * online + (1 - tau) * target. 1: a copy (periodic); < 1: Polyak."""
    epsilon_steps: int | None = None
    """Deprecated (0.3's fixed schedule; goes in 0.5): environment steps over which epsilon falls,
    whatever total-steps is. None: epsilon-fraction of the steps that run."""
    double_q: bool = True
    """Double DQN: the online network picks the next action, the target network values it."""
    huber_delta: float | None = None
    """The Huber loss's delta (where the TD loss turns from quadratic to linear). None: the
    squared TD error (CleanRL, PureJaxRL): on CartPole's returns of 100s, a delta of 1 makes the
    loss nearly L1, which ignores the few terminal transitions, and the Q-values diverge."""
    hidden: tuple[int, ...] = (120, 84)
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """mlp: activation."""
    replay_dtype: Literal["float32", "compute"] = "float32"
    """How the buffer stores float observations and rewards: float32, or the compute dtype (fp16/bf16
    runs: half the memory, rounded once; float16 holds at most 65504). Frames (MinAtar's 0/1, Atari's pixels) are
    stored as uint8 either way."""
    steps_per_row: int = 5_000
    """Environment steps per metrics row (the template's step: progress and checkpoints fall on rows)."""
    row_steps: int | None = None
    """Deprecated (0.3's name; goes in 0.5): steps-per-row."""


_NEVER = "epsilon never reaches epsilon-end in this run; epsilon-fraction 1 reaches it at the end"


@dataclasses.dataclass(frozen=True)
class DQNConfig(DQNFields, Config):
    """A DQN run: `DQNFields`, and the shared `Config` fields, as keyword arguments of one flat config."""

    max_grad_norm: float | None = None  # CleanRL and PureJaxRL's DQN do not clip

    FIELD_BOUNDS = {n: POSITIVE_INT for n in ("train_frequency", "target_update_interval", "epsilon_steps")}
    FIELD_BOUNDS |= {"steps_per_row": POSITIVE_INT, "row_steps": POSITIVE_INT, "lr": POSITIVE, "tau": RATE}
    FIELD_BOUNDS |= {"huber_delta": POSITIVE}
    RENAMED = {"row_steps": "steps_per_row"}
    # 0.3 recorded epsilon-steps and row-steps in every run: a resume compares what they give (`check_resume`).
    RESUMABLE = ("epsilon_steps", "row_steps", "steps_per_row")
    # Gradient steps, target updates and rows fall on whole vector steps.
    FIELD_MULTIPLES = {"train_frequency": "num_envs", "target_update_interval": "train_frequency"}
    FIELD_MULTIPLES |= {"steps_per_row": "train_frequency"}

    def check(self):
        if self.total_steps < self.steps_per_row:
            raise ValueError(
                f"total-steps {self.total_steps} is less than one row (steps-per-row {self.steps_per_row})"
            )
        run, ran = self.steps_run, self.whole_rows_note
        if not self.learning_starts < run:  # at or past the end: not one gradient step
            raise ValueError(
                f"learning-starts must lie in [0, {run}){ran} for any gradient step to be taken, "
                f"got {self.learning_starts}"
            )
        self.refuse_no_target_update(self.learning_starts + 1, f"learning-starts {self.learning_starts}")
        self.validate_parallel("batch-size", self.batch_size)
        if self.epsilon_steps is not None:
            if self.epsilon_fraction != type(self).epsilon_fraction:  # one would be ignored without a word
                raise ValueError(
                    f"epsilon-steps {self.epsilon_steps} and epsilon-fraction {self.epsilon_fraction} (given, or a "
                    "preset's) both set epsilon's schedule: give epsilon-fraction alone (epsilon-steps is deprecated)"
                )
            share = self.epsilon_steps / self.steps_run
            same = f"epsilon-fraction {share:.6g} is the same schedule" if share <= 1 else _NEVER
            text = "epsilon-steps is deprecated and goes in 0.5: write epsilon-fraction, the share of the run"
            text += f" (its steps in whole rows) over which epsilon falls ({same})"
            warnings.warn(text, FutureWarning, stacklevel=5)

    def refuse_unlearned(self) -> None:
        """A new run's (`DQN.setup`; a recorded run loads as it ran): the first gradient step also
        waits for a batch in the buffer, so a larger batch-size took none, and a target update
        before that step left the target network as initialised, unsaid."""
        run, ran = self.steps_run, self.whole_rows_note
        if self.batch_size > run:
            raise ValueError(
                f"batch-size {self.batch_size} is more transitions than the run collects ({run}){ran}: the buffer "
                "would never hold a batch, and no gradient step would be taken"
            )
        first = max(self.learning_starts + 1, self.batch_size)
        self.refuse_no_target_update(
            first, f"the first gradient step (once the buffer holds batch-size {self.batch_size})"
        )

    def refuse_no_target_update(self, first: int, after: str) -> None:
        """Refuses a target-update-interval with no multiple from environment step `first` (the
        first gradient step's) to the end of the run: the target would stay as initialised."""
        interval, run = self.target_update_interval, self.steps_run  # updates at the interval's multiples
        if -(-first // interval) * interval > run:
            raise ValueError(
                f"target-update-interval {interval} puts no target update between {after} and the end "
                f"({run}){self.whole_rows_note}: the target network would never learn"
            )

    @property
    def steps_run(self) -> int:
        """The environment steps (one seed's) the run takes: whole rows."""
        return self.total_steps // self.steps_per_row * self.steps_per_row

    @property
    def whole_rows_note(self) -> str:
        """What a refusal adds where total-steps is not whole rows: " (total-steps N runs M: whole rows)"."""
        run = self.steps_run
        return "" if run == self.total_steps else f" (total-steps {self.total_steps} runs {run}: whole rows)"

    @property
    def epsilon_follows_budget(self) -> bool:
        return self.epsilon_steps is None

    @property
    def epsilon_horizon(self) -> float:
        """Environment steps over which epsilon falls: epsilon-steps where given (deprecated), else
        epsilon-fraction of the steps that run."""
        return super().epsilon_horizon if self.epsilon_steps is None else float(self.epsilon_steps)

    def check_resume(self, saved: dict) -> None:
        """A resume keeps the rows of the run it continues (0.4 spelled steps-per-row row-steps) and
        its epsilon schedule where either spells it in epsilon-steps (0.3's runs all do)."""
        saved_row = saved.get("row_steps") or saved.get("steps_per_row", DQNFields.steps_per_row)
        if saved_row != self.steps_per_row:
            raise ValueError(
                f"this run's rows are {saved_row} environment steps, these settings' {self.steps_per_row}: resume "
                f"with --steps-per-row {saved_row}"
            )
        saved_steps = saved.get("epsilon_steps")
        if saved_steps is None and self.epsilon_steps is None:
            return
        if saved_steps is None:
            fraction = saved.get("epsilon_fraction", DQNFields.epsilon_fraction)
            saved_steps = max(1.0, fraction * saved.get("total_steps", self.total_steps))
        if round(saved_steps) != round(self.epsilon_horizon):
            raise ValueError(
                f"this run's epsilon falls over its first {round(saved_steps)} environment steps, these settings "
                f"over {round(self.epsilon_horizon)}: resume with --epsilon-steps {round(saved_steps)} to keep that "
                f"schedule (or --epsilon-fraction {saved_steps / self.steps_run:.6g} --allow-config-change)"
            )


def minatar(env: str = "Breakout-MinAtar", **overrides) -> DQNConfig:
    """MinAtar settings in the manner of CleanRL's Atari DQN and the MinAtar paper (Young &
    Tian 2019): a 100k buffer, batch 32, a gradient step every 4 environment steps, a target
    copy every 1000, epsilon 1 -> 0.01 over the first 10% of the steps (5M), the CNN torso.

    >>> minatar(total_steps=1_000_000).buffer_size
    100000
    """
    settings = dict(
        env=env,
        total_steps=5_000_000,
        num_envs=4,
        buffer_size=100_000,
        batch_size=32,
        lr=1e-4,
        train_frequency=4,
        learning_starts=20_000,
        target_update_interval=1_000,
        epsilon_end=0.01,
        epsilon_fraction=0.1,
        steps_per_row=20_000,
        network="cnn",
        huber_delta=1.0,
    )
    return DQNConfig(**{**settings, **overrides})
