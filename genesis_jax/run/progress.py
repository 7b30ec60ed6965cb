"""A run's progress bar on stderr (tqdm), or a bar that shows nothing."""

from __future__ import annotations

import sys
import time


def count(n: int, word: str) -> str:
    """`n` `word`s, the word singular for 1: count(1, "cell") is "1 cell"."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def progress_bar(total: int, initial: int = 0, enabled: bool = True, unit: str = "step"):
    """A tqdm bar of `total` units. Counts in the thousands read as 20.0k; small ones stay
    whole numbers ("3/5 epoch", not tqdm's scaled "3.00/5.00"). Where stderr is a file or a
    pipe (a log, a batch job), a line a report instead: a bar's redraws there are one long line."""
    if not enabled:
        return NoBar()
    if not sys.stderr.isatty() and "ipykernel" not in sys.modules:  # a notebook's stderr is no tty either
        return ReportLines(total, initial, unit)
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, unit_scale=total >= 1000, dynamic_ncols=True, file=sys.stderr)


class NoBar:
    """A bar that shows nothing. Not tqdm's `disable=True`: its first bar started tqdm's monitor
    thread, left running in the program after every run, `progress=False` ones included (and not
    tqdm.auto's, which in a notebook without ipywidgets warns)."""

    def set_postfix(self, refresh: bool = True, **values) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class ReportLines:
    """A progress bar's reports as lines on stderr, for a log: where the run is, and the row's
    own values, or without them the rate since it started ("2.0M/5.0M steps (40%), ret=500")."""

    def __init__(self, total: int, initial: int, unit: str):
        self.total, self.n, self.start, self.unit = total, initial, initial, unit
        self.began, self.postfix = time.monotonic(), ""

    def set_postfix(self, refresh: bool = True, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int) -> None:
        self.n += n
        rate = (self.n - self.start) / max(time.monotonic() - self.began, 1e-9)
        done = f"{_short(self.n)}/{_short(self.total)} {self.unit}s ({100 * self.n / max(self.total, 1):.0f}%)"
        line = ", ".join((done, self.postfix or f"{_short(rate)} {self.unit}s/s"))  # a postfix has its own rate
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


def _short(x: float) -> str:
    """20000 as 20.0k, 2.5e6 as 2.5M; below 1000 whole (or one decimal for a rate)."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.1f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"
