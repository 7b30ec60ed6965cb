"""The precision the front ends read from the environment (`run.config.resolve_precision_name`):
an explicit name first, then GENESIS_PRECISION, then ENABLE_FP16_TRAINING, else fp32; a bad
argument or flag refused in one sentence naming it."""

import pytest

from genesis_jax.run.config import resolve_precision_name


@pytest.mark.parametrize(
    "explicit, env, expected",
    [
        (None, {}, "fp32"),
        (None, {"ENABLE_FP16_TRAINING": "true"}, "fp16"),
        (None, {"ENABLE_FP16_TRAINING": "YES"}, "fp16"),
        (None, {"ENABLE_FP16_TRAINING": "1"}, "fp16"),
        (None, {"ENABLE_FP16_TRAINING": "no"}, "fp32"),
        (None, {"ENABLE_FP16_TRAINING": "0"}, "fp32"),
        (None, {"GENESIS_PRECISION": "bf16", "ENABLE_FP16_TRAINING": "true"}, "bf16"),
        ("fp32", {"GENESIS_PRECISION": "bf16", "ENABLE_FP16_TRAINING": "true"}, "fp32"),
    ],
)
def test_environment_resolution(explicit, env, expected):
    assert resolve_precision_name(explicit, env) == expected


def test_bad_enable_flag_is_a_clear_error():
    with pytest.raises(ValueError, match="ENABLE_FP16_TRAINING='maybe'"):
        resolve_precision_name(None, {"ENABLE_FP16_TRAINING": "maybe"})


@pytest.mark.parametrize(
    "explicit, environ, error, named",
    [(16, None, TypeError, ("precision", "16")), (None, ["fp16"], TypeError, ("environ", "['fp16']"))],
)
def test_a_bad_argument_is_refused_in_one_sentence_naming_it(explicit, environ, error, named):
    with pytest.raises(error) as caught:
        resolve_precision_name(explicit, environ)
    message = str(caught.value)
    assert all(word in message for word in named) and "\n" not in message


@pytest.mark.parametrize(
    "given, kept",
    [(" FP16 ", "fp16"), ("Auto", "auto"), ("p=f32,c=f16,o=f32", "p=f32,c=f16,o=f32"), ("P=F32, C=F16", "p=f32,c=f16")],
)
def test_a_config_keeps_a_named_precision_as_its_name(given, kept):
    """ "FP16" was kept as written: its run recorded it so, and a resume with "fp16" was refused as
    another precision. A jmp policy string is kept lower-cased without spaces (a resume with the
    summary's spelling of a spaced string was refused)."""
    from genesis_jax.algos.ppo import PPOConfig

    assert PPOConfig(precision=given).precision == kept


def test_a_run_that_recorded_fp16_in_capitals_resumes_in_fp16():
    """Runs before named precisions were kept as names recorded 'FP16'; a resume in it was
    refused as another precision, advising the spelling just refused."""
    from genesis_jax.algos.ppo import PPOConfig
    from genesis_jax.run.run_dir import check_config_changes

    config = PPOConfig(precision="fp16")
    assert check_config_changes({"config": {**config.to_dict(), "precision": "FP16"}}, config, allow=False) == []
