import json
import logging
import pathlib
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from genesis_jax import CheckpointMismatchError, CheckpointStore, DynamicLossScale, NoOpLossScale, TrainState
from genesis_jax.run.checkpoint import CHECKPOINT_FORMAT
from tests.support.helpers import mlp_loss, regression_problem


def make_state(hidden=(32, 32), scaler=None, precision="fp16", seed=1):
    x, _ = regression_problem()
    model, _ = mlp_loss(jnp.float16, hidden)
    params = model.init(jax.random.PRNGKey(seed), x)
    scaler = (
        scaler
        if scaler is not None
        else DynamicLossScale(
            init_scale=512.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=17, min_scale=2.0
        )
    )
    state = TrainState.create(params=params, tx=optax.adam(1e-3), scaler=scaler, precision=precision)
    # move every counter away from its default
    inner = jax.tree.map(
        lambda x: x + 0.5 if jnp.issubdtype(x.dtype, jnp.floating) else x + 2, state.opt_state.inner_state
    )
    return state.replace(
        step=jnp.asarray(41, jnp.int32),
        scaler=state.scaler.adjust(jnp.asarray(False)).adjust(jnp.asarray(False)).adjust(jnp.asarray(True)),
        pending_backoff=jnp.asarray(True),
        opt_state=state.opt_state._replace(
            inner_state=inner,
            skipped=jnp.asarray(3, jnp.int32),
            consecutive_skips=jnp.asarray(2, jnp.int32),
            halted=jnp.asarray(True),
        ),
    )


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_is_bit_exact(tmp_path):
    state = make_state()
    with CheckpointStore(tmp_path / "ck") as store:
        store.save(41, state, {"config": {"lr": 1e-3}})
    fresh = make_state(seed=5)
    fresh = fresh.replace(scaler=DynamicLossScale())
    with CheckpointStore(tmp_path / "ck") as store:
        restored, meta = store.restore(fresh)
    leaves_equal(restored, state)
    assert isinstance(restored.scaler, DynamicLossScale)
    assert float(restored.scaler.min_scale) == 2.0 and int(restored.scaler.growth_interval) == 17
    assert int(restored.scaler.backoffs) == 2 and bool(restored.pending_backoff)
    assert int(restored.scaler.growth_tracker) == 1
    assert meta["config"] == {"lr": 1e-3} and meta["precision"] == "fp16" and "jax" in meta["versions"]


def test_python_numbers_and_numpy_arrays_restore_into_a_target_like_the_state_saved(tmp_path):
    # save stores them as JAX does (int32, float32 without x64): the same kind of target fits
    state = {"w": jnp.float32(1.5), "count": 3, "rate": 0.5, "index": np.arange(3)}
    with CheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, state)
        restored, meta = store.restore({"w": jnp.float32(0), "count": 0, "rate": 0.0, "index": np.zeros(3, np.int64)})
    assert meta["spec"] == {"count": "int32[]", "index": "int32[3]", "rate": "float32[]", "w": "float32[]"}
    assert (int(restored["count"]), float(restored["rate"]), float(restored["w"])) == (3, 0.5, 1.5)
    np.testing.assert_array_equal(restored["index"], [0, 1, 2])


def test_max_to_keep_and_latest(tmp_path):
    state = make_state()
    with CheckpointStore(tmp_path, max_to_keep=2) as store:
        for step in (1, 2, 3):
            store.save(step, state.replace(step=jnp.asarray(step, jnp.int32)))
        store.wait()
        assert store.all_steps() == [2, 3] and store.latest_step() == 3


def test_other_shape_is_named(tmp_path):
    with CheckpointStore(tmp_path) as store:
        store.save(1, make_state())
        with pytest.raises(
            CheckpointMismatchError,
            match=r"params/params/dense_0/kernel: checkpoint float32\[4,32\] vs run float32\[4,16\]",
        ):
            store.restore(make_state(hidden=(16, 32)))


def test_other_precision_is_named(tmp_path):
    with CheckpointStore(tmp_path) as store:
        store.save(1, make_state(precision="fp16"))
        with pytest.raises(CheckpointMismatchError, match="precision 'fp16'.*'bf16'"):
            store.restore(make_state(precision="bf16"))


def test_fp32_checkpoint_into_fp16_run_warns_and_starts_scaler_fresh(tmp_path, caplog):
    fp32 = make_state(scaler=NoOpLossScale(), precision="fp32")
    with CheckpointStore(tmp_path) as store:
        store.save(1, fp32)
        target = make_state(precision="fp16", seed=9).replace(scaler=DynamicLossScale())
        with caplog.at_level(logging.WARNING, logger="genesis_jax"):
            restored, _ = store.restore(target)
    assert "no loss-scaler state" in caplog.text
    leaves_equal(restored.params, fp32.params)
    assert float(restored.scaler.loss_scale) == 2.0**16 and int(restored.scaler.growth_tracker) == 0
    assert restored.precision == "fp16"


def test_empty_directory_is_a_clear_error(tmp_path):
    with CheckpointStore(tmp_path) as store:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            store.restore(make_state())


# --- format 2 (genesis-jax 0.2) runs resume under format 3 ------------------------------------
#
# tests/data/{ppo,sac}_run_format2 are real run directories written by genesis-jax 0.2 (commit
# 361315f) through its command line:
#   train ppo --precision fp16 --total-steps 512 --num-envs 4 --num-steps 128 --hidden 8 8
#   train sac --precision fp16 --total-steps 64 --num-envs 2 --steps-per-row 8 --batch-size 8
#             --learning-starts 8 --hidden 16 16 --buffer-size 64
# Their train states hold the scaler under its 0.2 name (loss_scale), without pending_backoff
# or the scaler's backoffs count.

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
FORMAT_2_RUNS = {
    "ppo": (
        ["--precision", "fp16", "--num-envs", "4", "--num-steps", "128", "--hidden", "8", "8"],
        ("512", "1024"),
        ("train_state",),
    ),
    "sac": (
        ["--precision", "fp16", "--num-envs", "2", "--steps-per-row", "8", "--batch-size", "8"]
        + ["--learning-starts", "8", "--hidden", "16", "16", "--buffer-size", "64"],
        ("64", "128"),
        ("critic", "actor", "alpha"),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ppo", "sac"])
def test_a_finished_format_2_run_resumed_at_its_total_keeps_its_final_return(tmp_path, kind):
    from genesis_jax.cli import main

    args, (old_total, _), _ = FORMAT_2_RUNS[kind]
    run = tmp_path / kind
    shutil.copytree(DATA / f"{kind}_run_format2", run)
    before = json.loads((run / "summary.json").read_text())
    status = main(["train", kind, *args, "--total-steps", old_total, "--out", str(run), "--resume", "--no-progress"])
    assert status == 0
    after = json.loads((run / "summary.json").read_text())  # made again from the old version's rows
    assert after["final_return"] == before["final_return"] and after["total_steps"] == int(old_total)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ppo", "sac"])
def test_a_format_2_run_resumes_and_trains_on(tmp_path, kind):
    from genesis_jax.cli import main

    args, (old_total, new_total), states = FORMAT_2_RUNS[kind]
    old = DATA / f"{kind}_run_format2"
    run = tmp_path / kind
    shutil.copytree(old, run)
    with CheckpointStore(run / "checkpoints", async_save=False) as store:
        (old_step,) = store.all_steps()
        meta = store.read_meta()
        assert meta["format"] == 2 and meta["versions"]["genesis-jax"].startswith("0.2")
        raw, _ = store.restore_raw(old_step)
    assert all("loss_scale" in raw[name] and "scaler" not in raw[name] for name in states)
    old_rows = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        status = main(
            ["train", kind, *args, "--total-steps", new_total, "--out", str(run), "--resume", "--no-progress"]
        )
    assert status == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[: len(old_rows)] == old_rows and len(rows) > len(old_rows)  # the old rows kept, new ones after
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] == int(new_total) > int(old_total)
    with CheckpointStore(run / "checkpoints", async_save=False) as store:
        new_step = store.latest_step()
        assert new_step > old_step and store.read_meta(new_step)["format"] == CHECKPOINT_FORMAT
        new_raw, _ = store.restore_raw(new_step)
    for name in states:
        ts, was = new_raw[name], raw[name]
        assert "loss_scale" not in ts and {"scaler", "pending_backoff"} <= set(ts)
        assert int(ts["step"]) > int(was["step"])  # trained on from the restored state
        assert int(ts["opt_state"]["skipped"]) >= int(was["opt_state"]["skipped"])
        assert int(ts["scaler"]["backoffs"]) >= 0 and "backoffs" in ts["scaler"]
        # the scale read from format 2 went on: halved once per backoff since (growth_interval 2000:
        # no growth in these few steps), not a fresh 2^16; the growth tracker counted on
        backoffs = int(ts["scaler"]["backoffs"])
        assert float(ts["scaler"]["loss_scale"]) == float(was["loss_scale"]["loss_scale"]) * 0.5**backoffs
        if backoffs == 0:
            assert int(ts["scaler"]["growth_tracker"]) > int(was["loss_scale"]["growth_tracker"])
