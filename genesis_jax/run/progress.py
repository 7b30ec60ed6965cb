"""A run's progress bar on stderr (tqdm), or a bar that shows nothing."""

from __future__ import annotations

import sys


class _NoBar:
    def update(self, n):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def progress_bar(total: int, initial: int = 0, enabled: bool = True, unit: str = "step"):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True, file=sys.stderr)
