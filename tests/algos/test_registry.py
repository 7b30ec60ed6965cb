"""What every registered algorithm gets from its registry line, tested for each at its own
`tiny` size (`Presets.tiny`): a new algorithm is picked up here with nothing to add.

The declarations are checked on registration; `update`'s required metrics when it compiles;
the CLI's --help has its groups; a setting the devices refuse is one line before the disk;
seed 0 of a vmapped 2-seed run is the 1-seed run; 4 CPU devices match 1; a SIGKILL mid-run
resumes to the run never interrupted; the fp32 and fp16 runs of these tests pass
tests/algos/test_every_precision.py's checks; import-linter keeps it apart from the others; bench and
study list its workloads."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import signal
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax import algos
from genesis_jax.algos import REGISTRY, check_declarations, get_algorithm
from genesis_jax.algos.base import MEASURED, Algorithm, Presets, StudyTask, chunk_size
from genesis_jax.cli import main
from genesis_jax.run.session import Session
from tests.support import torture
from tests.support.files import committed_steps, one_line_error
from tests.support.helpers import tree_equal
from tests.support.processes import cpu_env, result_of, run_python, start_python, wait_until
from tests.support.registry import (
    CHECKED_IN_REGISTRY,
    NAMES,
    check_a_few_updates,
    run_record,
    tiny_argv,
    tiny_config,
    tiny_run,
)

REPO_TOML = tomllib.loads((pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_passes_its_registration_checks(name):
    algorithm = get_algorithm(name)
    assert algorithm.name == name and algorithm.presets.tiny
    tiny_config(name)  # the tiny settings make a valid config


def test_a_wrong_declaration_is_refused_when_registered():
    toy = get_algorithm("ppo")
    for change, words in [
        ({"name": "other"}, "must be the registry's 'ppo'"),
        ({"presets": Presets(tiny={})}, "`presets.tiny`"),
        ({"presets": Presets(tiny={"no_such_field": 1})}, "tiny sets 'no_such_field'"),
        ({"presets": Presets(tiny={"hidden": (8,)}, study={"t": StudyTask({"no_such": 1}, 8, None, "")})}, "'no_such'"),
        ({"budget_field": "epochs"}, "`budget_field` 'epochs'"),
        ({"config_class": dict}, "`config_class` must be a dataclass"),
        ({"update": Algorithm.update}, "fill in `update(self, state, data) -> (state, metrics)`"),
        ({"init": Algorithm.init}, "fill in `init(self, key) -> state`"),
        ({"presets": Presets(tiny={"hidden": (0,)})}, "`presets.tiny` is refused (hidden must be"),
    ]:
        broken = type("Broken", (toy,), change)
        with pytest.raises(TypeError, match=re.escape(words)):
            check_declarations("ppo", broken)
    bad_default = dataclasses.make_dataclass("Bad", [("lr", int, 0.8)], bases=(toy.config_class,), frozen=True)
    with pytest.raises(TypeError, match=re.escape("its default config is refused (lr must be an integer")):
        check_declarations("ppo", type("Broken", (toy,), {"config_class": bad_default}))
    with pytest.raises(TypeError, match=re.escape("module json must name its class: ALGORITHM = ")):
        algos._load("ppo", "json")  # a module that forgot its ALGORITHM line
    with pytest.raises(TypeError, match=re.escape("Broken.presets must be a `Presets`, got dict")):
        type("Broken", (toy,), {"presets": {"tiny": {"hidden": (8,)}}})  # refused as the class is made


def test_the_template_reports_each_rows_scale_skips_and_halt(monkeypatch):
    # The toy's update returns its loss alone: the scale, the skips and the guard's halt are the template's.
    monkeypatch.setitem(REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))

    def poison(grads, state):  # every 4th step's gradients not finite
        return jax.tree.map(lambda g: g + jnp.where(state.step % 4 == 0, jnp.inf, 0.0).astype(g.dtype), grads)

    result = get_algorithm("toy").train(tiny_config("toy", precision="fp16"), progress=False, grad_transform=poison)
    rows = result.metrics
    assert [r["skipped"] for r in rows[:5]] == [1, 0, 0, 0, 1] and sum(r["skipped"] for r in rows) == 8
    assert [r["loss_scale"] for r in rows[:2]] == [2.0**15, 2.0**15] and rows[4]["loss_scale"] == 2.0**14
    assert not any(r["halted"] for r in rows) and result.summary["skipped_updates"] == 8


@pytest.mark.parametrize("name", NAMES)
def test_help_lists_its_groups_and_every_field(name, capsys):
    assert main(["train", name, "--help"]) == 0
    text = capsys.readouterr().out
    for group in (name, "mixed-precision", "parallel", "run"):
        assert f"{group} options" in text
    for field in dataclasses.fields(get_algorithm(name).config_class):
        assert "--" + field.name.replace("_", "-") in text, field.name


@pytest.mark.parametrize("name", NAMES)
def test_more_devices_than_the_machine_has_is_one_line_before_the_disk(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", name, *tiny_argv(name), "--devices", "2", "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert line.startswith("genesis-jax: error: ") and "device" in line
    assert not out.exists()


@pytest.mark.slow  # two tiny compiled runs per algorithm
@pytest.mark.parametrize("name", NAMES)
def test_seed_0_of_a_vmapped_two_seed_run_is_the_one_seed_run(name):
    # Seed 0, not seed k: the world model's seeds share seed 0's data (tests/algos/test_seeds.py
    # has seed k = --seed + k on the template).
    one, two = tiny_run(name), tiny_run(name, num_seeds=2)
    first_seed = jax.tree.map(lambda x: x[0], two.train_state.params)
    for a, b in zip(jax.tree.leaves(one.train_state.params), jax.tree.leaves(first_seed)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-4, atol=1e-5)
    assert two.summary["total_updates"] == 2 * one.summary["total_updates"]


@pytest.mark.slow  # one 4-device subprocess training every algorithm; the 1-device runs are the test above's
def test_four_devices_match_one_device_for_every_algorithm():
    proc = run_python(["-m", "tests.support.registry", "devices"], cpu_env(host_devices=4), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = result_of(proc.stdout)
    assert runs["device_count"] == 4 and set(runs["algorithms"]) == set(NAMES)
    for name, four in runs["algorithms"].items():
        one = run_record(tiny_run(name))  # the same program on this process's one device
        assert one["updates"] == four["updates"] > 0, name
        assert four["replicas_agree"], name  # every device's copy of the train state, the same
        for a, b in zip(one["params"], four["params"]):  # the devices sum the batch in another order
            np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-5, err_msg=name)


def killable_budget(name: str) -> dict:
    """16 times the algorithm's tiny budget (`killable_run`'s)."""
    algorithm = get_algorithm(name)
    return {algorithm.budget_field: 16 * algorithm.presets.tiny.get(algorithm.budget_field, 1)}


def killable_run(name: str, precision: str):
    """16 times the algorithm's tiny run, a checkpoint every compiled chunk: (its config, the same
    run as a `genesis-jax` command line without --out, its rows, progress steps per row). The
    command's chunks are those of the config's run without checkpoints: one compiled program for
    both, the straight run and the resumed one. (Chunks of other lengths are other programs,
    which XLA may compile to other roundings: they matched at its optimisation level 1, not at 0.)"""
    algorithm = get_algorithm(name)
    budget = killable_budget(name)
    config = tiny_config(name, precision=precision, **budget)
    sizing = algorithm(config)
    rows, every = sizing.num_rows, sizing.steps_per_row
    sizing.close()
    per_chunk = chunk_size(rows, getattr(config, "updates_per_chunk", None))
    assert rows // per_chunk >= 4, (name, rows, per_chunk)  # checkpoints enough to be killed between
    argv = [
        "train",
        name,
        *tiny_argv(name, precision=precision, **budget),
        "--checkpoint-every",
        str(per_chunk * every),
    ]
    return config, argv, rows, every


@pytest.mark.slow  # per algorithm: a run in process, a CLI subprocess killed, a resume
@pytest.mark.parametrize("name", NAMES)
def test_a_sigkill_mid_run_resumes_to_the_run_never_interrupted(name, tmp_path):
    algorithm = get_algorithm(name)
    config, argv, rows, every = killable_run(name, "fp16")  # the loss scaler's state resumes too
    straight = tiny_run(name, precision="fp16", **killable_budget(name))  # `algorithm.train(config)`: `config`'s run
    out = tmp_path / "run"
    proc = start_python(["-m", "genesis_jax.cli", *argv, "--out", str(out)], cpu_env())
    wait_until(lambda: len(committed_steps(out)) >= 1, proc, timeout=300)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert committed_steps(out)[-1] < rows * every  # killed mid-run: the resume has work to do
    resumed = algorithm.train(config, str(out), resume=True, progress=False)
    tree_equal(resumed.state, straight.state)  # every leaf: params, optimizer, scaler, buffers, environments, keys
    timeless = lambda rows: [{k: v for k, v in r.items() if "per_second" not in k} for r in rows]  # noqa: E731
    assert json.dumps(timeless(resumed.metrics)) == json.dumps(timeless(straight.metrics))


@pytest.mark.slow  # the vmapped-seed and SIGKILL tests' runs, trained once per process (`tiny_run`)
@pytest.mark.parametrize("precision", CHECKED_IN_REGISTRY)
@pytest.mark.parametrize("name", NAMES)
def test_a_few_updates_at_fp32_and_fp16(name, precision):
    # tests/algos/test_every_precision.py's checks, on runs trained here anyway: the 1-seed fp32
    # run and the fp16 run never interrupted; that file checks the other precisions.
    budget = {} if precision == "fp32" else killable_budget(name)
    check_a_few_updates(name, precision, tiny_run(name, precision=precision, **budget))


@pytest.mark.slow  # 2-5 s per algorithm: an init and two lowerings
@pytest.mark.parametrize("name", NAMES)
def test_a_resumed_run_lowers_the_chunk_program_of_the_run_never_interrupted(name, tmp_path):
    # The persistent compilation cache keys a program by its text: a restored state typed otherwise
    # than the initial one (a weak leaf strongly typed, a leaf committed to its device) lowered
    # another program, compiled again on every resume instead of loaded.
    algorithm = get_algorithm(name)(tiny_config(name))
    try:
        state = algorithm.initial_state()
        options = {"name": name, "num_rows": algorithm.num_rows, "row_key": algorithm.row_key, "progress": False}
        options |= {"train_state_path": algorithm.train_state_path, "inputs": algorithm.inputs()}
        with Session(str(tmp_path), algorithm.config, **options) as session:
            session.save(session.restore(state))
        with Session(str(tmp_path), algorithm.config, resume=True, **options) as session:
            restored = session.restore(state, algorithm.from_checkpoint)  # into the initial state, as `train` restores
        assert not set(map(id, jax.tree.leaves(restored))) & set(map(id, jax.tree.leaves(state)))  # read back
        typed = lambda tree: [  # noqa: E731
            (jax.tree_util.keystr(path), jax.typeof(x), x.weak_type, x.committed, x.sharding)
            for path, x in jax.tree_util.tree_leaves_with_path(tree)
        ]
        assert typed(restored) == typed(state)
        assert algorithm.lower_chunk(restored, 1).as_text() == algorithm.lower_chunk(state, 1).as_text()
    finally:
        algorithm.close()


@pytest.mark.long
@pytest.mark.slow  # per algorithm: 5 processes (a straight run, 3 killed, the last resume)
@pytest.mark.parametrize("name", NAMES)
def test_the_torture_schedule_at_three_kills_ends_as_the_uninterrupted_run(name, tmp_path):
    _, argv, rows, _ = killable_run(name, "fp16")
    result = torture.torture(argv, tmp_path, 3, 0)
    assert len(result.kills) == 3 and torture.verdict(result, rows, MEASURED) == [], torture.table(result)


def test_the_import_contract_keeps_every_registered_algorithm_apart():
    contracts = REPO_TOML["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "independence" and "genesis_jax.algos.*" in c["modules"]]
    assert contract["modules"] == ["genesis_jax.algos.*"]  # every package in algos, whatever is registered
    for name, (module, _) in REGISTRY.items():
        assert module.startswith("genesis_jax.algos.") and module.count(".") >= 3, (name, module)


def test_bench_and_study_list_every_algorithms_own_workloads():
    from genesis_jax.cli.bench import workloads
    from genesis_jax.cli.study.cells import TASKS

    for name in NAMES:
        algorithm = get_algorithm(name)
        named = {w.name for w in algorithm.presets.bench if w.quick}
        assert named == {w.name for w in workloads(quick=True) if w.kind == name}
        assert {t for t, task in TASKS.items() if task.algo == name} == set(algorithm.presets.study)


def test_registration_is_one_line(monkeypatch):
    monkeypatch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))
    assert get_algorithm("toy").name == "toy"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_runs_plot_title_names_its_environment_and_precision(name):
    algorithm = get_algorithm(name)
    config = algorithm.config_class(precision="fp16")
    title = algorithm(config).title()
    assert "fp16" in title
    if hasattr(config, "env"):
        assert config.env in title and title.startswith(name.upper() if len(name) <= 3 else name)


NO_DEVICE_YET = """
import json
from jax._src import xla_bridge
from genesis_jax.algos import REGISTRY, get_algorithm
from genesis_jax.cli import build_parser
for name in REGISTRY:
    get_algorithm(name)
    build_parser().parse_args(["train", name])
print("RESULT " + json.dumps(xla_bridge.backends_are_initialized()))
"""


def test_no_algorithm_touches_a_device_as_it_is_imported_and_parsed():
    """A process of several must join the others before JAX starts a backend: SAC imported gymnax
    at import, which computes as it imports, so `launch ... train sac` could not start."""
    done = run_python(["-c", NO_DEVICE_YET], timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert result_of(done.stdout) is False
