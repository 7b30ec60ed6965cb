"""Stops: SIGINT / SIGTERM turned into a flag the loop reads, the exceptions a stopped
run raises (the divergence guard's stop, a signal), and the exit statuses they end with.

It loads no JAX at import (the command line and the launcher read the exit statuses)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from genesis_jax.amp.guard import DivergenceGuard

# Exit statuses of the command line and the launcher (a signal: 128 + its number).
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3  # the divergence guard stopped training (metrics and checkpoint written)
EXIT_SYSTEM = 4  # the system failed the run: disk full or read-only, out of memory, a missing dependency
EXIT_PEER = 5  # of several processes: this one stopped because another failed (whose message says why)


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first line of `err`'s message (at most `limit` characters), or its type's name where it
    has none: what a one-line refusal or a summary's `error` quotes of an error from elsewhere."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__


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


def divergence_message(
    guard: DivergenceGuard, scale: float, skip_streak: int, step: int, dynamic_scale: bool = True
) -> str:
    """The sentence a user reads when `guard` stops a run, naming the CLI's flags. The advice depends on
    `dynamic_scale`: only a dynamic loss scale can be tuned out of a skip streak; without
    one (fp32, bf16, a static scale) the gradients themselves are non-finite."""
    if guard.max_consecutive_skips is not None and skip_streak > guard.max_consecutive_skips:
        # strict mode (fp16-full's default) also skips a finite gradient's non-finite update
        cause = f"{skip_streak} consecutive updates were skipped as non-finite (their gradients, or in strict mode "
        cause += f"the update or new state; limit {guard.max_consecutive_skips})"
    elif guard.min_scale is not None:
        cause = f"the loss scale would fall below the floor {guard.min_scale:g} (it is {scale:g})"
    else:  # no limit of this guard explains it: the state was halted before (a resumed, stopped run)
        cause = f"the state was halted by the divergence guard before (scale {scale:g}, {skip_streak} skips in a row)"
    advice = (
        "Non-finite steps halve the scale faster than clean steps can grow it back; a scale floor "
        "(--min-loss-scale 1) or a shorter --growth-interval helps, or train in bf16/fp32"
        if dynamic_scale
        else "No loss scale is being adjusted here, so the loss or its gradients are themselves non-finite: "
        "check the inputs and hyperparameters, lower the learning rate or clip gradients (--max-grad-norm)"
    )
    return f"training diverged at optimizer step {step}: {cause}. {advice}"


def halted_report(train_state, guard: DivergenceGuard) -> str | None:
    """The guard's message if any (of possibly vmapped) train states halted, else None."""
    import jax.numpy as jnp

    from genesis_jax.amp.loss_scale import DynamicLossScale

    halted = jnp.atleast_1d(train_state.halted)
    if not bool(jnp.any(halted)):
        return None
    i = int(jnp.argmax(halted))  # the first halted seed's
    scale, streak, step = (
        jnp.atleast_1d(x)[i] for x in (train_state.scaler.loss_scale, train_state.skip_streak, train_state.step)
    )
    dynamic = isinstance(train_state.scaler, DynamicLossScale)
    return divergence_message(guard, float(scale), int(streak), int(step), dynamic)


@contextlib.contextmanager
def handling_signals(handler, only_python_handled: bool = False):
    """SIGINT and SIGTERM go to `handler` for the block (in the main thread; where
    `only_python_handled`, only those Python handles); it yields the handlers they had.
    `signal.SIG_DFL`: they end the process at once (a wait inside the runtime, where Python's
    own handlers would run only after it returns)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            if not only_python_handled or callable(signal.getsignal(s)):
                previous[s] = signal.signal(s, handler)
    try:
        yield previous
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


class StopSignals:
    """Context manager: SIGINT and SIGTERM set `received` (the signal number) instead of
    killing the process; the loop checks it between chunks. A repeat at least
    `SAME_STOP_SECONDS` after the first stops at once (`_at_once`): the chunk running is lost,
    the saved checkpoints stay. `notice(signum, at_once)`, where given, is called on the first
    and on such a repeat. Outside the main thread, where Python cannot install handlers, it
    does nothing."""

    # One stop asked twice: under `launch`, a terminal's Ctrl-C reaches each process directly and
    # again from the launcher, milliseconds apart.
    SAME_STOP_SECONDS = 1.0

    def __init__(self, notice=None):
        self.received: int | None = None
        self.notice = notice or (lambda signum, at_once: None)
        self._first_at = 0.0
        self._previous: dict = {}
        self._handlers = contextlib.ExitStack()

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self.received is None:
            self.received, self._first_at = signum, now
            self.notice(signum, False)
        elif now - self._first_at >= self.SAME_STOP_SECONDS:
            self.notice(signum, True)
            self._at_once(signum, frame)

    def _at_once(self, signum, frame) -> None:
        """Stops at once: a handler the caller had before any StopSignals is called; otherwise
        SIGINT raises KeyboardInterrupt and SIGTERM ends the process, as Python's defaults do
        (whatever a background shell left: one that ignores SIGINT sent this one on purpose)."""
        handler = self._previous.get(signum)
        while isinstance(getattr(handler, "__self__", None), StopSignals):
            handler = handler.__self__._previous.get(signum)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} received again: stopped at once")
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def __enter__(self):
        self._previous = self._handlers.enter_context(handling_signals(self._handle))
        for previous in self._previous.values():
            earlier = getattr(previous, "__self__", None)
            if isinstance(earlier, StopSignals) and earlier.received is not None:
                # held since the command began (the CLI's catcher)
                self.received, self._first_at = earlier.received, earlier._first_at
        return self

    def __exit__(self, *exc):
        self._handlers.close()
