"""PNG plots of a run's metrics (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations


def figure(nrows: int = 1, ncols: int = 1, *, figsize, **subplots):
    """(a figure drawn by Agg, its axes), without pyplot: no global figure state, nothing to
    close, and a process writing a run's plots imports a third less of matplotlib (0.4 s)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots)


def plot_curves(
    rows: list[dict], x_key: str, y_keys, path, title: str, floor: float | None = None, log_y: bool = True, twin_keys=()
) -> None:
    """Curves over `x_key` (None values as gaps) above the loss scale; a dashed line at a known
    floor; `twin_keys` (a loss beside a return) on an axis of their own, on the right."""
    xs = [r[x_key] for r in rows]
    fig, (ax1, ax2) = figure(2, 1, figsize=(7, 6), sharex=True)
    values = lambda key: [float("nan") if r[key] is None else r[key] for r in rows]  # noqa: E731
    for key in y_keys:
        ax1.plot(xs, values(key), label=key)
    if twin_keys:
        twin = ax1.twinx()
        for key in twin_keys:
            twin.plot(xs, values(key), color="tab:gray", alpha=0.6, label=key)
        twin.set_ylabel(", ".join(twin_keys))
        twin.legend(loc="upper right")
    if floor is not None:
        ax1.axhline(floor, linestyle="--", color="gray", label="noise floor")
    if log_y:
        ax1.set_yscale("log")
    ax1.legend(loc="upper left")
    ax1.set_title(title)
    ax2.plot(xs, [r["loss_scale"] for r in rows], color="tab:orange")
    ax2.set_yscale("log", base=2)
    ax2.set(ylabel="loss scale", xlabel=x_key)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


UNDERFLOW_PLOT = "underflow.png"


def plot_underflow(rows: list[dict], x_key: str, path, title: str) -> None:
    """The underflow telemetry over the run: per layer, the fraction of non-zero float32
    gradient entries below float16's smallest normal (solid) and flushed to 0 (dashed) in
    the float16 backward at the run's loss scale (`genesis_jax.amp.telemetry`)."""
    xs = [r[x_key] for r in rows]
    layers = sorted(k.split("/", 1)[1] for k in rows[0] if k.startswith("underflow/"))
    fig, ax = figure(figsize=(7, 4))
    for i, layer in enumerate(layers):
        color = f"C{i % 10}"
        ax.plot(xs, [r[f"underflow/{layer}"] for r in rows], color=color, label=layer)
        ax.plot(xs, [r[f"flushed/{layer}"] for r in rows], color=color, linestyle="--")
    ax.set(xlabel=x_key, ylabel="fraction of non-zero gradient entries", ylim=(-0.02, 1.02))
    ax.set_title(f"{title}: float16 underflow (solid: below normal, dashed: flushed to 0)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
