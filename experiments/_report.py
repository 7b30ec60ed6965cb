"""What every experiment script does with its markdown table: print it, and write it to a file if asked;
and its `--help` description."""

from __future__ import annotations


def emit(lines: list[str], out: str | None) -> str:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return text


def description(doc: str) -> str:
    """A script's `--help` description: its module docstring's first paragraph (argparse reflows it).

    >>> description('''One sentence
    ... over two lines.
    ...
    ...     python experiments/x.py
    ... ''')
    'One sentence\\nover two lines.'
    """
    return doc.strip().split("\n\n")[0]
