"""The GPU study in slices: what a lent GPU should run next, and the command that runs it.

A lent GPU gives a session about 15 minutes of device time, at most 10 a call, on a fresh
machine each time; the full `--preset gpu` study takes hours. So it runs a slice a call: first
the bench of the big-network workloads, then one task after another (its precisions in order,
fp32 first), each call until its deadline. A cell is the study's own unit of resume:
the cells a call finished come back as one archive, are unpacked into `benchmarks/study-gpu`
and committed, and the next call, in this session or a later one, starts after them.

    python experiments/gpu_slices.py next            # the next slice, and the device command
    python experiments/gpu_slices.py run --deadline 480 --out-dir "$OUT"   # on the GPU machine
    python experiments/gpu_slices.py unpack ARCHIVE  # here, then commit benchmarks/study-gpu

The GPU machine lacks some of the RL extra's packages: `wheels` prints the one `pip download`
that fetches them into `.whl/` (see the device notes), and the device command installs them.
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import subprocess
import sys
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from genesis_jax.cli.study import PRESETS  # noqa: E402

STUDY_DIR = ROOT / "benchmarks" / "study-gpu"
BENCH_DIR = ROOT / "benchmarks" / "bench-bignet-gpu"
PRECISIONS = ("fp32", "bf16", "fp16", "fp16-unscaled")
# The big-network workloads, 2 seeds, three precisions, a slice each: on a fresh H200,
# 1-2 minutes each for the PPO and PQN ones, about 5 for SAC.
BENCH_WORKLOADS = ("ppo-resmlp-1024", "ppo-cnn-minatar", "pqn-cnn-minatar", "sac-resmlp-1024")
# The device has jax, flax, optax, chex and orbax; these it lacks (Python 3.12 wheels).
WHEELS = "jmp gymnasium farama-notifications gymnax tyro docstring-parser typeguard shtab flashbax rliable arch"


def benched_workloads(bench_dir: pathlib.Path) -> set[str]:
    """The workloads with a row in any results.csv under `bench_dir` (one folder a bench run)."""
    workloads = set()
    for path in bench_dir.rglob("results.csv"):
        with path.open() as f:
            workloads |= {row["workload"] for row in csv.DictReader(f)}
    return workloads


def pending_slices(study_dir: pathlib.Path = STUDY_DIR, bench_dir: pathlib.Path = BENCH_DIR) -> list[tuple]:
    """The slices not yet done, in order: ("bench", workload) for each big-network workload with
    no results yet, then ("task", task, precisions) for every task of the GPU preset with cells
    still to run."""
    benched = benched_workloads(bench_dir)
    todo = [("bench", w) for w in BENCH_WORKLOADS if w not in benched]
    for task in PRESETS["gpu"]["tasks"]:
        missing = tuple(p for p in PRECISIONS if not (study_dir / "cells" / task / p / "summary.json").exists())
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
) -> list[tuple]:
    """Runs slices until `deadline` seconds have passed (a cell still running then is stopped and
    lost; its finished neighbours are kept), then archives what finished into `out_dir`."""
    start, done = time.monotonic(), []
    for item in pending_slices(study_dir, bench_dir):
        left = deadline - (time.monotonic() - start)
        if left < 30:
            break
        if item[0] == "bench":
            cmd = [sys.executable, "-m", "genesis_jax.cli", "bench", "--workloads", item[1]]
            cmd += ["--precisions", "fp32,bf16,fp16", "--out", str(bench_dir / item[1])]
        else:
            cmd = task_command(item[1], study_dir, num_seeds)
        print("slice:", *item[:2], *item[2:3], f"({left:.0f} s left)", flush=True)
        try:
            finished = subprocess.run(cmd, timeout=left, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            print("slice stopped at the deadline:", *item, flush=True)
            break
        if finished:
            done.append(item)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out_dir / "slices.tar.gz", "w:gz") as archive:
        for folder in (study_dir, bench_dir):
            if folder.exists():
                archive.add(folder, arcname=f"benchmarks/{folder.name}")
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
