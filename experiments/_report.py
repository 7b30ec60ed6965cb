"""What every experiment script does with its markdown table: print it, and write it to a file if asked."""

from __future__ import annotations


def emit(lines: list[str], out: str | None) -> str:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text
