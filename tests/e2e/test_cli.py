"""The train commands' options are generated from the config dataclasses (tyro): every field
has its flag, the defaults are the configs', `--help` shows the groups, "off" is None, parse
errors are one line with exit status 2, and the replaced spellings still work with a warning.
Only parsing runs here: no training."""

from __future__ import annotations

import dataclasses
import json

import pytest

from genesis_jax.algos.ppo import PPOConfig
from genesis_jax.algos.world_model import WorldModelConfig
from genesis_jax.cli import _box_message, main, parse_train_args, train_config
from genesis_jax.run.config import MixedPrecisionConfig
from genesis_jax.run.parallel import ParallelConfig
from tests.support.files import one_line_error

CONFIGS = {"ppo": PPOConfig, "world-model": WorldModelConfig}


def parse(workload, *argv):
    parts, run = parse_train_args(workload, list(argv))
    return train_config(workload, parts), run


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("workload", CONFIGS)
def test_with_no_options_the_config_is_the_libraries_default(workload):
    config, run = parse(workload)
    assert config == CONFIGS[workload]()
    assert (run.out, run.resume, run.progress, run.train_kwargs()["writers"]) == (None, False, True, ())


def test_version_is_the_installed_distribution_s(capsys):
    from importlib.metadata import version

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"genesis-jax {version('genesis-jax')}\n"


@pytest.mark.parametrize("workload", CONFIGS)
def test_help_has_a_flag_for_every_config_field_in_its_group(workload, capsys):
    assert main(["train", workload, "--help"]) == 0
    text = capsys.readouterr().out
    titles = [
        line for line in text.splitlines() if "options" in line and "─" in line or line.strip().endswith("options")
    ]
    title_words = " ".join(titles)
    for group in (workload, "mixed-precision", "parallel", "run"):
        assert f"{group} options" in title_words, titles
    for field in dataclasses.fields(CONFIGS[workload]):
        assert flag(field.name) in text, field.name
    for field in dataclasses.fields(MixedPrecisionConfig) + dataclasses.fields(ParallelConfig):
        assert flag(field.name) in text


def test_every_field_is_set_by_its_flag():
    config, run = parse(
        "ppo",
        *("--env", "Acrobot-v1", "--env-backend", "gymnasium", "--total-steps", "2048", "--num-envs", "8"),
        *("--hidden", "32", "16", "--activation", "relu", "--no-anneal-lr", "--no-clip-value", "--lr", "1e-3"),
        *("--precision", "bf16", "--loss-scaling", "static", "--init-loss-scale", "1024", "--max-grad-norm", "None"),
        *("--guard-min-scale", "None", "--max-consecutive-skips", "7", "--inject-loss-spike", "3", "5"),
        *("--devices", "2", "--heartbeat-timeout", "9"),
        *("--out", "somewhere", "--resume", "--no-progress", "--tensorboard", "--checkpoint-every", "4096"),
    )
    assert (config.env, config.env_backend, config.total_steps, config.num_envs) == ("Acrobot-v1", "gymnasium", 2048, 8)
    assert (config.hidden, config.activation, config.anneal_lr, config.clip_value, config.lr) == (
        (32, 16),
        "relu",
        False,
        False,
        1e-3,
    )
    assert (config.precision, config.loss_scaling, config.init_loss_scale) == ("bf16", "static", 1024.0)
    assert (config.max_grad_norm, config.guard_min_scale, config.max_consecutive_skips) == (None, None, 7)
    assert (config.inject_loss_spike, config.devices, config.heartbeat_timeout) == ((3, 5), 2, 9)
    assert run.train_kwargs() == {
        "out_dir": "somewhere",
        "checkpoint_every": 4096,
        "resume": True,
        "overwrite": False,
        "allow_config_change": False,
        "allow_unverified": False,
        "progress": False,
        "writers": ("tensorboard",),
    }


def test_each_trainer_keeps_its_own_clipping_default():
    assert parse("ppo")[0].max_grad_norm == 0.5
    assert parse("world-model")[0].max_grad_norm == 1.0


def test_the_precision_default_comes_from_the_environment_and_a_flag_overrides_it(monkeypatch, capsys):
    monkeypatch.setenv("ENABLE_FP16_TRAINING", "1")
    assert parse("ppo")[0].precision == "fp16"
    assert parse("ppo", "--precision", "fp32")[0].precision == "fp32"
    monkeypatch.setenv("GENESIS_PRECISION", "fp17")
    assert main(["train", "ppo", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "GENESIS_PRECISION" in err[0] and "unknown precision 'fp17'" in err[0], err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--total-steps", "abc"], "--total-steps"),
        (["--no-such-option", "1"], "--no-such-option"),
        (["--env-backend", "gym"], "gym"),
        (["--init-loss-scale", "nan"], "init-loss-scale must be a finite number"),
        (["--max-grad-norm", "-0.5", "--precision", "fp16"], None),  # the old spelling of off: accepted
        (["--loss-scaling", "sometimes"], "sometimes"),
    ],
)
def test_a_parse_error_is_one_line_and_exit_status_2(argv, words, capsys):
    if words is None:
        config, _ = parse("ppo", *argv)
        assert config.max_grad_norm is None
        return
    assert main(["train", "ppo", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("genesis-jax") and "error" in err[0] and words in err[0], err


@pytest.mark.parametrize(
    "old, new, field, value",
    [
        (["--hidden", "32,16"], ["--hidden", "32", "16"], "hidden", (32, 16)),
        (["--inject-loss-spike=3,5"], ["--inject-loss-spike", "3", "5"], "inject_loss_spike", (3, 5)),
        (["--max-grad-norm", "0"], ["--max-grad-norm", "None"], "max_grad_norm", None),
        (["--guard-min-scale", "0"], ["--guard-min-scale", "None"], "guard_min_scale", None),
        (["--max-consecutive-skips", "0"], ["--max-consecutive-skips", "None"], "max_consecutive_skips", None),
    ],
)
def test_replaced_spellings_still_work_with_a_deprecation_warning(old, new, field, value, capsys):
    config_old, _ = parse("ppo", *old)
    warning = capsys.readouterr().err.strip().splitlines()
    config_new, _ = parse("ppo", *new)
    assert capsys.readouterr().err == ""
    assert getattr(config_old, field) == getattr(config_new, field) == value
    assert config_old == config_new
    assert len(warning) == 1 and "deprecated" in warning[0] and " ".join(new) in warning[0], warning


def test_a_negative_guard_value_is_not_taken_for_off(capsys):
    assert main(["train", "ppo", "--guard-min-scale", "-1", "--no-progress"]) == 2
    assert "guard-min-scale must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "box",
    [
        "╭─ Value error ─────╮\n│ Error parsing --x: invalid  │\n│ literal │\n│ ───── │\n│ For full help │\n╰──╯\n",
        " Value error \n ---------- \n  Error parsing --x: invalid\n  literal\n  -----\n  For full help\n",
        "\x1b[1;31m╭─ Value error ─╮\x1b[0m\n\x1b[31m│\x1b[0m Error parsing --x: invalid literal │\n╰──╯\n",
    ],
)
def test_tyros_error_box_becomes_its_message(box):
    assert _box_message(box) == "Error parsing --x: invalid literal"


@pytest.mark.parametrize(("typo", "meant"), [("--totl-steps", "--total-steps"), ("--precison", "--precision")])
def test_a_mistyped_flag_is_answered_with_the_flag_it_resembles(typo, meant, capsys):
    assert main(["train", "ppo", typo, "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"genesis-jax train ppo: error: Unrecognized options: {typo}, 1 (did you mean {meant}?)"]


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["eval", "runs/x", "--episods", "3"], " (did you mean --episodes?)"),
        (["eval", "runs/x", "--tasks", "3"], ""),  # study's: no flag of eval's is like it
        (["eval", "runs/x", "--num-seed", "3"], " (did you mean --seed?)"),  # eval's own, not study's --num-seeds
        (["study", "--out", "runs/s", "--num-seed", "3"], " (did you mean --num-seeds?)"),  # not taken as it: trained
    ],
)
def test_a_mistyped_flag_of_another_subcommand_is_answered_too(argv, hint, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(f"unrecognized arguments: {' '.join(argv[-2:])}{hint}")
    assert not (tmp_path / "runs").exists()


def test_parsing_a_train_command_does_not_start_jax():
    """`jax.distributed.initialize` must run before any JAX computation, and the CLI joins other
    processes only after parsing: no module the parse imports may compute at import time."""
    from tests.support.processes import run_python

    code = (
        "import jax._src.xla_bridge as xb\n"
        "from genesis_jax.cli import parse_train_args\n"
        "for name in ('ppo', 'world-model'):\n"
        "    parse_train_args(name, [])\n"
        "print('backends started:', bool(xb._backends))\n"
    )
    out = run_python(["-c", code])
    assert out.returncode == 0 and out.stdout.strip() == "backends started: False", out.stderr[-2000:]


def test_a_sigint_while_a_train_command_starts_up_stops_it_before_training(tmp_path, monkeypatch, capsys):
    """Python's own SIGINT raises KeyboardInterrupt wherever it lands, and one that lands in a
    JAX callback is swallowed: the run trained on. The CLI holds the signal from its start."""
    import os
    import signal

    from genesis_jax import algos, cli

    monkeypatch.setitem(algos.REGISTRY, "toy", ("tests.algos.toy_algorithm", "a toy regression"))
    parse = cli._parse

    def parse_then_interrupt(argv):
        parsed = parse(argv)
        os.kill(os.getpid(), signal.SIGINT)  # while the run is set up, before its Session
        return parsed

    monkeypatch.setattr(cli, "_parse", parse_then_interrupt)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where a background shell started the tests
    out = tmp_path / "run"
    status = cli.main(["train", "toy", "--total-steps", "32", "--out", str(out), "--no-progress"])
    assert status == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SIGINT received before training began" in err[0]
    assert not out.exists()  # the directory it made goes too: an empty checkpoints/ refused the same command again
    assert signal.getsignal(signal.SIGINT) == before  # the CLI's catcher is gone again


@pytest.mark.parametrize(
    ("precision", "backend", "says"),
    [("fp16", "cpu", True), ("bf16", "cpu", True), ("fp32", "cpu", False), ("fp16", "gpu", False)],
)
def test_the_cpu_notice_is_for_half_precision_compute_on_a_cpu_only(precision, backend, says):
    from genesis_jax.amp.policy import get_precision
    from genesis_jax.cli import cpu_precision_notice

    notice = cpu_precision_notice(get_precision(precision), backend)
    assert (notice is not None) == says
    if says:
        assert notice.count("\n") == 0 and "docs/precision.md" in notice and precision in notice


@pytest.mark.parametrize(("argv", "printed"), [([], 1), (["--quiet"], 0)])
def test_train_prints_the_cpu_notice_once_unless_quiet(argv, printed, capsys, monkeypatch):
    """The CLI's wiring on this CPU backend, the training itself replaced by a stand-in that
    starts training (the note is printed as the first chunk starts, past every refusal)."""
    from genesis_jax.algos import get_algorithm

    ran = []

    def stand_in(config, announce=lambda notes: None, **kwargs):
        announce([])
        ran.append(config)
        return type("R", (), {"line": "trained"})()

    monkeypatch.setattr(get_algorithm("ppo"), "train", stand_in)
    assert main(["train", "ppo", "--precision", "fp16", "--no-progress", *argv]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("note: fp16 computes in float16") == printed
    assert ran[0].precision == "fp16" and "trained" in captured.out


@pytest.mark.parametrize(
    ("precision", "says"),
    [
        ("p=f32,c=f16,o=f16", "output=float16"),
        ("c=bf16", "output=bfloat16"),
        ("p=f32,c=f16,o=f32", None),
        ("fp16", None),
    ],
)
def test_an_output_dtype_the_trainers_do_not_use_is_said(precision, says, capsys, monkeypatch):
    from genesis_jax.algos import get_algorithm

    def stand_in(config, announce=lambda notes: None, **kwargs):  # the training replaced: its start announced
        announce([])
        return type("R", (), {"line": "trained"})()

    monkeypatch.setattr(get_algorithm("ppo"), "train", stand_in)
    assert main(["train", "ppo", "--precision", precision, "--no-progress"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "the trainers' heads and losses" in line]
    assert notes == (
        [f"note: {precision} asks for {says}; the trainers' heads and losses are float32 whatever it says"]
        if says
        else []
    )


def test_a_refused_half_precision_run_on_a_cpu_prints_only_its_error(capsys):
    # The note waits for training to start: a refusal stays one line.
    assert main(["train", "ppo", "--precision", "fp16", "--devices", "2", "--no-progress"]) == 2
    assert one_line_error(capsys).startswith("genesis-jax: error: devices 2")


@pytest.mark.slow  # a tiny PPO run, compiled
def test_the_compile_and_a_rounded_budget_are_said_before_the_bar_starts(tmp_path, capsys):
    argv = ["train", "ppo", "--precision", "fp32", "--total-steps", "1000", "--num-envs", "4", "--num-steps", "128"]
    argv += ["--eval-episodes", "0"]  # no greedy evaluation after training: not what is said before the bar
    argv += ["--init-loss-scale", "1024"]  # fp32 scales no loss: said, with the budget
    assert main([*argv, "--update-epochs", "1", "--num-minibatches", "1", "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    note = "note: --total-steps 1,000 runs as 1 update of 512 steps: 512 steps\n"
    unused = "note: --init-loss-scale changes nothing here: fp32 scales no loss\n"
    compiling = "compiling the training program (the bar starts when it is done) ...\n"
    assert err.count(note) == 1 and err.count(compiling) == 1 and err.count(unused) == 1
    assert err.index(compiling) < err.index(note) < err.index(unused) < err.index("512/512")  # the bar after
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["total_steps"] == 512


def test_a_budget_of_whole_rows_gets_no_note(tmp_path):
    from genesis_jax.algos import get_algorithm

    ppo = get_algorithm("ppo")
    config = ppo.config_class(total_steps=1024, num_envs=4, num_steps=128)
    assert ppo(config).budget_note() is None
    assert (
        "1,025 runs as 2 updates of 512 steps: 1,024 steps"
        in ppo(ppo.config_class(total_steps=1025, num_envs=4, num_steps=128)).budget_note()
    )


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (
            {"precision": "bf16", "init_loss_scale": 1024.0, "min_loss_scale": 2.0},
            "--init-loss-scale, --min-loss-scale change nothing here: bf16 scales no loss",
        ),
        (
            {"precision": "fp16", "loss_scaling": "none", "growth_interval": 5},
            "--growth-interval changes nothing here: fp16 with loss-scaling none scales no loss",
        ),
        (
            {"precision": "fp16", "loss_scaling": "static", "init_loss_scale": 8.0, "min_loss_scale": 1.0},
            "--min-loss-scale changes nothing here: a static loss scale neither grows nor has a floor",
        ),
        # auto: what it picks here (the CLI resolves it first; the Python API asks the config)
        (
            {"precision": "auto", "init_loss_scale": 8.0},
            "--init-loss-scale changes nothing here: auto (fp32 here) scales no loss",
        ),
        ({"precision": "fp16", "growth_interval": 5, "min_loss_scale": 1.0}, None),  # dynamic: every one applies
        ({"precision": "fp32"}, None),  # the defaults: nothing given, nothing said
    ],
)
def test_loss_scale_settings_that_change_nothing_are_said(settings, said):
    from genesis_jax.algos.ppo import PPOConfig

    assert PPOConfig(**settings).unused_scaling_note() == (said and f"note: {said}")
