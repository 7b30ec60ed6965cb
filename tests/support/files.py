"""What the bad-input tests compare: a run directory's files, byte for byte, and the one line
an error printed."""

import os
import pathlib


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
