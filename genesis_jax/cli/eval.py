"""`genesis-jax eval RUN_DIR`: a trained run's policy played over whole episodes, its mean
return and spread printed in one line (or as JSON), and optionally a video of them."""

from __future__ import annotations

import argparse
import json

DESCRIPTION = (
    "Loads the newest checkpoint of a run of an algorithm that acts (ppo, dqn, sac, pqn, or an installed one with "
    "`act`), plays --episodes whole episodes (the environment's own time limit) greedily in the run's precision, "
    "deterministic from --seed, and prints their mean return +/- std, min and max. A stopped or unfinished run's "
    "newest checkpoint plays (the line says so); a directory without a checkpoint, a corrupted one or another "
    "workload's run is refused in one line."
)


def add_eval_parser(sub) -> None:
    """The `eval` subcommand's options, on the `genesis-jax` subparsers `sub`."""
    arg = sub.add_parser(
        "eval", help="play a trained run's policy: mean return over whole episodes, a video", description=DESCRIPTION
    ).add_argument
    arg("run_dir", metavar="RUN_DIR", help="the run directory (--out of genesis-jax train)")
    arg("--episodes", type=int, default=10, help="whole episodes to play (default 10)")
    arg("--seed", type=int, default=0, help="seed of the episodes (and of the actions' noise; default 0)")
    arg(
        "--stochastic",
        action="store_true",
        help="act as in training: ppo and sac sample, dqn and pqn are epsilon-greedy at the run's last epsilon",
    )
    arg("--seed-index", type=int, default=0, help="of a run of several seeds, which one (default 0: the first)")
    arg("--step", type=int, help="the checkpoint to play, by its directory name (default: the newest)")
    arg(
        "--video",
        metavar="FILE",
        help="record the episodes into FILE (.gif, or .mp4 with opencv): gymnax's renderers, gymnasium's rgb_array",
    )
    arg(
        "--video-frames",
        type=int,
        default=1000,
        help="frames recorded at most, from the first episode on (default 1000)",
    )
    arg("--json", action="store_true", help="print the result as one JSON object, each episode's return included")
    arg("--allow-unverified-checkpoint", action="store_true", help="load a checkpoint that has no checksum")


def run_eval(args: argparse.Namespace) -> int:
    from genesis_jax.algos.evaluate import check_eval_options, evaluate, load

    check_eval_options(args.episodes, args.seed, args.video, args.video_frames)
    options = dict(seed_index=args.seed_index, step=args.step, allow_unverified=args.allow_unverified_checkpoint)
    policy = load(args.run_dir, greedy=not args.stochastic, **options)
    result = evaluate(policy, args.episodes, args.seed, args.video, args.video_frames)
    print(json.dumps(result.to_dict()) if args.json else result.line())
    return 0
