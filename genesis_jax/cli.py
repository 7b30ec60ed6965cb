"""`genesis-jax`: train PPO (and more) in reduced precision from the command line.

Bad input ends with one line on stderr and exit status 2, never a traceback; a run the
divergence guard stops exits with 3; SIGINT / SIGTERM save a final checkpoint and exit with
128 + the signal number (130 / 143).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Sequence

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3  # the divergence guard stopped training (metrics and checkpoint written)
EXIT_SYSTEM = 4  # the system failed the run: disk full or read-only, out of memory, a missing dependency


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage block
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 64,64, got {text!r}") from None
    return values


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Where and how a training run goes: `train()`'s keyword arguments beside the config."""

    out: str | None = None
    """Run directory for metrics.jsonl, summary.json, the plot and checkpoints."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (PPO) or epochs (world model); 0: at the end only."""
    resume: bool = False
    """Continue the run in --out from its newest checkpoint."""
    overwrite: bool = False
    """Replace a run already in --out (set aside until the new run ends, then deleted)."""
    allow_config_change: bool = False
    """With --resume: continue although settings that change the run differ (the summary lists them)."""
    progress: bool = True
    """Show a progress bar."""
    tensorboard: bool = False
    """Also write TensorBoard event files to OUT/tensorboard (pip install 'genesis-jax[tensorboard]')."""
    wandb: bool = False
    """Also log to a Weights & Biases run in OUT (pip install 'genesis-jax[wandb]'; WANDB_MODE=offline: no network)."""

    def train_kwargs(self) -> dict:
        writers = tuple(name for name in ("tensorboard", "wandb") if getattr(self, name))
        return {
            "out_dir": self.out,
            "checkpoint_every": self.checkpoint_every,
            "resume": self.resume,
            "overwrite": self.overwrite,
            "allow_config_change": self.allow_config_change,
            "progress": self.progress,
            "writers": writers,
        }


def _trainer(workload: str):
    """(own fields class, config class, train function) of a `train` workload."""
    if workload == "ppo":
        from genesis_jax.ppo import PPOConfig, train
        from genesis_jax.ppo.config import PPOFields

        return PPOFields, PPOConfig, train
    from genesis_jax.world_model import WorldModelConfig, train
    from genesis_jax.world_model.train import WorldModelFields

    return WorldModelFields, WorldModelConfig, train


# `--help`'s groups: the trainer's own fields, then the shared ones, then the run's options.
_GROUP_HELP = {
    "mixed_precision": "Precision, loss scaling, clipping, the divergence guard and fault injection.",
    "parallel": "Data parallelism over devices and processes.",
    "run": "The run directory, checkpoints, resume and logging.",
}


def _defaults(cls, config_cls, environ=None):
    """`cls` holding `config_cls`'s defaults for its fields (the precision from the environment)."""
    from genesis_jax.precision import resolve_precision_name

    if cls is RunOptions:
        return cls()
    values = {f.name: getattr(config_cls(), f.name) for f in dataclasses.fields(cls) if f.init}
    if "precision" not in values:
        return cls(**values)
    values["precision"] = resolve_precision_name(None, environ)
    try:
        return cls(**values)
    except ValueError as err:
        raise ValueError(f"the precision from GENESIS_PRECISION / ENABLE_FP16_TRAINING: {err}") from None


def _values(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init}


def parse_train_args(workload: str, argv: Sequence[str]):
    """Parses `genesis-jax train WORKLOAD ARGV` with tyro, from the config dataclasses.

    Returns:
        (parts, run): `parts` maps "trainer", "mixed_precision" and "parallel" to the parsed
        groups (combine them with `train_config`), `run` is the `RunOptions`.

    Raises:
        SystemExit: 0 after `--help`; 2 after a parse error, printed as one line.
        ValueError: for a bad GENESIS_PRECISION / ENABLE_FP16_TRAINING (the precision's default).
    """
    import typing

    import tyro

    from genesis_jax.parallel import ParallelConfig
    from genesis_jax.precision import MixedPrecisionConfig

    fields_cls, config_cls, _ = _trainer(workload)
    trainer_group = workload.replace("-", "_")  # `--help` titles the groups by these names
    groups = {
        trainer_group: (fields_cls, f"The {workload} run's own settings."),
        "mixed_precision": (MixedPrecisionConfig, _GROUP_HELP["mixed_precision"]),
        "parallel": (ParallelConfig, _GROUP_HELP["parallel"]),
        "run": (RunOptions, _GROUP_HELP["run"]),
    }
    command_cls = dataclasses.make_dataclass(
        "TrainCommand",
        [(name, typing.Annotated[cls, tyro.conf.arg(help=text)]) for name, (cls, text) in groups.items()],
        frozen=True,
    )
    default = command_cls(**{name: _defaults(cls, config_cls) for name, (cls, _) in groups.items()})
    prog = f"genesis-jax train {workload}"
    argv, notes = _old_spellings(list(argv))
    for note in notes:
        print(f"genesis-jax: warning: {note}", file=sys.stderr)
    parsed = _tyro_one_line_errors(
        lambda: tyro.cli(command_cls, args=argv, default=default, prog=prog, config=(tyro.conf.OmitArgPrefixes,)), prog
    )
    parts = {"trainer": getattr(parsed, trainer_group), "mixed_precision": parsed.mixed_precision}
    return {**parts, "parallel": parsed.parallel}, parsed.run


def train_config(workload: str, parts: dict):
    """The trainer's config from the groups `parse_train_args` returned (validated)."""
    _, config_cls, _ = _trainer(workload)
    return config_cls(**{key: value for part in parts.values() for key, value in _values(part).items()})


def _tyro_one_line_errors(parse, prog: str):
    """Runs tyro's parse; its error box (stderr) becomes the one line `prog: error: ...`."""
    import contextlib
    import io

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parse()
    except SystemExit as exit_:
        if not exit_.code:
            sys.stderr.write(captured.getvalue())
            raise
        print(f"{prog}: error: {_box_message(captured.getvalue())}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None


def _box_message(box: str) -> str:
    """The message of one of tyro's error boxes, on one line: the text between the title and
    the first rule. The box is drawn in UTF-8 (title in the top border) or ASCII (title, then
    a rule), maybe with colour codes."""
    import re

    lines = [line.strip().strip("│╭╮╰╯").strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", box).splitlines()]

    def is_rule(line: str) -> bool:
        return bool(line) and set(line) <= set("─-")

    start = next((i + 1 for i, line in enumerate(lines) if is_rule(line) or line.startswith("─ ")), 0)
    words = []
    for line in lines[start:]:
        if is_rule(line) or (not line and words):
            break
        if line:
            words.append(line)
    return " ".join(words) or " ".join(line for line in lines if line)


# Spellings the generated CLI replaced: still accepted, with a warning, until a later version.
_COMMA_LISTS = ("--hidden", "--inject-loss-spike")  # now: --hidden 64 64
_ZERO_FOR_OFF = ("--max-grad-norm", "--guard-min-scale", "--max-consecutive-skips")  # now: None


def _old_spellings(argv: list[str]) -> tuple[list[str], list[str]]:
    """`argv` with the replaced spellings rewritten, and a deprecation note for each."""
    out, notes = [], []
    i = 0
    while i < len(argv):
        flag, sep, value = argv[i].partition("=")
        if flag in _COMMA_LISTS + _ZERO_FOR_OFF and (sep or i + 1 < len(argv)):
            if not sep:
                i += 1
                value = argv[i]
            if flag in _COMMA_LISTS and "," in value:
                parts = [v.strip() for v in value.split(",") if v.strip()]
                notes.append(f"'{flag} {value}' is deprecated; write '{flag} {' '.join(parts)}'")
                out += [flag, *parts]
            elif flag in _ZERO_FOR_OFF and _is_zero_for_off(flag, value):
                notes.append(f"'{flag} {value}' for off is deprecated; write '{flag} None'")
                out += [flag, "None"]
            else:
                out += [flag, value]
        else:
            out.append(argv[i])
        i += 1
    return out, notes


def _is_zero_for_off(flag: str, value: str) -> bool:
    try:
        number = float(value)
    except ValueError:
        return False
    return number <= 0 if flag == "--max-grad-norm" else number == 0


def _add_demo_args(p: argparse.ArgumentParser) -> None:
    # Defaults stay run_demo's own: an option not given is not passed.
    given = {"default": argparse.SUPPRESS}
    p.add_argument("--precision", help="fp32 | bf16 | fp16 | fp16-full | a jmp policy string (default fp16)", **given)
    p.add_argument("--loss-scaling", choices=("dynamic", "static", "none"), **given)
    p.add_argument("--init-loss-scale", type=float, **given)
    p.add_argument("--growth-interval", type=int, **given)
    p.add_argument("--min-loss-scale", type=float, **given)
    p.add_argument("--steps", type=int, **given)
    p.add_argument("--seed", type=int, **given)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="genesis-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train an agent or a model")
    train_sub = train.add_subparsers(dest="workload", required=True, parser_class=_Parser)

    # The train workloads' options come from their config dataclasses (see `parse_train_args`).
    train_sub.add_parser("ppo", help="PPO on a gymnax, gymnasium or envpool environment", add_help=False)
    train_sub.add_parser("world-model", help="a world model from trajectories", add_help=False)

    collect = sub.add_parser(
        "collect", help="collect trajectories from an env (random or trained PPO policy) into a .npz"
    )
    collect.add_argument("--env", required=True)
    collect.add_argument("--env-backend", choices=("gymnax", "gymnasium"), default=None)
    collect.add_argument(
        "--policy", default="random", help="random, or a PPO run directory (its newest checkpoint acts)"
    )
    collect.add_argument("--num-sequences", type=int, default=256)
    collect.add_argument("--sequence-length", type=int, default=64)
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--out", required=True, help="path of the .npz to write (refused if it exists)")

    bench = sub.add_parser("bench", help="the precision benchmark: speed, memory, accuracy, overflow, mismatch")
    bench.add_argument("--quick", action="store_true", help="tiny budgets: under 3 minutes on 2 CPU cores")
    bench.add_argument("--seeds", type=_int_list, default=None, help="comma-separated seeds (default 0,1)")
    bench.add_argument("--precisions", default="fp32,bf16,fp16,fp16-full")
    bench.add_argument("--workloads", default=None, help="comma-separated workload names (default: all)")
    bench.add_argument("--out", required=True, help="directory for results.csv, results.md and precision.png")

    launch = sub.add_parser(
        "launch",
        help="run a train command as several JAX processes on this machine",
        description="Runs 'genesis-jax COMMAND' as --processes processes joined by jax.distributed "
        "(process 0 prints and writes the run). Example: genesis-jax launch --processes 2 "
        "--local-devices 2 -- train ppo --devices 4 --out runs/dp",
    )
    launch.add_argument("--processes", type=int, required=True, help="number of processes")
    launch.add_argument(
        "--local-devices",
        type=int,
        default=None,
        help="CPU: forced host devices per process (sets XLA_FLAGS); default: leave XLA_FLAGS alone",
    )
    launch.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    launch.add_argument(
        "--grace",
        type=float,
        default=60.0,
        help="seconds the other processes get to stop after one failed (default 60)",
    )
    launch.add_argument(
        "train_command",
        nargs=argparse.REMAINDER,
        metavar="-- train ...",
        help="the genesis-jax train command every process runs",
    )

    demo = sub.add_parser("demo", help="a small MLP regression in fp16 with loss scaling")
    _add_demo_args(demo)
    return parser


def _run_train(workload: str, parts: dict, run: RunOptions) -> int:
    _, _, train = _trainer(workload)
    s = train(train_config(workload, parts), **run.train_kwargs()).summary
    if not _primary():
        return 0
    if workload == "ppo":
        print(
            f"PPO {s['env']} [{s['precision']}] final_return={s['final_return']:.1f} "
            f"steps/s={s['steps_per_second']:.0f} compile={s['compile_seconds']:.1f}s "
            f"loss_scale={s['loss_scale']:g} skipped={s['skipped_updates']}/{s['total_updates']}"
        )
        if run.out:
            print(f"wrote {run.out}/summary.json, metrics.jsonl, ppo.png")
        return 0
    floor = f" noise_floor={s['noise_floor']:.4f}" if s["noise_floor"] is not None else ""
    print(
        f"world model [{s['precision']}] train_loss={s['final_train_loss']:.4f} eval_loss={s['eval_loss']:.4f}{floor} "
        f"steps/s={s['steps_per_second']:.1f} loss_scale={s['loss_scale']:g} "
        f"skipped={s['skipped_updates']}/{s['total_updates']} "
        f"activation_bytes={s['activation_bytes']}"
    )
    return 0


def _run_collect(args) -> int:
    import os

    from genesis_jax.world_model.data import collect_dataset, save_dataset

    if os.path.exists(args.out):
        raise ValueError(f"{args.out} exists; choose another path")
    if not args.out.endswith(".npz"):
        raise ValueError(f"dataset path must end in .npz, got {args.out!r}")
    if args.num_sequences < 1 or args.sequence_length < 1:
        raise ValueError("num-sequences and sequence-length must be positive integers")
    data = collect_dataset(args.env, args.num_sequences, args.sequence_length, args.seed, args.env_backend, args.policy)
    save_dataset(data, args.out)
    print(f"wrote {args.out}: {args.num_sequences} sequences x {args.sequence_length} steps, {data['meta']['source']}")
    return 0


def _run_bench(args) -> int:
    import pathlib

    from genesis_jax.bench import run_benchmark

    seeds = args.seeds or (0, 1)
    only = None if args.workloads is None else [w.strip() for w in args.workloads.split(",")]
    command = "genesis-jax bench " + " ".join(
        (["--quick"] if args.quick else [])
        + [f"--seeds {','.join(map(str, seeds))}", f"--precisions {args.precisions}"]
        + ([f"--workloads {args.workloads}"] if args.workloads else [])
        + [f"--out {args.out}"]
    )
    run_benchmark(
        args.out,
        quick=args.quick,
        seeds=seeds,
        precisions=[p.strip() for p in args.precisions.split(",")],
        only=only,
        command=command,
    )
    print(f"wrote {args.out}/results.csv, results.md, precision.png")
    print((pathlib.Path(args.out) / "results.md").read_text())
    return 0


def _run_launch(args) -> int:
    from genesis_jax.launch import launch

    command = args.train_command[1:] if args.train_command[:1] == ["--"] else args.train_command
    return launch(command, args.processes, local_devices=args.local_devices, port=args.port, grace_seconds=args.grace)


def _run_demo(args) -> int:
    from genesis_jax.demo import run_demo

    print(json.dumps(run_demo(**{k: v for k, v in vars(args).items() if k != "command"})))
    return 0


def _primary() -> bool:
    """Process 0 of a multi-process run, or the only process (JAX not started is one process)."""
    import jax

    return not jax.distributed.is_initialized() or jax.process_index() == 0


def _system_failure(err: BaseException) -> str:
    """One line for an error the system caused, naming the file where there is one."""
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    return str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__


TRAIN_WORKLOADS = ("ppo", "world-model")


def _parse(argv: list[str]):
    """(argparse namespace, train groups or None): a train workload's options go to tyro."""
    if len(argv) >= 2 and argv[0] == "train" and argv[1] in TRAIN_WORKLOADS:
        parts, run = parse_train_args(argv[1], argv[2:])
        return argparse.Namespace(command="train", workload=argv[1], parts=parts, run=run), parts["parallel"]
    return build_parser().parse_args(argv), None


def main(argv: list[str] | None = None) -> int:
    try:
        args, parallel = _parse(sys.argv[1:] if argv is None else list(argv))
    except ValueError as err:  # GENESIS_PRECISION / ENABLE_FP16_TRAINING not understood
        print(f"genesis-jax: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as exit_:  # --help (0), or a parse error already printed in one line (2)
        return exit_.code or 0
    if parallel is not None and parallel.coordinator_address is not None:
        # First of all: JAX must join the other processes before anything touches a device.
        from genesis_jax.parallel import initialize_distributed

        try:
            initialize_distributed(
                parallel.coordinator_address, parallel.num_processes, parallel.process_id, parallel.heartbeat_timeout
            )
        except ValueError as err:
            print(f"genesis-jax: error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # Of several processes, only process 0 logs, prints and shows progress (Session sees to
    # the bar); the others report errors alone.
    worker = not _primary()
    logging.basicConfig(
        level=logging.ERROR if worker else logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr
    )
    from gymnasium.error import DependencyNotInstalled as DependencyMissing

    from genesis_jax.checkpoint import CheckpointMismatchError
    from genesis_jax.reliability import DivergenceError, TrainingInterrupted
    from genesis_jax.runs import RunDirectoryError

    try:
        if args.command == "demo":
            return _run_demo(args)
        if args.command == "launch":
            return _run_launch(args)
        if args.command == "bench":
            return _run_bench(args)
        if args.command == "collect":
            return _run_collect(args)
        if args.command == "train":
            return _run_train(args.workload, args.parts, args.run)
    except (ValueError, RunDirectoryError, CheckpointMismatchError, FileNotFoundError) as err:
        print(f"genesis-jax: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (OSError, MemoryError, ImportError, DependencyMissing) as err:
        print(f"genesis-jax: system failure: {_system_failure(err)}", file=sys.stderr)
        return EXIT_SYSTEM
    except DivergenceError as err:
        print(f"genesis-jax: stopped: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    except TrainingInterrupted as err:
        print(f"genesis-jax: {err}", file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt:
        print("genesis-jax: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if "RESOURCE_EXHAUSTED" not in str(err):  # XLA's out-of-memory error has no class of its own
            raise
        print(f"genesis-jax: system failure: out of device memory: {str(err).splitlines()[0][:300]}", file=sys.stderr)
        return EXIT_SYSTEM
    print(f"genesis-jax: error: unknown command {args.command!r}", file=sys.stderr)
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
