"""A resume knows what it resumes: a changed setting is named ("num-envs: 4 -> 8") before any
count in the new settings' units, the world model's data is recorded by identity and a change
of it refused (or recorded with --allow-config-change), and a finished SAC run is extended
with its replay buffer grown to the longer run's capacity, exactly as if it had had it."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos import get_algorithm
from genesis_jax.algos.sac.train import SAC
from genesis_jax.algos.world_model.config import WorldModelFields
from genesis_jax.algos.world_model.data import synthetic_dataset
from genesis_jax.cli import main
from genesis_jax.data.trajectories import save_dataset
from genesis_jax.run.checkpoint import CheckpointMismatchError
from genesis_jax.run.session import Session
from tests.support.files import metric_rows, one_line_error, snapshot
from tests.support.helpers import tree_equal
from tests.support.registry import tiny_argv, tiny_config


@dataclasses.dataclass(frozen=True)
class WideConfig:
    """A loop whose rows each count `width` samples: `width` shapes nothing, but counts in its units."""

    chunks: int = 4
    width: int = 4
    RESUMABLE_FIELDS = ("chunks",)

    def to_dict(self):
        return dataclasses.asdict(self)


def run_wide(out, config, **options):
    step = lambda s: ({"w": s["w"] + 1}, {"w": s["w"]})  # noqa: E731
    rows = lambda m, done: [{"chunk": done + 1}]  # noqa: E731
    session = Session(out, config, name="wide", num_rows=config.chunks, row_key="chunk", steps_per_row=config.width,
                      unit="sample", checkpoint_every=1, progress=False, **options)  # fmt: skip
    with session:
        state = session.restore({"w": jnp.float32(0)})
        session.finish({}, session.run(state, step, rows))


def test_a_changed_setting_is_named_before_the_run_is_counted_in_its_units(tmp_path):
    run_wide(tmp_path / "run", WideConfig())
    before = snapshot(tmp_path / "run")
    # 4 chunks of 4 samples ran; counted at width 8 they would be "4 chunks (32 samples)", which they are not.
    with pytest.raises(CheckpointMismatchError, match="width: 4 -> 8") as err:
        run_wide(tmp_path / "run", WideConfig(chunks=2, width=8), resume=True)
    assert "32 samples" not in str(err.value) and "--allow-config-change" in str(err.value)
    assert snapshot(tmp_path / "run") == before


PPO = ["train", "ppo", *tiny_argv("ppo")]  # 256 steps: 4 updates of 4 environments x 16 steps


@pytest.mark.slow  # a tiny PPO run through the command line, then refused resumes (nothing compiled): ~10 s
def test_a_ppo_resume_with_other_num_envs_names_them_in_one_line(tmp_path, capsys):
    run = tmp_path / "ppo"
    assert main([*PPO, "--out", str(run)]) == 0
    before, _ = snapshot(run), capsys.readouterr()
    assert main([*PPO, "--num-envs", "8", "--out", str(run), "--resume"]) == 2
    line = one_line_error(capsys)
    assert "num-envs: 4 -> 8" in line and "512 steps" not in line, line
    # Allowed, a network of another shape still cannot continue: said naming the setting, not the arrays alone.
    assert main([*PPO, "--hidden", "8", "--out", str(run), "--resume", "--allow-config-change"]) == 2
    line = one_line_error(capsys)
    assert "hidden: [16] -> (8,)" in line and "params" in line, line
    # Allowed, other steps an update (num-envs, num-steps) would count the updates run in other units.
    for flags, steps, change in [
        (["--num-envs", "8", "--total-steps", "512"], 128, "num-envs: 4 -> 8"),
        (["--num-steps", "8"], 32, "num-steps: 16 -> 8"),
    ]:
        assert main([*PPO, *flags, "--out", str(run), "--resume", "--allow-config-change"]) == 2
        line = one_line_error(capsys)
        assert f"counts 64 steps per update, these settings {steps} ({change}" in line, line
    assert snapshot(run) == before


@pytest.mark.slow  # two tiny fp16 PPO runs: ~15 s
def test_a_resume_with_another_loss_scaler_rule_runs_with_it(tmp_path):
    """Every field of a scaler is a leaf, so a checkpoint restores the saved run's rule with its
    scale: a resume allowed to change the growth interval or the floor (as the guard's stop
    advises) ran under the old rule while its summary recorded the new one."""
    config = tiny_config("ppo", precision="fp16", init_loss_scale=1024.0)
    first = get_algorithm("ppo").train(config, str(tmp_path / "run"), progress=False)
    saved = first.train_state.scaler
    assert (float(saved.loss_scale), int(saved.growth_interval), first.summary["skipped_updates"]) == (1024, 2000, 0)
    # 4 updates more of 2 optimizer steps, each clean: at interval 1 the scale doubles on each (at 2000: stays).
    longer = dataclasses.replace(config, total_steps=512, growth_interval=1, min_loss_scale=1024.0)
    resumed = get_algorithm("ppo").train(longer, str(tmp_path / "run"), resume=True, allow_config_change=True,
                                         progress=False)  # fmt: skip
    scaler = resumed.train_state.scaler
    assert resumed.summary["skipped_updates"] == 0
    assert (first.summary["resumed_from"], resumed.summary["resumed_from"]) == (0, 4)  # what wall_seconds covers
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert json.loads(json.dumps(resumed.summary["config"])) == written["config"]  # as summary.json holds it
    assert (int(scaler.growth_interval), float(scaler.min_scale), int(scaler.growth_tracker)) == (1, 1024, 0)
    assert float(scaler.loss_scale) == 1024 * 2.0**8


def test_a_resume_with_another_static_scale_runs_with_it(tmp_path):
    """A static scale and no scaling hold one field alike, so flax's restore now refuses one
    restored as the other by its value: a resume allowed to change the static scale was
    refused with it; the run layer checks the kind from the checkpoint's meta instead."""
    config = tiny_config("ppo", precision="fp16", loss_scaling="static", init_loss_scale=1024.0)
    get_algorithm("ppo").train(config, str(tmp_path / "run"), progress=False)
    longer = dataclasses.replace(config, total_steps=512, init_loss_scale=512.0)
    resumed = get_algorithm("ppo").train(longer, str(tmp_path / "run"), resume=True, allow_config_change=True,
                                         progress=False)  # fmt: skip
    assert float(resumed.train_state.scaler.loss_scale) == 512.0
    unscaled = dataclasses.replace(config, total_steps=768, loss_scaling="none")
    with pytest.raises(ValueError, match="holds a StaticLossScale but the run uses a NoOpLossScale"):  # the meta says
        get_algorithm("ppo").train(unscaled, str(tmp_path / "run"), resume=True, allow_config_change=True,
                                   progress=False)  # fmt: skip


@pytest.mark.slow  # a tiny world-model run through the command line, then its resumes: ~10 s
def test_a_world_model_resume_on_other_data_at_the_same_path_is_refused_or_recorded(tmp_path, capsys):
    data, run = tmp_path / "data.npz", tmp_path / "wm"
    first = synthetic_dataset(32, 8, seed=0)
    save_dataset(first, str(data))
    sizes = {f: getattr(WorldModelFields, f) for f in ("num_sequences", "sequence_length")}  # a .npz has its own
    argv = ["train", "world-model", *tiny_argv("world-model", **sizes), "--data", str(data), "--out", str(run)]
    assert main(argv) == 0
    # Other sequences under the same name and path: only the digest tells them apart.
    save_dataset({**synthetic_dataset(32, 8, seed=1), "meta": first["meta"]}, str(data))
    before, _ = snapshot(run), capsys.readouterr()
    assert main([*argv, "--epochs", "2", "--resume"]) == 2
    line = one_line_error(capsys)
    assert "dataset: " in line and "sha256" in line and "--allow-config-change" in line, line
    assert snapshot(run) == before
    assert main([*argv, "--epochs", "2", "--resume", "--allow-config-change"]) == 0
    changes = json.loads((run / "summary.json").read_text())["config_changes"]
    assert len(changes) == 1 and changes[0].startswith("dataset: ") and "32 sequences x 8 steps" in changes[0]


def train_sac(out, resume=False, **settings):
    config = tiny_config("sac", **settings)
    return SAC.train(config, str(out), resume=resume, progress=False, allow_config_change=resume)


@pytest.mark.slow  # three tiny SAC runs: ~30 s
def test_a_finished_sac_run_is_extended_as_if_its_buffer_had_the_longer_run_s_capacity(tmp_path):
    # tiny: buffer-size 64, total-steps 32: a buffer of 32 transitions, filled by the end; extended to 64.
    short = train_sac(tmp_path / "extended", total_steps=32)
    assert int(short.state.buffer.is_full) and short.state.buffer.experience.obs.shape[1] == 32
    extended = SAC.train(tiny_config("sac", total_steps=64), str(tmp_path / "extended"), resume=True, progress=False)
    straight = train_sac(tmp_path / "straight", total_steps=64)
    assert extended.summary["config_changes"] == []
    assert metric_rows(tmp_path / "extended") == metric_rows(tmp_path / "straight")
    tree_equal(extended.state, straight.state)  # the buffer, its transitions in order, and everything learned


@pytest.mark.slow  # three tiny SAC runs: ~30 s
def test_a_wrapped_sac_buffer_grows_unrolled_oldest_first_and_resumes_again(tmp_path):
    out = tmp_path / "run"
    small = train_sac(out, total_steps=64, buffer_size=16)  # 64 transitions through 16 slots: wrapped 4 times
    old = jax.device_get(small.state.buffer)
    grown = train_sac(out, total_steps=64, buffer_size=40, resume=True)  # nothing left to run: only the restore
    new = jax.device_get(grown.state.buffer)
    assert grown.summary["config_changes"] == ["buffer-size: 16 -> 40"]
    head = int(old.current_index)
    for before, after in zip(jax.tree.leaves(old.experience), jax.tree.leaves(new.experience)):
        np.testing.assert_array_equal(after[:, :16], np.roll(before, -head, axis=1))  # oldest first
        assert not after[:, 16:].any()
    assert (int(new.current_index), bool(new.is_full)) == (16, False)
    # 32 transitions more: 48 held in 40 slots (it wraps again), the 48 the small buffer dropped not counted.
    longer = train_sac(out, total_steps=96, buffer_size=40, resume=True)
    assert (int(longer.state.buffer.current_index), bool(longer.state.buffer.is_full)) == (8, True)
    again = train_sac(out, total_steps=96, buffer_size=40, resume=True)  # its own checkpoint restores
    tree_equal(again.state.buffer, longer.state.buffer)
    with pytest.raises(ValueError, match="holds 40 transitions, these settings give it 16: .* does not shrink"):
        train_sac(out, total_steps=96, buffer_size=16, resume=True)


@pytest.mark.parametrize("name", ["ppo", "dqn", "world-model"])
def test_the_stop_hint_gives_the_flags_a_bare_resume_would_reset_and_they_parse_back(name):
    """A run stopped by a signal says how to continue it. `--resume --out DIR` alone took the
    defaults of what a resume may change: a 1,000,000-step PPO run stopped at update 504 and
    resumed so ended at the default 500,000, silently. The hint now carries those flags, and the
    CLI parses them back to the run's own values."""
    from genesis_jax.algos import get_algorithm
    from genesis_jax.cli import parse_train_args, train_config
    from genesis_jax.run.config import resume_flags

    algorithm = get_algorithm(name)
    budget = algorithm.budget_field
    config = dataclasses.replace(
        algorithm.config_class(), **{budget: 4 * getattr(algorithm.config_class(), budget)}, max_consecutive_skips=7
    )
    flags = resume_flags(config)
    assert f"--{budget.replace('_', '-')} {getattr(config, budget)}" in flags and "--max-consecutive-skips 7" in flags
    assert resume_flags(algorithm.config_class()) == "--precision fp32"  # the defaults: its precision alone
    parts, _ = parse_train_args(name, flags.split())
    assert train_config(name, parts) == config  # every setting of the run, none reset
    fp16 = dataclasses.replace(config, precision="fp16", seed=3)  # beyond what a resume may change
    assert train_config(name, parse_train_args(name, resume_flags(fp16).split())[0]) == fp16
    # A process of several: its joining flags are its own (launch gives them), the rest the run's.
    joined = dataclasses.replace(config, devices=2, coordinator_address="127.0.0.1:4567", num_processes=2, process_id=1)
    assert resume_flags(joined) == resume_flags(dataclasses.replace(config, devices=2))


def test_precision_auto_is_recorded_and_compared_as_what_it_picked(tmp_path, capsys):
    """A `--precision auto` run recorded 'auto' while its summary said fp32, and a resume with
    --precision fp32 was refused ('auto' -> 'fp32'). The CLI now records the pick and says it;
    a run holding 'auto' (the Python API's, an older CLI's) compares as what auto picks here."""
    from genesis_jax.algos.ppo import PPOConfig
    from genesis_jax.amp import get_precision
    from genesis_jax.run.run_dir import check_config_changes

    out = tmp_path / "run"
    assert main(["train", "ppo", *tiny_argv("ppo", precision="auto"), "--out", str(out)]) == 0
    picked = get_precision("auto").name  # fp32 on a CPU
    assert f"note: precision auto picked {picked} (backend " in capsys.readouterr().err
    assert json.loads((out / "summary.json").read_text())["precision"] == picked
    assert main(["train", "ppo", *tiny_argv("ppo", precision=picked), "--out", str(out), "--resume"]) == 0
    auto, own = PPOConfig(precision="auto"), PPOConfig(precision=picked)
    assert check_config_changes({"config": auto.to_dict()}, own, allow=False) == []
    assert check_config_changes({"config": own.to_dict()}, auto, allow=False) == []
