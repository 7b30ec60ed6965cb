"""The world model's configuration."""

from __future__ import annotations

import dataclasses
from typing import Literal

from genesis_jax.algos.base import Config
from genesis_jax.run.config import OPEN_UNIT_INTERVAL, POSITIVE, POSITIVE_INT, SeedFields


@dataclasses.dataclass(frozen=True)
class WorldModelFields(SeedFields):
    """The world model's fields: the shared seeds group and its own (`WorldModelConfig` adds
    the shared mixed-precision and data-parallel ones). Each field's text is also its `--help` line."""

    seed: int = 0
    """Seed of the data, the parameters and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run: each its own parameters and shuffles, all on --seed's data."""
    data: str = "synthetic"
    """synthetic | synthetic-small | synthetic-wide | a gymnax or gymnasium env id (random policy) | a .npz
    written by 'genesis-jax collect'. synthetic-small: the synthetic system in units 100x smaller, no
    terminations; synthetic-wide: the synthetic system without terminations, in its own units, seen
    through 256 observation dimensions."""
    num_sequences: int = 2048
    """Sequences to generate or collect (not for a .npz)."""
    sequence_length: int = 32
    """Steps per sequence (not for a .npz)."""
    eval_fraction: float = 0.2
    """Share of the sequences held out for the eval loss."""
    epochs: int = 20
    """Passes over the training sequences."""
    batch_size: int = 1024
    """Transitions per update."""
    width: int = 128
    """Hidden width."""
    depth: int = 2
    """Residual blocks of the MLP core (the GRU core is one cell)."""
    core: Literal["mlp", "gru"] = "mlp"
    """The dynamics core."""
    horizon: int = 1
    """Open-loop steps per sample (> 1: a multi-step loss)."""
    lr: float = 1e-3
    """Adam's learning rate."""
    loss_weight: float = 1.0
    """The training loss's coefficient, as an auxiliary loss is weighted: below 1, smaller gradients
    (train_loss and eval_loss are reported unweighted)."""


# The counts that must be positive integers.
_COUNTS = ("num_sequences", "sequence_length", "epochs", "batch_size", "width", "depth", "horizon")


@dataclasses.dataclass(frozen=True)
class WorldModelConfig(WorldModelFields, Config):
    """A world-model run: `WorldModelFields`, and the shared `Config` fields (clipping at norm
    1.0 by default), as one flat config."""

    RESUMABLE = ("epochs",)  # more epochs extend the run

    # Each field's accepted range (types come from the annotations): `run.config.check_fields`.
    FIELD_BOUNDS = {name: POSITIVE_INT for name in _COUNTS}
    FIELD_BOUNDS |= {"eval_fraction": OPEN_UNIT_INTERVAL, "lr": POSITIVE, "loss_weight": POSITIVE}

    def check(self):
        self.validate_parallel("batch-size", self.batch_size)
        if self.core == "gru" and self.depth not in (WorldModelFields.depth, 1):  # it builds one cell, whatever asked
            raise ValueError(f"depth {self.depth} is the MLP core's blocks: the GRU core is one cell; drop --depth")
        sizes = (self.num_sequences, self.sequence_length)
        if self.data.endswith(".npz") and sizes != (WorldModelFields.num_sequences, WorldModelFields.sequence_length):
            raise ValueError(f"--num-sequences and --sequence-length size generated data; {self.data} has its own")
        if self.horizon > self.sequence_length and not self.data.endswith(".npz"):  # a .npz's: checked on its data
            raise ValueError(f"horizon {self.horizon} is longer than the sequences ({self.sequence_length})")
