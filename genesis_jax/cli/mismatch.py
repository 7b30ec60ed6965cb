"""The rollout-precision x learner-precision grid: the training-inference mismatch that the
Precision-RL work measures, for small-network PPO.

Each cell trains PPO with the rollout policy in one precision and the learner in another
and reports the mean over training of KL v1, KL v2, max |delta p| (the largest over
training) and the final return.

>>> cells = mismatch_grid("CartPole-v1", total_steps=100_000)   # doctest: +SKIP
>>> plot_heatmaps(cells, "mismatch.png")                         # doctest: +SKIP
"""

from __future__ import annotations

import sys

import numpy as np

from genesis_jax.run import plots

GRID_PRECISIONS = ("fp32", "bf16", "fp16")
METRICS = ("mismatch_kl_v1", "mismatch_kl_v2", "mismatch_max_dp", "final_return")


def grid_configs(env: str, total_steps: int, precisions=GRID_PRECISIONS, seed: int = 0, **ppo_settings) -> list:
    """The grid's PPO configs, (learner, rollout) in row order: a ValueError for a setting, a
    precision or an environment PPO refuses, before any cell trains."""
    from genesis_jax.algos.ppo import PPOConfig
    from genesis_jax.envs.in_loop import resolve_in_loop

    if not precisions:
        raise ValueError("no precisions: the grid would have no cells")
    settings = dict(env=env, total_steps=total_steps, seed=seed, **ppo_settings)
    configs = [PPOConfig(precision=lr, rollout_precision=ro, **settings) for lr in precisions for ro in precisions]
    resolve_in_loop(configs[0], "ppo")  # the env id (PPOConfig takes any string): refused here, not mid-grid
    return configs


def mismatch_grid(
    env: str, total_steps: int, precisions=GRID_PRECISIONS, seed: int = 0, log=sys.stderr, **ppo_settings
) -> list[dict]:
    """One PPO run per (rollout, learner) pair; returns a row per cell."""
    from genesis_jax.algos.ppo import train

    cells, pairs = [], [(learner, rollout) for learner in precisions for rollout in precisions]
    for (learner, rollout), config in zip(pairs, grid_configs(env, total_steps, precisions, seed, **ppo_settings)):
        s = train(config, progress=False).summary
        cells.append({"env": env, "rollout": rollout, "learner": learner, **{k: s[k] for k in METRICS}})
        print(
            f"{env} rollout={rollout} learner={learner}: kl_v2={s['mismatch_kl_v2']:.3g} "
            f"max_dp={s['mismatch_max_dp']:.3g} return={s['final_return']:.1f}",
            file=log,
            flush=True,
        )
    return cells


def table(cells: list[dict]) -> list[str]:
    lines = ["| env | rollout | learner | KL v1 | KL v2 | max abs dp | final return |", "|---|---|---|---|---|---|---|"]
    return lines + [
        f"| {c['env']} | {c['rollout']} | {c['learner']} | {c['mismatch_kl_v1']:.3g} | "
        f"{c['mismatch_kl_v2']:.3g} | {c['mismatch_max_dp']:.3g} | {c['final_return']:.1f} |"
        for c in cells
    ]


def grid_matrix(cells: list[dict], env: str, metric: str, precisions=GRID_PRECISIONS) -> np.ndarray:
    """[learner, rollout] matrix of one metric for one env."""
    m = np.full((len(precisions), len(precisions)), np.nan)
    for c in cells:
        if c["env"] == env:
            m[precisions.index(c["learner"]), precisions.index(c["rollout"])] = c[metric]
    return m


def plot_heatmaps(cells: list[dict], path, metric: str = "mismatch_kl_v2", precisions=GRID_PRECISIONS) -> None:
    """One heat map per env: learner precision (rows) x rollout precision (columns)."""
    envs = list(dict.fromkeys(c["env"] for c in cells))
    fig, axes = plots.figure(1, len(envs), figsize=(4.5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        m = grid_matrix(cells, env, metric, precisions)
        shown = np.log10(np.maximum(m, 1e-12))  # exact zeros (same precision) at the bottom of the scale
        image = ax.imshow(shown, cmap="viridis")
        for (i, j), value in np.ndenumerate(m):
            ax.text(j, i, f"{value:.1e}", ha="center", va="center", color="white", fontsize=8)
        ticks = range(len(precisions))
        ax.set(xticks=ticks, xticklabels=precisions, yticks=ticks, yticklabels=precisions)
        ax.set(xlabel="rollout precision", ylabel="learner precision", title=f"{env}: log10 {metric}")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
