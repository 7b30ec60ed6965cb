"""What the tests read back from a run directory (its metric rows, its committed checkpoints,
every file byte for byte) and the one line an error printed."""

import json
import os
import pathlib


def metric_rows(run: pathlib.Path, wall_clock=()) -> list[dict]:
    """The run's metrics.jsonl rows, without the keys named in `wall_clock` (times that differ
    between two runs of the same work)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in wall_clock} for row in rows]


def written_rows(run: pathlib.Path) -> int:
    """How many whole rows (lines ended by their newline) the run's metrics.jsonl holds so far:
    for polling a run another process is writing, whose last line may be half written."""
    path = run / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def committed_steps(run: pathlib.Path) -> list[int]:
    """The steps of the run's complete checkpoints (run/checkpoints/<step>), oldest first."""
    checkpoints = run / "checkpoints"
    return sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.exists() else []


def snapshot(path: pathlib.Path) -> dict:
    """Every file under `path` with its bytes: equal snapshots mean nothing on disk changed."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    """The one line written to stderr (asserted to be one)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def unwritable_path(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    """A path under a directory this process may not write. Root ignores permission bits, so
    as root a path in sysfs, which refuses every new file; else one in a read-only directory."""
    if os.geteuid() == 0:
        return pathlib.Path("/sys") / f"genesis-jax-test-{name}"
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o555)
    return parent / name
