"""Episode bookkeeping for vectorised environments stepped inside a compiled loop: each
environment's running return and the newest finished episodes' returns, from which an
algorithm reports its `final_return` (the mean of the last `RECENT` finished episodes)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

RECENT = 10  # final_return: the mean of the last RECENT finished training episodes


class Episodes(struct.PyTreeNode):
    """`running`: each environment's return so far; `recent`: the newest RECENT finished
    episodes' returns (NaN: none yet), a ring; `count`: finished episodes so far.

    >>> e = Episodes.create(num_envs=2)
    >>> e, (finished, return_sum) = e.record(jnp.array([1.0, 2.0]), jnp.array([True, False]))
    >>> int(finished), float(return_sum), float(e.recent_mean()), e.running.tolist()
    (1, 1.0, 1.0, [0.0, 2.0])
    """

    running: jax.Array
    recent: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, num_envs: int) -> Episodes:
        return cls(jnp.zeros(num_envs, jnp.float32), jnp.full(RECENT, jnp.nan, jnp.float32), jnp.int32(0))

    def record(self, reward, done) -> tuple[Episodes, tuple[jax.Array, jax.Array]]:
        """One vector step's rewards and ends: the new bookkeeping, and (episodes finished,
        the sum of their returns)."""
        returns = self.running + reward
        slot = jnp.where(done, (self.count + jnp.cumsum(done) - 1) % RECENT, RECENT)  # RECENT: not written
        running, ended = running_returns(self.running, reward, done)
        new = Episodes(running, self.recent.at[slot].set(returns, mode="drop"), self.count + done.sum())
        return new, ended

    def recent_mean(self) -> jax.Array:
        return jnp.nanmean(self.recent)


def running_returns(running, reward, done) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One vector step of each environment's running return: the new running returns (0 where
    an episode ended), and (episodes ended, the sum of their returns).

    >>> running, (ended, return_sum) = running_returns(jnp.array([1.0, 2.0]), jnp.ones(2), jnp.array([True, False]))
    >>> running.tolist(), int(ended), float(return_sum)
    ([0.0, 3.0], 1, 2.0)
    """
    returns = running + reward
    return jnp.where(done, 0.0, returns), (done.sum(), jnp.where(done, returns, 0.0).sum())


def final_return_summary(recent, num_seeds: int) -> dict:
    """The summary's final_return (the mean over seeds), each seed's (the mean return of its
    last RECENT finished episodes, NaN where none finished) and what it is, from the newest
    returns (`Episodes.recent`, or a ring of the same shape) of a 1- or N-seed run."""
    recent = np.asarray(recent).reshape(num_seeds, RECENT)
    per_seed = [float(np.nanmean(r)) if np.isfinite(r).any() else float("nan") for r in recent]
    return {
        "final_return": float(np.mean(per_seed)),
        "final_return_per_seed": per_seed,
        "final_return_is": f"the mean return of the last {RECENT} finished training episodes (epsilon-greedy)",
    }


def episode_columns(episodes, return_sum, per_seed: bool = False) -> dict[str, list]:
    """A chunk's episode columns from [seeds, rows] counts and return sums of the episodes that
    ended in each row: the mean return of those episodes (None where none ended), the totals,
    and with `per_seed` each seed's counts and sums (what `final_return_of_rows` reads)."""
    episodes, return_sum = np.asarray(episodes).astype(int), np.asarray(return_sum, np.float64)
    counts, sums = episodes.sum(0), return_sum.sum(0)
    columns = {
        "episode_return": [float(s / n) if n else None for s, n in zip(sums, counts)],
        "episodes": counts.tolist(),
        "return_sum": sums.tolist(),
    }
    if per_seed:
        columns |= {"episodes_per_seed": episodes.T.tolist(), "return_sum_per_seed": return_sum.T.tolist()}
    return columns


def final_return_of_rows(rows: list[dict], num_seeds: int) -> dict:
    """The summary's final_return (the mean return of the episodes that ended in the last tenth
    of the rows, all seeds pooled) and each seed's, from rows with per-seed episode columns."""
    last = rows[-max(1, len(rows) // 10) :]
    no_rows = np.zeros((1, num_seeds))
    sums, counts = (np.sum([r[f"{k}_per_seed"] for r in last] or no_rows, 0) for k in ("return_sum", "episodes"))
    return {
        "final_return": float(sums.sum() / counts.sum()) if counts.sum() else float("nan"),
        "final_return_per_seed": [float(s / n) if n else float("nan") for s, n in zip(sums, counts)],
    }


def mean_over_seeds(values) -> list:
    """[seeds, rows] -> each row's mean over the seeds with a value (None where none has)."""
    have = ~np.isnan(values)
    sums, counts = np.where(have, values, 0.0).sum(0), have.sum(0)
    return [float(s / n) if n else None for s, n in zip(sums, counts)]
