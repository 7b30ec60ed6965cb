"""Runs the PyTorch parity comparisons and prints a markdown table; with --out, writes it and a
PNG of the two loss-scale trajectories overlaid into that directory.

    python experiments/parity_report.py --out benchmarks/parity   # the committed report
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))  # the harness: tests/parity
from _report import description  # noqa: E402

from genesis_jax.nets import MLP, ActorCritic  # noqa: E402
from tests.parity import harness as parity  # noqa: E402

INJECT = (20, 21, 90, 150)
# (per-step loss rtol, final weights atol); see tests/parity/test_parity.py for why.
TOLERANCES = {
    ("fp32", "torch-style"): (1e-5, 1e-6),
    ("fp32", "optax"): (3e-5, 5e-6),
    ("fp16", "optax"): (3e-3, 3e-4),
    ("bf16", "optax"): (2e-2, 5e-3),
}


def _row(quantity, ours, theirs, tolerance, relative=True):
    abs_d, rel_d = parity.max_diffs(ours, theirs)
    ok = (rel_d if relative else abs_d) <= tolerance
    return {
        "quantity": quantity,
        "max_abs_diff": abs_d,
        "max_rel_diff": rel_d,
        "tolerance": f"{'rel' if relative else 'abs'} {tolerance:g}",
        "pass": ok,
    }


def run(out_dir: str | None) -> list[dict]:
    rows = []
    flags = parity.overflow_sequence(10_000)
    t_traj, j_traj = parity.torch_scaler_trajectory(flags), parity.jax_scaler_trajectory(flags)
    rows.append(_row("loss scale + growth tracker, 10k steps", j_traj, t_traj, 0.0, relative=False))
    x, y = parity.regression_data(200)
    params = MLP(features=(64, 64, 1)).init(jax.random.PRNGKey(0), x[0])
    torch_runs = {}
    for (precision, optimizer), (loss_rtol, param_atol) in TOLERANCES.items():
        if precision not in torch_runs:
            torch_runs[precision] = parity.torch_amp_training(params, x, y, precision, INJECT)
        t_l, t_s, t_p = torch_runs[precision]
        j_l, j_s, j_p = parity.jax_training(params, x, y, precision, INJECT, optimizer=optimizer)
        name = f"MLP {precision}, {'optax.adam' if optimizer == 'optax' else 'torch-style Adam'}"
        rows.append(_row(f"{name}: per-step loss (200 steps)", j_l, t_l, loss_rtol))
        rows.append(
            {
                "quantity": f"{name}: skipped steps {j_s}",
                "max_abs_diff": float(len(set(j_s) ^ set(t_s))),
                "max_rel_diff": 0.0,
                "tolerance": "identical sets",
                "pass": j_s == t_s,
            }
        )
        rows.append(_row(f"{name}: final weights", j_p, t_p, param_atol, relative=False))
    batch = parity.ppo_batch()
    ac_params = ActorCritic(action_dim=2).init(jax.random.PRNGKey(3), jnp.zeros((1, 4)))
    t_loss, t_grads = parity.torch_ppo_loss_and_grads(ac_params, batch)
    j_loss, j_grads = parity.jax_ppo_loss_and_grads(ac_params, batch)
    rows.append(_row("PPO loss fp32 (CleanRL)", np.array(j_loss), np.array(t_loss), 1e-5))
    rows.append(_row("PPO grads fp32", j_grads, t_grads, 1e-5, relative=False))
    batch = parity.world_model_batch()
    wm_params = parity.init_world_model(width=64, depth=2, seed=4)
    t_loss, t_grads = parity.torch_world_model_loss_and_grads(wm_params, batch, 64, 2)
    j_loss, j_grads = parity.jax_world_model_loss_and_grads(wm_params, batch, 64, 2)
    rows.append(_row("world-model loss fp32", np.array(j_loss), np.array(t_loss), 1e-5))
    rows.append(_row("world-model grads fp32", j_grads, t_grads, 1e-5, relative=False))

    lines = ["| quantity | max abs diff | max rel diff | tolerance | pass |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['quantity']} | {r['max_abs_diff']:.3g} | {r['max_rel_diff']:.3g} | {r['tolerance']} | "
        f"{'yes' if r['pass'] else 'NO'} |"
        for r in rows
    ]
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "parity.md"), "w") as f:
            f.write(
                "PyTorch AMP parity (torch " + __import__("torch").__version__ + ", CPU)\n\n" + "\n".join(lines) + "\n"
            )
        _plot(flags, t_traj, j_traj, os.path.join(out_dir, "parity_loss_scale.png"))
    print("\n".join(lines))
    return rows


def _plot(flags, torch_traj, jax_traj, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(torch_traj[:, 0], label="torch.amp.GradScaler", linewidth=3, alpha=0.5)
    ax.plot(jax_traj[:, 0], label="genesis_jax.DynamicLossScale", linestyle="--")
    bad = np.flatnonzero(~flags)
    ax.scatter(bad, np.full(bad.shape, torch_traj[:, 0].min()), marker="|", color="red", label="non-finite step")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss scale")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "--out", default=None, help="directory for parity.md and the PNG (benchmarks/parity: the committed ones)"
    )
    args = p.parse_args(argv)
    rows = run(args.out)
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
