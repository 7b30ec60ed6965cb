"""PNG plots of a run's metrics (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(
    rows: list[dict],
    x_key: str,
    y_keys,
    path,
    title: str,
    floor: float | None = None,
    log_y: bool = True,
    x_label: str | None = None,
    y_label: str | None = None,
) -> None:
    """Curves over `x_key` (None values as gaps) above the loss scale; a dashed line at a known floor."""
    plt = _pyplot()
    xs = [r[x_key] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for key in y_keys:
        ax1.plot(xs, [float("nan") if r[key] is None else r[key] for r in rows], label=key)
    if floor is not None:
        ax1.axhline(floor, linestyle="--", color="gray", label="noise floor")
    if log_y:
        ax1.set_yscale("log")
    if y_label:
        ax1.set_ylabel(y_label)
    else:
        ax1.legend()
    ax1.set_title(title)
    ax2.plot(xs, [r["loss_scale"] for r in rows], color="tab:orange")
    ax2.set_yscale("log", base=2)
    ax2.set_ylabel("loss scale")
    ax2.set_xlabel(x_label or x_key)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_ppo(rows: list[dict], path, title: str = "PPO") -> None:
    """Episode return and loss scale against environment steps."""
    plot_curves(
        rows,
        "step",
        ("episode_return",),
        path,
        title,
        log_y=False,
        x_label="environment steps",
        y_label="mean episode return",
    )
