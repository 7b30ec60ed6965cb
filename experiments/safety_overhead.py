"""The overhead ledger: what genesis-jax's safety costs each algorithm's training loop, in fp32.

Per workload, three builds of the same training run, alternating round by round:
- `plain`: the trainer's step as a plain optax loop (`jax.value_and_grad`, the same gradient
  clipping, the optimizer, `optax.apply_updates`): no loss scaler, no finite decision, no skip;
- `default`: `amp.train_step` as the trainers ship it (skip non-finite gradients, decided from
  the global norm that clipping takes anyway);
- `strict`: the same plus the post-step checks (`--strict-finite-checks True`).

Each figure is the run's steps/s with compilation excluded (the trainer's own summary: the
compiled chunks, environment steps included), the median of `--repeats` runs; the cost is
plain's steps/s over the mode's, minus one. The plain build swaps the step in by patching
the two places the trainers call `amp.train_step` from (the template and `shared_scale_step`)
and the optimizer wrapper `TrainState.create` applies; nothing else in the run changes.

    python experiments/safety_overhead.py --repeats 3 --out benchmarks/safety-overhead-cpu.md
    python experiments/safety_overhead.py --smoke            # every workload, tiny budgets
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(__file__))
from _report import emit  # noqa: E402

from genesis_jax.algos import base, get_algorithm  # noqa: E402
from genesis_jax.amp import multi, optim  # noqa: E402
from genesis_jax.amp import state as amp_state  # noqa: E402
from genesis_jax.run import probes  # noqa: E402

MODES = ("plain", "default", "strict")
SMALL_PPO = {"num_envs": 8, "num_steps": 32, "num_minibatches": 4}
# name: (algorithm, settings, smoke settings). CPU-sized versions of the precision benchmark's
# workloads (genesis_jax/bench.py): the same networks, budgets of seconds on 2 cores.
WORKLOADS = {
    "ppo-mlp": ("ppo", {"total_steps": 262_144}, {"total_steps": 4096}),
    "ppo-resmlp-1024": (
        "ppo",
        {"network": "resmlp", "width": 1024, "depth": 2, **SMALL_PPO, "total_steps": 2048},
        {"network": "resmlp", "width": 1024, "depth": 2, **SMALL_PPO, "total_steps": 512},
    ),
    "ppo-cnn-minatar": (
        "ppo",
        {"env": "Breakout-MinAtar", "network": "cnn", **SMALL_PPO, "total_steps": 16_384},
        {"env": "Breakout-MinAtar", "network": "cnn", **SMALL_PPO, "total_steps": 1024},
    ),
    "dqn": ("dqn", {"total_steps": 100_000}, {"total_steps": 10_000, "learning_starts": 1000}),
    "sac": ("sac", {"total_steps": 4000, "learning_starts": 500}, {"total_steps": 600, "learning_starts": 400}),
    "world-model": (
        "world-model",
        {"width": 128, "depth": 2, "batch_size": 512, "epochs": 6, "num_sequences": 1024},
        {"width": 64, "depth": 2, "batch_size": 256, "epochs": 1, "num_sequences": 256},
    ),
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


def plain_train_step(state, batch, loss_fn, *, axis_name=None, faults=None, grad_transform=None):
    """A plain optax step with the metrics the trainers read: the loss, its gradient norm."""
    del faults, grad_transform
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    if axis_name is not None:
        grads, loss = jax.lax.pmean((grads, loss), axis_name)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(
        step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state
    )
    metrics = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "loss_scale": state.loss_scale.loss_scale,
        "grads_finite": jnp.asarray(True),
        "halted": jnp.asarray(False),
        "aux": aux,
    }
    return new_state, metrics


@contextlib.contextmanager
def plain_steps():
    """Every trainer on `plain_train_step` and `plain_optimizer` while inside."""
    saved = (base.train_step, multi.train_step, amp_state.skip_nonfinite)
    base.train_step = multi.train_step = plain_train_step
    amp_state.skip_nonfinite = plain_optimizer
    try:
        yield
    finally:
        base.train_step, multi.train_step, amp_state.skip_nonfinite = saved


def run_once(kind: str, settings: dict, mode: str, seed: int) -> float:
    """steps/s of one fp32 run, compilation excluded."""
    algorithm = get_algorithm(kind)
    config = algorithm.config_class(precision="fp32", seed=seed, strict_finite_checks=(mode == "strict"), **settings)
    with plain_steps() if mode == "plain" else contextlib.nullcontext():
        result = algorithm.train(config, progress=False)
    return result.summary["steps_per_second"]


def measure(names: list[str], repeats: int, smoke: bool) -> dict:
    speeds = {name: {mode: [] for mode in MODES} for name in names}
    for round_number in range(repeats):
        for name in names:
            kind, settings, smoke_settings = WORKLOADS[name]
            order = MODES if round_number % 2 == 0 else MODES[::-1]  # drift hits every mode alike
            for mode in order:
                sps = run_once(kind, smoke_settings if smoke else settings, mode, seed=round_number)
                speeds[name][mode].append(sps)
                print(f"round {round_number}: {name} {mode} {sps:,.0f} steps/s", file=sys.stderr, flush=True)
    return speeds


def report(speeds: dict, repeats: int, command: str) -> list[str]:
    lines = [
        f"Overhead ledger, fp32, median of {repeats} alternating rounds; machine: {probes.machine_name()}; "
        f"{probes.versions_line()}",
        f"command: `{command}`",
        "",
        "| workload | plain optax steps/s | amp default steps/s | amp strict steps/s | default cost | strict cost"
        " | GPU column |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, by_mode in speeds.items():
        med = {mode: statistics.median(v) for mode, v in by_mode.items()}
        cost = {mode: med["plain"] / med[mode] - 1 for mode in ("default", "strict")}
        lines.append(
            f"| {name} | {med['plain']:,.0f} | {med['default']:,.0f} | {med['strict']:,.0f} "
            f"| {cost['default']:+.1%} | {cost['strict']:+.1%} | not run |"
        )
    lines += [
        "",
        "Cost: plain steps/s / mode steps/s - 1 (positive: slower than plain optax). Steps/s are whole",
        "training loops (compiled chunks, environment steps included), compilation excluded.",
    ]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from: " + ", ".join(WORKLOADS))
    p.add_argument("--smoke", action="store_true", help="tiny budgets: checks that every build runs")
    p.add_argument("--out", default=None, help="write the markdown report here too")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; accepted: {', '.join(WORKLOADS)}")
    start = time.perf_counter()
    speeds = measure(names, args.repeats, args.smoke)
    command = "python experiments/safety_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = report(speeds, args.repeats, command.strip())
    lines.append(f"\nWall time of the whole ledger: {time.perf_counter() - start:.0f} s.")
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
