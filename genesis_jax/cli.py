"""`genesis-jax`: train PPO (and more) in reduced precision from the command line.

Bad input ends with one line on stderr and exit status 2, never a traceback; a run the
divergence guard stops exits with 3; SIGINT / SIGTERM save a final checkpoint and exit with
128 + the signal number (130 / 143).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

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


def _add_precision_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--precision",
        default=None,
        help="fp32 | bf16 | fp16 | fp16-full | auto | a jmp policy string "
        "(default: $GENESIS_PRECISION, else $ENABLE_FP16_TRAINING, else fp32)",
    )
    p.add_argument(
        "--loss-scaling",
        choices=("dynamic", "static", "none"),
        default=None,
        help="default: dynamic for fp16, none for fp32/bf16",
    )
    p.add_argument("--init-loss-scale", type=float, default=2.0**16)
    p.add_argument("--growth-interval", type=int, default=2000)
    p.add_argument("--min-loss-scale", type=float, default=None, help="floor for the dynamic scale (default: none)")


def _add_reliability_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("divergence guard and fault injection")
    g.add_argument(
        "--guard-min-scale",
        type=float,
        default=2.0**-14,
        help="stop when a skip would bring the loss scale below this (default 2^-14; 0: off)",
    )
    g.add_argument(
        "--max-consecutive-skips",
        type=int,
        default=100,
        help="stop after more than this many skipped updates in a row (default 100; 0: off)",
    )
    g.add_argument(
        "--inject-nonfinite",
        type=float,
        default=0.0,
        metavar="RATE",
        help="make the gradients non-finite on this fraction of updates (seeded by --seed)",
    )
    g.add_argument(
        "--inject-loss-spike",
        type=_int_list,
        default=(),
        metavar="STEPS",
        help="comma-separated optimizer steps whose loss is multiplied by --loss-spike-factor",
    )
    g.add_argument("--loss-spike-factor", type=float, default=1e6)


def _add_parallel_args(p: argparse.ArgumentParser, split: str) -> None:
    g = p.add_argument_group("data parallelism")
    g.add_argument("--devices", type=int, default=1, help=f"devices on the data axis ({split} are split over them)")
    g.add_argument(
        "--coordinator-address",
        default=None,
        help="multi-host: host:port of process 0, or auto (read from SLURM, Open MPI, Kubernetes...)",
    )
    g.add_argument("--num-processes", type=int, default=None, help="multi-host: number of processes (hosts)")
    g.add_argument("--process-id", type=int, default=None, help="multi-host: this process's index")
    g.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=30,
        metavar="SECONDS",
        help="multi-host: a process silent this long is declared dead and the others exit (default 30)",
    )


def _parallel_kwargs(args) -> dict:
    return {
        "devices": args.devices,
        "coordinator_address": args.coordinator_address,
        "num_processes": args.num_processes,
        "process_id": args.process_id,
        "heartbeat_timeout": args.heartbeat_timeout,
    }


def _reliability_kwargs(args) -> dict:
    return {
        "guard_min_scale": None if args.guard_min_scale == 0 else args.guard_min_scale,
        "max_consecutive_skips": None if args.max_consecutive_skips == 0 else args.max_consecutive_skips,
        "inject_nonfinite": args.inject_nonfinite,
        "inject_loss_spike": args.inject_loss_spike,
        "loss_spike_factor": args.loss_spike_factor,
    }


def _add_run_args(p: argparse.ArgumentParser, checkpoint_unit: str) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out", default=None, help="run directory for metrics.jsonl, summary.json, the plot and checkpoints"
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar=checkpoint_unit.upper(),
        help=f"checkpoint every {checkpoint_unit.upper()} {checkpoint_unit} (0: only at the end)",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run already in --out (set aside until the new run ends, then deleted)",
    )
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="with --resume: continue although settings that change the run differ (the summary lists them)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files to OUT/tensorboard (pip install 'genesis-jax[tensorboard]')",
    )
    p.add_argument(
        "--wandb",
        action="store_true",
        help="also log to a Weights & Biases run in OUT "
        "(pip install 'genesis-jax[wandb]'; WANDB_MODE=offline works without a network)",
    )


def _writers(args) -> tuple[str, ...]:
    return tuple(name for name in ("tensorboard", "wandb") if getattr(args, name))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="genesis-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train an agent or a model")
    train_sub = train.add_subparsers(dest="workload", required=True, parser_class=_Parser)

    ppo = train_sub.add_parser("ppo", help="PPO on a gymnax or gymnasium environment")
    ppo.add_argument("--env", default="CartPole-v1")
    ppo.add_argument(
        "--env-backend",
        choices=("gymnax", "gymnasium", "envpool"),
        default=None,
        help="default: gymnax where it has the id, else gymnasium; envpool: Atari (pip install -e '.[envpool]')",
    )
    _add_precision_args(ppo)
    ppo.add_argument("--rollout-precision", default=None, help="precision of the acting policy (default: --precision)")
    ppo.add_argument("--total-steps", type=int, default=500_000)
    ppo.add_argument("--num-envs", type=int, default=4)
    ppo.add_argument("--num-steps", type=int, default=128, help="rollout length per env per update")
    ppo.add_argument("--update-epochs", type=int, default=4)
    ppo.add_argument("--num-minibatches", type=int, default=4)
    ppo.add_argument("--lr", type=float, default=2.5e-4)
    ppo.add_argument("--no-anneal-lr", action="store_true")
    ppo.add_argument("--gamma", type=float, default=0.99)
    ppo.add_argument("--gae-lambda", type=float, default=0.95)
    ppo.add_argument("--clip-eps", type=float, default=0.2)
    ppo.add_argument("--no-clip-value", action="store_true")
    ppo.add_argument("--ent-coef", type=float, default=0.01)
    ppo.add_argument("--vf-coef", type=float, default=0.5)
    ppo.add_argument("--max-grad-norm", type=float, default=0.5, help="<= 0 turns clipping off")
    ppo.add_argument(
        "--network",
        default=None,
        help="policy torso: mlp | resmlp | cnn | impala (default: cnn for image observations, mlp otherwise)",
    )
    ppo.add_argument("--hidden", type=_int_list, default=(64, 64), help="mlp: hidden widths")
    ppo.add_argument("--activation", choices=("tanh", "relu", "gelu", "silu"), default="tanh", help="mlp")
    ppo.add_argument("--width", type=int, default=256, help="resmlp: residual stream width")
    ppo.add_argument("--depth", type=int, default=2, help="resmlp: residual blocks")
    ppo.add_argument("--num-seeds", type=int, default=1, help="seeds trained together in one compiled run (gymnax)")
    ppo.add_argument("--vectorization", choices=("sync", "async"), default="sync", help="gymnasium vectorisation")
    ppo.add_argument("--action-repeat", type=int, default=1, help="gymnasium only")
    ppo.add_argument("--updates-per-chunk", type=int, default=None, help="updates per compiled chunk between reports")
    _add_reliability_args(ppo)
    _add_parallel_args(ppo, "environments")
    _add_run_args(ppo, "steps")

    wm = train_sub.add_parser("world-model", help="a world model from trajectories")
    wm.add_argument("--data", default="synthetic", help="synthetic | an env id (random policy) | a .npz from 'collect'")
    _add_precision_args(wm)
    wm.add_argument("--epochs", type=int, default=20)
    wm.add_argument("--batch-size", type=int, default=1024)
    wm.add_argument("--width", type=int, default=128)
    wm.add_argument("--depth", type=int, default=2)
    wm.add_argument("--core", choices=("mlp", "gru"), default="mlp")
    wm.add_argument("--horizon", type=int, default=1, help="open-loop steps per sample (multi-step loss)")
    wm.add_argument("--num-sequences", type=int, default=2048)
    wm.add_argument("--sequence-length", type=int, default=32)
    wm.add_argument("--lr", type=float, default=1e-3)
    _add_reliability_args(wm)
    _add_parallel_args(wm, "batch rows")
    _add_run_args(wm, "epochs")

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
    _add_precision_args(demo)
    demo.add_argument("--steps", type=int, default=500)
    demo.add_argument("--seed", type=int, default=0)
    return parser


def _ppo_config(args):
    from genesis_jax.ppo import PPOConfig
    from genesis_jax.precision import resolve_precision_name

    return PPOConfig(
        env=args.env,
        env_backend=args.env_backend,
        precision=resolve_precision_name(args.precision),
        rollout_precision=args.rollout_precision,
        loss_scaling=args.loss_scaling,
        init_loss_scale=args.init_loss_scale,
        growth_interval=args.growth_interval,
        min_loss_scale=args.min_loss_scale,
        total_steps=args.total_steps,
        num_envs=args.num_envs,
        num_steps=args.num_steps,
        update_epochs=args.update_epochs,
        num_minibatches=args.num_minibatches,
        lr=args.lr,
        anneal_lr=not args.no_anneal_lr,
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip_eps=args.clip_eps,
        clip_value=not args.no_clip_value,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=None
        if args.max_grad_norm <= 0
        else args.max_grad_norm,  # nan reaches the config, which refuses it
        network=args.network,
        hidden=args.hidden,
        activation=args.activation,
        width=args.width,
        depth=args.depth,
        seed=args.seed,
        num_seeds=args.num_seeds,
        vectorization=args.vectorization,
        action_repeat=args.action_repeat,
        updates_per_chunk=args.updates_per_chunk,
        **_reliability_kwargs(args),
        **_parallel_kwargs(args),
    )


def _run_ppo(args) -> int:
    from genesis_jax.ppo import train

    config = _ppo_config(args)
    result = train(
        config,
        out_dir=args.out,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        overwrite=args.overwrite,
        allow_config_change=args.allow_config_change,
        progress=not args.no_progress,
        writers=_writers(args),
    )
    s = result.summary
    if not _primary():
        return 0
    print(
        f"PPO {s['env']} [{s['precision']}] final_return={s['final_return']:.1f} "
        f"steps/s={s['steps_per_second']:.0f} compile={s['compile_seconds']:.1f}s "
        f"loss_scale={s['loss_scale']:g} skipped={s['skipped_updates']}/{s['total_updates']}"
    )
    if args.out:
        print(f"wrote {args.out}/summary.json, metrics.jsonl, ppo.png")
    return 0


def _run_world_model(args) -> int:
    from genesis_jax.precision import resolve_precision_name
    from genesis_jax.world_model import WorldModelConfig, train

    config = WorldModelConfig(
        data=args.data,
        precision=resolve_precision_name(args.precision),
        loss_scaling=args.loss_scaling,
        init_loss_scale=args.init_loss_scale,
        growth_interval=args.growth_interval,
        min_loss_scale=args.min_loss_scale,
        epochs=args.epochs,
        batch_size=args.batch_size,
        width=args.width,
        depth=args.depth,
        core=args.core,
        horizon=args.horizon,
        num_sequences=args.num_sequences,
        sequence_length=args.sequence_length,
        lr=args.lr,
        seed=args.seed,
        **_reliability_kwargs(args),
        **_parallel_kwargs(args),
    )
    s = train(
        config,
        out_dir=args.out,
        overwrite=args.overwrite,
        resume=args.resume,
        progress=not args.no_progress,
        allow_config_change=args.allow_config_change,
        writers=_writers(args),
        checkpoint_every=args.checkpoint_every,
    ).summary
    if not _primary():
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

    result = run_demo(
        precision=args.precision or "fp16",
        steps=args.steps,
        seed=args.seed,
        loss_scaling=args.loss_scaling,
        init_loss_scale=args.init_loss_scale,
        growth_interval=args.growth_interval,
        min_loss_scale=args.min_loss_scale,
    )
    print(json.dumps(result))
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "coordinator_address", None) is not None:
        # First of all: JAX must join the other processes before anything touches a device.
        from genesis_jax.parallel import initialize_distributed

        try:
            initialize_distributed(
                args.coordinator_address, args.num_processes, args.process_id, args.heartbeat_timeout
            )
        except ValueError as err:
            print(f"genesis-jax: error: {err}", file=sys.stderr)
            return EXIT_BAD_INPUT
    # Of several processes, only process 0 logs, prints and shows progress; the others report errors alone.
    worker = not _primary()
    if worker:
        args.no_progress = True
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
        if args.command == "train" and args.workload == "ppo":
            return _run_ppo(args)
        if args.command == "train" and args.workload == "world-model":
            return _run_world_model(args)
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
    parser.error(f"unknown command {args.command!r}")
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
