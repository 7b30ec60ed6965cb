"""DQN's replay buffer for 1e6 MinAtar transitions: its bytes with frames stored as uint8 (what
DQN does) against the same buffer in float32, measured on the buffer state's shapes
(`jax.eval_shape`: nothing allocated).

Usage: python experiments/dqn_replay_memory.py [--capacity 1000000] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
from _report import description, emit  # noqa: E402

from genesis_jax.algos.dqn import DQN, minatar  # noqa: E402
from genesis_jax.data.replay import buffer_bytes, make_replay  # noqa: E402

GAMES = ("Breakout-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar")


def sizes(env: str, capacity: int) -> tuple[int, int, dict]:
    """(DQN's buffer bytes, the float32 buffer's bytes, DQN's stored dtypes)."""
    algo = DQN(minatar(env, buffer_size=capacity))
    compact = buffer_bytes(jax.eval_shape(algo.replay.init))
    example = {k: jnp.zeros(leaf.shape, leaf.dtype) for k, leaf in algo.replay.added.items()}
    as_float = {
        **example,
        "obs": example["obs"].astype(jnp.float32),
        "next_obs": example["next_obs"].astype(jnp.float32),
    }
    float32 = buffer_bytes(jax.eval_shape(make_replay(as_float, capacity, 32).init))
    return compact, float32, {k: str(leaf.stored) for k, leaf in algo.replay.added.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    command = " ".join(["python", "experiments/dqn_replay_memory.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        f"# DQN replay buffer memory: {args.capacity} MinAtar transitions",
        "",
        f"`{command}`. Bytes of the buffer state's arrays (obs, next_obs, action, reward, terminated,",
        "and flashbax's two counters), from `jax.eval_shape` of its init: nothing allocated.",
        "",
        "| game | stored dtypes | bytes (DQN: uint8 frames) | bytes (float32 frames) | ratio |",
        "|---|---|---|---|---|",
    ]
    for env in GAMES:
        compact, float32, dtypes = sizes(env, args.capacity)
        stored = ", ".join(f"{k} {v}" for k, v in sorted(dtypes.items()))
        lines.append(f"| {env} | {stored} | {compact} | {float32} | {compact / float32:.4f} |")
    emit(lines, args.out)


if __name__ == "__main__":
    main()
