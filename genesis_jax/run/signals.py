"""Stops: SIGINT / SIGTERM turned into a flag the loop reads, the exceptions a stopped
run raises (the divergence guard's stop, a signal), and the exit statuses they end with.

It loads no JAX at import (the command line and the launcher read the exit statuses)."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genesis_jax.amp.guard import DivergenceGuard

# Exit statuses of the command line and the launcher (a signal: 128 + its number).
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3  # the divergence guard stopped training (metrics and checkpoint written)
EXIT_SYSTEM = 4  # the system failed the run: disk full or read-only, out of memory, a missing dependency
EXIT_PEER = 5  # of several processes: this one stopped because another failed (whose message says why)


class DivergenceError(RuntimeError):
    """Training stopped by the divergence guard; metrics and a checkpoint of the last good
    state were written first. `summary` is the run's summary at the stop."""

    def __init__(self, message: str, summary: dict | None = None):
        super().__init__(message)
        self.summary = summary


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM arrived; a final checkpoint was saved. `signum` names the signal."""

    def __init__(self, message: str, signum: int, summary: dict | None = None):
        super().__init__(message)
        self.signum = signum
        self.summary = summary


def halted_report(train_state, guard: DivergenceGuard) -> str | None:
    """The guard's message if any (of possibly vmapped) train states halted, else None."""
    import jax.numpy as jnp

    from genesis_jax.amp.loss_scale import DynamicLossScale

    halted = jnp.atleast_1d(train_state.halted)
    if not bool(jnp.any(halted)):
        return None
    i = int(jnp.argmax(halted))
    pick = lambda x: float(jnp.atleast_1d(x)[i])  # noqa: E731
    dynamic = isinstance(train_state.scaler, DynamicLossScale)
    return guard.explain(
        pick(train_state.scaler.loss_scale),
        int(pick(train_state.skip_streak)),
        int(pick(train_state.step)),
        dynamic,
    )


class StopSignals:
    """Context manager: SIGINT and SIGTERM set `received` (the signal number) instead of
    killing the process; the loop checks it between chunks. Outside the main thread, where
    Python cannot install handlers, it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        self.received = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = previous = signal.signal(sig, self._handle)
                earlier = getattr(previous, "__self__", None)
                if isinstance(earlier, StopSignals) and earlier.received is not None:
                    self.received = earlier.received  # held since the command began (the CLI's catcher)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
