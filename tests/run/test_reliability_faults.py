"""Reliability in one process: fault injection, the divergence guard, the world model's exact
resume, and bad input on resume leaving the run untouched. The kill-and-signal tests, with real
subprocesses, are in test_reliability_kills.py."""

import hashlib
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import DynamicLossScale, NoOpLossScale, TrainState, train_step
from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.algos.ppo import train as train_ppo
from genesis_jax.amp.guard import DivergenceGuard
from genesis_jax.amp.testing import FaultInjection
from genesis_jax.cli import main
from genesis_jax.run.checkpoint import CheckpointStore
from genesis_jax.run.signals import DivergenceError
from tests.support.files import metric_rows
from tests.support.helpers import mlp_loss, regression_problem, tree_equal
from tests.support.small_run import ppo_argv


def mlp_state(dtype=jnp.float32, scaler=None, precision="fp32", max_grad_norm=1.0, guard=None):
    x, y = regression_problem()
    model, loss_fn = mlp_loss(dtype)
    params = model.init(jax.random.PRNGKey(1), x)
    state = TrainState.create(
        params=params,
        tx=optax.adam(1e-3),
        scaler=scaler or NoOpLossScale(),
        precision=precision,
        max_grad_norm=max_grad_norm,
        guard=guard,
    )
    return state, loss_fn, (x, y)


def run_steps(state, loss_fn, batch, n, **options):
    step = jax.jit(lambda state, batch: train_step(state, loss_fn, batch, has_aux=True, **options))
    history = []
    for _ in range(n):
        state, metrics = step(state, batch)
        history.append(jax.device_get(metrics))
    return state, history


# --- fault injection ------------------------------------------------------------------------


def test_injected_steps_are_seeded_and_counted():
    faults = FaultInjection(nonfinite_rate=0.2, seed=3)
    hits = [int(s) for s in range(200) if faults.is_nonfinite_step(s)]
    assert hits == [int(s) for s in range(200) if FaultInjection(0.2, seed=3).is_nonfinite_step(s)]
    assert hits != [int(s) for s in range(200) if FaultInjection(0.2, seed=4).is_nonfinite_step(s)]
    assert faults.count_nonfinite(200) == len(hits) and 20 <= len(hits) <= 60


def test_every_injected_step_is_skipped_and_nothing_else():
    faults = FaultInjection(nonfinite_rate=0.25, seed=0)
    state, loss_fn, batch = mlp_state()
    state, history = run_steps(state, loss_fn, batch, 40, faults=faults)
    skipped = [i for i, m in enumerate(history) if not m["grads_finite"]]
    assert skipped == [i for i in range(40) if faults.is_nonfinite_step(i)]
    assert int(state.skipped) == faults.count_nonfinite(40) == len(skipped) > 0


@pytest.mark.slow
def test_loss_spike_overflows_fp16_and_is_clipped_in_fp32():
    faults = FaultInjection(loss_spike_steps=(2,), loss_spike_factor=1e6)
    state16, loss_fn16, batch = mlp_state(jnp.float16, DynamicLossScale(), "fp16", max_grad_norm=1.0)
    state16, h16 = run_steps(state16, loss_fn16, batch, 4, faults=faults)
    assert [bool(m["grads_finite"]) for m in h16] == [True, True, False, True]
    assert float(state16.scaler.loss_scale) == 2.0**15
    state32, loss_fn32, batch = mlp_state(max_grad_norm=1.0)
    state32, h32 = run_steps(state32, loss_fn32, batch, 4, faults=faults)
    assert all(bool(m["grads_finite"]) for m in h32)
    np.testing.assert_allclose(h32[2]["grad_norm"] / h32[1]["grad_norm"], 1e6, rtol=0.05)


# --- divergence guard ----------------------------------------------------------------------


def test_guard_halts_when_the_scale_would_fall_below_its_floor_and_freezes_the_state():
    always = FaultInjection(nonfinite_rate=1.0)
    state, loss_fn, batch = mlp_state(jnp.float16, DynamicLossScale(init_scale=1.0), "fp16", guard=DivergenceGuard())
    start = jax.device_get(state)
    state, history = run_steps(state, loss_fn, batch, 20, faults=always)
    # 1, 1/2, ..., 2^-14 are allowed; the 15th halving (to 2^-15) trips the guard.
    assert [bool(m["halted"]) for m in history].index(True) == 14
    assert float(state.scaler.loss_scale) == 2.0**-14
    assert int(state.step) == 15 and int(state.skipped) == 15 and bool(state.halted)
    tree_equal(state.params, start.params)
    tree_equal(state.opt_state.inner_state, start.opt_state.inner_state)


def test_guard_halts_after_too_many_consecutive_skips_even_with_a_floor():
    always = FaultInjection(nonfinite_rate=1.0)
    scaler = DynamicLossScale(init_scale=4.0, min_scale=1.0)
    state, loss_fn, batch = mlp_state(jnp.float16, scaler, "fp16", guard=DivergenceGuard(max_consecutive_skips=5))
    state, history = run_steps(state, loss_fn, batch, 12, faults=always)
    assert [bool(m["halted"]) for m in history].index(True) == 5  # the 6th skip in a row
    assert int(state.skip_streak) == 6 and int(state.step) == 6 and float(state.scaler.loss_scale) == 1.0


def test_clean_steps_reset_the_streak():
    faults = FaultInjection(nonfinite_rate=0.5, seed=1)
    state, loss_fn, batch = mlp_state(guard=DivergenceGuard(max_consecutive_skips=8))
    state, history = run_steps(state, loss_fn, batch, 60, faults=faults)
    streak, longest = 0, 0
    for m in history:
        streak = 0 if m["grads_finite"] else streak + 1
        longest = max(longest, streak)
    assert longest <= 8 and not bool(state.halted)
    assert int(state.skip_streak) == streak


def tiny_ppo_argv(out, total_steps: int) -> list[str]:
    """`genesis-jax train ppo` in fp16 for `total_steps` into `out`."""
    return [*ppo_argv(total_steps), "--quiet", "--out", str(out)]


def tiny_world_model_argv(out, epochs: int) -> list[str]:
    """`genesis-jax train world-model` on 64 sequences, 16 wide, into `out`."""
    sizes = ["--epochs", str(epochs), "--num-sequences", "64", "--batch-size", "256", "--width", "16"]
    return ["train", "world-model", *sizes, "--out", str(out), "--no-progress"]


@pytest.mark.slow  # a PPO run through the CLI: 16 s
def test_ppo_without_floor_is_stopped_by_the_guard_with_metrics_and_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    argv = tiny_ppo_argv(out, 51200) + ["--inject-nonfinite", "0.3"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diverged" in err[0] and "--min-loss-scale" in err[0] and "growth-interval" in err[0]
    summary = json.loads((out / "summary.json").read_text())
    rows = metric_rows(out)
    assert summary["stopped"] == "diverged" and rows[-1]["halted"] and not any(r["halted"] for r in rows[:-1])
    assert summary["iterations"] == len(rows) < 100
    assert summary["skipped_updates"] >= summary["injected_nonfinite"] > 0
    store = CheckpointStore(out / "checkpoints")
    state, meta = store.restore_raw()
    store.close()
    assert meta["step"] == len(rows)
    ts = state["train_state"]
    assert bool(ts["opt_state"]["halted"]) and float(ts["scaler"]["loss_scale"]) >= 2.0**-14  # skip_nonfinite's
    # Its resume stops again at once, as troubleshooting.md says: no row, no checkpoint added
    # (each resume once logged a halted row and saved a checkpoint that changed nothing).
    before = snapshot(out)
    assert main([*argv, "--resume"]) == 3
    assert "diverged" in capsys.readouterr().err
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k != "summary.json"} == {
        k: v for k, v in before.items() if k != "summary.json"
    }


@pytest.mark.slow  # a PPO run to divergence: 19-27 s
def test_python_api_raises_divergence_error_with_summary():
    config = PPOConfig(precision="fp16", total_steps=51200, inject_nonfinite=0.3)
    with pytest.raises(DivergenceError) as info:
        train_ppo(config, progress=False)
    assert info.value.summary["stopped"] == "diverged"


@pytest.mark.slow  # a PPO run: 12 s
def test_fp16_with_floor_skips_exactly_the_injected_steps():
    # An initial scale of 2^13 keeps CartPole clear of overflows of its own (2^16 has two
    # in the first update), so every skip here is an injected one.
    config = PPOConfig(
        precision="fp16", total_steps=20480, inject_nonfinite=0.05, min_loss_scale=1.0, init_loss_scale=2.0**13, lr=1e-3
    )
    summary = train_ppo(config, progress=False).summary
    assert summary["stopped"] is None
    # 40 updates of 16 optimizer steps (4 epochs x 4 minibatches): 640 steps, about 32 of them injected.
    injected = FaultInjection(0.05).count_nonfinite(640)
    assert summary["skipped_updates"] == summary["injected_nonfinite"] == injected > 0


# --- exact resume: the world model -----------------------------------------------------------


# --- bad input: one line, exit 2, nothing on disk changed ------------------------------------


def snapshot(path: pathlib.Path) -> dict:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    assert main(tiny_ppo_argv(root / "ppo", 2048)) == 0
    assert main(tiny_world_model_argv(root / "wm", epochs=1)) == 0
    return root


def corrupt_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    import shutil

    shutil.copytree(src, dst)
    for f in (dst / "checkpoints").rglob("*"):
        if f.is_file() and "state" in f.parts and f.stat().st_size > 0:
            f.write_bytes(b"\x00garbage" * 8)
    return dst


@pytest.mark.slow  # the small_runs fixture trains PPO and a world model: 26 s
@pytest.mark.parametrize(
    "case, extra, words",
    [
        ("ppo", ["--hidden", "32", "32"], "other settings (hidden: [64, 64] -> (32, 32))"),
        ("ppo", ["--precision", "bf16"], "a run resumes in its own precision: resume with --precision fp16"),
        ("wm", [], "comes from a world-model run, not ppo"),
        ("corrupt", [], "cannot be read"),
        ("ppo", ["--num-envs", "0"], "num-envs must be a positive integer"),
        ("ppo", ["--num-steps", "-3"], "num-steps must be a positive integer"),
        ("ppo", ["--inject-nonfinite", "1.5"], "inject-nonfinite must be a rate"),
        ("ppo", ["--max-consecutive-skips", "-1"], "max-consecutive-skips must be a positive integer"),
        ("ppo", ["--guard-min-scale", "-1"], "guard-min-scale must be >= 0"),
    ],
)
def test_bad_resume_or_settings_leave_the_run_untouched(small_runs, tmp_path, capsys, case, extra, words):
    run = corrupt_copy(small_runs / "ppo", tmp_path / "bad") if case == "corrupt" else small_runs / case
    before = snapshot(run)
    argv = tiny_ppo_argv(run, 4096) + ["--resume"]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert snapshot(run) == before


@pytest.mark.slow  # small_runs fixture (26 s), then 12 s
def test_world_model_bad_input_leaves_the_run_untouched(small_runs, capsys):
    run = small_runs / "wm"
    before = snapshot(run)
    for extra, words in (
        (["--batch-size", "0"], "batch-size must be a positive integer"),
        (["--width", "64"], "other settings (width: 16 -> 64)"),
        ([], "holds another run"),
    ):
        resume = [] if words == "holds another run" else ["--resume"]
        assert main(tiny_world_model_argv(run, epochs=2) + resume + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err
    assert snapshot(run) == before


def test_the_guard_explains_a_halt_its_own_limits_do_not_cover():
    """A run the guard stopped, resumed with the floor turned off: the message says the state
    was halted before, instead of failing to format the missing floor."""
    from genesis_jax.amp import DivergenceGuard
    from genesis_jax.run.signals import divergence_message

    text = divergence_message(DivergenceGuard(min_scale=None), 6.1e-05, 3, 85)
    assert "halted by the divergence guard before" in text and "step 85" in text
    assert "below the floor" in divergence_message(DivergenceGuard(), 6.1e-05, 3, 85)
