"""The algorithm template: what one algorithm writes, and what it gets for free.

An algorithm is a subclass of `Algorithm` in its own folder. Its whole contract with the
template is these 18 names (7 declared, 3 set by `setup`, 5 filled in, 3 optional hooks),
each with a default here or checked when the class is made or registered, none looked up by
duck typing:

- declared (class attributes): `name`, `config_class` (its config: its own fields, the first
  base, + `Config`: the shared mixed-precision and parallel fields), `presets` (the runs the
  tools make of it: a few-row `tiny` run for the generic tests, `bench` workloads and `study`
  tasks), `budget_field` (the field a longer run raises), `row_key` (the rows' counter:
  "update", "row", "epoch"), `train_state_path` (the `TrainState` whose scale the rows
  report) and `metrics` (each metric's reduction over seeds, `REDUCTIONS`);
- set by `setup`: `steps_per_row` (environment steps of a row, 1 for an epoch), `spec` (the
  environment it acts in, None for none) and `data` (constant inputs of `update`, a dataset);
- filled in: `setup()`, `init(key) -> state`, `update(state, data) -> (state, metrics)` (one
  row, built on `amp.train_step`: the template scans it into compiled chunks),
  `summary(rows, state) -> dict` (its own summary fields) and, where it acts,
  `act(state, greedy=True) -> act(key, obs) -> actions` (None where it does not act);
- optional hooks with defaults: `shardings` (PPO's environments split over devices),
  `from_checkpoint` (SAC's buffer grown on resume), `inputs` (the world model's dataset).

From those the template writes everything else: each row's `loss_scale`, `skipped` (the
skips of every optimizer in the state) and `halted` (what the divergence guard's stop reads);
the rows (each metric reduced as declared, numbered, per seed where asked), the summary's
head (environment, steps, `final_return` from the rows' episodes, and the greedy policy's
`eval_return` where it acts in a gymnax environment), the plot, the progress bar's fields
and the one-line report; the Session (run directory, checkpoints and resume, signals, the
divergence guard's stop, metric writers, the progress bar); seeds trained together under
`vmap`; data parallelism over a device mesh; the common summary (speed, compile time,
memory, overflow counts); the opt-in underflow telemetry (`underflow`); its `genesis-jax
train NAME` command, bench rows, study tasks, its API reference page and the generic tests.
Its `score` (the summary field the bench reports as how well it learned) follows: `final_return`
where it acts, else `eval_loss`; a checkpoint's step is its row. Registering it (a line of
`genesis_jax.algos._HELP`, or another package's entry point) checks the declarations.

Why this shape: PureJaxRL's `make_train(config) -> train(rng)` compiles the whole run as one
program, which leaves no place for checkpoints, progress or signals; Rejax's `Algorithm`
(a pytree holding its config, shared behaviour in mixins) keeps those out too. Here the pure
parts stay pure and jit-able (one update, scanned into chunks as PureJaxRL does), and the
host loop between chunks, which every algorithm needs the same, is written once.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp import TrainState, train_step
from genesis_jax.amp.loss_scale import with_rules_of
from genesis_jax.amp.policy import get_precision
from genesis_jax.amp.telemetry import underflow_metrics
from genesis_jax.envs.episodes import episode_columns, final_return_of_rows
from genesis_jax.envs.play import MAX_EPISODES, play_gymnax
from genesis_jax.run import plots, probes
from genesis_jax.run.checkpoint import at_path
from genesis_jax.run.config import (
    UNIT_INTERVAL,
    Bounds,
    EnvFields,
    MixedPrecisionConfig,
    NetworkFields,
    RunFields,
    SeedFields,
)
from genesis_jax.run.parallel import ParallelConfig, replicated, start_distributed
from genesis_jax.run.session import Session


@dataclasses.dataclass
class RunResult:
    """What `train` returns: the summary (as in summary.json), the final state, the metric rows."""

    summary: dict
    state: Any
    metrics: list[dict]
    train_state_path: tuple[str, ...] = ()
    line: str = ""  # the algorithm's one-line report of the run

    @property
    def train_state(self) -> TrainState:
        return at_path(self.state, self.train_state_path)

    def __getattr__(self, name):
        try:
            return self.__dict__["summary"][name]
        except KeyError:
            raise AttributeError(name) from None


def chunk_size(total: int, requested: int | None, target_chunks: int = 25) -> int:
    """Rows per compiled chunk: a divisor of `total` (one compilation serves the whole
    run) near total / target_chunks, or the `requested` one."""
    if requested is not None:
        if total % requested:
            raise ValueError(f"updates-per-chunk {requested} does not divide the run's {total} rows")
        return requested
    ideal = max(1, total // target_chunks)
    small = [d for d in range(1, math.isqrt(total) + 1) if total % d == 0]  # O(sqrt n), not O(n)
    divisors = small + [total // d for d in small]
    return min(divisors, key=lambda d: (abs(d - ideal), d))


SEED_AXIS = "seed"  # the vmap axis of seeds trained together


@dataclasses.dataclass(frozen=True)
class ActingFields(NetworkFields, SeedFields, RunFields, EnvFields):
    """The field groups of every algorithm that acts: its environments, run length, seeds and
    network (`run.config`), and its returns' discount; an algorithm's fields add the others it
    composes and its own."""

    gamma: float = 0.99
    """Discount factor."""
    eval_episodes: int = 32
    """Greedy episodes played after training, for the summary's eval_return (gymnax; 0: none)."""

    FIELD_BOUNDS = {"gamma": UNIT_INTERVAL, "eval_episodes": Bounds(f"from 0 to {MAX_EPISODES}", 0, MAX_EPISODES)}
    RESUMABLE = ("eval_episodes",)  # played after training: a resume may change it


@dataclasses.dataclass(frozen=True)
class Config(MixedPrecisionConfig, ParallelConfig):
    """The fields every algorithm's config shares, after its own (`XConfig(XFields, Config)`):
    the mixed-precision and data-parallel ones. `RENAMED` (old name -> today's) reads a field's
    former spelling for a release, with a warning, and resumes the runs that recorded it."""

    RENAMED = {}

    def __post_init__(self):
        for old, new in self.RENAMED.items():  # the old spellings, read for a release
            if getattr(self, old) is not None:
                flag, new_flag = old.replace("_", "-"), new.replace("_", "-")
                # today's spelling given too (not its default, the class's): one would be dropped unsaid
                if getattr(self, new) not in (getattr(type(self), new), getattr(self, old)):
                    raise ValueError(
                        f"{flag} {getattr(self, old)} and {new_flag} {getattr(self, new)} (given, or a preset's) "
                        f"both set {new_flag}: give {new_flag} alone ({flag} is deprecated)"
                    )
                warnings.warn(f"{flag} is deprecated and goes in 0.5: write {new_flag}", FutureWarning, stacklevel=3)
                object.__setattr__(self, new, getattr(self, old))
                object.__setattr__(self, old, None)
        super().__post_init__()

    def check_resume(self, saved: dict) -> None:
        """A run recorded under a field's old spelling resumes with the same value under today's."""
        for old, new in self.RENAMED.items():
            was, flag = saved.get(old), new.replace("_", "-")
            if was is not None and was != getattr(self, new):
                raise ValueError(
                    f"this run's {flag} is {was}, these settings' {getattr(self, new)}: resume with --{flag} {was}"
                )


@dataclasses.dataclass(frozen=True)
class BenchWorkload:
    """A `genesis-jax bench` workload an algorithm names: its config settings besides precision and seed."""

    name: str
    settings: dict
    quick: bool = False  # in `bench --quick` (CPU-sized); else in the full (GPU-sized) run
    vmap_seeds: bool = False  # all seeds in one compiled run (JAX environments)
    seconds: float | None = None  # total steps sized to about this long a run (host environments)
    kind: str = dataclasses.field(default="", kw_only=True)  # the algorithm that declares it: set as it is read


@dataclasses.dataclass(frozen=True)
class StudyTask:
    """A `genesis-jax study` task an algorithm names: its settings, budget and reference score."""

    settings: dict
    total_steps: int  # the default budget, in the algorithm's `budget_field` unit
    reference: float | None  # None: the study's own fp32 IQM (said so in the report), or a loss task's floor
    reference_source: str
    score: str = "return"  # "return" (higher is better) or "loss" (an eval loss: scored as log10, lower is better)
    # set as `study_tasks` reads it: the algorithm that declares it, and the config field the budget sets
    algo: str = dataclasses.field(default="", kw_only=True)
    budget_field: str = dataclasses.field(default="total_steps", kw_only=True)


# What the algorithms' study tasks cite as their reference returns, and the MinAtar games they cover.
GYMNAX_README = "gymnax README, table of environments (gymnax-blines PPO checkpoint)"
NO_PUBLISHED_REFERENCE = "none published for this gymnax version that we could verify: the study's own fp32 IQM"
MINATAR_GAMES = ("Breakout", "Asterix", "Freeway", "SpaceInvaders")
# The classic-control tasks of several algorithms' studies.
CARTPOLE = StudyTask({"env": "CartPole-v1"}, 500_000, 500.0, f"{GYMNAX_README}: R 500 (the maximum)")
ACROBOT = StudyTask({"env": "Acrobot-v1"}, 500_000, -80.0, f"{GYMNAX_README}: R -80")


@dataclasses.dataclass(frozen=True)
class Presets:
    """The runs the tools around an algorithm make of it, declared once in its class."""

    tiny: dict  # config settings of a few-row run, for the generic tests
    bench: tuple[BenchWorkload, ...] = ()  # `genesis-jax bench` workloads
    study: dict[str, StudyTask] = dataclasses.field(default_factory=dict)  # `genesis-jax study` tasks by name


def minatar_tasks(name: str, settings: Callable[[str], dict], total_steps: int) -> dict[str, StudyTask]:
    """A study task per MinAtar game: `name` with the game's name for {game}, `settings(game)`."""
    task = lambda game: StudyTask(settings(game), total_steps, None, NO_PUBLISHED_REFERENCE)
    return {name.format(game=game): task(game) for game in MINATAR_GAMES}


# How a metric becomes its rows' column (`Algorithm.metrics`: metric -> reduction over the seeds
# trained together). A metric not declared is averaged; "underflow/LAYER" follows "underflow".
# " per seed" after a reduction adds, in an N-seed run, the column NAME_per_seed (each seed's value).
_CASTS = {
    "mean": float,  # the mean (NaN where a seed's is)
    "nanmean": lambda v: float(v) if np.isfinite(v) else None,  # the mean of the seeds with a value, else None
    "sum": int,  # counts
    "any": bool,  # flags
    "rate": float,  # the sum per second of wall time (the world model's optimizer steps)
}
REDUCTIONS = (*_CASTS, "episodes")  # episodes: `episode_columns` of `episodes` and `return_sum`
PER_SEED = " per seed"
# The template's own metrics (`compile_chunk`), under every algorithm's; the guard's `halted_per_seed` as it is.
_REQUIRED = {"loss_scale": "mean" + PER_SEED, "skipped": "sum" + PER_SEED, "halted": "any"}


def metric_columns(metrics: dict, declared: dict, num_seeds: int, seconds: float = 0.0) -> dict[str, list]:
    """A chunk's columns (a list each, an entry per row) from its metrics ([seeds, rows], or
    [rows] for one seed), each reduced over the seeds as `declared` says (`REDUCTIONS`).

    >>> metric_columns({"loss": [[1.0, 2.0], [3.0, 4.0]], "skipped": [[0, 1], [1, 1]]}, {"skipped": "sum"}, 2)
    {'loss': [2.0, 3.0], 'skipped': [1, 2]}
    """
    m = {k: np.asarray(v).reshape(num_seeds, -1) for k, v in metrics.items()}
    how_of = lambda key: declared.get(key, declared.get(key.split("/")[0], "mean"))  # noqa: E731
    columns, per_seed = {}, {}
    for key, values in m.items():
        how = how_of(key)
        reduction, seeds = how.removesuffix(PER_SEED), how.endswith(PER_SEED) and num_seeds > 1
        if reduction == "episodes":
            columns.update(episode_columns(values, m["return_sum"], per_seed=how.endswith(PER_SEED)))
            continue
        if key == "return_sum" and how_of("episodes").startswith("episodes"):
            continue
        if key.endswith("_per_seed"):  # each seed's own, cast as its metric is
            reduction, seeds = how_of(key.removesuffix("_per_seed")).removesuffix(PER_SEED), True
        cast = _CASTS[reduction]
        if values.dtype == np.float32 and reduction in ("mean", "nanmean"):  # 0.05, not 0.05000000074505806
            cast = lambda v, cast=cast: cast(float(str(np.float32(v))))  # noqa: E731  (float32's shortest digits)
        with np.errstate(invalid="ignore", divide="ignore"):
            if reduction == "nanmean":
                have = ~np.isnan(values)
                reduced = np.where(have, values, 0.0).sum(0) / have.sum(0)
            elif reduction == "rate":
                reduced = values.sum(0) * values.shape[1] / max(seconds, 1e-9)
            else:
                reduced = {"sum": values.sum(0), "any": values.any(0)}.get(reduction, values.astype(float).mean(0))
        if not key.endswith("_per_seed"):
            columns[key] = [cast(v) for v in reduced]
        if seeds:
            per_seed[key if key.endswith("_per_seed") else f"{key}_per_seed"] = [[cast(v) for v in r] for r in values.T]
    return {**columns, **per_seed}


# The plot's curves, the progress bar's fields and the one-line report's results, from the rows
# and the summary: (column or summary field, the bar's or the line's label, format).
_LOSSES = ("loss", "train_loss", "eval_loss", "critic_loss", "actor_loss")
_BAR = (("episode_return", "ret", ".1f"), ("epsilon", "eps", ".2f"))
_BAR += (("train_loss", "train", ".4f"), ("eval_loss", "eval", ".4f"))
_RESULTS = ("final_return", ".1f"), ("eval_return", ".1f"), ("final_train_loss", ".4f"), ("eval_loss", ".4f")
_RESULTS += ("noise_floor", ".4f"), ("final_loss", ".4f")
_TELEMETRY = ("underflow", "flushed")  # the opt-in underflow telemetry's columns: their means in the summary


def bar_fields(row: dict, shown: dict) -> dict:
    """The progress bar's own fields after `row`: the newest known value of each (`shown`, updated)."""
    shown.update({label: f"{row[key]:{fmt}}" for key, label, fmt in _BAR if row.get(key) is not None})
    return shown


# Summary fields measured while training: a resume with nothing left to run keeps the run's own.
MEASURED = (
    "steps_per_second",
    "compile_seconds",
    "wall_seconds",
    "resumed_from",
    "train_step_bytes",
    "compiled_temp_bytes",
    "peak_device_bytes",
)


def _largest_divisor_at_most(total: int, limit: int) -> int:
    return next(d for d in range(min(limit, total), 0, -1) if total % d == 0)


# 0.4's declarations, read until 0.5 with a FutureWarning: three are now `presets`, two follow from others.
_GROUPED_DECLARATIONS = {"tiny": "tiny", "bench_workloads": "bench", "study_tasks": "study"}
_DERIVED_DECLARATIONS = {"score", "checkpoint_key"}


def _read_old_declarations(cls) -> None:
    old = {name: cls.__dict__[name] for name in _GROUPED_DECLARATIONS if name in cls.__dict__}
    if old:
        inherited = getattr(cls, "presets", None) or Presets(tiny={})  # what a parent declared, either way
        cls.presets = dataclasses.replace(inherited, **{_GROUPED_DECLARATIONS[k]: v for k, v in old.items()})
        message = f"{cls.__name__} declares {', '.join(old)}: now presets = Presets(tiny=, bench=, study=)"
        warnings.warn(f"{message}; the old names go in 0.5", FutureWarning, stacklevel=3)
    for name in sorted(_DERIVED_DECLARATIONS & cls.__dict__.keys()):
        message = "a checkpoint's step is its row" if name == "checkpoint_key" else "final_return or eval_loss"
        warnings.warn(f"{cls.__name__}.{name} is ignored ({message}); it goes in 0.5", FutureWarning, stacklevel=3)


class Algorithm:
    """Subclass, declare, and fill in `setup`, `init`, `update`, `summary` (and `act`): the module docstring."""

    # -- what an algorithm declares ----------------------------------------------------
    name: ClassVar[str]  # the `train` subcommand and the checkpoints' kind
    config_class: ClassVar[type]  # its config: its own fields (the first base) + `Config`
    presets: ClassVar[Presets]  # its tiny run (the generic tests'), bench workloads and study tasks
    budget_field: ClassVar[str] = "total_steps"  # the field a longer run raises (environment steps, epochs)
    row_key: ClassVar[str] = "update"  # the rows' column counting them ("update", "row", "epoch")
    train_state_path: ClassVar[tuple[str, ...]] = ("train_state",)  # the TrainState whose scale the rows report
    metrics: ClassVar[dict[str, str]] = {}  # metric -> its reduction over seeds (REDUCTIONS); default "mean"
    act: ClassVar[Callable | None] = None  # act(state, greedy=True) -> act(key, obs) -> actions, where it acts

    # -- what its `setup` sets ---------------------------------------------------------
    steps_per_row: int = 1  # environment steps of a row (1: a row is an epoch or an optimizer update)
    spec: Any = None  # the `EnvSpec` it acts in; the template makes its environments (`env`) from it
    data: Any = None  # constant inputs of `update` (a dataset), passed to the compiled chunk

    env: Any = None  # `envs.in_loop.InLoopEnv`: `spec`'s num-envs environments, made by the template
    init_compile_seconds: float = 0.0
    row_time: float | None = None  # when the newest rows were made (the "rate" reduction's clock)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _read_old_declarations(cls)
        if "presets" in cls.__dict__ and not isinstance(cls.presets, Presets):  # a parent's was checked with it
            raise TypeError(f"{cls.__name__}.presets must be a `Presets`, got {type(cls.presets).__name__}")
        if "config_class" in cls.__dict__:  # derived from the declarations: what the tools around it read
            cls.fields = cls.config_class.__bases__[0]  # the first --help group
        if "name" in cls.__dict__:
            cls.plot_file = f"{cls.name.replace('-', '_')}.png"  # the run directory's PNG
        # The summary field the bench reports as how well it learned: the training return where it
        # acts, else the held-out loss.
        cls.score = "final_return" if cls.act is not None else "eval_loss"
        cls.underflow_telemetry = "underflow" in cls.metrics  # whether `update` measures it
        for metric, how in cls.metrics.items():
            if how.removesuffix(PER_SEED) not in REDUCTIONS:
                raise TypeError(f"{cls.__name__}.metrics reduces {metric!r} by {how!r}; accepted: {REDUCTIONS}")

    def __init__(self, config, grad_transform: Callable | None = None, recorded: bool = False):
        self.config = config
        self.grad_transform = grad_transform
        # A run recorded earlier (`load`, a resume) is built as it ran: settings refused since for a
        # new run, because they never changed what it computed, are taken as recorded.
        self.recorded = recorded
        self.faults = config.faults(config.seed)
        # Every setting is checked before a file is touched, in one order for every algorithm:
        # the config's own fields (its constructor), then the devices, then the algorithm's setup.
        config.mesh()
        if config.underflow_telemetry and not self.underflow_telemetry:
            raise ValueError(f"underflow-telemetry is not measured by {self.name}; it is by ppo and world-model")
        self.setup()
        if self.spec is not None:  # imported here: gymnax's import starts JAX's backends, which parsing must not
            from genesis_jax.envs.in_loop import in_loop_env, refuse_unapplied_settings

            if not recorded:
                refuse_unapplied_settings(self.spec, config)
            self.env = in_loop_env(self.spec, config.num_envs, config.seed, config.vectorization, config.action_repeat)

    # -- what an algorithm fills in -----------------------------------------------------

    def setup(self) -> None:
        """Checks the input (env, data) and builds networks; touches no file."""

    def init(self, key):
        raise NotImplementedError

    def update(self, state, data):
        raise NotImplementedError

    def summary(self, rows: list[dict], state) -> dict:
        return {}

    def inputs(self) -> dict[str, str]:
        """What the run trains on besides its config (the world model's dataset: its source, size
        and digest): checkpoints record it, and a resume on other inputs is refused as a changed setting."""
        return {}

    def from_checkpoint(self, state, meta: dict):
        """(`state` shaped as the checkpoint with `meta` holds it, a function from that shape to
        this run's): the state as it is by default; SAC's replay buffer grows to a longer run's capacity."""
        return state, lambda restored: restored

    def shardings(self, state, mesh):
        """Data parallelism: the state's shardings over `mesh` (default: all replicated)."""
        return jax.tree.map(lambda _: replicated(mesh), state)

    # -- what the template does ---------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return getattr(self.config, self.budget_field) // self.steps_per_row

    @property
    def num_seeds(self) -> int:
        return getattr(self.config, "num_seeds", 1)

    def close(self) -> None:
        """Releases host resources (environment processes)."""
        if self.env is not None:
            self.env.close()

    def optimizer_states(self, state) -> list:
        """Every amp `TrainState` in `state`, one per optimizer. "skipped" has one meaning: the
        skips of all of them (per optimizer, summed, and per seed), in the rows and the summary."""
        is_train_state = lambda x: isinstance(x, TrainState)  # noqa: E731
        return [x for x in jax.tree.leaves(state, is_leaf=is_train_state) if is_train_state(x)]

    def budget_note(self) -> str | None:
        """One line where the budget is not a whole number of rows, saying what runs instead."""
        asked, runs, unit = getattr(self.config, self.budget_field), self.num_rows * self.steps_per_row, self.unit
        if asked == runs:
            return None
        return (
            f"note: --{self.budget_field.replace('_', '-')} {asked:,} runs as {self.num_rows:,} {self.row_key}"
            f"{'' if self.num_rows == 1 else 's'} of {self.steps_per_row:,} {unit}s: {runs:,} {unit}s"
        )

    @property
    def unit(self) -> str:
        """What the progress bar counts: environment steps where it acts, else rows."""
        return "step" if self.spec is not None else self.row_key

    def rows(self, metrics: dict, done: int) -> list[dict]:
        """A chunk's `metrics.jsonl` rows: each metric reduced over seeds as `metrics` declares,
        numbered by `row_key` from done + 1, with the environment steps so far ("step")."""
        now = time.perf_counter()
        seconds, self.row_time = now - (self.row_time or now), now
        columns = metric_columns(metrics, {**_REQUIRED, **self.metrics}, self.num_seeds, seconds)
        index = np.arange(done + 1, done + len(columns["skipped"]) + 1)
        steps = {"step": (index * self.steps_per_row).tolist()} if self.spec is not None else {}
        columns = {self.row_key: index.tolist(), **steps, **columns}
        return [dict(zip(columns, values)) for values in zip(*columns.values(), strict=True)]

    def title(self) -> str:
        """The plot's title: the algorithm, its environment where it has one, the precision."""
        env = f" {self.config.env}" if self.spec is not None else ""
        return f"{self.display_name}{env} ({self.config.train_precision().name})"

    @property
    def display_name(self) -> str:
        return self.name.upper() if len(self.name) <= 3 else self.name.replace("-", " ")

    def plot(self, rows: list[dict], path, summary: dict) -> None:
        """The run's PNG: its training return (losses on a second axis), or else its losses."""
        row = rows[0] if rows else {}
        losses = [k for k in _LOSSES if k in row]
        x_key, file = "step" if "step" in row else self.row_key, path / self.plot_file
        if "episode_return" in row:
            plots.plot_curves(rows, x_key, ["episode_return"], file, self.title(), log_y=False, twin_keys=losses)
        else:
            plots.plot_curves(rows, x_key, losses, file, self.title(), floor=summary.get("noise_floor"))
        if "underflow" in row:  # the opt-in telemetry: its own picture
            plots.plot_underflow(rows, self.row_key, path / plots.UNDERFLOW_PLOT, title=self.title())

    def describe(self, s: dict) -> str:
        """The one line the CLI prints at the end of a run."""
        env = f" {s['env']}" if "env" in s else ""
        if s["total_updates"] and s["skipped_updates"] == s["total_updates"]:  # the model as initialised
            results = f"no update was applied (all {s['total_updates']} skipped: gradients not finite)"
        else:
            results = " ".join(f"{k}={s[k]:{fmt}}" for k, fmt in _RESULTS if s.get(k) is not None)
        rollout = s.get("rollout_precision", s["precision"])  # PPO's, where it acts in another precision
        precision = s["precision"] + ("" if rollout == s["precision"] else f", rollout {rollout}")
        return (
            f"{self.display_name}{env} [{precision}] {results} steps/s={s['steps_per_second']:.0f} "
            f"compile={s['compile_seconds']:.1f}s loss_scale={s['loss_scale']:g} "
            f"skipped={s['skipped_updates']}/{s['total_updates']}"
        )

    def seed_keys(self):
        """Seed k of an N-seed run starts from PRNGKey(seed + k), as a 1-seed run with
        --seed seed+k does: any seed of a study can be rerun alone."""
        if self.num_seeds == 1:
            return jax.random.PRNGKey(self.config.seed)
        return jax.vmap(jax.random.PRNGKey)(self.config.seed + np.arange(self.num_seeds))

    def train_step(self, train_state: TrainState, loss_fn, batch):
        """`amp.train_step` (`loss_fn` with aux) with this run's gradient hook and fault injection:
        under the seeds' vmap, seed k's seeded by seed + k (the fault steps a 1-seed run of that
        seed would get), so one seed's faults are its own."""
        faults = self.faults
        if faults is not None and self.num_seeds > 1:
            faults = dataclasses.replace(faults, seed=self.config.seed + jax.lax.axis_index(SEED_AXIS))
        return train_step(train_state, loss_fn, batch, has_aux=True, faults=faults, grad_transform=self.grad_transform)

    def make_replay(self, example, capacity: int, batch_size: int, **options):
        """A replay buffer of transitions like `example` (`data.replay.make_replay`), its memory
        (`buffer_bytes`: every seed's buffer) refused in one line where the machine has less."""
        from genesis_jax.data import replay  # flashbax: imported by the algorithms that replay

        buffer = replay.make_replay(example, capacity, batch_size, **options)
        self.buffer_bytes = replay.buffer_bytes(jax.eval_shape(buffer.init)) * self.num_seeds
        replay.check_replay_sizes(capacity, batch_size, self.buffer_bytes, replay.available_memory_bytes())
        return buffer

    def underflow(self, loss_of: Callable, train_state: TrainState, batch) -> dict:
        """The opt-in underflow telemetry (`underflow-telemetry`; {} without it): the gradients of
        `loss_of(precision)` (its loss in that precision) on `batch`, in a float32 and a float16
        backward at the current loss scale, before the update changes the params."""
        if not self.config.underflow_telemetry:
            return {}
        params, scale = train_state.params, train_state.scaler.loss_scale
        reference = jax.grad(lambda p: loss_of(get_precision("fp32"))(p, batch)[0])(params)
        half = jax.grad(lambda p: loss_of(get_precision("fp16"))(p, batch)[0] * scale)(params)
        return underflow_metrics(reference, half)

    def compile_chunk(self, state, per_chunk: int):
        """`call(state) -> (state, metrics[per_chunk])`, compiled (`lower_chunk`)."""
        self.compiled = compiled = self.lower_chunk(state, per_chunk).compile()
        return lambda state: compiled(state, self.data)

    def lower_chunk(self, state, per_chunk: int) -> jax.stages.Lowered:
        """The chunk program for `state`, lowered: `update` scanned `per_chunk` times, vmapped
        over seeds, sharded over the mesh, the state donated. Each row's metrics get the
        template's own: the scale, the skips of every optimizer in the state, and whether the
        divergence guard halted it."""

        def update(state, data):
            new, metrics = self.update(state, data)
            self.check_metrics(metrics)
            before, after = self.optimizer_states(state), self.optimizer_states(new)
            return new, {
                **metrics,
                "loss_scale": self.train_state_of(new).scaler.loss_scale,
                "skipped": sum(a.skipped - b.skipped for a, b in zip(after, before)),
                "halted": jnp.any(jnp.stack([a.halted for a in after])),
            }

        def chunk(state, data):
            return jax.lax.scan(lambda s, _: update(s, data), state, None, per_chunk)

        if self.num_seeds > 1:  # one seed's guard freezes that seed alone; the run stops when every seed has halted
            seeds = jax.vmap(chunk, in_axes=(0, None), axis_name=SEED_AXIS)

            def chunk(state, data):
                state, m = seeds(state, data)
                halted = jnp.broadcast_to(m["halted"].all(0), m["halted"].shape)
                return state, {**m, "halted_per_seed": m["halted"], "halted": halted}

        mesh, out = self.config.mesh(), {}
        if mesh is not None:
            out["out_shardings"] = (self.shardings(jax.eval_shape(lambda: state), mesh), replicated(mesh))
        return jax.jit(chunk, donate_argnums=0, **out).lower(state, self.data)

    def check_metrics(self, metrics) -> None:
        """Refuses, as `update` is traced (before the run starts), metrics the rows cannot be made
        of: not a dict of numbers, a declared metric never returned (a typo would leave the real
        one averaged), or `episodes` without `return_sum`. These failed deep in JAX, or after the
        first chunk had run."""
        where = f"{type(self).__name__}.update"
        if not isinstance(metrics, dict):
            raise TypeError(
                f"{where} must return (state, metrics), metrics a dict of scalars; got {type(metrics).__name__}"
            )
        for key, value in metrics.items():
            if jnp.shape(value) != ():
                raise TypeError(f"{where}'s metric {key!r} has shape {jnp.shape(value)}: reduce it to one number a row")
        # "underflow" is measured only where asked (`underflow-telemetry`)
        needed = [k for k in self.metrics if k != "underflow"]
        needed += ["return_sum"] if self.metrics.get("episodes", "").startswith("episodes") else []
        for key in needed:
            if key not in metrics:
                raise TypeError(
                    f"{where} returns no metric {key!r}, which `metrics` declares: return it, or fix the name"
                )

    def train_state_of(self, state) -> TrainState:
        """The `TrainState` at `train_state_path` in `state`; a TypeError naming the path where
        it names none (an AttributeError deep in the compiled chunk's trace said nothing of it)."""
        try:
            found = at_path(state, self.train_state_path)
        except AttributeError:
            found = None
        if not isinstance(found, TrainState):
            raise TypeError(
                f"{type(self).__name__}.train_state_path {self.train_state_path} names no amp.TrainState of its "
                f"state ({type(state).__name__}): give the attribute names that lead to the one whose scale rows report"
            )
        return found

    def initial_state(self):
        """The initial state, from one compiled program (a Flax init run eagerly compiles
        dozens of small ops one by one: seconds). Seeds go through `lax.map`, not `vmap`: a
        vmapped init (an fp16-full PPO's orthogonal initializers, batched QR) deadlocked XLA's
        CPU runtime (jax 0.10.2). An init that resets host environments runs eagerly."""
        keys = self.seed_keys()
        init = self.init if self.num_seeds == 1 else (lambda keys: jax.lax.map(self.init, keys))
        mesh = self.config.mesh()
        if mesh is not None:
            self.data = jax.device_put(self.data, replicated(mesh)) if self.data is not None else None
        if self.env is not None and self.env.host is not None:  # an init that resets host environments: eagerly
            return init(keys)  # (host environments refuse devices > 1: there is no mesh)
        shardings = None if mesh is None else self.shardings(jax.eval_shape(init, keys), mesh)
        start = time.perf_counter()
        compiled = jax.jit(init, out_shardings=shardings).lower(keys).compile()
        self.init_compile_seconds = time.perf_counter() - start
        return compiled(keys)

    def common_summary(self, rows, state, session: Session, compile_seconds: float) -> dict:
        """The fields every algorithm's summary has: precision, speed, memory, overflow counts;
        where it acts, its environment, steps, `final_return` and `eval_return`; the telemetry's means."""
        ts = self.train_state_of(state)
        steps_per_seed = np.atleast_1d(np.asarray(ts.step))  # the faults are injected into this one's steps
        optimizers = self.optimizer_states(state)
        total_updates = sum(int(np.sum(np.asarray(o.step))) for o in optimizers)
        skipped_per_seed = sum(np.atleast_1d(np.asarray(o.skipped)) for o in optimizers)
        skipped = int(np.sum(skipped_per_seed))
        seeds = self.config.seed + np.arange(len(steps_per_seed))  # seed k's faults are seeded by seed + k
        injected = [self.config.fault_injection(int(s)).count_nonfinite(int(n)) for s, n in zip(seeds, steps_per_seed)]
        compiled = getattr(self, "compiled", None)
        memory = compiled.memory_analysis() if compiled is not None else None
        summary = {
            "precision": self.config.train_precision().name,
            "seed": self.config.seed,
            "num_seeds": self.num_seeds,
            "steps_per_second": session.steps_per_second(self.steps_per_row * self.num_seeds),
            "compile_seconds": compile_seconds,
            "wall_seconds": session.elapsed(),
            "resumed_from": session.rows_done - session.rows_run,  # 0: the times above are the whole run's
            "train_step_bytes": probes.step_memory_bytes(compiled) if compiled is not None else None,
            "compiled_temp_bytes": int(getattr(memory, "temp_size_in_bytes", 0)) if memory is not None else None,
            "peak_device_bytes": probes.peak_device_bytes(),
            "loss_scale": float(np.mean(np.asarray(ts.scaler.loss_scale))),
            "skipped_updates": skipped,
            "total_updates": total_updates,
            "overflow_rate": skipped / total_updates if total_updates else 0.0,
            "injected_nonfinite": sum(injected),
            "iterations": len(rows),
            "device": probes.device_name(self.config.devices),
        }
        if self.num_seeds > 1:
            summary |= {
                "seeds": seeds.tolist(),
                "skipped_updates_per_seed": skipped_per_seed.tolist(),
                "loss_scale_per_seed": np.asarray(ts.scaler.loss_scale, float).tolist(),
                "halted_per_seed": np.asarray(ts.halted).tolist(),
                "injected_nonfinite_per_seed": injected,
            }
        if self.spec is not None:
            summary |= {"env": self.config.env, "env_backend": self.spec.backend}
            summary |= {"total_steps": rows[-1]["step"] if rows else 0, **self.greedy_evaluation(state)}
        if "episodes" in self.metrics:
            summary |= final_return_of_rows(rows, self.num_seeds)
            summary["final_return_is"] = "the mean return of the episodes that ended in the last tenth of the rows"
        return summary | {
            f"{k}_mean": float(np.mean([r[k] for r in rows])) for k in _TELEMETRY if rows and k in rows[0]
        }

    def greedy_evaluation(self, state) -> dict:
        """The summary's `eval_return` (and per seed): the mean return of `eval_episodes` episodes of the
        greedy policy (`act(state, greedy=True)`) after training, played as `genesis-jax eval` plays
        them (`envs.play`), seed k's from seed + k (as a 1-seed run of that seed). Empty where the
        algorithm does not act or eval-episodes is 0; where its episodes cannot all end under jit (a
        host environment, no time limit), `eval_return_is` says so."""
        episodes = getattr(self.config, "eval_episodes", 0)
        if self.act is None or not episodes:
            return {}
        if self.spec.backend != "gymnax" or self.spec.max_episode_steps is None:  # said, not skipped silently
            where = "a host environment" if self.spec.backend != "gymnax" else "an environment with no time limit"
            return {"eval_return_is": f"not played: {where} (genesis-jax eval plays it)"}
        act = lambda state, key, obs: self.act(state, greedy=True)(key, obs)
        seeds = [jax.tree.map(lambda x: x[k], state) for k in range(self.num_seeds)] if self.num_seeds > 1 else [state]
        played = [play_gymnax(self.spec, act, s, episodes, self.config.seed + k) for k, s in enumerate(seeds)]
        per_seed = [float(np.mean(p.returns)) for p in played]
        return {
            "eval_return": float(np.mean(per_seed)),
            "eval_return_per_seed": per_seed,
            "eval_return_is": f"the mean return of {episodes} greedy episodes after training",
        }

    def _progress(self, session: Session) -> Callable[[dict], dict]:
        counted, shown = {"rows": 0, "skipped": 0}, {}  # the skips so far, added up once per row
        steps = self.steps_per_row * self.num_seeds  # a row's, all seeds'

        def postfix(row: dict) -> dict:
            new_rows = session.rows[counted["rows"] :]  # those restored on resume, then each chunk's
            counted["skipped"] += sum(int(np.sum(r.get("skipped", 0))) for r in new_rows)
            counted["rows"] = len(session.rows)
            scale, sps = f"{row['loss_scale']:g}", f"{session.steps_per_second(steps):.0f}"
            return {**bar_fields(row, shown), "scale": scale, "skipped": counted["skipped"], "sps": sps}

        return postfix

    @classmethod
    def train(
        cls, config, out_dir: str | None = None, *, checkpoint_every: int = 0, grad_transform=None, **run_options
    ) -> RunResult:
        """Trains as `config` says. `out_dir` (None: nothing written) gets metrics.jsonl,
        summary.json, a PNG and checkpoints every `checkpoint_every` progress units (PPO:
        environment steps; world model: epochs; 0: at the end only).
        `grad_transform(scaled_grads, train_state) -> grads` runs before the finite check.
        `run_options` are `Session`'s (resume, overwrite, progress, max_to_keep,
        allow_config_change, writers). A guard stop or a signal raises as `Session.finish` says."""
        if not isinstance(config, cls.config_class):  # a dict of settings failed deep inside, on an attribute
            kind = cls.config_class.__name__
            raise TypeError(f"{cls.name} trains from a {kind}, got a {type(config).__name__}: pass {kind}(**settings)")
        start_distributed(config)  # before anything touches a device
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint-every must be >= 0, got {checkpoint_every}")
        # A resume is built as the run recorded it; one allowed to change settings is checked as a new run is.
        recorded = bool(run_options.get("resume")) and not run_options.get("allow_config_change")
        algo = cls(config, grad_transform, recorded=recorded)  # bad input fails here
        try:
            return algo._train(out_dir, checkpoint_every, run_options)
        finally:
            algo.close()

    def _train(self, out_dir, checkpoint_every: int, run_options: dict) -> RunResult:
        announce = run_options.pop("announce", None)  # announce(notes): the caller prints them (the CLI)
        per_chunk = chunk_size(self.num_rows, getattr(self.config, "updates_per_chunk", None))
        every = max(1, checkpoint_every // self.steps_per_row) if checkpoint_every else 0
        if every and out_dir is not None:
            per_chunk = _largest_divisor_at_most(self.num_rows, min(per_chunk, every))
        session = Session(
            out_dir,
            self.config,
            name=self.name,
            train_state_path=self.train_state_path,
            num_rows=self.num_rows,
            row_key=self.row_key,
            steps_per_row=self.steps_per_row,
            unit=self.unit,
            checkpoint_every=every,
            inputs=self.inputs(),
            **run_options,
        )
        session.postfix = self._progress(session)
        self.session = session
        with session:
            template = self.initial_state()
            state = session.restore(template, self.from_checkpoint, self.config.check_resume)
            if session.config_changes:  # a scaler restored holds the saved run's settings: this run's instead
                state = with_rules_of(state, template)
            remaining = session.num_rows - session.rows_done
            if remaining % per_chunk:  # resumed where these chunks do not land on the total: they would run past it
                per_chunk = _largest_divisor_at_most(remaining, per_chunk)
            if remaining and session.progress:  # past every refusal: a note never joins a one-line error
                session.note("compiling the training program (the bar starts when it is done) ...")
            notes = [note for note in (self.budget_note(), self.config.unused_scaling_note()) if note]

            def on_start():  # just before the first step (not if a signal came while compiling), before the bar
                self.row_time = time.perf_counter()
                if announce is not None:
                    announce(notes)
                    return
                for note in notes:
                    session.note(note)

            start = time.perf_counter()
            # A finished run resumed has nothing left to run: nothing to compile.
            call = self.compile_chunk(state, per_chunk) if remaining else None
            compile_seconds = self.init_compile_seconds + time.perf_counter() - start
            state = session.run(state, call, self.rows, per_chunk, on_start=on_start)
            if session.stopped and not session.rows_run:
                session.finish({})  # a signal before the first chunk: nothing to sum up, it raises
            summary = self.common_summary(session.rows, state, session, compile_seconds)
            summary |= self.summary(session.rows, state)
            if not session.rows_run:  # nothing ran here: what the run measured when it ran stays
                summary.update({k: v for k, v in session.previous_summary.items() if k in MEASURED and v is not None})
            plot = lambda rows, path: self.plot(rows, path, summary)  # noqa: E731
            summary = session.finish(summary, self.train_state_of(state), plot=plot)
        return RunResult(summary, state, session.rows, self.train_state_path, self.describe(summary))
