"""The PPO driver: chunks of jitted updates, progress, metrics, summary, plot, checkpoints.

>>> from genesis_jax.ppo import PPOConfig, train
>>> result = train(PPOConfig(env="CartPole-v1", precision="fp16", total_steps=20_000), out_dir=None)  # doctest: +SKIP
>>> result.summary["final_return"]                                                             # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import time
from typing import Any

import jax
import numpy as np

from genesis_jax import runs
from genesis_jax.checkpoint import CheckpointStore
from genesis_jax.envs.registry import resolve_env
from genesis_jax.parallel import replicated, start_distributed
from genesis_jax.ppo.config import PPOConfig
from genesis_jax.reliability import DivergenceError, StopSignals, TrainingInterrupted, halted_report

# Per-update metrics kept in metrics.jsonl (means over minibatch steps and seeds).
_LOGGED = (
    "loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm", "loss_scale",
    "skipped", "mismatch_kl_v1", "mismatch_kl_v2", "mismatch_max_dp", "mismatch_ratio_dev",
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
        from genesis_jax.ppo.jax_loop import make_jax_ppo

        from genesis_jax.ppo.jax_loop import runner_shardings

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
            jitted = jax.jit(run_chunk_fn, static_argnums=1, donate_argnums=0, out_shardings=(shardings, replicated(mesh)))

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
        columns["episode_return_per_seed"] = [[None if np.isnan(r) else float(r) for r in col] for col in seed_returns.T]
        columns["return_sum_per_seed"] = m["return_sum"].T.astype(float).tolist()
        columns["episodes_per_seed"] = episodes.T.tolist()
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _until_halt(rows: list[dict]) -> list[dict]:
    """Rows up to and including the update where the divergence guard stopped training."""
    for i, row in enumerate(rows):
        if row["halted"]:
            return rows[: i + 1]
    return rows


def summarise(rows: list[dict], config: PPOConfig, runner, timing: dict, backend: str, stopped: str | None = None) -> dict:
    """summary.json: the run's outcome in one flat dict."""
    last = rows[-max(1, len(rows) // 10):]
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


def train(
    config: PPOConfig,
    out_dir: str | None = None,
    *,
    checkpoint_every: int = 0,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    grad_transform=None,
    max_to_keep: int = 3,
    allow_config_change: bool = False,
) -> PPOResult:
    """Trains PPO as `config` says; writes metrics.jsonl, summary.json, ppo.png and
    checkpoints under `out_dir` when one is given. `checkpoint_every` is in env steps.
    `resume` continues the run there; a config that differs from the run's in more than
    `PPOConfig.RESUMABLE_FIELDS` is refused unless `allow_config_change` (the summary then
    lists the changes)."""
    if checkpoint_every < 0:
        raise ValueError(f"checkpoint-every must be >= 0, got {checkpoint_every}")
    # A bad id or an unsupported space fails here, before anything is written.
    backend = resolve_env(config.env, config.env_backend).backend
    start_distributed(config)
    if config.devices > 1 and backend != "gymnax":
        raise ValueError("devices > 1 needs a JAX environment (env backend gymnax)")
    run_dir = runs.RunDirectory(out_dir, resume=resume, overwrite=overwrite) if out_dir is not None else None
    wall_start = time.perf_counter()
    init, compile_chunks, host_env = _build(config, backend, grad_transform)
    per_chunk = chunk_size(config.num_updates, config.updates_per_chunk)
    if checkpoint_every and run_dir:
        per_chunk = min(per_chunk, max(1, checkpoint_every // config.batch_size))
        while config.num_updates % per_chunk:
            per_chunk -= 1
    # Every input is validated: only now is the output directory touched.
    with run_dir.opened(finished=(DivergenceError, TrainingInterrupted)) if run_dir else contextlib.nullcontext():
        runner = init(_seed_keys(config))
        rows: list[dict] = []
        store = CheckpointStore(run_dir.checkpoints, max_to_keep=max_to_keep) if run_dir else None
        done_updates = 0
        stopped = None
        config_changes = []
        try:
            if run_dir and resume:
                runner, done_updates, rows, config_changes = runs.resume_run(
                    run_dir, store, runner, config, kind="ppo", meta_key="step", metrics_key="update",
                    allow_config_change=allow_config_change,
                )
            compile_start = time.perf_counter()
            call = compile_chunks(runner, per_chunk)
            compile_seconds = time.perf_counter() - compile_start
            # The compiled chunk (rollouts and updates) on JAX envs; host loops have no single program.
            step_bytes = runs.step_memory_bytes(call) if hasattr(call, "memory_analysis") else None
            run_seconds, run_steps, last_ckpt, last_return = 0.0, 0, done_updates, float("nan")
            skipped_total = sum(r["skipped"] for r in rows)
            bar = runs.progress_bar(config.total_steps, done_updates * config.batch_size, enabled=progress)
            with StopSignals() as signals:
                # (Timed from before each call: the host loop's calls run the chunk synchronously.)
                dispatched = time.perf_counter()
                pending = call(runner) if done_updates < config.num_updates else None
                while pending is not None:
                    runner, chunk_metrics = pending
                    pending = None
                    chunk_metrics = jax.device_get(chunk_metrics)
                    run_seconds += time.perf_counter() - dispatched
                    run_steps += per_chunk * config.batch_size * config.num_seeds
                    halted = bool(np.any(chunk_metrics["halted"]))
                    due = checkpoint_every and (done_updates + per_chunk - last_ckpt) * config.batch_size >= checkpoint_every
                    more = done_updates + per_chunk < config.num_updates
                    # The next chunk is dispatched before the host turns this one's metrics into rows,
                    # files and progress, so the two overlap; not when this chunk's state is still
                    # needed (a checkpoint or a stop), since the call consumes it.
                    if more and not halted and signals.received is None and not (store and due):
                        dispatched = time.perf_counter()
                        pending = call(runner)
                    new_rows = _until_halt(_per_update_rows(chunk_metrics, done_updates, config))
                    done_updates += len(new_rows)
                    rows.extend(new_rows)
                    if run_dir:
                        run_dir.append_metrics(new_rows)
                    skipped_total += sum(r["skipped"] for r in new_rows)
                    finished = [r["episode_return"] for r in new_rows if r["episode_return"] is not None]
                    last_return = finished[-1] if finished else last_return
                    bar.update(len(new_rows) * config.batch_size)
                    bar.set_postfix(ret=f"{last_return:.1f}", scale=f"{new_rows[-1]['loss_scale']:.0f}", skipped=skipped_total,
                                    sps=f"{run_steps / run_seconds:.0f}" if run_seconds else "-")
                    if pending is not None:
                        continue
                    if halted:
                        stopped = "diverged"
                    elif signals.received is not None:
                        stopped = signal.Signals(signals.received).name
                    if store and (due or stopped or not more):
                        store.save(done_updates, runner, {"config": config.to_dict(), "kind": "ppo"}, force=True)
                        last_ckpt = done_updates
                    if more and not stopped:
                        dispatched = time.perf_counter()
                        pending = call(runner)
            bar.close()
        finally:
            if store:
                store.close()
            if host_env is not None:
                host_env.close()
        timing = {
            "compile_seconds": compile_seconds,
            "run_seconds": run_seconds,
            "run_steps": run_steps,
            "wall_seconds": time.perf_counter() - wall_start,
            "train_step_bytes": step_bytes,
        }
        summary = {**summarise(rows, config, runner, timing, backend, stopped), "config_changes": config_changes}
        if run_dir:
            run_dir.write_summary(summary, config.to_dict())
            runs.plot_ppo(rows, run_dir.path / "ppo.png", title=f"PPO {config.env} ({summary['precision']})")
        where = f"; metrics and a checkpoint are in {out_dir}" if run_dir else ""
        if stopped == "diverged":
            raise DivergenceError(halted_report(runner.train_state, config.divergence_guard()) + where, summary)
        if stopped is not None:
            resume_hint = f"; continue with --resume --out {out_dir}" if run_dir else ""
            raise TrainingInterrupted(
                f"{stopped} received: stopped after update {done_updates} of {config.num_updates}{where}{resume_hint}",
                getattr(signal, stopped), summary,
            )
        return PPOResult(summary=summary, runner_state=runner, metrics=rows)
