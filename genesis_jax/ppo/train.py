"""The PPO driver: chunks of jitted updates, progress, metrics, summary, plot, checkpoints.

>>> from genesis_jax.ppo import PPOConfig, train
>>> result = train(PPOConfig(env="CartPole-v1", precision="fp16", total_steps=20_000), out_dir=None)  # doctest: +SKIP
>>> result.summary["final_return"]                                                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import numpy as np

from genesis_jax import runs
from genesis_jax.envs.registry import resolve_env
from genesis_jax.parallel import replicated, start_distributed
from genesis_jax.ppo.config import PPOConfig
from genesis_jax.session import Session

# Per-update metrics kept in metrics.jsonl (means over minibatch steps and seeds).
_LOGGED = (
    "loss",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "grad_norm",
    "loss_scale",
    "skipped",
    "mismatch_kl_v1",
    "mismatch_kl_v2",
    "mismatch_max_dp",
    "mismatch_ratio_dev",
)


@dataclasses.dataclass
class PPOResult:
    summary: dict
    runner_state: Any
    metrics: list[dict]

    @property
    def train_state(self):
        return self.runner_state.train_state

    def __getattr__(self, name):
        try:
            return self.__dict__["summary"][name]
        except KeyError:
            raise AttributeError(name) from None


def chunk_size(num_updates: int, requested: int | None, target_chunks: int = 25) -> int:
    """Updates per compiled chunk: a divisor of num_updates (so one compilation serves the
    whole run) near num_updates / target_chunks."""
    if requested is not None:
        if num_updates % requested:
            raise ValueError(f"updates-per-chunk {requested} does not divide the {num_updates} updates")
        return requested
    ideal = max(1, num_updates // target_chunks)
    small = [d for d in range(1, math.isqrt(num_updates) + 1) if num_updates % d == 0]  # O(sqrt n), not O(n)
    divisors = small + [num_updates // d for d in small]
    return min(divisors, key=lambda d: (abs(d - ideal), d))


def _build(config: PPOConfig, backend: str, grad_transform=None):
    """(init(keys) -> runner, compile_chunks(runner, n) -> run(runner), host env or None)."""
    if backend == "gymnax":
        from genesis_jax.ppo.jax_loop import make_jax_ppo, runner_shardings

        mesh = config.mesh()
        init, run_chunk, spec = make_jax_ppo(config, grad_transform, mesh)
        if config.num_seeds > 1:
            init, run_chunk_fn = jax.vmap(init), jax.vmap(run_chunk, in_axes=(0, None))
        else:
            run_chunk_fn = run_chunk
        if mesh is None:
            jitted = jax.jit(run_chunk_fn, static_argnums=1, donate_argnums=0)
        else:
            shardings = runner_shardings(jax.eval_shape(init, _seed_keys(config)), mesh)
            init = jax.jit(init, out_shardings=shardings)
            jitted = jax.jit(
                run_chunk_fn, static_argnums=1, donate_argnums=0, out_shardings=(shardings, replicated(mesh))
            )

        def compile_chunks(runner, per_chunk):
            return jitted.lower(runner, per_chunk).compile()

        return init, compile_chunks, None
    from genesis_jax.ppo.host_loop import make_host_ppo

    init, run_chunk, warmup, env = make_host_ppo(config, grad_transform)

    def compile_host(runner, per_chunk):
        warmup(runner)
        return lambda r: run_chunk(r, per_chunk)

    return init, compile_host, env


def _seed_keys(config: PPOConfig):
    base = jax.random.PRNGKey(config.seed)
    return jax.random.split(base, config.num_seeds) if config.num_seeds > 1 else base


def _per_update_rows(chunk_metrics: dict, first_update: int, config: PPOConfig) -> list[dict]:
    """metrics.jsonl rows: one per update, means over seeds, plus each seed's return.
    (Column-wise numpy, then one dict per update: this runs on every chunk.)"""
    m = {k: np.asarray(v) for k, v in chunk_metrics.items()}
    if config.num_seeds == 1:
        m = {k: v[None] for k, v in m.items()}  # [seeds, updates]
    updates = np.arange(first_update + 1, first_update + m["loss"].shape[1] + 1)
    episodes = m["episodes"].astype(np.int64)
    finished = episodes > 0
    seed_returns = np.where(finished, m["return_sum"] / np.maximum(episodes, 1), np.nan)
    mean_returns = np.sum(np.where(finished, seed_returns, 0.0), 0) / np.maximum(finished.sum(0), 1)
    columns = {
        "update": updates.tolist(),
        "step": (updates * config.batch_size).tolist(),
        "episode_return": [float(r) if any_ else None for r, any_ in zip(mean_returns, finished.any(0))],
        "episodes": episodes.sum(0).tolist(),
        "return_sum": m["return_sum"].sum(0).astype(float).tolist(),
        **{k: m[k].mean(0).astype(float).tolist() for k in _LOGGED if k != "skipped"},
        "skipped": m["skipped"].sum(0).astype(int).tolist(),
        "halted": m["halted"].any(0).tolist(),
    }
    if config.num_seeds > 1:
        columns["episode_return_per_seed"] = [
            [None if np.isnan(r) else float(r) for r in col] for col in seed_returns.T
        ]
        columns["return_sum_per_seed"] = m["return_sum"].T.astype(float).tolist()
        columns["episodes_per_seed"] = episodes.T.tolist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def summarise(
    rows: list[dict], config: PPOConfig, runner, timing: dict, backend: str, stopped: str | None = None
) -> dict:
    """summary.json: the run's outcome in one flat dict."""
    last = rows[-max(1, len(rows) // 10) :]
    episodes = sum(r["episodes"] for r in last)
    final_return = sum(r["return_sum"] for r in last) / episodes if episodes else float("nan")
    if config.num_seeds > 1 and rows:
        seed_episodes = np.sum([r["episodes_per_seed"] for r in last], axis=0)
        seed_sums = np.sum([r["return_sum_per_seed"] for r in last], axis=0)
        per_seed = [float(s / e) if e else float("nan") for s, e in zip(seed_sums, seed_episodes)]
    else:
        per_seed = [final_return]
    ts = runner.train_state
    steps_per_seed = np.atleast_1d(np.asarray(ts.step))
    total_updates = int(np.sum(steps_per_seed))
    faults = config.fault_injection(config.seed)
    skipped = int(np.sum(np.asarray(ts.skipped)))
    steps = rows[-1]["step"] if rows else 0
    return {
        "env": config.env,
        "env_backend": backend,
        "precision": config.train_precision().name,
        "rollout_precision": config.rollout_precision_resolved().name,
        "seed": config.seed,
        "num_seeds": config.num_seeds,
        "total_steps": steps,
        "final_return": final_return,
        "final_return_per_seed": per_seed,
        "steps_per_second": timing["run_steps"] / timing["run_seconds"] if timing["run_seconds"] > 0 else float("nan"),
        "compile_seconds": timing["compile_seconds"],
        "wall_seconds": timing["wall_seconds"],
        "train_step_bytes": timing["train_step_bytes"],
        "loss_scale": float(np.mean(np.asarray(ts.loss_scale.loss_scale))),
        "skipped_updates": skipped,
        "total_updates": total_updates,
        "overflow_rate": skipped / total_updates if total_updates else 0.0,
        "injected_nonfinite": sum(faults.count_nonfinite(int(n)) for n in steps_per_seed),
        "stopped": stopped,
        "iterations": len(rows),
        "mismatch_kl_v1": float(np.mean([r["mismatch_kl_v1"] for r in rows])) if rows else float("nan"),
        "mismatch_kl_v2": float(np.mean([r["mismatch_kl_v2"] for r in rows])) if rows else float("nan"),
        "mismatch_max_dp": float(np.max([r["mismatch_max_dp"] for r in rows])) if rows else float("nan"),
        "device": runs.device_name(),
    }


def _postfix(row: dict, skipped: list[int]) -> dict:
    skipped[0] += row["skipped"]
    ret = row["episode_return"]
    return {"ret": "-" if ret is None else f"{ret:.1f}", "scale": f"{row['loss_scale']:.0f}", "skipped": skipped[0]}


def train(
    config: PPOConfig,
    out_dir: str | None = None,
    *,
    checkpoint_every: int = 0,
    grad_transform=None,
    **run_options,
) -> PPOResult:
    """Trains PPO as `config` says; `out_dir` (None: nothing written) gets metrics.jsonl,
    summary.json, ppo.png and checkpoints every `checkpoint_every` environment steps (0: at
    the end only). `grad_transform(grads, train_state) -> grads` runs before the finite check.
    `run_options` are `Session`'s (resume, overwrite, progress, max_to_keep,
    allow_config_change, writers). Returns a `PPOResult` (summary, final runner state, metric
    rows); a guard stop or a signal raises as `Session.finish` says."""
    start_distributed(config)  # before anything touches a device
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint-every must be >= 0, got {checkpoint_every}")
    # A bad id or an unsupported space fails here, before anything is written.
    backend = resolve_env(config.env, config.env_backend).backend
    if config.devices > 1 and backend != "gymnax":
        raise ValueError("devices > 1 needs a JAX environment (env backend gymnax)")
    per_chunk = chunk_size(config.num_updates, config.updates_per_chunk)
    every_updates = max(1, checkpoint_every // config.batch_size) if checkpoint_every else 0
    if every_updates and out_dir is not None:
        per_chunk = min(per_chunk, every_updates)
        while config.num_updates % per_chunk:
            per_chunk -= 1
    skipped = [0]
    session = Session(
        out_dir,
        config,
        kind="ppo",
        train_state_path=("train_state",),
        total=config.num_updates,
        position_key="update",
        meta_key="step",
        unit_size=config.batch_size,
        unit="step",
        checkpoint_every=every_updates,
        postfix=lambda row: {
            **_postfix(row, skipped),
            "sps": session.steps_per_second(config.batch_size * config.num_seeds),
        },
        **run_options,
    )
    init, compile_chunks, host_env = _build(config, backend, grad_transform)
    # Every input is validated: only now is the output directory touched.
    try:
        with session:
            runner = session.restore(init(_seed_keys(config)))
            skipped[0] = sum(r["skipped"] for r in session.rows)
            compile_start = time.perf_counter()
            call = compile_chunks(runner, per_chunk)
            compile_seconds = time.perf_counter() - compile_start
            # The compiled chunk (rollouts and updates) on JAX envs; host loops have no single program.
            step_bytes = runs.step_memory_bytes(call) if hasattr(call, "memory_analysis") else None
            runner = session.run(runner, call, lambda m, done: _per_update_rows(m, done, config), per_chunk)
            timing = {
                "compile_seconds": compile_seconds,
                "run_seconds": session.timing.run_seconds,
                "run_steps": session.timing.positions_run * config.batch_size * config.num_seeds,
                "wall_seconds": session.elapsed(),
                "train_step_bytes": step_bytes,
            }
            summary = summarise(session.rows, config, runner, timing, backend, session.stopped)
            title = f"PPO {config.env} ({summary['precision']})"
            summary = session.finish(
                summary, runner.train_state, plot=lambda rows, path: runs.plot_ppo(rows, path / "ppo.png", title=title)
            )
    finally:
        if host_env is not None:
            host_env.close()
    return PPOResult(summary=summary, runner_state=runner, metrics=session.rows)
