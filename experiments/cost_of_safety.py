"""The cost of safety: genesis-jax against PureJaxRL's own `ppo.py` and `dqn.py`, fp32 and fp16,
side by side in one process, rounds alternating.

Runs, all on CartPole-v1 with PureJaxRL's CartPole settings (`--steps` environment steps):
- PureJaxRL's `ppo.py` (benchmarks/peers/purejaxrl_ppo.py), its whole run under one jit;
- `genesis-jax train ppo --precision fp32` and `fp16`: the trainer the CLI runs with `--out`,
  its defaults otherwise: metrics rows, progress chunks, the Session, an Orbax checkpoint at
  the end;
- PureJaxRL's `ppo.py` converted to `genesis_jax.amp` (benchmarks/peers/purejaxrl_ppo_amp.py),
  run in fp32 compute and in fp16: the library's cost in a user's own loop;
- PureJaxRL's `dqn.py` and `genesis-jax train dqn --precision fp32` (the functions of
  experiments/dqn_vs_purejaxrl.py: 10 checkpoints in the run).
A round runs each once, in reversed order every other round; each figure is the median of
`--repeats` rounds. Steps/s exclude compilation: PureJaxRL's runs (and the amp-converted
file) are compiled once and timed around the call. genesis-jax's have two figures: its
training loop (the steps/s the CLI reports: the compiled chunks with the host's rows and
saves between them, the span PureJaxRL's one call is timed over), on which the targets are
judged, and end to end (the whole `train` call: set-up, initial state, chunks, rows, the
checkpoints, summary and plot) less its compile time.

The PureJaxRL files import distrax: pip install -e '.[bench]'.

    python experiments/cost_of_safety.py --steps 500000 --repeats 3 --out benchmarks/cost-of-safety-cpu.md
    python experiments/cost_of_safety.py --smoke      # 20,480 steps, one round
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import dqn_vs_purejaxrl  # noqa: E402
from _report import description, emit  # noqa: E402

from genesis_jax.algos.ppo import PPOConfig, train  # noqa: E402
from genesis_jax.run import probes  # noqa: E402

PEERS = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "peers")
PPO_CONFIG = {  # ppo.py's own `__main__` settings, without its per-update debug printing
    "LR": 2.5e-4,
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
    "DEBUG": False,
}
PEER_PPO = "PureJaxRL ppo.py (fp32)"
TARGETS = {  # run: (its reference, the ratio it must reach)
    "genesis-jax train ppo --precision fp32": (PEER_PPO, 1.0),
    "ppo.py with genesis_jax.amp, fp32 compute": (PEER_PPO, 0.97),
    "genesis-jax train dqn --precision fp32": ("PureJaxRL dqn.py (fp32)", 0.97),
}


def load_peer(filename: str):
    """A vendored PureJaxRL file (benchmarks/peers/) as a module."""
    if importlib.util.find_spec("distrax") is None:
        raise SystemExit("PureJaxRL's ppo.py imports distrax: pip install -e '.[bench]'")
    spec = importlib.util.spec_from_file_location(filename[:-3], os.path.join(PEERS, filename))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compiled_peer_ppo(module, steps: int, precision: str | None = None):
    """A `() -> steps/s` timing one call of the file's `make_train`, compiled once here."""
    config = dict(PPO_CONFIG, TOTAL_TIMESTEPS=steps, **({"PRECISION": precision} if precision else {}))
    rng = jax.random.PRNGKey(30)
    compiled = jax.jit(module.make_train(config)).lower(rng).compile()
    done = config["NUM_UPDATES"] * config["NUM_STEPS"] * config["NUM_ENVS"]  # whole updates, as genesis-jax

    def run() -> dict:
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(rng))
        seconds = time.perf_counter() - start
        returns = np.asarray(out["metrics"]["returned_episode_returns"])
        return {"steps_per_second": done / seconds, "final_return": float(returns[-1].mean())}

    return run


def genesis_ppo(steps: int, precision: str, seed: int) -> dict:
    """`train ppo` as the CLI runs it (its defaults are PureJaxRL's CartPole settings)."""
    config = PPOConfig(precision=precision, total_steps=steps, seed=seed)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        result = train(config, out_dir=out, progress=False)
        seconds = time.perf_counter() - start
    summary = result.summary
    return {
        "steps_per_second": summary["total_steps"] / (seconds - summary["compile_seconds"]),
        "loop_steps_per_second": summary["steps_per_second"],
        "final_return": summary["final_return"],
    }


def check_defaults_match() -> None:
    """genesis-jax's PPO defaults are ppo.py's settings: a drift would compare unlike runs."""
    ours = dataclasses.asdict(PPOConfig())
    pairs = {"lr": "LR", "num_envs": "NUM_ENVS", "num_steps": "NUM_STEPS", "update_epochs": "UPDATE_EPOCHS"}
    pairs |= {"num_minibatches": "NUM_MINIBATCHES", "gamma": "GAMMA", "gae_lambda": "GAE_LAMBDA"}
    pairs |= {"clip_eps": "CLIP_EPS", "ent_coef": "ENT_COEF", "vf_coef": "VF_COEF", "max_grad_norm": "MAX_GRAD_NORM"}
    pairs |= {"activation": "ACTIVATION", "anneal_lr": "ANNEAL_LR"}
    differ = {k: (ours[k], PPO_CONFIG[v]) for k, v in pairs.items() if ours[k] != PPO_CONFIG[v]}
    if differ or ours["hidden"] != (64, 64):
        raise SystemExit(f"genesis-jax's PPO defaults no longer match ppo.py's: {differ}")


def make_runs(ppo_steps: int, dqn_steps: int) -> dict:
    """{run name: (round number) -> {"steps_per_second", "final_return"}}, compiled where the run allows."""
    ppo, ppo_amp, dqn = load_peer("purejaxrl_ppo.py"), load_peer("purejaxrl_ppo_amp.py"), dqn_vs_purejaxrl.load_peer()
    peer_ppo = compiled_peer_ppo(ppo, ppo_steps)
    amp_fp32 = compiled_peer_ppo(ppo_amp, ppo_steps, "fp32")
    amp_fp16 = compiled_peer_ppo(ppo_amp, ppo_steps, "fp16")
    return {
        PEER_PPO: lambda r: peer_ppo(),
        "genesis-jax train ppo --precision fp32": lambda r: genesis_ppo(ppo_steps, "fp32", r),
        "genesis-jax train ppo --precision fp16": lambda r: genesis_ppo(ppo_steps, "fp16", r),
        "ppo.py with genesis_jax.amp, fp32 compute": lambda r: amp_fp32(),
        "ppo.py with genesis_jax.amp, fp16": lambda r: amp_fp16(),
        "PureJaxRL dqn.py (fp32)": lambda r: dqn_vs_purejaxrl.run_peer(dqn, dqn_steps),
        "genesis-jax train dqn --precision fp32": lambda r: dqn_vs_purejaxrl.run_ours(dqn_steps, double_q=False),
    }


def measure(runs: dict, repeats: int) -> dict:
    results = {name: [] for name in runs}
    for round_number in range(repeats):
        names = list(runs) if round_number % 2 == 0 else list(runs)[::-1]
        for name in names:
            results[name].append(runs[name](round_number))
            print(
                f"round {round_number}: {name}: {results[name][-1]['steps_per_second']:,.0f} steps/s", file=sys.stderr
            )
    return results


def loop_speed(result: dict) -> float:
    """The training loop's steps/s: PureJaxRL's call, genesis-jax's Session (see the docstring)."""
    return result.get("loop_steps_per_second", result.get("session_steps_per_second", result["steps_per_second"]))


def report(results: dict, args, command: str) -> list[str]:
    loop = {name: statistics.median(loop_speed(r) for r in rs) for name, rs in results.items()}
    whole = {name: statistics.median(r["steps_per_second"] for r in rs) for name, rs in results.items()}
    reference = {name: PEER_PPO if "ppo" in name else "PureJaxRL dqn.py (fp32)" for name in results}
    lines = [
        "# The cost of safety: genesis-jax vs PureJaxRL's ppo.py and dqn.py, CartPole-v1",
        "",
        f"`{command}`; machine: {probes.machine_name()}; {probes.versions_line()}, {peer_versions()}.",
        f"PPO {args.ppo_steps:,} steps, DQN {args.dqn_steps:,} steps; median of {args.repeats} rounds, the runs",
        "alternating within a round (reversed every other round); compilation excluded. Training loop:",
        "PureJaxRL's one call; genesis-jax's Session (the steps/s the CLI reports). End to end:",
        "genesis-jax's whole `train` call less compiling (PureJaxRL's runs: the same as their loop).",
        "",
        "| run | training loop steps/s per round | median | vs PureJaxRL | target | end to end, median "
        "| vs PureJaxRL | final return |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rs in results.items():
        ratio = loop[name] / loop[reference[name]]
        target = TARGETS.get(name)
        verdict = f">= {target[1]:.2f}x: {'met' if ratio >= target[1] else 'not met'}" if target else ""
        speeds = ", ".join(format(loop_speed(r), ",.0f") for r in rs)
        returns = ", ".join(format(r["final_return"], ".1f") for r in rs)
        lines.append(
            f"| {name} | {speeds} | {loop[name]:,.0f} | {ratio:.2f}x | {verdict} | {whole[name]:,.0f} "
            f"| {whole[name] / whole[reference[name]]:.2f}x | {returns} |"
        )
    lines += [
        "",
        "vs PureJaxRL: PPO runs against ppo.py, DQN runs against dqn.py. Final return: PureJaxRL's is its",
        "LogWrapper's mean over the envs' last finished episodes; genesis-jax's the mean of the last",
        "finished training episodes. fp16 runs slower than fp32 on a CPU (no float16 arithmetic there).",
    ]
    return lines


def peer_versions() -> str:
    """The versions the PureJaxRL files run on, beyond `probes.versions_line`."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("gymnax", "flashbax", "distrax", "tfp-nightly"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "--steps", "--ppo-steps", dest="ppo_steps", metavar="N", type=int, default=500_000, help="steps of every run"
    )
    p.add_argument("--dqn-steps", type=int, default=None, help="the DQN pair's steps (default: --steps)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; each figure is their median")
    p.add_argument("--smoke", action="store_true", help="one round of 20,480 steps")
    p.add_argument(
        "--out",
        default=None,
        help="write the markdown report here too (the committed one: benchmarks/cost-of-safety-cpu.md)",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.ppo_steps, args.repeats = 20_480, 1
    args.dqn_steps = args.dqn_steps or args.ppo_steps
    check_defaults_match()
    results = measure(make_runs(args.ppo_steps, args.dqn_steps), args.repeats)
    command = "python experiments/cost_of_safety.py " + " ".join(argv if argv is not None else sys.argv[1:])
    emit(report(results, args, command.strip()), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
