"""The precision benchmark: fp32, bf16, fp16 and fp16-full side by side on every registered
algorithm's workloads (`Presets.bench`), several seeds.

The full run (meant for a GPU) has the networks where half precision can pay: PPO with a
width-1024 residual MLP and with the CNN on MinAtar Breakout, world models of width 1024
and 2048, DQN and PQN with the CNN on MinAtar Breakout, SAC with a width-1024 residual torso,
plus the 64x64 CartPole policy on gymnax and on gymnasium (host environments, sized by time).
`--quick` has small CartPole PPO and PQN and world-model configs for a CPU.

Per workload x precision it records the total steps, steps/s (median over seeds,
compilation excluded), compile seconds, the training step's device bytes (XLA's memory
analysis of the compiled step: this step alone, CPUs too), activation bytes (world model),
peak device memory so far (where the backend reports it), final return or eval loss (mean
and std over seeds), skipped updates, overflow rate, final loss scale, mismatch KL, the
device and package versions; for the world model also its achieved FLOP/s (XLA's FLOP count
of one step x steps/s) against a large matmul's rate measured in the same run. It writes
`results.csv`, `results.md` and `precision.png`.

    genesis-jax bench --quick --out runs/bench          # under 3 minutes on 2 CPU cores
    genesis-jax bench --out runs/bench-gpu              # the full run: 6-7 minutes on an H100
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import pathlib
import statistics
import sys
import time
import timeit

import numpy as np

from genesis_jax.algos import bench_workloads, get_algorithm
from genesis_jax.algos.base import ActingFields, BenchWorkload
from genesis_jax.run import plots, probes

PRECISIONS = ("fp32", "bf16", "fp16", "fp16-full")


def workloads(quick: bool) -> list[BenchWorkload]:
    """Every registered algorithm's workloads (`Presets.bench`): tiny budgets for
    --quick (CPU, CI); GPU-sized ones otherwise, the large networks where half precision can
    pay, few enough to finish in minutes on one GPU."""
    return list(bench_workloads(quick).values())


def _train_or_stop(algorithm, config):
    """(summary, metrics) of a run; a run the divergence guard stopped counts, with no result."""
    from genesis_jax.run.signals import DivergenceError

    try:
        result = algorithm.train(config, progress=False)
        return result.summary, result.metrics
    except DivergenceError as err:
        return err.summary, []


def _steps_for_seconds(algorithm, settings: dict, precision: str, seconds: float) -> int:
    """Total steps for a run of about `seconds`, from the steps/s of a two-row run, in
    whole rows (the algorithm's `steps_per_row` steps: PPO's update, DQN's and SAC's row)."""
    probe = algorithm.config_class(precision=precision, **settings)
    sizing = algorithm(probe)
    per_row = sizing.steps_per_row
    sizing.close()
    probe = dataclasses.replace(probe, total_steps=2 * per_row)
    steps_per_second = algorithm.train(probe, progress=False).summary["steps_per_second"]
    return max(probe.total_steps, int(steps_per_second * seconds) // per_row * per_row)


def _record(algorithm, summary: dict, metrics: list[dict], seed_index: int | None = None) -> dict:
    """One seed's bench row from any algorithm's summary: its score, speed, memory, overflows."""
    score = algorithm.score
    given = ("compile_seconds", "overflow_rate", "loss_scale", "train_step_bytes", "skipped_updates", "stopped")
    optional = ("mismatch_kl_v2", "activation_bytes", "compiled_temp_bytes", "flops_per_step")
    return {
        "accuracy": summary[f"{score}_per_seed"][seed_index] if seed_index is not None else summary[score],
        "steps_per_second": summary["steps_per_second"] / summary.get("num_seeds", 1),
        **{key: summary[key] for key in given},
        **{key: summary.get(key) for key in optional},
        "peak_device_bytes": summary.get("peak_device_bytes", probes.peak_device_bytes()),
        "total_steps": summary.get("total_steps", summary["total_updates"]),
        "scale_trace": [(r.get("step", r[algorithm.row_key]), r["loss_scale"]) for r in metrics],
    }


def _run(w: BenchWorkload, precision: str, seeds: list[int]) -> list[dict]:
    """A workload's rows, one per seed, through the algorithm template: any registered algorithm."""
    algorithm = get_algorithm(w.kind)
    settings = dict(w.settings)
    if issubclass(algorithm.config_class, ActingFields):  # the bench scores training returns:
        settings.setdefault("eval_episodes", 0)  # no greedy evaluation to compile and play
    if w.seconds is not None:
        settings["total_steps"] = _steps_for_seconds(algorithm, settings, precision, w.seconds)
    if w.vmap_seeds:
        config = algorithm.config_class(precision=precision, seed=seeds[0], num_seeds=len(seeds), **settings)
        summary, metrics = _train_or_stop(algorithm, config)
        return [_record(algorithm, summary, metrics, i if len(seeds) > 1 else None) for i in range(len(seeds))]
    configs = [algorithm.config_class(precision=precision, seed=seed, **settings) for seed in seeds]
    return [_record(algorithm, *_train_or_stop(algorithm, config)) for config in configs]


def _mean_std(values):
    values = [v for v in values if v is not None and np.isfinite(v)]
    return (float(np.mean(values)), float(np.std(values))) if values else (None, None)


def summarise_cell(workload: BenchWorkload, precision: str, seed_runs: list[dict], matmul_flops=None) -> dict:
    """One results row from the runs of one workload x precision; `matmul_flops`, the
    device's measured rate on a large matmul in this precision's compute dtype, puts the
    world model's achieved rate in proportion."""
    once = "total_steps activation_bytes compiled_temp_bytes peak_device_bytes train_step_bytes mismatch_kl_v2"
    first = {key: next((r[key] for r in seed_runs if r[key] is not None), None) for key in once.split()}
    steps_per_second = statistics.median(r["steps_per_second"] for r in seed_runs)
    flops = next((r["flops_per_step"] for r in seed_runs if r["flops_per_step"] is not None), None)
    achieved = flops * steps_per_second if flops else None
    # A diverged seed has no accuracy; `diverged_seeds` says how many there were.
    accuracy, accuracy_std = _mean_std([r["accuracy"] for r in seed_runs if r["stopped"] != "diverged"])
    return {
        "workload": workload.name,
        "precision": precision,
        "seeds": len(seed_runs),
        "accuracy_metric": get_algorithm(workload.kind).score,
        "accuracy_mean": accuracy,
        "accuracy_std": accuracy_std,
        "steps_per_second": steps_per_second,
        "compile_seconds": statistics.median(r["compile_seconds"] for r in seed_runs),
        **first,
        "achieved_tflops": achieved / 1e12 if achieved else None,
        "matmul_tflops": matmul_flops / 1e12 if matmul_flops else None,
        "matmul_fraction": achieved / matmul_flops if achieved and matmul_flops else None,
        "skipped_updates": sum(r["skipped_updates"] for r in seed_runs),
        "overflow_rate": float(np.mean([r["overflow_rate"] for r in seed_runs])),
        "final_loss_scale": float(np.mean([r["loss_scale"] for r in seed_runs])),
        "diverged_seeds": sum(r["stopped"] == "diverged" for r in seed_runs),
        "device": probes.device_name(),
        "versions": probes.versions_line(),
    }


def _ratio(row: dict, base: dict | None, key: str, inverse: bool = False) -> float | None:
    if not (base and row[key] and base[key]):
        return None
    return base[key] / row[key] if inverse else row[key] / base[key]


def add_ratios(rows: list[dict]) -> list[dict]:
    """speedup (steps/s over fp32's), memory_ratio (activation bytes over fp32's),
    step_memory_ratio (the training step's device bytes over fp32's) and accuracy_ratio
    (return over fp32's; for losses fp32's over ours), so that above 1 is better for speed
    and accuracy and below 1 is better for memory."""
    base = {r["workload"]: r for r in rows if r["precision"] == "fp32"}
    for r in rows:
        b = base.get(r["workload"])
        r["speedup"] = _ratio(r, b, "steps_per_second")
        # Activation bytes, not peak memory: a process's peak covers every run before it.
        r["memory_ratio"] = _ratio(r, b, "activation_bytes")
        r["step_memory_ratio"] = _ratio(r, b, "train_step_bytes")
        r["accuracy_ratio"] = _ratio(r, b, "accuracy_mean", inverse=r["accuracy_metric"] != "final_return")
    return rows


# results.csv's columns, in order; results.md shows SHOWN of them
COLUMNS = tuple(
    "workload precision seeds total_steps steps_per_second speedup compile_seconds accuracy_metric accuracy_mean "
    "accuracy_std accuracy_ratio activation_bytes compiled_temp_bytes train_step_bytes peak_device_bytes memory_ratio "
    "step_memory_ratio achieved_tflops matmul_tflops matmul_fraction skipped_updates overflow_rate final_loss_scale "
    "mismatch_kl_v2 diverged_seeds device versions".split()
)
SHOWN = tuple(
    "workload precision seeds steps_per_second speedup compile_seconds accuracy_metric accuracy_mean accuracy_std "
    "accuracy_ratio train_step_bytes step_memory_ratio memory_ratio matmul_fraction skipped_updates overflow_rate "
    "final_loss_scale mismatch_kl_v2 diverged_seeds".split()
)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_results(rows: list[dict], traces: dict, out: pathlib.Path, header: str, quick: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
    lines = [header, "", "| " + " | ".join(SHOWN) + " |", "|" + "---|" * len(SHOWN)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in SHOWN) + " |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    plot_results(rows, traces, out / "precision.png", quick)


def accuracy_caption(rows: list[dict], quick: bool) -> str:
    """The accuracy panel's title: how many seeds a ratio stands on, and that --quick's budgets
    are too small for the ratio to say whether a precision learns as well."""
    seeds = sorted({r["seeds"] for r in rows})
    counted = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    caveat = "; --quick: tiny budgets, not a learning comparison" if quick else ""
    return f"accuracy over fp32 (higher is better; {counted} seed{'s' if seeds[-1] > 1 else ''} each{caveat})"


def plot_results(rows: list[dict], traces: dict, path, quick: bool = False) -> None:
    names = list(dict.fromkeys(r["workload"] for r in rows))
    precisions = list(dict.fromkeys(r["precision"] for r in rows))
    fig, axes = plots.figure(2, 2, figsize=(12, 8))
    width = 0.8 / max(1, len(precisions))
    for ax, key, title in (
        (axes[0, 0], "speedup", "steps/s over fp32"),
        (axes[0, 1], "step_memory_ratio", "training-step memory over fp32"),
        (axes[1, 0], "accuracy_ratio", accuracy_caption(rows, quick)),
    ):
        for j, p in enumerate(precisions):
            values = [next((r[key] for r in rows if r["workload"] == n and r["precision"] == p), None) for n in names]
            ax.bar(np.arange(len(names)) + j * width, [v if v is not None else 0 for v in values], width, label=p)
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=15, fontsize=8)
        ax.set_title(title)
    axes[0, 0].legend(fontsize=8)
    ax = axes[1, 1]
    for (name, precision), trace in traces.items():
        if trace and precision in ("fp16", "fp16-full"):
            xs, ys = zip(*trace)
            ax.plot(np.asarray(xs) / max(xs), ys, label=f"{name} {precision}")
    ax.set_yscale("log", base=2)
    ax.set(xlabel="fraction of training", title="loss scale")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def matmul_flops_per_second(dtype, size: int, repeats: int = 10) -> float:
    """The device's rate on a `size`^3 matmul in `dtype` (2 size^3 FLOPs a product), the best
    of `repeats` after a warm-up: the yardstick for a model's achieved rate."""
    import jax
    import jax.numpy as jnp

    a, b = (jax.random.normal(jax.random.PRNGKey(i), (size, size), jnp.float32).astype(dtype) for i in (0, 1))
    product = jax.jit(jnp.matmul)
    product(a, b).block_until_ready()
    return 2 * size**3 / min(timeit.repeat(lambda: product(a, b).block_until_ready(), number=1, repeat=repeats))


def seeds_line(ran: dict[str, list[int]]) -> str:
    """The seeds the workloads ran ({workload: seeds}), for results.md's header.

    >>> seeds_line({"ppo": [0, 1], "wm": [0]})
    'seeds [0, 1] for ppo; [0] for wm'
    """
    groups: dict[tuple, list[str]] = {}
    for name, seeds in ran.items():
        groups.setdefault(tuple(seeds), []).append(name)
    if len(groups) == 1:
        return f"seeds {list(next(iter(groups)))}"
    return "seeds " + "; ".join(f"{list(seeds)} for {', '.join(names)}" for seeds, names in groups.items())


def run_benchmark(out_dir, quick=False, seeds=(0, 1), precisions=PRECISIONS, only=None, command=None):
    """Runs every workload x precision for `seeds`; writes the results under `out_dir`
    (`command`, the invocation to name in results.md)."""
    seeds = list(seeds)
    if not seeds or seeds != list(range(seeds[0], seeds[0] + len(seeds))):  # a vmapped run trains seed, seed+1, ...
        raise ValueError(f"--seeds must be consecutive and distinct (as 0,1,2), got {','.join(map(str, seeds))}")
    if unknown := [p for p in precisions if p not in PRECISIONS]:
        raise ValueError(f"unknown precision {unknown[0]!r} for the benchmark; accepted: {', '.join(PRECISIONS)}")
    every = workloads(quick)
    chosen = [w for w in every if only is None or w.name in only]
    if missing := sorted(set(only or ()) - {w.name for w in chosen}):
        full = " (it runs without --quick)" if quick and missing[0] in {w.name for w in workloads(False)} else ""
        raise ValueError(f"unknown workload {missing[0]!r}{full}; known: {', '.join(w.name for w in every)}")
    # a run's directory: its plot and files are not the benchmark's to mix with
    if held := [name for name in ("metrics.jsonl", "checkpoints") if (pathlib.Path(out_dir) / name).exists()]:
        raise ValueError(f"{out_dir} holds a training run ({held[0]}): give the benchmark its own --out")
    started = time.perf_counter()
    rows, traces, ran = [], {}, {}
    # compute dtype -> FLOP/s, measured where a world model is benchmarked
    matmul_rate = functools.cache(lambda dtype: matmul_flops_per_second(dtype, 1024 if quick else 8192))
    from genesis_jax.amp.policy import get_precision

    for w in chosen:
        # --quick: every seed only where they share one compiled run (PPO on gymnax); one elsewhere.
        w_seeds = ran[w.name] = seeds if (w.vmap_seeds or not quick) else seeds[:1]
        for p in precisions:
            t0 = time.perf_counter()
            seed_runs = _run(w, p, w_seeds)
            # an achieved FLOP/s to put in proportion
            rate = matmul_rate(get_precision(p).compute_dtype) if seed_runs[0]["flops_per_step"] is not None else None
            rows.append(summarise_cell(w, p, seed_runs, rate))
            traces[(w.name, p)] = seed_runs[0]["scale_trace"]
            print(
                f"{w.name} {p}: {rows[-1]['steps_per_second']:.0f} steps/s, {rows[-1]['accuracy_metric']} "
                f"{_fmt(rows[-1]['accuracy_mean'])} ({time.perf_counter() - t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    rows = add_ratios(rows)
    header = (
        f"Precision benchmark ({'quick' if quick else 'full'}), {seeds_line(ran)}, device {probes.device_name()}, "
        f"{time.perf_counter() - started:.0f} s in all; versions: {probes.versions_line()}"
        + (f"; command: {command}" if command else "")
    )
    write_results(rows, traces, pathlib.Path(out_dir), header, quick)
    return rows
