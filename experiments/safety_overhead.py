"""The overhead ledger: what genesis-jax's safety costs each algorithm's training step, in fp32.

Per workload, three builds of the same trainer:
- `plain`: the trainer's step as a plain optax loop (`jax.value_and_grad`, the same gradient
  clipping, the optimizer, `optax.apply_updates`): no loss scaler, no finite decision, no skip;
- `default`: `amp.train_step` as the trainers ship it (skip non-finite gradients, decided from
  the global norm that clipping takes anyway);
- `strict`: the same plus the post-step checks (`--strict-finite-checks True`).

Each build compiles the trainer's own chunk (`Algorithm.compile_chunk`: `--positions` of its
progress positions, PPO's updates with their rollouts, DQN's and SAC's rows, the world
model's epochs) and the chunk is timed call by call, the three builds interleaved call by
call, so that a machine whose speed drifts (a shared CPU does, by tens of percent over
minutes) slows all three alike; each figure is the median of `--calls` timed calls after
`--warmup` untimed ones (which also fill the replay buffers past learning-starts). The cost
is the mode's median time over plain's, minus one. The plain build swaps the step in by
patching the two places the trainers call `amp.train_step` from (the template and SAC's
update) and the optimizer wrapper `TrainState.create` applies, while it traces.

    python experiments/safety_overhead.py --out benchmarks/safety-overhead-cpu.md
    python experiments/safety_overhead.py --smoke            # every workload, a few calls
    python experiments/safety_overhead.py --hlo --workloads dqn,sac   # what each build compiles to

`--hlo` times nothing: it counts, in each build's compiled chunk, the fusions (on a CPU, a
kernel each), the conditionals and the bytes XLA's cost analysis says it accesses. The HLO
holds a loop's body once, so the counts are those of one step's program, whatever the load on
the machine: where a timing misses, they say what the default mode adds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(__file__))
from _report import description, emit  # noqa: E402

from genesis_jax.algos import base, get_algorithm  # noqa: E402
from genesis_jax.amp import optim  # noqa: E402
from genesis_jax.amp import state as amp_state  # noqa: E402
from genesis_jax.run import probes  # noqa: E402

sac_train = importlib.import_module("genesis_jax.algos.sac.train")  # the module, not the function of that name

MODES = ("plain", "default", "strict")
SMALL_PPO = {"num_envs": 8, "num_steps": 32, "num_minibatches": 4}
# name: (algorithm, settings, positions per timed call). CPU-sized versions of the precision
# benchmark's workloads (genesis_jax/cli/bench.py): the same networks, calls of 0.05-2 s on 2 cores.
WORKLOADS = {
    "ppo-mlp": ("ppo", {}, 16),
    "ppo-resmlp-1024": ("ppo", {"network": "resmlp", "width": 1024, "depth": 2, **SMALL_PPO}, 1),
    "ppo-cnn-minatar": ("ppo", {"env": "Breakout-MinAtar", "network": "cnn", **SMALL_PPO}, 4),
    "dqn": ("dqn", {"learning_starts": 1000, "steps_per_row": 1000}, 2),
    "sac": ("sac", {"learning_starts": 256, "steps_per_row": 50}, 2),
    "world-model": ("world-model", {"width": 128, "depth": 2, "batch_size": 512, "num_sequences": 1024}, 1),
}


def plain_optimizer(inner, *, max_grad_norm=None, guard=None, advance_schedule_on_skip=False, strict=False):
    """In place of `skip_nonfinite`: the state the trainers read (a `SkipNonFiniteState`,
    nothing ever counted), and an update that clips and steps, whatever the gradients hold."""
    del guard, advance_schedule_on_skip, strict
    tx = optax.chain(optax.clip_by_global_norm(max_grad_norm), inner) if max_grad_norm is not None else inner

    def init(params):
        zero = jnp.asarray(0, jnp.int32)
        return optim.SkipNonFiniteState(tx.init(params), zero, zero + 0, jnp.asarray(False))

    def update(grads, state, params=None, **ignored):
        del ignored
        updates, inner_state = tx.update(grads, state.inner_state, params)
        return updates, state._replace(inner_state=inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


def plain_train_step(state, loss_fn, *args, has_aux=False, axis_name=None, faults=None, grad_transform=None):
    """A plain optax step with the metrics the trainers read: the loss, its gradient norm."""
    del faults, grad_transform

    def with_aux(params, *args):
        out = loss_fn(params, *args)
        return out if has_aux else (out, None)

    (loss, aux), grads = jax.value_and_grad(with_aux, has_aux=True)(state.params, *args)
    if axis_name is not None:
        grads, loss = jax.lax.pmean((grads, loss), axis_name)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "loss_scale": state.scaler.loss_scale,
        "grads_finite": jnp.asarray(True),
        "halted": jnp.asarray(False),
        "aux": aux,
    }
    return new_state, metrics


@contextlib.contextmanager
def plain_steps():
    """Every trainer on `plain_train_step` and `plain_optimizer` while inside."""
    saved = (base.train_step, sac_train.train_step, amp_state.skip_nonfinite)
    base.train_step = sac_train.train_step = plain_train_step
    amp_state.skip_nonfinite = plain_optimizer
    try:
        yield
    finally:
        base.train_step, sac_train.train_step, amp_state.skip_nonfinite = saved


def compiled_chunk(kind: str, settings: dict, mode: str, positions: int, hlo: bool = False):
    """(the first state, a compiled `state -> (state, metrics)` of `positions` positions); with
    `hlo`, (fusions, conditionals, bytes accessed) of that compiled program instead."""
    algorithm = get_algorithm(kind)
    config = algorithm.config_class(precision="fp32", strict_finite_checks=(mode == "strict"), **settings)
    with plain_steps() if mode == "plain" else contextlib.nullcontext():
        algo = algorithm(config)
        state = algo.initial_state()
        call = algo.compile_chunk(state, positions)
    if not hlo:
        return state, call
    text, cost = algo.compiled.as_text(), algo.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return text.count(" fusion("), text.count(" conditional("), cost.get("bytes accessed", float("nan"))


def hlo_report(names: list[str]) -> list[str]:
    lines = ["| workload | build | fusions | conditionals | bytes accessed |", "| --- | --- | --- | --- | --- |"]
    for name in names:
        kind, settings, positions = WORKLOADS[name]
        counts = {mode: compiled_chunk(kind, settings, mode, positions, hlo=True) for mode in MODES}
        for mode, (fusions, conditionals, nbytes) in counts.items():
            more = "" if mode == "plain" else f" ({nbytes / counts['plain'][2] - 1:+.1%})"
            lines.append(f"| {name} | {mode} | {fusions} | {conditionals} | {nbytes:,.0f}{more} |")
    return lines


def measure(names: list[str], calls: int, warmup: int) -> dict:
    """{workload: {mode: [seconds of each timed call]}}."""
    seconds = {}
    for name in names:
        kind, settings, positions = WORKLOADS[name]
        built = {mode: compiled_chunk(kind, settings, mode, positions) for mode in MODES}
        states = {mode: state for mode, (state, _) in built.items()}
        seconds[name] = {mode: [] for mode in MODES}
        for number in range(warmup + calls):
            order = MODES if number % 2 == 0 else MODES[::-1]
            for mode in order:
                start = time.perf_counter()
                states[mode], metrics = built[mode][1](states[mode])
                jax.block_until_ready(metrics)
                if number >= warmup:
                    seconds[name][mode].append(time.perf_counter() - start)
        med = {mode: statistics.median(v) for mode, v in seconds[name].items()}
        print(f"{name}: " + ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in med.items()), file=sys.stderr, flush=True)
    return seconds


def report(seconds: dict, calls: int, command: str) -> list[str]:
    lines = [
        f"Overhead ledger, fp32, median of {calls} interleaved calls of each trainer's compiled chunk; "
        f"machine: {probes.machine_name()}; {probes.versions_line()}",
        f"command: `{command}`",
        "",
        "| workload (positions per call) | plain optax ms | amp default ms | amp strict ms | default cost "
        "| strict cost | GPU |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, by_mode in seconds.items():
        med = {mode: statistics.median(v) * 1e3 for mode, v in by_mode.items()}
        cost = {mode: med[mode] / med["plain"] - 1 for mode in ("default", "strict")}
        lines.append(
            f"| {name} ({WORKLOADS[name][2]}) | {med['plain']:.2f} | {med['default']:.2f} | {med['strict']:.2f} "
            f"| {cost['default']:+.1%} | {cost['strict']:+.1%} | not run |"
        )
    lines += [
        "",
        "ms: one call of the compiled chunk (PPO: rollout and update; DQN and SAC: a row of environment",
        "and gradient steps; world model: an epoch). Cost: mode ms / plain ms - 1 (positive: slower",
        "than plain optax).",
    ]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--calls", type=int, default=15, help="timed calls per build (default 15)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from: " + ", ".join(WORKLOADS))
    p.add_argument("--smoke", action="store_true", help="2 calls after 3 warm-up ones: checks that every build runs")
    p.add_argument("--out", default=None, help="write the markdown report here too")
    p.add_argument("--hlo", action="store_true", help="time nothing: count what each build compiles to")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; accepted: {', '.join(WORKLOADS)}")
    if args.hlo:
        emit(hlo_report(names), args.out)
        return 0
    calls, warmup = (2, 3) if args.smoke else (args.calls, args.warmup)
    start = time.perf_counter()
    seconds = measure(names, calls, warmup)
    command = "python experiments/safety_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = report(seconds, calls, command.strip())
    lines.append(f"\nWall time of the whole ledger: {time.perf_counter() - start:.0f} s.")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
