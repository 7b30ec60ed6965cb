"""The algorithm template gives a new algorithm (tests/algos/toy_algorithm.py, 100 lines with
its config) the CLI, the Session, checkpoints and resume, seeds under vmap and bench rows."""

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax import algos
from genesis_jax.algos import REGISTRY, base, get_algorithm
from genesis_jax.algos.base import ActingFields, BenchWorkload, Presets, StudyTask, chunk_size, metric_columns
from genesis_jax.cli import main
from genesis_jax.envs.play import MAX_EPISODES
from tests.algos.toy_algorithm import Toy, ToyConfig
from tests.support.files import metric_rows


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))


def test_registration_gives_the_cli_command(registered, tmp_path, capsys):
    out = tmp_path / "toy"
    status = main(["train", "toy", "--total-steps", "64", "--precision", "fp16", "--out", str(out), "--no-progress"])
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = metric_rows(out)
    assert [r["update"] for r in rows] == list(range(1, 65))
    assert summary["precision"] == "fp16" and summary["total_updates"] == 64 and summary["final_loss"] < 0.05
    assert summary["skipped_updates"] == sum(r["skipped"] for r in rows)
    assert (out / "checkpoints").is_dir() and (out / "toy.png").is_file()
    captured = capsys.readouterr()
    assert captured.out.startswith("TOY [fp16] eval_loss=") and " final_loss=" in captured.out
    assert captured.err.count("note: fp16 computes in float16") == 1  # printed as training started
    assert main(["train", "toy", "--help"]) == 0
    assert "--lr" in capsys.readouterr().out


def test_resume_from_a_checkpoint_continues_bit_identically(tmp_path):
    config = ToyConfig(precision="fp16", total_steps=64)
    straight = Toy.train(config, str(tmp_path / "run"), checkpoint_every=16, progress=False, max_to_keep=None)
    for later in (48, 64):  # as if the run had died after its checkpoint at step 32
        shutil.rmtree(tmp_path / "run" / "checkpoints" / str(later))
    resumed = Toy.train(config, str(tmp_path / "run"), checkpoint_every=16, progress=False, resume=True)
    jax.tree.map(np.testing.assert_array_equal, resumed.train_state.params, straight.train_state.params)
    assert resumed.metrics == straight.metrics  # the same rows, each update once


def test_seeds_under_vmap_keep_their_own_counts():
    result = Toy.train(ToyConfig(precision="fp16", total_steps=32, num_seeds=3), progress=False)
    assert np.asarray(result.train_state.skipped).shape == (3,)
    assert np.asarray(result.train_state.params["w"]).shape == (3, 3)
    assert result.summary["total_updates"] == 3 * 32


def test_bench_rows_for_free(registered):
    from genesis_jax.cli.bench import _run

    (row,) = _run(BenchWorkload("toy-small", {"total_steps": 32}, kind="toy"), "fp16", [0])
    assert row["accuracy"] < 1.0 and row["total_steps"] == 32 and len(row["scale_trace"]) == 32


def test_chunks_divide_the_run():
    assert chunk_size(64, None) == 2 and chunk_size(10**15 // 4096, None) > 0
    with pytest.raises(ValueError, match="does not divide"):
        chunk_size(64, 5)


def test_a_resume_between_chunk_boundaries_stops_at_the_total(tmp_path):
    # 3 updates, then extended to 64: chunks of 2 (chunk_size(64)) from update 3 once ran to 65.
    assert chunk_size(64, None) == 2
    Toy.train(ToyConfig(total_steps=3), str(tmp_path), progress=False)
    longer = Toy.train(ToyConfig(total_steps=64), str(tmp_path), resume=True, allow_config_change=True, progress=False)
    assert [r["update"] for r in longer.metrics] == list(range(1, 65))
    assert int(longer.train_state.step) == 64


def test_each_metric_is_reduced_over_seeds_as_declared():
    nan = float("nan")
    metrics = {
        "loss": [[1.0, nan], [3.0, 4.0]],  # [seeds, rows]
        "recent_return": [[10.0, nan], [nan, nan]],
        "skipped": [[0, 1], [1, 1]],
        "halted": [[False, True], [False, False]],
        "episodes": [[1, 0], [3, 1]],
        "return_sum": [[10.0, 0.0], [60.0, 5.0]],
        "underflow/dense": [[0.5, 0.5], [0.25, 0.25]],
        "steps": [[4, 4], [4, 4]],
    }
    declared = {
        "recent_return": "nanmean per seed",
        "skipped": "sum per seed",
        "halted": "any",
        "episodes": "episodes per seed",
        "steps": "rate",
    }
    columns = metric_columns(metrics, declared, num_seeds=2, seconds=4.0)
    assert columns["loss"][0] == 2.0 and np.isnan(columns["loss"][1])  # undeclared: the mean
    assert columns["recent_return"] == [10.0, None]  # nanmean: the seeds with a value, None where none has one
    assert columns["recent_return_per_seed"] == [[10.0, None], [None, None]]
    assert columns["skipped"] == [1, 2] and columns["skipped_per_seed"] == [[0, 1], [1, 1]]
    assert columns["halted"] == [False, True] and "halted_per_seed" not in columns
    assert columns["episode_return"] == [17.5, 5.0] and columns["episodes"] == [4, 1]
    assert columns["episode_return_per_seed"] == [[10.0, 20.0], [None, 5.0]] and "return_sum" in columns
    assert columns["underflow/dense"] == [0.375, 0.375]  # "underflow/LAYER" follows "underflow": the mean
    assert columns["steps"] == [4.0, 4.0]  # 8 a row, 2 rows in 4 s
    one = metric_columns({k: np.asarray(v)[:1] for k, v in metrics.items()}, declared, num_seeds=1, seconds=4.0)
    assert not [k for k in one if k.endswith("_per_seed")]  # a 1-seed run's rows have no per-seed columns


def test_a_float32_metric_is_written_with_float32s_own_digits_not_float64s():
    # float(np.float32(0.05)) is 0.05000000074505806: a row said so, and `rows.epsilon == 0.05` found nothing
    metrics = {"epsilon": np.float32([[0.05, 0.3]]), "recent_return": np.float32([[np.nan, 1 / 3]])}
    columns = metric_columns(metrics, {"recent_return": "nanmean"}, num_seeds=1)
    assert columns["epsilon"] == [0.05, 0.3] and columns["recent_return"] == [None, 0.33333334]
    two = metric_columns({"epsilon": np.float32([[0.05], [0.25]])}, {}, num_seeds=2)
    assert two["epsilon"] == [0.15]  # the seeds' mean, in float32's digits too


def test_a_reduction_not_known_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="reduces 'loss' by 'median'"):
        type("Bad", (Toy,), {"metrics": {"loss": "median"}})


@pytest.mark.parametrize("name", [n for n in REGISTRY if issubclass(get_algorithm(n).config_class, ActingFields)])
def test_eval_episodes_is_bounded_as_evals_are_and_a_resume_may_change_it(name):
    config_class = get_algorithm(name).config_class
    refusal = f"eval-episodes must be an integer from 0 to {MAX_EPISODES}, got {MAX_EPISODES + 1}"
    with pytest.raises(ValueError, match=refusal):
        config_class(eval_episodes=MAX_EPISODES + 1)
    assert config_class(eval_episodes=0).eval_episodes == 0
    assert "eval_episodes" in config_class.RESUMABLE_FIELDS  # played after training: not what it computes


def test_0_4_declarations_still_register_with_a_future_warning():
    with pytest.warns(FutureWarning) as caught:

        class Old(Toy):
            tiny = dict(total_steps=16)
            study_tasks = {"t": base.CARTPOLE}
            checkpoint_key, score = "step", "final_loss"

    assert Old.presets == Presets(tiny={"total_steps": 16}, study={"t": base.CARTPOLE})
    ppo = get_algorithm("ppo")
    with pytest.warns(FutureWarning, match="declares tiny: now presets"):

        class OldPPO(ppo):  # what it does not declare again, it inherits, as in 0.4.0
            tiny = {**ppo.presets.tiny, "num_envs": 2}

    assert OldPPO.presets == Presets({**ppo.presets.tiny, "num_envs": 2}, ppo.presets.bench, ppo.presets.study)
    assert OldPPO.presets.bench and OldPPO.presets.study
    assert Old.score == "eval_loss"  # the bench's score follows from acting, whatever was declared
    assert [str(w.message) for w in caught] == [
        "Old declares tiny, study_tasks: now presets = Presets(tiny=, bench=, study=); the old names go in 0.5",
        "Old.checkpoint_key is ignored (a checkpoint's step is its row); it goes in 0.5",
        "Old.score is ignored (final_return or eval_loss); it goes in 0.5",
    ]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_train_from_a_dict_of_settings_is_refused_naming_the_config_class(name, tmp_path):
    algorithm = get_algorithm(name)
    kind = algorithm.config_class.__name__
    with pytest.raises(TypeError, match=f"^{name} trains from a {kind}, got a dict: pass {kind}\\(\\*\\*settings\\)$"):
        algorithm.train({"total_steps": 64}, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "declared, returned, words",
    [
        ({}, lambda m: m["loss"], "Bad.update must return (state, metrics), metrics a dict of scalars"),
        ({}, lambda m: {"loss": jnp.stack([m["loss"]] * 2)}, "Bad.update's metric 'loss' has shape (2,)"),
        ({"losss": "sum"}, lambda m: m, "Bad.update returns no metric 'losss', which `metrics` declares"),
        ({"episodes": "episodes"}, lambda m: {**m, "episodes": 0}, "returns no metric 'return_sum'"),
    ],
)
def test_metrics_the_rows_cannot_hold_are_refused_before_the_run(declared, returned, words, tmp_path):
    # These failed deep in JAX's tracing, after the first chunk (a KeyError), or not at all (a typo averaged).
    class Bad(Toy):
        metrics = declared

        def update(self, state, data):
            state, metrics = super().update(state, data)
            return state, returned(metrics)

    with pytest.raises(TypeError, match=re.escape(words)):
        Bad.train(ToyConfig(total_steps=4), str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_installed_plugin_that_fails_to_load_is_left_out_of_the_tools_that_go_through_them_all(
    monkeypatch, tmp_path
):
    # One such plugin stopped bench and study for every algorithm, study saying to install rliable.
    import importlib.metadata

    info = tmp_path / "plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugins\nVersion: 1.0\n")
    entry_points = "toy = tests.algos.toy_algorithm:Toy [extra]\nbroken = no_such_package.algo\n"
    entry_points += "raising = raising_plugin\nnameless = tests.algos.toy_algorithm:NoSuch\n"
    (info / "entry_points.txt").write_text(f"[{algos.PLUGINS}]\n{entry_points}")
    (tmp_path / "raising_plugin.py").write_text("import os\n\nos.no_such_function()\n")  # an AttributeError
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(algos, "REGISTRY", dict(REGISTRY))
    algos._register_plugins(importlib.metadata.entry_points(group=algos.PLUGINS))  # an installed package's
    assert algos.REGISTRY["toy"][0] == "tests.algos.toy_algorithm:Toy [extra]"  # "module:Class", as entry points name
    with pytest.warns(UserWarning) as warned:
        classes = algos.loadable()
    said = sorted(str(w.message) for w in warned)
    assert said[0].startswith("algorithm 'broken' (no_such_package.algo) left out: No module named")
    assert said[1].endswith("module tests.algos.toy_algorithm must have a class NoSuch")
    assert said[2].startswith("algorithm 'raising' (raising_plugin) left out: module 'os' has no attribute")
    assert classes["toy"] is Toy and not {"broken", "raising", "nameless"} & set(classes)
    assert set(REGISTRY) < set(classes)
    with pytest.raises(ModuleNotFoundError):  # its own command still says why
        algos.get_algorithm("broken")


@pytest.mark.parametrize("path", [("ts",), ()])
def test_a_train_state_path_that_names_no_train_state_is_refused_before_the_run(path, tmp_path):
    # ("ts",) failed as an AttributeError deep in the compiled chunk's trace
    bad = type("Bad", (Toy,), {"train_state_path": path})
    with pytest.raises(TypeError, match=re.escape(f"Bad.train_state_path {path} names no amp.TrainState of its state")):
        bad.train(ToyConfig(total_steps=4), str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_another_package_registers_by_entry_point_and_a_taken_name_is_refused(monkeypatch):
    # The docs' registry line meant editing this package; an installed package's entry point registers instead.
    from importlib.metadata import EntryPoint

    monkeypatch.setattr(algos, "REGISTRY", dict(REGISTRY))
    points = [EntryPoint(name, "tests.algos.toy_algorithm", algos.PLUGINS) for name in ("toy", "ppo")]
    with pytest.warns(UserWarning, match="'ppo' is taken by genesis_jax.algos.ppo.train: give tests.algos.toy_al"):
        algos._register_plugins(points)
    assert algos.REGISTRY["toy"][0] == "tests.algos.toy_algorithm" and algos.get_algorithm("toy") is Toy
    assert algos.REGISTRY["ppo"] == REGISTRY["ppo"]  # the built-in stays
    algos.register("toy", "tests.algos.toy_algorithm", "again")  # the same module twice: harmless
    with pytest.raises(ValueError, match="^algorithm name 'ppo' is taken by genesis_jax.algos.ppo.train: give"):
        algos.register("ppo", "my_package.toy", "a toy")
    with pytest.raises(ValueError, match="^algorithm 'plug': 'my_pkg.toy:Toy extra' is no 'package.module' or"):
        algos.register("plug", "my_pkg.toy:Toy extra", "a toy")  # an AttributeError's traceback, loaded


@pytest.mark.parametrize("score", ["return", "loss"])
def test_a_study_task_the_study_cannot_score_is_refused_before_its_cells_train(score, registered, monkeypatch):
    # The toy's cells trained, then the report failed with a KeyError ('epochs') on their summaries.
    from genesis_jax.cli.study import cells

    monkeypatch.setitem(cells.TASKS, "toy:fit", StudyTask({}, 32, None, "none", score=score, algo="toy"))
    with pytest.raises(ValueError, match=r"^study task 'toy:fit' is scored by .*, which toy does not report: leave"):
        cells.check_cell("toy:fit", cells.cell_config("toy:fit", "fp32", 1, 0, 32))
    cells.check_cell("pqn:CartPole-v1", cells.cell_config("pqn:CartPole-v1", "fp32", 1, 0, 4096))  # one that acts
    # ... and one that acts where no random return is measured: a gymnasium env, or none the task names
    envs = {"ppo:probe": {"env": "tests.support.custom_envs:Probe-v0", "num_envs": 2}, "ppo:default": {}}
    for name, settings in envs.items():
        monkeypatch.setitem(cells.TASKS, name, StudyTask(settings, 4096, None, "none", algo="ppo"))
        with pytest.raises(ValueError, match=f"^study task '{name}' is scored by .* a gymnax environment the task"):
            cells.check_cell(name, cells.cell_config(name, "fp32", 1, 0, 4096))
