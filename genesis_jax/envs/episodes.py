"""Episode bookkeeping for vectorised environments stepped inside a compiled loop (each
environment's running return) and the metrics rows' and summary's returns made from it:
`final_return` is the mean return of the episodes that ended in the run's last tenth of rows
(`final_return_of_rows`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def running_returns(running, reward, done) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """One vector step of each environment's running return: the new running returns (0 where
    an episode ended), and (episodes ended, the sum of their returns).

    >>> running, (ended, return_sum) = running_returns(jnp.array([1.0, 2.0]), jnp.ones(2), jnp.array([True, False]))
    >>> running.tolist(), int(ended), float(return_sum)
    ([0.0, 3.0], 1, 2.0)
    """
    returns = running + reward
    return jnp.where(done, 0.0, returns), (done.sum(), jnp.where(done, returns, 0.0).sum())


def episode_columns(episodes, return_sum, per_seed: bool = False) -> dict[str, list]:
    """A chunk's episode columns from [seeds, rows] counts and return sums of the episodes that
    ended in each row: the mean return of those episodes (all seeds pooled; None where none
    ended) and the totals; with `per_seed`, in an N-seed run, each seed's count, sum and mean
    too (what `final_return_of_rows` and the study read, and TensorBoard's per-seed curves).

    >>> columns = episode_columns([[1, 0], [3, 1]], [[10.0, 0.0], [60.0, 5.0]], per_seed=True)
    >>> columns["episode_return"], columns["episode_return_per_seed"]
    ([17.5, 5.0], [[10.0, 20.0], [None, 5.0]])
    """
    episodes, return_sum = np.asarray(episodes).astype(int), np.asarray(return_sum, np.float64)
    means = lambda sums, counts: [float(s / n) if n else None for s, n in zip(sums, counts)]  # noqa: E731
    columns = {
        "episode_return": means(return_sum.sum(0), episodes.sum(0)),
        "episodes": episodes.sum(0).tolist(),
        "return_sum": return_sum.sum(0).tolist(),
    }
    if per_seed and len(episodes) > 1:
        columns["episodes_per_seed"] = episodes.T.tolist()
        columns["return_sum_per_seed"] = return_sum.T.tolist()
        columns["episode_return_per_seed"] = [means(s, n) for s, n in zip(return_sum.T, episodes.T)]
    return columns


def final_return_of_rows(rows: list[dict], num_seeds: int) -> dict:
    """The summary's final_return (the mean return of the episodes that ended in the last tenth
    of the rows, all seeds pooled) and each seed's, from rows with `episode_columns` (a 1-seed
    run's rows need no per-seed columns).

    >>> rows = [{"episodes": 2, "return_sum": 30.0}] * 9 + [{"episodes": 4, "return_sum": 100.0}]
    >>> final_return_of_rows(rows, 1)
    {'final_return': 25.0, 'final_return_per_seed': [25.0]}
    """
    last = rows[-max(1, len(rows) // 10) :]
    per_seed = lambda r, k: r[f"{k}_per_seed"] if f"{k}_per_seed" in r else [r[k]]  # noqa: E731
    sums, counts = (
        np.sum([per_seed(r, k) for r in last] or np.zeros((1, num_seeds)), 0) for k in ("return_sum", "episodes")
    )
    return {
        "final_return": float(sums.sum() / counts.sum()) if counts.sum() else float("nan"),
        "final_return_per_seed": [float(s / n) if n else float("nan") for s, n in zip(sums, counts)],
    }
