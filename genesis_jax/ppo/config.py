"""PPO configuration: defaults are PureJaxRL's CartPole settings."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from genesis_jax.nets.torsos import NETWORKS
from genesis_jax.parallel import ParallelConfig
from genesis_jax.precision import RESUMABLE_BASE_FIELDS, MixedPrecisionConfig, Precision, get_precision


@dataclasses.dataclass(frozen=True)
class PPOConfig(MixedPrecisionConfig, ParallelConfig):
    env: str = "CartPole-v1"
    env_backend: str | None = None  # gymnax | gymnasium | envpool; None: gymnax where it has the id, else gymnasium
    rollout_precision: str | None = None  # None: the training precision
    total_steps: int = 500_000
    num_envs: int = 4
    num_steps: int = 128
    update_epochs: int = 4
    num_minibatches: int = 4
    lr: float = 2.5e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    clip_value: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float | None = 0.5
    network: str | None = None  # mlp | resmlp | cnn | impala; None: cnn for images, mlp otherwise
    hidden: Sequence[int] = (64, 64)  # mlp
    activation: str = "tanh"  # mlp
    width: int = 256  # resmlp
    depth: int = 2  # resmlp: residual blocks
    seed: int = 0
    num_seeds: int = 1
    vectorization: str = "sync"  # gymnasium: sync (DummyVecEnv) | async (SubprocVecEnv)
    action_repeat: int = 1  # gymnasium only
    updates_per_chunk: int | None = None  # None: about 25 progress reports per run

    # What a resume may change without changing what the run is (see `train`).
    RESUMABLE_FIELDS = RESUMABLE_BASE_FIELDS + ("total_steps", "updates_per_chunk", "vectorization")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.hidden, (str, bytes)) or not all(isinstance(h, (int, np.integer)) for h in self.hidden):
            raise ValueError(f"hidden must be a sequence of integers such as (64, 64), got {self.hidden!r}")
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        positive = (
            "total_steps",
            "num_envs",
            "num_steps",
            "update_epochs",
            "num_minibatches",
            "num_seeds",
            "action_repeat",
            "width",
            "depth",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if any(h < 1 for h in self.hidden) or not self.hidden:
            raise ValueError(f"hidden sizes must be positive integers, got {self.hidden!r}")
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num-envs x num-steps = {self.batch_size} is not divisible into {self.num_minibatches} minibatches"
            )
        if self.total_steps < self.batch_size:
            raise ValueError(
                f"total-steps {self.total_steps} is less than one rollout (num-envs x num-steps = {self.batch_size})"
            )
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"gamma and gae-lambda must lie in [0, 1], got {self.gamma}, {self.gae_lambda}")
        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")
        if self.vectorization not in ("sync", "async"):
            raise ValueError(f"vectorization must be sync or async, got {self.vectorization!r}")
        if self.updates_per_chunk is not None and self.updates_per_chunk < 1:
            raise ValueError(f"updates-per-chunk must be >= 1, got {self.updates_per_chunk}")
        self.validate_parallel("num-envs", self.num_envs)
        if self.devices > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")
        self.rollout_precision_resolved()  # fail now on an unknown name, not after env set-up

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_steps // self.batch_size

    def rollout_precision_resolved(self) -> Precision:
        return get_precision(self.rollout_precision or self.precision)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
