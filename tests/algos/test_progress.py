"""The progress bar as a user reads it: skips counted over the whole run, the newest known
return kept, whole numbers for small counts."""

import re

import pytest

from genesis_jax.algos.base import bar_fields
from genesis_jax.algos.ppo import PPO, PPOConfig
from genesis_jax.algos.world_model import WorldModelConfig
from genesis_jax.algos.world_model import train as train_world_model


def _last_postfix(stderr: str) -> str:
    return stderr.replace("\r", "\n").strip().splitlines()[-1]


@pytest.mark.slow  # an 8192-step PPO run: 23-32 s
def test_ppo_bar_counts_the_skips_so_far(capsys):
    # Non-finite gradients on a third of the steps (the scale floored at 1): several updates skip, in several chunks.
    config = PPOConfig(
        precision="fp16", total_steps=8192, num_envs=4, num_steps=128, inject_nonfinite=0.3, min_loss_scale=1.0, seed=1,
        eval_episodes=0,  # the bar is the training's: no greedy evaluation after it (its own compile)
    )  # fmt: skip
    result = PPO.train(config, progress=True)
    skipped = result.summary["skipped_updates"]
    per_update = [row["skipped"] for row in result.metrics]
    assert skipped == sum(per_update) > max(per_update)  # the total is not one update's count
    shown = re.findall(r"skipped=(\d+)", _last_postfix(capsys.readouterr().err))
    assert shown and int(shown[-1]) == skipped


def test_the_bar_keeps_the_newest_known_return():
    shown = {}  # the bar's fields so far
    assert "ret" not in bar_fields({"episode_return": None}, shown)  # nothing finished yet: nothing shown
    assert bar_fields({"episode_return": 21.5}, shown)["ret"] == "21.5"
    assert bar_fields({"episode_return": None}, shown)["ret"] == "21.5"  # an update without an episode end keeps it
    assert bar_fields({"episode_return": 20.0, "epsilon": 0.5}, shown) == {"ret": "20.0", "eps": "0.50"}


@pytest.mark.slow  # a world-model run: 17-24 s
def test_world_model_bar_shows_whole_epochs(capsys):
    train_world_model(WorldModelConfig(precision="fp32", epochs=2, num_sequences=64, batch_size=256), progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "2.00/2.00" not in err


def test_a_run_without_progress_leaves_no_thread_running(monkeypatch):
    # tqdm's disabled bar started tqdm's monitor thread, left running in the program after the run.
    import threading

    import jax.numpy as jnp
    import tqdm

    from genesis_jax.run.session import Session

    monkeypatch.setattr(tqdm.tqdm, "monitor", None)  # one an earlier bar started is not this run's
    before = set(threading.enumerate())
    with Session(None, name="toy", num_rows=2, progress=False) as session:
        step, to_rows = lambda w: (w * 0.5, {"loss": w}), lambda m, done: [{"update": done + 1}]
        w = session.run(session.restore(jnp.float32(8.0)), step, to_rows)
        session.finish({})
    assert float(w) == 2.0 and set(threading.enumerate()) == before and tqdm.tqdm.monitor is None
