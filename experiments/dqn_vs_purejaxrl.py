"""DQN speed on CartPole-v1 against PureJaxRL's `dqn.py` (vendored in benchmarks/peers/) with
the same config, fp32, side by side in one process: PureJaxRL's whole run under one jit vs
`genesis-jax train dqn` with its metrics rows, progress chunks and checkpoints on.

Both run PureJaxRL's CartPole settings (10 envs, buffer 10000, batch 128, Adam 2.5e-4, target
copy every 500 steps, epsilon 1 -> 0.05 over 250k steps, learning after 10000, a gradient step
every 10 steps, squared TD loss, 5e5 steps). genesis-jax runs plain DQN's max target here
(`double_q=False`, as PureJaxRL; its default double DQN adds one forward pass per update). The two alternate,
`--repeats` times each; steps/s excludes compilation for both.

Usage: python experiments/dqn_vs_purejaxrl.py [--steps 500000] [--repeats 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _report import description, emit  # noqa: E402

from genesis_jax.algos.dqn import DQNConfig, train  # noqa: E402
from genesis_jax.run.probes import device_name, versions_line  # noqa: E402

PEER = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "peers", "purejaxrl_dqn.py")


def load_peer():
    spec = importlib.util.spec_from_file_location("purejaxrl_dqn", PEER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_peer(peer, steps: int) -> dict:
    config = dict(peer.CONFIG, TOTAL_TIMESTEPS=steps)
    rngs = jax.random.split(jax.random.PRNGKey(config["SEED"]), config["NUM_SEEDS"])
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(peer.make_train(config))).lower(rngs).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(rngs))
    seconds = time.perf_counter() - start
    return {
        "steps_per_second": steps / seconds,
        "compile_seconds": compile_seconds,
        "final_return": float(np.asarray(out["metrics"]["returns"])[0, -1]),
    }


def our_config(steps: int, double_q: bool) -> DQNConfig:
    return DQNConfig(total_steps=steps, double_q=double_q, precision="fp32")


def run_ours(steps: int, double_q: bool) -> dict:
    config = our_config(steps, double_q)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = train(config, out_dir=out, checkpoint_every=steps // 10, progress=False)
        seconds = time.perf_counter() - start
        checkpoints = len([p for p in os.listdir(os.path.join(out, "checkpoints")) if p.isdigit()])
    s = result.summary
    return {  # end to end: the whole `train` call (set-up, checkpoints, rows, summary, plot) less compiling
        "steps_per_second": steps / (seconds - s["compile_seconds"]),
        "session_steps_per_second": s["steps_per_second"],
        "compile_seconds": s["compile_seconds"],
        "final_return": s["final_return"],
        "final_return_is": s["final_return_is"],
        "rows": len(result.metrics),
        "checkpoints": checkpoints,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--steps", type=int, default=500_000, help="environment steps (default 500000; at least 15000)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    try:
        our_config(args.steps, double_q=False)
    except ValueError as err:
        parser.error(str(err))
    peer = load_peer()
    load_before = os.getloadavg()[0]
    runs = {"PureJaxRL dqn.py": [], "genesis-jax (double_q=False)": []}
    for _ in range(args.repeats):  # alternating, so that a change in the machine's load hits all alike
        runs["PureJaxRL dqn.py"].append(run_peer(peer, args.steps))
        runs["genesis-jax (double_q=False)"].append(run_ours(args.steps, double_q=False))
    peer_sps = np.median([r["steps_per_second"] for r in runs["PureJaxRL dqn.py"]])
    command = " ".join(["python", "experiments/dqn_vs_purejaxrl.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [
        "# DQN CartPole-v1: genesis-jax vs PureJaxRL's dqn.py (fp32, same config)",
        "",
        f"`{command}` on {device_name()} ({versions_line()}).",
        f"Load average (1 min) before, after: {load_before:.2f}, {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores); "
        "the runs alternate so that",
        "load changes hit all of them alike. genesis-jax ran with metrics rows (every 5000 steps), its",
        "progress chunks and 10 Orbax checkpoints on; its steps/s is end to end: the whole `train` call",
        "(set-up, chunks, checkpoints, metrics rows, summary and plot) less the compile time; the",
        "Session's column is its training loop alone (the compiled chunks with the host's rows and",
        "checkpoint saves between them), the same span PureJaxRL's single call is timed over.",
        "",
        "| run | steps/s per repeat | median steps/s | vs PureJaxRL | training loop steps/s (Session) | vs PureJaxRL "
        "| compile s | final return |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, results in runs.items():
        sps = [r["steps_per_second"] for r in results]
        loop = np.median([r.get("session_steps_per_second", r["steps_per_second"]) for r in results])
        lines.append(
            f"| {name} | {', '.join(f'{x:.0f}' for x in sps)} | {np.median(sps):.0f} | "
            f"{np.median(sps) / peer_sps:.2f}x | {loop:.0f} | {loop / peer_sps:.2f}x | "
            f"{np.median([r['compile_seconds'] for r in results]):.1f} | "
            f"{', '.join(format(r['final_return'], '.1f') for r in results)} |"
        )
    lines += [
        "",
        "final return: PureJaxRL's is its LogWrapper's mean over the envs' last finished episodes at the",
        f"last step; genesis-jax's is {runs['genesis-jax (double_q=False)'][0]['final_return_is']}.",
    ]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
