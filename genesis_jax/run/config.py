"""What every algorithm's config is made of, declared once: the field groups it composes (run
length, environments, seeds, network, replay), the mixed-precision settings every config
shares and how they become the amp pieces (the scaler, the divergence guard, the fault
injection), and one way of checking them all: a table of ranges per class, types from the
annotations, and a `check` per class for the relations between its fields."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from typing import Any, Literal, Mapping

import numpy as np
import optax

from genesis_jax.amp._checks import is_int, refuse_unless
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.loss_scale import INT32_MAX, check_loss_scale_args
from genesis_jax.amp.policy import Precision, check_precision, get_precision, recorded_spelling
from genesis_jax.amp.state import TrainState
from genesis_jax.amp.testing import FaultInjection

# -- field checks: every trainer config's types and ranges, in one place ----------------------

INT64_MAX = 2**63 - 1
SEED_MAX = 2**32 - 1  # jax.random.PRNGKey keeps a seed's low 32 bits: larger seeds would collide
FLOAT32_MAX = float(np.finfo(np.float32).max)  # hyperparameters enter float32 programs


JOINING_FIELDS = ("coordinator_address", "num_processes", "process_id")


def resume_flags(config) -> str:
    """The flags that continue a run of `config` as it is: its fields that differ from their
    defaults, which a bare `--resume` would take (a run of 1,000,000 steps resumed without
    `--total-steps` ended at the default 500,000; one in fp16 was refused), less a multi-process
    run's joining flags (each process's own, and `launch` gives them itself: its coordinator's
    port was this run's alone)."""
    flags = []
    for field in dataclasses.fields(config) if dataclasses.is_dataclass(config) else ():
        value = getattr(config, field.name)
        if field.name in JOINING_FIELDS or field.default in (dataclasses.MISSING, value):
            continue
        flag = "--" + flag_name(field.name)
        if isinstance(value, bool):
            flags.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            flags += [flag, " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)]
    return " ".join(flags)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The values a numeric field accepts: `low` and `high`, each included unless `*_open`;
    `text` says it in the error message."""

    text: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below


POSITIVE_INT = Bounds(f"a positive integer (at most {INT32_MAX})", 1, INT32_MAX)
SEED = Bounds(f"an integer from 0 to {SEED_MAX} (2^32-1: jax.random.PRNGKey keeps 32 bits)", 0, SEED_MAX)
POSITIVE = Bounds("> 0", 0, low_open=True)
NON_NEGATIVE = Bounds(">= 0", 0)
UNIT_INTERVAL = Bounds("in [0, 1]", 0, 1)
OPEN_UNIT_INTERVAL = Bounds("in (0, 1)", 0, 1, low_open=True, high_open=True)
RATE = Bounds("in (0, 1]", 0, 1, low_open=True)  # a Polyak rate: 0 would never move
STEPS = Bounds(f"a positive integer (at most {INT64_MAX})", 1, INT64_MAX)  # environment steps: int64
INT32_STEPS = Bounds(f"a positive integer, at most {INT32_MAX} (the environment step counter is int32)", 1, INT32_MAX)
_INT32 = Bounds(f"an integer from {-INT32_MAX - 1} to {INT32_MAX} (int32)", -INT32_MAX - 1, INT32_MAX)


def flag_name(field: str) -> str:
    """A field's name as its command-line flag says it (without the dashes)."""
    return field.replace("_", "-")


def _declared(cls, name: str) -> list:
    """Each of `cls`'s classes' own `name` (a table, a method), base classes first."""
    return [vars(klass)[name] for klass in reversed(cls.__mro__) if name in vars(klass)]


@functools.lru_cache(maxsize=None)
def _field_table(cls) -> tuple[tuple[str, Any, Bounds | None], ...]:
    """(name, annotation, bounds) of each field: the `FIELD_BOUNDS` tables of `cls` and its
    bases, a subclass's entries winning."""
    hints = typing.get_type_hints(cls)
    bounds = {name: b for table in _declared(cls, "FIELD_BOUNDS") for name, b in table.items()}
    return tuple((f.name, hints[f.name], bounds.get(f.name)) for f in dataclasses.fields(cls) if f.init)


def _checked(value, kind, bounds: Bounds | None):
    """(the value as a plain Python value, None) if it is of `kind`, else (None, what is accepted)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None, None
        (inner,) = [a for a in args if a is not type(None)]
        checked, accepted = _checked(value, inner, bounds)
        return checked, accepted and f"{accepted} or None"
    if origin is typing.Literal:
        if isinstance(value, str) and value in args:
            return value, None
        return None, "one of " + ", ".join(map(str, args))
    if origin is tuple:  # tuple[int, ...]; bounds, where given, hold for each entry of a non-empty one
        if not isinstance(value, (tuple, list)) or not all(map(is_int, value)):
            return None, "a sequence of integers"
        if bounds is not None and not (value and all(map(bounds.holds, value))):
            return None, f"a non-empty sequence, each {bounds.text}"
        if not all(_INT32.holds(v) for v in value):
            return None, "a sequence of int32 integers"
        return tuple(int(v) for v in value), None
    if kind is bool:
        return (bool(value), None) if isinstance(value, (bool, np.bool_)) else (None, "true or false")
    if kind is str:
        return (value, None) if isinstance(value, str) and value.strip() else (None, "a non-empty string")
    if kind is int:
        bounds = bounds or _INT32
        accepted = bounds.text if "integer" in bounds.text else f"an integer {bounds.text}"  # 1e4 is no int
        return (int(value), None) if is_int(value) and bounds.holds(value) else (None, accepted)
    if kind is float:
        number = isinstance(value, (float, np.floating)) or is_int(value)
        if not number or not abs(value) <= FLOAT32_MAX:
            return None, "a finite number" + (f" {bounds.text}" if bounds else "")
        return (float(value), None) if bounds is None or bounds.holds(value) else (None, bounds.text)
    return value, None  # a type this table does not know: its own check decides


def check_fields(config) -> None:
    """Every field of a config dataclass against its annotation (bool is no int; a float field
    takes an int; names are strings; a Literal's choices) and the `FIELD_BOUNDS` tables of its
    classes; each value is stored back as a plain Python value. The first bad field raises a
    `ValueError` naming the field, the value and what is accepted."""
    for name, kind, bounds in _field_table(type(config)):
        value = getattr(config, name)
        checked, accepted = _checked(value, kind, bounds)
        if accepted is not None:
            raise ValueError(f"{flag_name(name)} must be {accepted}, got {value!r}")
        object.__setattr__(config, name, checked)


def budget_schedules(config) -> list[str]:
    """The schedules of `config` that follow its total-steps (each class's `budget_schedules`):
    a resume with another total-steps moves them mid-run, which the resume says."""
    return [schedule for method in reversed(_declared(type(config), "budget_schedules")) for schedule in method(config)]


def check_relations(config) -> None:
    """The relations between a config's fields, once each field is known good: its classes'
    `FIELD_MULTIPLES` tables (field -> the field it must be a multiple of), then each class's
    own `check`, base classes first."""
    for table in _declared(type(config), "FIELD_MULTIPLES"):
        for name, of in table.items():
            value, base = getattr(config, name), getattr(config, of)
            if value % base:
                raise ValueError(f"{flag_name(name)} {value} must be a multiple of {flag_name(of)} {base}")
    for check in _declared(type(config), "check"):
        check(config)


_TRUE_WORDS = ("true", "1", "yes")
_FALSE_WORDS = ("false", "0", "no")


def resolve_precision_name(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Chooses the precision name: explicit argument > GENESIS_PRECISION > ENABLE_FP16_TRAINING > fp32.

    `environ` defaults to `os.environ`. An `ENABLE_FP16_TRAINING` other than true / 1 / yes
    (fp16) or false / 0 / no (fp32) is a `ValueError`.

    Examples:
        >>> resolve_precision_name(environ={"ENABLE_FP16_TRAINING": "true"})
        'fp16'
        >>> resolve_precision_name("bf16", environ={"GENESIS_PRECISION": "fp16"})
        'bf16'
        >>> resolve_precision_name(environ={})
        'fp32'
    """
    ok = explicit is None or isinstance(explicit, str)
    refuse_unless(ok, "the precision", explicit, "a name such as 'fp16' or None")
    ok = environ is None or isinstance(environ, Mapping)
    refuse_unless(ok, "environ", environ, "a mapping of environment variables or None")
    env = os.environ if environ is None else environ
    named, flag = (env.get("GENESIS_PRECISION") or "").strip(), env.get("ENABLE_FP16_TRAINING") or ""
    word = flag.strip().lower()
    if explicit is not None or named:
        return explicit if explicit is not None else named
    if not word or word in _TRUE_WORDS + _FALSE_WORDS:
        return "fp16" if word in _TRUE_WORDS else "fp32"
    raise ValueError(
        f"ENABLE_FP16_TRAINING={flag!r} is not understood; use one of "
        f"{', '.join(_TRUE_WORDS)} (fp16) or {', '.join(_FALSE_WORDS)} (fp32)"
    )


@dataclasses.dataclass(frozen=True)
class MixedPrecisionConfig:
    """The mixed-precision fields every trainer config shares (a dataclass base): the
    policy, the loss scaler, gradient clipping, the divergence guard and fault injection.
    `precision=None` means fp32: a config never reads the environment itself; `from_env`
    (and the CLI) resolve GENESIS_PRECISION / ENABLE_FP16_TRAINING, once, where the run is
    set up. Each field's text below is also its `--help` line."""

    precision: str | None = None
    """fp32 | bf16 | fp16 | fp16-full | auto | a jmp policy string (None: fp32). Default on the
    command line: $GENESIS_PRECISION, else $ENABLE_FP16_TRAINING, else fp32."""
    loss_scaling: Literal["dynamic", "static", "none"] | None = None
    """None: the precision's own (dynamic for fp16, none for fp32 and bf16)."""
    init_loss_scale: float = 2.0**16  # PyTorch GradScaler's defaults
    """The loss scale to start from (static scaling: the scale)."""
    growth_interval: int = 2000
    """Finite steps in a row after which a dynamic scale doubles."""
    min_loss_scale: float | None = None
    """A floor for the dynamic scale. None: no floor."""
    max_grad_norm: float | None = 1.0
    """Clip the unscaled gradients' global norm to this. None: no clipping."""
    strict_finite_checks: bool | None = None
    """Also skip a step whose new params or optimizer state would hold inf or NaN (extra
    passes each step). None: on where params are stored in float16 (fp16-full), else off."""
    guard_min_scale: float | None = DivergenceGuard().min_scale
    """Stop the run when a skip would bring the loss scale below this. None: no floor."""
    max_consecutive_skips: int | None = DivergenceGuard().max_consecutive_skips
    """Stop the run after more than this many skipped updates in a row. None: no limit."""
    inject_nonfinite: float = 0.0
    """Fault injection: make the gradients non-finite on this fraction of updates (seeded)."""
    inject_loss_spike: tuple[int, ...] = ()
    """Fault injection: optimizer steps whose loss is multiplied by loss-spike-factor."""
    loss_spike_factor: float = 1e6
    """Fault injection: the factor of inject-loss-spike."""
    underflow_telemetry: bool = False
    """Log, per layer, the fraction of gradient entries non-zero in float32 that a float16
    backward at the current loss scale flushes to 0 or leaves below float16's smallest normal
    (one float32 and one float16 backward more per update; PPO and the world model)."""

    # The shared fields' bounds (this class's and ParallelConfig's, and every trainer's seed); a
    # subclass adds its own table (`check_fields`). Finer checks (the loss scale's float32
    # range, the guard's) stay with the amp pieces that use the values.
    FIELD_BOUNDS = {
        "seed": SEED,
        "init_loss_scale": POSITIVE,
        "growth_interval": POSITIVE_INT,
        "min_loss_scale": POSITIVE,
        "max_grad_norm": POSITIVE,
        "guard_min_scale": NON_NEGATIVE,
        "max_consecutive_skips": POSITIVE_INT,
        "inject_nonfinite": Bounds("a rate in [0, 1]", 0, 1),
        "loss_spike_factor": POSITIVE,
        "devices": POSITIVE_INT,
        "num_processes": POSITIVE_INT,
        "process_id": Bounds(f"an integer from 0 to {INT32_MAX}", 0, INT32_MAX),
        "heartbeat_timeout": POSITIVE_INT,
    }
    # The fields a resume may change (how it runs, not what it computes): the device layout and
    # the guard's limits here; a field group adds its own (`RESUMABLE`).
    RESUMABLE = (
        "devices",
        "coordinator_address",
        "num_processes",
        "process_id",
        "heartbeat_timeout",
        "guard_min_scale",
        "max_consecutive_skips",
        "underflow_telemetry",
    )
    RESUMABLE_FIELDS = RESUMABLE  # a subclass's: every class's `RESUMABLE` (`__init_subclass__`)

    def __new__(cls, *args, **fields):  # before the dataclass's __init__, whose TypeError names no near field
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        for name in sorted(set(fields) - set(names)):
            near = difflib.get_close_matches(name, names, 1)
            raise TypeError(f"{cls.__name__} has no field {name!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
        return super().__new__(cls)

    def __post_init__(self):
        check_fields(self)  # every field's type and range, the subclass's too, before anything else
        name = "fp32" if self.precision is None else self.precision
        object.__setattr__(self, "precision", recorded_spelling(name))  # "FP16" as "fp16": resumes compare it
        # Fail now on an unknown name or bad scaler, guard or fault settings; without touching
        # a device, which would start JAX before the CLI joins other processes.
        scaling = check_precision(self.precision, self.loss_scaling)
        try:
            check_loss_scale_args(scaling, self.init_loss_scale, self.growth_interval, self.min_loss_scale)
        except ValueError as err:  # amp's argument names, said as this config's flags
            raise ValueError(re.sub(r"\b(init|min)_scale\b", r"\1-loss-scale", str(err))) from None
        self.divergence_guard()
        self.fault_injection(0)
        check_relations(self)  # the relations between fields, each class's (`FIELD_MULTIPLES`, `check`)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Every class's `RESUMABLE`, and a `RESUMABLE_FIELDS` written by hand (as configs did before the groups).
        names = [f for attr in ("RESUMABLE", "RESUMABLE_FIELDS") for fields in _declared(cls, attr) for f in fields]
        cls.RESUMABLE_FIELDS = tuple(dict.fromkeys(names))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **fields):
        """The config with `fields`, its precision (unless given) from GENESIS_PRECISION /
        ENABLE_FP16_TRAINING in `environ` (default: `os.environ`).

        >>> from genesis_jax.algos.ppo import PPOConfig
        >>> PPOConfig.from_env({"ENABLE_FP16_TRAINING": "true"}, total_steps=1024).precision
        'fp16'
        """
        return cls(**{**fields, "precision": resolve_precision_name(fields.get("precision"), environ)})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def train_precision(self) -> Precision:
        return get_precision(self.precision, self.loss_scaling)

    def unused_scaling_note(self) -> str | None:
        """One line where a loss-scale setting other than its default changes nothing: the run
        scales no loss, or its static scale neither grows nor has a floor. None otherwise. Asked
        when the run starts, so 'auto' is what it picks on this backend."""
        precision = self.train_precision()
        scaling = precision.loss_scaling
        growth = ("growth_interval", "min_loss_scale")  # a dynamic scale's alone
        unused = {"none": ("init_loss_scale", *growth), "static": growth}.get(scaling, ())
        given = [f"--{f.replace('_', '-')}" for f in unused if getattr(self, f) != getattr(type(self), f)]
        if not given:
            return None
        name = f"auto ({precision.name} here)" if self.precision == "auto" else self.precision
        why = f"{name}{' with loss-scaling none' * (self.loss_scaling == 'none')} scales no loss"
        why = "a static loss scale neither grows nor has a floor" if scaling == "static" else why
        return f"note: {', '.join(given)} change{'s' * (len(given) == 1)} nothing here: {why}"

    def divergence_guard(self):
        return DivergenceGuard(self.guard_min_scale, self.max_consecutive_skips)

    def fault_injection(self, seed: int):
        return FaultInjection(self.inject_nonfinite, self.inject_loss_spike, self.loss_spike_factor, seed)

    def faults(self, seed: int) -> FaultInjection | None:
        """The fault injection for `train_step`, or None when none is asked for."""
        faults = self.fault_injection(seed)
        return faults if faults.active else None

    def check_resume(self, saved: dict) -> None:
        """Refuses, in one sentence saying what works, a resume whose state these settings
        would shape differently from the saved run's (`saved`: its config as a dict)."""

    def adam(self, learning_rate, eps: float = 1e-8) -> optax.GradientTransformation:
        """`optax.adam`, its eps at least 1e-5 where the moments are stored in float16 (fp16-full):
        1e-8 flushes to 0 there, and a zero gradient's update 0 / (0 + 0) is non-finite."""
        if np.dtype(self.train_precision().param_dtype) == np.float16:
            eps = max(eps, 1e-5)
        return optax.adam(learning_rate, eps=eps)

    def create_train_state(self, params, tx, apply_fn=None, shared_scaler: bool = False) -> TrainState:
        """An `amp.TrainState` as this config says: the precision, its loss scaler, clipping
        and the divergence guard on `tx` (wrapped in `skip_nonfinite`); `shared_scaler` for
        optimizers sharing one scaler (`amp.update_scaler`)."""
        precision = self.train_precision()
        return TrainState.create(
            params=params,
            tx=tx,
            apply_fn=apply_fn,
            scaler=precision.scaler(self.init_loss_scale, self.growth_interval, self.min_loss_scale),
            precision=precision,
            max_grad_norm=self.max_grad_norm,
            guard=self.divergence_guard(),
            strict=self.strict_finite_checks,
            shared_scaler=shared_scaler,
        )


# -- field groups: the fields several algorithms share, declared once -------------------------
# An algorithm's `...Fields` dataclass composes the groups it needs and adds its own fields;
# it redeclares a group's field only to change its default, narrow its type or say what it
# means there (else the group's text stays the `--help` line). A dataclass puts its last
# base's fields first: list the groups in the reverse of their `--help` order. Each group
# carries its ranges (`FIELD_BOUNDS`), what a resume may change (`RESUMABLE`) and the
# relations between its fields (`check`).


@dataclasses.dataclass(frozen=True)
class RunFields:
    """How long a run is and how often it reports."""

    total_steps: int = 500_000
    """Environment steps in all (all environments together)."""
    updates_per_chunk: int | None = None
    """Rows (the template's steps) per compiled chunk between progress reports. None: about 25 reports per run."""

    FIELD_BOUNDS = {"total_steps": STEPS, "updates_per_chunk": POSITIVE_INT}
    RESUMABLE = ("total_steps", "updates_per_chunk")  # a longer run extends this one


@dataclasses.dataclass(frozen=True)
class EnvFields:
    """The environments an algorithm steps inside its compiled loop (`envs.in_loop`)."""

    env: str = "CartPole-v1"
    """A gymnax or gymnasium environment id (CartPole-v1, Breakout-MinAtar, Pendulum-v1, ALE/Pong-v5, ...)."""
    env_backend: Literal["gymnax", "gymnasium", "envpool"] | None = None
    """None: gymnax where it has the id, else gymnasium (extras: atari, gymnasium[mujoco]); envpool: Atari."""
    num_envs: int = 4
    """Environments stepped in parallel."""
    vectorization: Literal["sync", "async"] = "sync"
    """gymnasium: sync (in this process) or async (a subprocess per environment)."""
    action_repeat: int = 1
    """gymnasium: repeat each action this many steps (not Atari, which skips 4 frames itself)."""

    FIELD_BOUNDS = {"num_envs": POSITIVE_INT, "action_repeat": POSITIVE_INT}
    RESUMABLE = ("vectorization",)


@dataclasses.dataclass(frozen=True)
class SeedFields:
    """The seed, and how many seeds train together under `vmap`."""

    seed: int = 0
    """Seed of the parameters, the environments, the run's random draws and the fault injection."""
    num_seeds: int = 1
    """Seeds trained together in one compiled run (JAX environments); seed k is --seed + k."""

    FIELD_BOUNDS = {"seed": SEED, "num_seeds": POSITIVE_INT}

    def check(self) -> None:
        if self.seed + self.num_seeds - 1 > SEED_MAX:
            raise ValueError(f"seed + num-seeds - 1 must be at most {SEED_MAX}, got {self.seed + self.num_seeds - 1}")
        if getattr(self, "devices", 1) > 1 and self.num_seeds > 1:
            raise ValueError("num-seeds > 1 and devices > 1 cannot be combined; run the seeds one after another")


@dataclasses.dataclass(frozen=True)
class NetworkFields:
    """The torso of the algorithm's networks (`nets.torsos`)."""

    network: str | None = None
    """Torso: mlp | resmlp | cnn | impala. None: cnn for image observations, mlp otherwise."""
    hidden: tuple[int, ...] = (64, 64)
    """mlp: hidden widths."""

    FIELD_BOUNDS = {"hidden": POSITIVE_INT}

    def check(self) -> None:
        from genesis_jax.nets.torsos import NETWORKS  # flax: imported where a network is checked

        if self.network is not None and self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; accepted: {', '.join(NETWORKS)}")


@dataclasses.dataclass(frozen=True)
class ResMLPFields:
    """The residual MLP torso's shape (network resmlp)."""

    width: int = 256
    """resmlp: residual stream width."""
    depth: int = 2
    """resmlp: residual blocks."""

    FIELD_BOUNDS = {"width": POSITIVE_INT, "depth": POSITIVE_INT}
    USED_WHEN = {"width": ("network", "resmlp"), "depth": ("network", "resmlp")}  # summary.json leaves them out else


@dataclasses.dataclass(frozen=True)
class ReplayFields:
    """An off-policy algorithm's replay buffer (`data.replay`)."""

    buffer_size: int = 1_000_000
    """Transitions the replay buffer holds, per seed."""
    batch_size: int = 256
    """Transitions per gradient step."""
    learning_starts: int = 10_000
    """Environment steps of collection only before the first gradient step."""

    # The buffer against the batch and the memory: `data.replay.check_replay_sizes`, where it is built.
    FIELD_BOUNDS = {"buffer_size": POSITIVE_INT, "batch_size": POSITIVE_INT, "learning_starts": NON_NEGATIVE}


def summary_config(config) -> dict:
    """`config.to_dict()` less the fields the run does not use, as `summary.json` shows it: a
    field group's `USED_WHEN` maps a field to (another field, the value that one must have)."""
    used_when = {k: v for table in reversed(_declared(type(config), "USED_WHEN")) for k, v in table.items()}
    return {
        k: v
        for k, v in config.to_dict().items()
        if k not in used_when or getattr(config, used_when[k][0], None) == used_when[k][1]
    }
