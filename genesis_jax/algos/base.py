"""The algorithm template: what one algorithm writes, and what it gets for free.

An algorithm is a subclass of `Algorithm`, one file: its config dataclass (its own fields
plus the shared `MixedPrecisionConfig` and `ParallelConfig`) and four pure functions,

- `init(key) -> state`: the whole training state (a pytree holding an `amp.TrainState`);
- `update(state, data) -> (state, metrics)`: one row, the template's step (a PPO update,
  DQN's or SAC's `row_steps` environment steps, an epoch) built on `amp.train_step`; the
  template scans it into compiled chunks;
- `rows(metrics, done) -> list[dict]`: a chunk's metrics as `metrics.jsonl` rows;
- `summary(rows, state) -> dict`: its own summary fields;

and, where it acts in an environment, `act(state, greedy=True) -> act(key, obs) -> actions` (its
trained policy, greedy or as in training: what `genesis_jax.load` and `genesis-jax eval` play). It also
declares, as class attributes, what the tools around it need: `config_class`, `tiny` (the
settings of a few-update run, which every generic test trains), `budget_field`,
`bench_workloads` and `study_tasks`. Registering it (one line in `genesis_jax.algos.REGISTRY`)
checks these, and `update`'s metrics are checked for `REQUIRED_METRICS` when it is compiled.
From that
alone `Algorithm.train` gives it the Session (run directory, checkpoints and resume,
SIGINT / SIGTERM, the divergence guard's stop, metric writers, the progress bar), seeds
trained together under `vmap` (a `num_seeds` field), data parallelism over a device mesh
(`shardings`), the common summary (speed, compile time, memory, overflow counts), its
`genesis-jax train NAME` command, bench rows, study tasks, its API reference page and the
generic tests (kill and resume, bad input, seeds, devices, every precision).

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
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp import TrainState, train_step
from genesis_jax.run import plots, probes
from genesis_jax.run.checkpoint import at_path
from genesis_jax.run.parallel import replicated, start_distributed
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

# What `update` must return among its metrics, one value per row: the template reads
# them for the rows' per-seed columns, the progress bar and the divergence guard's stop.
REQUIRED_METRICS = ("loss_scale", "skipped", "halted")


@dataclasses.dataclass(frozen=True)
class BenchWorkload:
    """A `genesis-jax bench` workload an algorithm names: its config settings besides precision and seed."""

    name: str
    settings: dict
    quick: bool = False  # in `bench --quick` (CPU-sized); else in the full (GPU-sized) run
    vmap_seeds: bool = False  # all seeds in one compiled run (JAX environments)
    seconds: float | None = None  # total steps sized to about this long a run (host environments)


@dataclasses.dataclass(frozen=True)
class StudyTask:
    """A `genesis-jax study` task an algorithm names: its settings, budget and reference score."""

    settings: dict
    total_steps: int  # the default budget, in the algorithm's `budget_field` unit
    reference: float | None  # None: the study's own fp32 IQM (said so in the report), or a loss task's floor
    reference_source: str
    score: str = "return"  # "return" (higher is better) or "loss" (an eval loss: scored as log10, lower is better)


# What the algorithms' study tasks cite as their reference returns, and the MinAtar games they cover.
GYMNAX_README = "gymnax README, table of environments (gymnax-blines PPO checkpoint)"
NO_PUBLISHED_REFERENCE = "none published for this gymnax version that we could verify: the study's own fp32 IQM"
MINATAR_GAMES = ("Breakout", "Asterix", "Freeway", "SpaceInvaders")


def _stop_when_every_seed_halted(chunk):
    """Seeds are independent runs: one seed's divergence guard freezes that seed alone, and
    the run stops only when every seed has halted. The chunk's `halted` metric ([seeds,
    rows]) becomes "every seed halted" (what the Session stops on); each seed's own
    flag moves to `halted_per_seed`."""

    def wrapped(state, data):
        state, metrics = chunk(state, data)
        if isinstance(metrics, dict) and "halted" in metrics:
            per_seed = metrics["halted"]
            metrics = {
                **metrics,
                "halted_per_seed": per_seed,
                "halted": jnp.broadcast_to(per_seed.all(0), per_seed.shape),
            }
        return state, metrics

    return wrapped


# Per-seed columns the template adds to an N-seed run's rows: metric -> column.
_PER_SEED_COLUMNS = {
    "loss_scale": "loss_scale_per_seed",
    "skipped": "skipped_per_seed",
    "halted_per_seed": "halted_per_seed",
}


def add_seed_columns(rows: list[dict], metrics, num_seeds: int) -> list[dict]:
    """Each seed's loss scale, skips and halt flag in the rows of an N-seed run (the
    algorithm's own rows average or sum over seeds)."""
    if num_seeds == 1 or not isinstance(metrics, dict):
        return rows
    for key, column in _PER_SEED_COLUMNS.items():
        values = np.asarray(metrics.get(key, np.empty(0)))
        if values.shape != (num_seeds, len(rows)):  # metrics not one per row and seed: not a row column
            continue
        for row, per_seed in zip(rows, values.T.tolist()):
            row[column] = per_seed
    return rows


# Summary fields measured while training: a resume with nothing left to run keeps the run's own.
MEASURED = (
    "steps_per_second",
    "compile_seconds",
    "wall_seconds",
    "train_step_bytes",
    "compiled_temp_bytes",
    "peak_device_bytes",
)


def _largest_divisor_at_most(total: int, limit: int) -> int:
    return next(d for d in range(min(limit, total), 0, -1) if total % d == 0)


class Algorithm:
    """Subclass, set the class attributes, fill in `setup`, `init`, `update`, `rows`, `summary`."""

    name: ClassVar[str]  # the `train` subcommand and the checkpoints' kind
    fields: ClassVar[type]  # the algorithm's own config fields: the first --help group
    config_class: ClassVar[type]  # its config: `fields` + MixedPrecisionConfig + ParallelConfig
    config: Any  # an instance of `config_class`
    tiny: ClassVar[dict] = {}  # config settings of a few-update run, for the generic tests
    budget_field: ClassVar[str] = "total_steps"  # the field a longer run raises (environment steps, epochs)
    bench_workloads: ClassVar[tuple[BenchWorkload, ...]] = ()
    study_tasks: ClassVar[dict[str, StudyTask]] = {}  # task name -> task
    row_key: ClassVar[str] = "update"  # the rows' column counting them ("update", "row", "epoch")
    checkpoint_key: ClassVar[str | None] = None  # the checkpoint meta's field for it (default: row_key)
    train_state_path: ClassVar[tuple[str, ...]] = ("train_state",)
    plot_file: ClassVar[str] = "curves.png"  # the run directory's PNG
    score: ClassVar[str] = "final_loss"  # the summary field that says how well it learned (bench rows)

    # Set by `setup`: the rows in the run, and the progress bar's steps per row and their name
    # (PPO: the environment steps of an update, "step"; the world model: 1 "epoch").
    num_rows: int = 1
    steps_per_row: int = 1
    step_name: str = "update"
    data: Any = None  # constant inputs of `update` (a dataset), passed to the compiled chunk
    env: Any = None  # an `envs.in_loop.InLoopEnv` where the algorithm steps environments in its loop
    underflow_telemetry: ClassVar[bool] = False  # whether `update` measures it (config.underflow_telemetry)
    init_compile_seconds: float = 0.0

    def __init__(self, config, grad_transform: Callable | None = None):
        self.config = config
        self.grad_transform = grad_transform
        self.faults = config.faults(config.seed)
        # Every setting is checked before a file is touched, in one order for every algorithm:
        # the config's own fields (its constructor), then the devices, then the algorithm's setup.
        config.mesh()
        if getattr(config, "underflow_telemetry", False) and not self.underflow_telemetry:
            raise ValueError(f"underflow-telemetry is not measured by {self.name}; it is by ppo and world-model")
        self.setup()

    # -- what an algorithm fills in -----------------------------------------------------

    def setup(self) -> None:
        """Checks the input (env, data) and builds networks; touches no file."""

    def init(self, key):
        raise NotImplementedError

    def update(self, state, data):
        raise NotImplementedError

    def rows(self, metrics, done: int) -> list[dict]:
        raise NotImplementedError

    def summary(self, rows: list[dict], state) -> dict:
        return {}

    def optimizer_states(self, state) -> list:
        """Every amp `TrainState` in `state`, one per optimizer. "skipped" has one meaning: the
        skips of all of them (per optimizer, summed, and per seed), in the rows and the summary."""
        return [at_path(state, self.train_state_path)]

    def postfix(self, row: dict) -> dict:
        """The algorithm's own progress-bar fields for the newest row."""
        return {}

    def inputs(self) -> dict[str, str]:
        """What the run trains on besides its config (the world model's dataset: its source, size
        and digest): checkpoints record it, and a resume on other inputs is refused as a changed setting."""
        return {}

    def from_checkpoint(self, state, meta: dict):
        """(`state` shaped as the checkpoint with `meta` holds it, a function from that shape to
        this run's): the state as it is by default; SAC's replay buffer grows to a longer run's capacity."""
        return state, lambda restored: restored

    def budget_note(self) -> str | None:
        """One line where the budget is not a whole number of rows, saying what runs instead."""
        asked, runs = getattr(self.config, self.budget_field), self.num_rows * self.steps_per_row
        if asked == runs:
            return None
        return (
            f"note: --{self.budget_field.replace('_', '-')} {asked:,} runs as {self.num_rows:,} {self.row_key}s of "
            f"{self.steps_per_row:,} {self.step_name}s: {runs:,} {self.step_name}s"
        )

    def describe(self, summary: dict) -> str:
        """The one line the CLI prints at the end of a run."""
        return f"{self.name} [{summary['precision']}]"

    def shardings(self, state, mesh):
        """Data parallelism: the state's shardings over `mesh` (default: all replicated)."""
        return jax.tree.map(lambda _: replicated(mesh), state)

    def plot(self, rows: list[dict], file) -> None:
        """Draws the run's PNG into `file`; default: the rows' losses against the row."""
        keys = [k for k in ("loss", "train_loss", "eval_loss") if rows and k in rows[0]]
        plots.plot_curves(rows, self.row_key, keys, file, title=self.title())

    @property
    def host_init(self) -> bool:
        """Whether `init` resets environments on the host (gymnasium, EnvPool): it then runs
        eagerly, not compiled."""
        return self.env is not None and self.env.host is not None

    def close(self) -> None:
        """Releases host resources (environment processes)."""
        if self.env is not None:
            self.env.close()

    # -- what the template does ---------------------------------------------------------

    def by_seed(self, chunk_metrics: dict) -> dict:
        """A chunk's metrics as [seeds, rows] numpy arrays (a 1-seed run's too)."""
        return {k: np.asarray(v).reshape(self.num_seeds, -1) for k, v in chunk_metrics.items()}

    def rows_of(self, done: int, columns: dict[str, list]) -> list[dict]:
        """A chunk's rows from its columns (a list each, an entry per row): each row numbered
        by `row_key` from done + 1, and the environment steps so far ("step")."""
        index = np.arange(done + 1, done + len(next(iter(columns.values()))) + 1)
        columns = {self.row_key: index.tolist(), "step": (index * self.steps_per_row).tolist(), **columns}
        return [dict(zip(columns, values)) for values in zip(*columns.values(), strict=True)]

    def title(self) -> str:
        """The plot's title: the algorithm, its environment where it has one, the precision."""
        env = getattr(self.config, "env", None)
        name = self.name.upper() if len(self.name) <= 3 else self.name
        return f"{name}{f' {env}' if env else ''} ({self.config.train_precision().name})"

    @property
    def num_seeds(self) -> int:
        return getattr(self.config, "num_seeds", 1)

    def seed_keys(self):
        """Seed k of an N-seed run starts from PRNGKey(seed + k), as a 1-seed run with
        --seed seed+k does: any seed of a study can be rerun alone."""
        if self.num_seeds == 1:
            return jax.random.PRNGKey(self.config.seed)
        return jax.vmap(jax.random.PRNGKey)(self.config.seed + np.arange(self.num_seeds))

    def seed_faults(self):
        """This seed's fault injection: under the seeds' vmap, seeded by seed + k (the fault
        steps a 1-seed run of that seed would get), so one seed's faults are its own."""
        if self.faults is None or self.num_seeds == 1:
            return self.faults
        return dataclasses.replace(self.faults, seed=self.config.seed + jax.lax.axis_index(SEED_AXIS))

    def train_step(self, train_state: TrainState, batch, loss_fn, axis_name=None):
        """`amp.train_step` with this run's fault injection and gradient hook."""
        return train_step(
            train_state,
            loss_fn,
            batch,
            has_aux=True,
            axis_name=axis_name,
            faults=self.seed_faults(),
            grad_transform=self.grad_transform,
        )

    def compile_chunk(self, state, per_chunk: int):
        """`call(state) -> (state, metrics[per_chunk])`, compiled: `update` scanned
        `per_chunk` times, vmapped over seeds, sharded over the mesh, the state donated."""

        def update(state, data):
            state, metrics = self.update(state, data)
            missing = [k for k in REQUIRED_METRICS if not isinstance(metrics, dict) or k not in metrics]
            if missing:  # checked while tracing: costs nothing at run time
                raise TypeError(
                    f"{type(self).__name__}.update returns no {', '.join(missing)} metric (REQUIRED_METRICS)"
                )
            return state, metrics

        def chunk(state, data):
            return jax.lax.scan(lambda s, _: update(s, data), state, None, per_chunk)

        if self.num_seeds > 1:
            chunk = _stop_when_every_seed_halted(jax.vmap(chunk, in_axes=(0, None), axis_name=SEED_AXIS))
        mesh = self.config.mesh()
        if mesh is None:
            jitted = jax.jit(chunk, donate_argnums=0)
        else:
            shardings = self.shardings(jax.eval_shape(lambda: state), mesh)
            jitted = jax.jit(chunk, donate_argnums=0, out_shardings=(shardings, replicated(mesh)))
        compiled = jitted.lower(state, self.data).compile()
        self.compiled = compiled
        return lambda state: compiled(state, self.data)

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
        if self.host_init:  # host environments refuse devices > 1: there is no mesh
            return init(keys)
        shardings = None if mesh is None else self.shardings(jax.eval_shape(init, keys), mesh)
        start = time.perf_counter()
        compiled = jax.jit(init, out_shardings=shardings).lower(keys).compile()
        self.init_compile_seconds = time.perf_counter() - start
        return compiled(keys)

    def common_summary(self, rows, state, session: Session, compile_seconds: float) -> dict:
        """The fields every algorithm's summary has: precision, speed, memory, overflow counts."""
        ts = at_path(state, self.train_state_path)
        steps_per_seed = np.atleast_1d(np.asarray(ts.step))  # the faults are injected into this one's steps
        optimizers = self.optimizer_states(state)
        total_updates = sum(int(np.sum(np.asarray(o.step))) for o in optimizers)
        skipped_per_seed = sum(np.atleast_1d(np.asarray(o.skipped)) for o in optimizers)
        skipped = int(np.sum(skipped_per_seed))
        seeds = self.config.seed + np.arange(len(steps_per_seed))  # seed k's faults are seeded by seed + k
        injected = [self.config.fault_injection(int(s)).count_nonfinite(int(n)) for s, n in zip(seeds, steps_per_seed)]
        compiled = getattr(self, "compiled", None)
        per_seed = {}
        if self.num_seeds > 1:
            per_seed = {
                "seeds": seeds.tolist(),
                "skipped_updates_per_seed": skipped_per_seed.tolist(),
                "loss_scale_per_seed": np.asarray(ts.scaler.loss_scale, float).tolist(),
                "halted_per_seed": np.asarray(ts.halted).tolist(),
                "injected_nonfinite_per_seed": injected,
            }
        return {
            "precision": self.config.train_precision().name,
            "seed": self.config.seed,
            "steps_per_second": session.steps_per_second(self.steps_per_row * self.num_seeds),
            "compile_seconds": compile_seconds,
            "wall_seconds": session.elapsed(),
            "train_step_bytes": probes.step_memory_bytes(compiled) if compiled is not None else None,
            "loss_scale": float(np.mean(np.asarray(ts.scaler.loss_scale))),
            "skipped_updates": skipped,
            "total_updates": total_updates,
            "overflow_rate": skipped / total_updates if total_updates else 0.0,
            "injected_nonfinite": sum(injected),
            "iterations": len(rows),
            "device": probes.device_name(),
            **per_seed,
        }

    def _progress(self, session: Session) -> Callable[[dict], dict]:
        counted = {"rows": 0, "skipped": 0}  # the skips so far, added up once per row

        def postfix(row: dict) -> dict:
            new_rows = session.rows[counted["rows"] :]  # those restored on resume, then each chunk's
            counted["skipped"] += sum(int(np.sum(r.get("skipped", 0))) for r in new_rows)
            counted["rows"] = len(session.rows)
            return {
                **self.postfix(row),
                "scale": f"{row['loss_scale']:g}",
                "skipped": counted["skipped"],
                "sps": f"{session.steps_per_second(self.steps_per_row * self.num_seeds):.0f}",
            }

        return postfix

    @classmethod
    def train(
        cls,
        config,
        out_dir: str | None = None,
        *,
        checkpoint_every: int = 0,
        grad_transform: Callable | None = None,
        **run_options,
    ) -> RunResult:
        """Trains as `config` says. `out_dir` (None: nothing written) gets metrics.jsonl,
        summary.json, a PNG and checkpoints every `checkpoint_every` progress units (PPO:
        environment steps; world model: epochs; 0: at the end only).
        `grad_transform(scaled_grads, train_state) -> grads` runs before the finite check.
        `run_options` are `Session`'s (resume, overwrite, progress, max_to_keep,
        allow_config_change, writers). A guard stop or a signal raises as `Session.finish` says."""
        start_distributed(config)  # before anything touches a device
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint-every must be >= 0, got {checkpoint_every}")
        algo = cls(config, grad_transform)  # bad input fails here, before anything is written
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
            kind=self.name,
            train_state_path=self.train_state_path,
            total=self.num_rows,
            position_key=self.row_key,
            meta_key=self.checkpoint_key,
            unit_size=self.steps_per_row,
            unit=self.step_name,
            checkpoint_every=every,
            inputs=self.inputs(),
            **run_options,
        )
        session.postfix = self._progress(session)
        self.session = session
        with session:
            state = session.restore(self.initial_state(), self.from_checkpoint)
            remaining = session.total - session.position
            if remaining % per_chunk:  # resumed where these chunks do not land on the total: they would run past it
                per_chunk = _largest_divisor_at_most(remaining, per_chunk)
            if remaining and session.progress:  # past every refusal: a note never joins a one-line error
                session.note("compiling the training program (the bar starts when it is done) ...")
            note = self.budget_note()

            def on_start():  # just before the first step (not if a signal came while compiling), before the bar
                if announce is not None:
                    announce([note] if note else [])
                elif note:
                    session.note(note)

            start = time.perf_counter()
            # A finished run resumed has nothing left to run: nothing to compile.
            call = self.compile_chunk(state, per_chunk) if remaining else None
            compile_seconds = self.init_compile_seconds + time.perf_counter() - start
            to_rows = lambda metrics, done: add_seed_columns(self.rows(metrics, done), metrics, self.num_seeds)  # noqa: E731
            state = session.run(state, call, to_rows, per_chunk, on_start=on_start)
            if session.stopped and not session.timing.positions_run:
                session.finish({})  # a signal before the first chunk: nothing to sum up, it raises
            summary = {
                **self.common_summary(session.rows, state, session, compile_seconds),
                **self.summary(session.rows, state),
            }
            if not session.timing.positions_run:  # nothing ran here: what the run measured when it ran stays
                summary.update({k: v for k, v in session.previous_summary.items() if k in MEASURED and v is not None})

            def plot(rows, path):
                self.plot(rows, path / self.plot_file)
                if rows and "underflow" in rows[0]:  # the opt-in telemetry: its own picture
                    plots.plot_underflow(rows, self.row_key, path / plots.UNDERFLOW_PLOT, title=self.title())

            summary = session.finish(summary, at_path(state, self.train_state_path), plot=plot)
        return RunResult(summary, state, session.rows, self.train_state_path, self.describe(summary))
