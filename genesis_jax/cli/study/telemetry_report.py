"""The study's underflow section: what a float16 backward lost, with and without loss
scaling, from the cells that recorded the opt-in telemetry (`genesis_jax.amp.telemetry`;
the study turns it on in its `cells.TELEMETRY_PRECISIONS` cells)."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from genesis_jax.cli.study import cells  # noqa: E402

KINDS = ("underflow", "flushed")


def summarise(rows: list[dict]) -> dict:
    """Means over the run of the telemetry (each row: means over seeds): the totals, and per
    layer; empty for rows without it."""
    if not rows or "underflow" not in rows[0]:
        return {}
    layers = sorted(k.split("/", 1)[1] for k in rows[0] if k.startswith("underflow/"))
    mean = lambda key: float(np.mean([r[key] for r in rows]))  # noqa: E731
    return {
        **{kind: mean(kind) for kind in KINDS},
        "layers": {layer: {kind: mean(f"{kind}/{layer}") for kind in KINDS} for layer in layers},
    }


def plot(task: str, by_precision: dict[str, list[dict]], out: pathlib.Path) -> str:
    """underflow_TASK.png: the share of non-zero float32 gradient entries below float16's
    smallest normal (solid) and flushed to 0 (dashed), over the run, per precision."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (precision, rows) in enumerate(by_precision.items()):
        x_key = "step" if "step" in rows[0] else "epoch"
        xs = [r[x_key] for r in rows]
        ax.plot(xs, [r["underflow"] for r in rows], color=f"C{i}", label=f"{precision}: below normal")
        ax.plot(xs, [r["flushed"] for r in rows], color=f"C{i}", linestyle="--", label=f"{precision}: flushed to 0")
    ax.set(xlabel=x_key, ylabel="fraction of non-zero gradient entries", ylim=(-0.02, 1.02), title=task)
    ax.legend(fontsize=8)
    name = f"underflow_{task.replace(':', '_')}.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=100)
    plt.close(fig)
    return name


def section(out: pathlib.Path, tasks, precisions) -> list[str]:
    """The report's lines: per task and precision, the run's mean fractions and the layer
    that lost most; a plot per task."""
    lines = [
        "Per task, over the whole run (each update's first minibatch; means over seeds): of the gradient entries "
        "that are non-zero in a float32 backward, the share a float16 backward at the cell's loss scale leaves "
        "below float16's smallest normal (2^-14; fewer significant bits) or flushes to 0 (lost). "
        "`genesis_jax.amp.telemetry`; `--underflow-telemetry` on `train ppo` and `train world-model`.",
        "",
        "| task | precision | below normal | flushed to 0 | layer losing most (flushed) |",
        "|---|---|---|---|---|",
    ]
    pictures = []
    for task in tasks:
        recorded = {}
        for precision in precisions:
            path = cells.cell_dir(out, task, precision)
            rows = cells.read_rows(path) if (path / "metrics.jsonl").is_file() else []
            numbers = summarise(rows)
            if not numbers:
                continue
            recorded[precision] = rows
            worst = max(numbers["layers"].items(), key=lambda item: item[1]["flushed"])
            lines.append(
                f"| {task} | {precision} | {numbers['underflow']:.4f} | {numbers['flushed']:.4f} "
                f"| {worst[0]} ({worst[1]['flushed']:.4f}) |"
            )
        if recorded:
            pictures.append(plot(task, recorded, out))
    if not pictures:
        return ["No cell of this study recorded the underflow telemetry."]
    return lines + ["", *[f"![{name}]({name})" for name in pictures]]
