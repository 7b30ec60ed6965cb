"""The GPU study in slices: what a lent GPU should run next, and the command that runs it.

A lent GPU gives a session about 15 minutes of device time, at most 10 a call, on a fresh
machine each time; the full `--preset gpu` study takes hours. So it runs a slice a call: first
the bench of the big-network workloads, then the pre-registered studies whose confirmatory
cells are still to run (a committed `benchmarks/*/plan.json`: their hundreds of seeds a cell
take days on 2 CPU cores and minutes on a GPU; the cheapest first), then one task of the GPU
preset after another (its precisions in order, fp32 first), each call until its deadline. A
cell is the study's own unit of resume: the cells a call finished come back as one archive
(without checkpoints), are unpacked into `benchmarks/` and committed, and the next call, in
this session or a later one, starts after them.

    python experiments/gpu_slices.py next            # the next slice, and the device command
    python experiments/gpu_slices.py run --deadline 480 --out-dir "$OUT"   # on the GPU machine
    python experiments/gpu_slices.py unpack ARCHIVE  # here, then commit benchmarks/study-gpu

The GPU machine lacks some of the RL extra's packages: `wheels` prints the one `pip download`
that fetches them into `.whl/` (see the device notes), and the device command installs them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# This process only orders the slices; each runs in a child, which needs the whole GPU. Importing
# the package imports gymnax, whose import makes a jax array: that starts JAX's backend, which on a
# GPU takes 75% of its memory at once, so the children got the rest and a 1,652-seed cell ran out.
# So this process, run as a script, runs JAX on the CPU; its children get the environment it was
# given, with 95% of the GPU's memory theirs instead of JAX's default 75% (a confirmatory cell runs
# its hundreds of seeds as one program: the MinAtar PPO pilots' CPU step sizes, scaled to 1,652
# seeds, are 59-114 GB; an H200 has 139).
CHILD_ENV = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95", **os.environ}
if __name__ == "__main__":
    os.environ["JAX_PLATFORMS"] = "cpu"

from genesis_jax.cli.study import PRESETS  # noqa: E402

BENCHMARKS = ROOT / "benchmarks"
STUDY_DIR = BENCHMARKS / "study-gpu"
BENCH_DIR = BENCHMARKS / "bench-bignet-gpu"
PRECISIONS = ("fp32", "bf16", "fp16", "fp16-unscaled")
# The big-network workloads, 2 seeds, three precisions, a slice each: on a fresh H200,
# 1-2 minutes each for the PPO and PQN ones, about 5 for SAC.
BENCH_WORKLOADS = ("ppo-resmlp-1024", "ppo-cnn-minatar", "pqn-cnn-minatar", "sac-resmlp-1024")
# The device has jax, flax, optax, chex and orbax; these it lacks (Python 3.12 wheels). rliable
# 1.2 is an sdist alone, so the device gets 1.0.8, which does not bound arch: arch 8 refuses the
# RandomState rliable hands it (the study's statistics fail), hence arch pinned to rliable 1.2's bound.
WHEELS = "jmp gymnasium farama-notifications gymnax tyro docstring-parser typeguard shtab flashbax rliable arch==7.2.0"


def benched_workloads(bench_dir: pathlib.Path) -> set[str]:
    """The workloads with a row in any results.csv under `bench_dir` (one folder a bench run)."""
    workloads = set()
    for path in bench_dir.rglob("results.csv"):
        with path.open() as f:
            workloads |= {row["workload"] for row in csv.DictReader(f)}
    return workloads


def cell_done(study_dir: pathlib.Path, task: str, precision: str) -> bool:
    return (study_dir / "cells" / task / precision / "summary.json").exists()


def planned_study(study_dir: pathlib.Path) -> dict | None:
    """The settings the plan in `study_dir` fixed for its confirmatory study (None: no plan that fixes them)."""
    path = study_dir / "plan.json"
    return json.loads(path.read_text()).get("study") if path.exists() else None


def confirmatory_slices(benchmarks: pathlib.Path = BENCHMARKS) -> list[tuple]:
    """("confirm", study folder, its missing cells) for every planned study with cells still to
    run, the fewest environment steps still to train first. A cell is the unit of resume (the
    archive leaves checkpoints out), so a cell must fit one call: its report lists the device
    its cells ran on, whatever device the plan's pilot ran on."""
    slices = []
    for study_dir in sorted(p.parent for p in benchmarks.glob("*/plan.json")):
        fixed = planned_study(study_dir)
        if fixed is None:
            continue
        missing = [(t, p) for t in fixed["tasks"] for p in fixed["precisions"] if not cell_done(study_dir, t, p)]
        steps = sum(fixed["total_steps"][t] for t, _ in missing) * fixed["num_seeds"]
        if missing:
            slices.append((steps, ("confirm", study_dir.name, tuple(f"{t}/{p}" for t, p in missing))))
    return [item for _, item in sorted(slices)]


def confirmatory_command(study_dir: pathlib.Path) -> list[str]:
    """The study command its plan fixed (plan.md's "To run it"): it refuses any other settings."""
    fixed = planned_study(study_dir)
    steps = ",".join(f"{task}={n}" for task, n in fixed["total_steps"].items())
    cmd = [sys.executable, "-m", "genesis_jax.cli", "study", "--out", str(study_dir)]
    cmd += ["--tasks", ",".join(fixed["tasks"]), "--precisions", ",".join(fixed["precisions"])]
    cmd += ["--total-steps", steps, "--seed", str(fixed["seed"]), "--num-seeds", str(fixed["num_seeds"])]
    return cmd + ["--reps", str(fixed["reps"]), "--confirmatory", "--no-progress"]


def pending_slices(
    study_dir: pathlib.Path = STUDY_DIR, bench_dir: pathlib.Path = BENCH_DIR, benchmarks: pathlib.Path = BENCHMARKS
) -> list[tuple]:
    """The slices not yet done, in order: ("bench", workload) for each big-network workload with
    no results yet, the planned studies' ("confirm", folder, missing cells), then ("task", task,
    precisions) for every task of the GPU preset with cells still to run."""
    benched = benched_workloads(bench_dir)
    todo = [("bench", w) for w in BENCH_WORKLOADS if w not in benched]
    todo += confirmatory_slices(benchmarks)
    for task in PRESETS["gpu"]["tasks"]:
        missing = tuple(p for p in PRECISIONS if not cell_done(study_dir, task, p))
        if missing:
            todo.append(("task", task, missing))
    return todo


def task_command(task: str, study_dir: pathlib.Path, num_seeds: int | None = None) -> list[str]:
    """The study command for a task's cells, in order, fp32 first (cells done before are kept,
    each cell is kept as it finishes). Its statistics take the fewest replications: the report
    that counts is made here, from all the cells, once they are in."""
    preset = PRESETS["gpu"]
    steps = preset["total_steps"][task]
    return [
        *(sys.executable, "-m", "genesis_jax.cli", "study", "--preset", "gpu", "--tasks", task),
        *("--precisions", ",".join(PRECISIONS), "--total-steps", f"{task}={steps}", "--out", str(study_dir)),
        *("--num-seeds", str(num_seeds or preset["num_seeds"]), "--reps", "100", "--no-cost", "--no-progress"),
    ]


def device_command() -> str:
    """The one line to give the device tool's `run` (with carry [".whl"])."""
    install = (
        "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        "--target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:. || exit;"
    )
    return f"{install} PYTHONUNBUFFERED=1 python3 experiments/gpu_slices.py run --deadline 480 --out-dir $OUT"


def run(
    deadline: float,
    out_dir: pathlib.Path,
    study_dir: pathlib.Path = STUDY_DIR,
    bench_dir: pathlib.Path = BENCH_DIR,
    num_seeds: int | None = None,
    benchmarks: pathlib.Path = BENCHMARKS,
) -> list[tuple]:
    """Runs slices until `deadline` seconds have passed (a cell still running then is stopped and
    lost; its finished neighbours are kept), then archives what finished into `out_dir`."""
    start, done, folders = time.monotonic(), [], [study_dir, bench_dir]
    for item in pending_slices(study_dir, bench_dir, benchmarks):
        left = deadline - (time.monotonic() - start)
        if left < 30:
            break
        if item[0] == "bench":
            cmd = [sys.executable, "-m", "genesis_jax.cli", "bench", "--workloads", item[1]]
            cmd += ["--precisions", "fp32,bf16,fp16", "--out", str(bench_dir / item[1])]
        elif item[0] == "confirm":
            folders.append(benchmarks / item[1])
            cmd = confirmatory_command(benchmarks / item[1])
        else:
            cmd = task_command(item[1], study_dir, num_seeds)
        print("slice:", *item[:2], *item[2:3], f"({left:.0f} s left)", flush=True)
        try:
            finished = subprocess.run(cmd, timeout=left, check=False, env=CHILD_ENV).returncode == 0
        except subprocess.TimeoutExpired:
            print("slice stopped at the deadline:", *item, flush=True)
            break
        if finished:
            done.append(item)
    out_dir.mkdir(parents=True, exist_ok=True)
    no_checkpoints = lambda info: None if "/checkpoints" in info.name else info  # a cell's results, not its state
    with tarfile.open(out_dir / "slices.tar.gz", "w:gz") as archive:
        for folder in folders:
            if folder.exists():
                archive.add(folder, arcname=f"benchmarks/{folder.name}", filter=no_checkpoints)
    return done


def unpack(archive_path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Extracts a `run`'s archive into the repository (only under benchmarks/); returns the
    cells and bench results it holds."""
    with tarfile.open(archive_path) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith("benchmarks/") and ".." not in m.name]
        archive.extractall(root, members=members, filter="data")
    return sorted(m.name for m in members if m.name.endswith(("summary.json", "results.csv")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("next", help="the next slice and the device command")
    sub.add_parser("wheels", help="the pip download of the packages the GPU machine lacks")
    run_parser = sub.add_parser("run", help="on the GPU machine: run slices until the deadline")
    run_parser.add_argument("--deadline", type=float, default=480.0, help="seconds (default 480)")
    run_parser.add_argument("--out-dir", type=pathlib.Path, required=True, help="where the archive goes ($OUT)")
    unpack_parser = sub.add_parser("unpack", help="here: unpack a run's archive into benchmarks/")
    unpack_parser.add_argument("archive", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.verb == "next":
        todo = pending_slices()
        print("next slice:", *(todo[0] if todo else ("none: the GPU study is complete",)))
        print(f"{len(todo)} slices left; device command (carry ['.whl']):\n  {device_command()}")
    elif args.verb == "wheels":
        print(
            "python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            "--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "
            f"-d .whl {WHEELS}"
        )
    elif args.verb == "run":
        done = run(args.deadline, args.out_dir)
        print(f"{len(done)} slices finished:", *(" ".join(map(str, item[:2])) for item in done), sep="\n  ")
    else:
        print(*unpack(args.archive), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
