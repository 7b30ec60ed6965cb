import logging

import jax.numpy as jnp
import pytest

from genesis_jax.amp.policy import PRECISION_NAMES, get_precision


@pytest.mark.parametrize(
    "name, param, compute, output, scaling",
    [
        ("fp32", jnp.float32, jnp.float32, jnp.float32, "none"),
        ("bf16", jnp.float32, jnp.bfloat16, jnp.float32, "none"),
        ("fp16", jnp.float32, jnp.float16, jnp.float32, "dynamic"),
        ("fp16-full", jnp.float16, jnp.float16, jnp.float32, "dynamic"),
    ],
)
def test_named_policies(name, param, compute, output, scaling):
    if name == "fp16-full":
        with pytest.warns(UserWarning, match="less stable"):
            p = get_precision(name)
    else:
        p = get_precision(name)
    assert (p.policy.param_dtype, p.policy.compute_dtype, p.policy.output_dtype) == (param, compute, output)
    assert p.loss_scaling == scaling


def test_jmp_policy_string_and_override():
    p = get_precision("params=float32,compute=float16,output=float32")
    assert p.compute_dtype == jnp.float16 and p.loss_scaling == "dynamic"
    assert get_precision("params=float32,compute=bfloat16,output=bfloat16").loss_scaling == "none"
    assert get_precision("fp16", loss_scaling="static").loss_scaling == "static"
    assert get_precision("FP16").policy.compute_dtype == jnp.float16


def test_a_policy_string_with_float16_params_is_scaled_and_warned_as_fp16_full_is():
    # its gradients are float16 whatever the compute: unscaled, the small ones flushed to zero unsaid
    for spelled in ("params=float16,compute=float32,output=float32", "p=f16,c=f16,o=f32"):
        with pytest.warns(UserWarning, match=f"precision '{spelled}' stores parameters .* less stable"):
            assert get_precision(spelled).loss_scaling == "dynamic"


def test_a_policy_string_reads_past_spaces_and_refuses_a_dtype_jax_would_truncate():
    p = get_precision("params=float32, compute=float16, output=float32")  # as an error message may wrap it
    assert (p.name, p.compute_dtype, p.loss_scaling) == (
        "params=float32,compute=float16,output=float32",
        jnp.float16,
        "dynamic",
    )
    with pytest.raises(ValueError, match=r"asks for params=float64, which JAX computes as float32 here"):
        get_precision("params=float64,compute=float64,output=float64")  # ran in float32, recorded as float64


def test_auto_says_what_it_chose(caplog):
    with caplog.at_level(logging.INFO, logger="genesis_jax"):
        p = get_precision("auto")
    assert p.name == "fp32"  # the test suite runs on CPU
    assert "chose fp32" in caplog.text


@pytest.mark.parametrize("bad", ["fp8", "", "float17", "params=float32,compute=int3,output=float32"])
def test_unknown_precision_lists_accepted(bad):
    with pytest.raises(ValueError) as err:
        get_precision(bad)
    for name in PRECISION_NAMES:
        assert name in str(err.value)


def test_bad_loss_scaling():
    with pytest.raises(ValueError, match="dynamic, static, none"):
        get_precision("fp16", loss_scaling="sometimes")


def test_the_precision_names_are_the_named_policies_and_auto():
    from genesis_jax.amp import policy

    assert PRECISION_NAMES == (*policy._NAMED_POLICIES, "auto")
