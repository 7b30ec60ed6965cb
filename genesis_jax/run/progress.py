"""A run's progress bar on stderr (tqdm), or a bar that shows nothing."""

from __future__ import annotations

import sys


def count(n: int, word: str) -> str:
    """`n` `word`s, the word singular for 1: count(1, "cell") is "1 cell"."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def progress_bar(total: int, initial: int = 0, enabled: bool = True, unit: str = "step"):
    """A tqdm bar of `total` units. Counts in the thousands read as 20.0k; small ones stay
    whole numbers ("3/5 epoch", not tqdm's scaled "3.00/5.00")."""
    if not enabled:  # shows nothing; not tqdm.auto's, which in a notebook without ipywidgets warns
        from tqdm import tqdm as plain

        return plain(disable=True)
    from tqdm.auto import tqdm

    scaled = total >= 1000
    return tqdm(total=total, initial=initial, unit=unit, unit_scale=scaled, dynamic_ncols=True, file=sys.stderr)
