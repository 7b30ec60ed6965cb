"""fp32 parity of each actor-critic torso with a PyTorch mirror (torch.nn.functional on the
same weights): the NHWC/NCHW layouts, flatten order, SAME pooling pads and LayerNorm eps
all have to agree for these to pass."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

if os.environ.get("CI"):
    import torch  # in CI a missing torch is a failure, never a skip
else:
    torch = pytest.importorskip("torch", reason="parity tests need torch (pip install -e '.[test]')")

from genesis_jax.nets import ActorCritic  # noqa: E402
from genesis_jax.nets.torsos import cnn_layout_for  # noqa: E402

# Each case runs a torso in JAX and in torch: 9-21 s a case.
pytestmark = pytest.mark.slow

F = torch.nn.functional


def t(x):
    return torch.from_numpy(np.asarray(x, np.float32).copy())


def linear(p, x):
    return F.linear(x, t(p["kernel"]).T, t(p["bias"]))


def conv(p, x, stride, padding):
    """x NCHW; flax's HWIO kernel as torch's OIHW."""
    return F.conv2d(x, t(p["kernel"]).permute(3, 2, 0, 1), t(p["bias"]), stride=stride, padding=padding)


def layer_norm(p, x):
    return F.layer_norm(x, x.shape[-1:], t(p["scale"]), t(p["bias"]), eps=1e-6)  # flax's eps


def max_pool_same(x, kernel=3, stride=2):
    """flax's max_pool(padding="SAME"): -inf pads, the smaller half before."""
    pads = []
    for size in (x.shape[3], x.shape[2]):  # F.pad takes the last dimension first
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.max_pool2d(F.pad(x, pads, value=float("-inf")), kernel, stride)


def flatten_nhwc(x):
    return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


def torch_resmlp(p, x):
    x = linear(p["embed"], x)
    for i in range(len([k for k in p if k.startswith("block_")])):
        b = p[f"block_{i}"]
        x = x + linear(b["project"], F.relu(linear(b["expand"], layer_norm(b["norm"], x))))
    return layer_norm(p["final_norm"], x)


def torch_nature_cnn(p, x, convs):
    x = x.permute(0, 3, 1, 2)
    for i, (_, _, stride) in enumerate(convs):
        x = F.relu(conv(p[f"conv_{i}"], x, stride, 0))
    return F.relu(linear(p["dense"], flatten_nhwc(x)))


def torch_impala(p, x):
    x = x.permute(0, 3, 1, 2)
    for i in range(3):
        b = p[f"block_{i}"]
        x = max_pool_same(conv(b["conv"], x, 1, 1))
        for j in range(2):
            y = conv(b[f"res_{j}_a"], F.relu(x), 1, 1)
            x = x + conv(b[f"res_{j}_b"], F.relu(y), 1, 1)
    return F.relu(linear(p["dense"], flatten_nhwc(F.relu(x))))


CASES = {
    "resmlp": ((17,), lambda p, x: torch_resmlp(p, x)),
    "cnn-minatar": ((10, 10, 4), lambda p, x: torch_nature_cnn(p, x, cnn_layout_for((10, 10))[0])),
    "cnn-nature": ((84, 84, 4), lambda p, x: torch_nature_cnn(p, x, cnn_layout_for((84, 84))[0])),
    "impala": ((64, 64, 3), torch_impala),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torso_and_heads_agree_with_torch_in_fp32(case):
    obs_shape, torch_torso = CASES[case]
    network = case.split("-")[0]
    net = ActorCritic(action_dim=5, network=network, obs_shape=obs_shape, width=32, depth=2)
    rng = np.random.default_rng(0)
    obs = rng.uniform(0, 1, size=(6, *obs_shape)).astype(np.float32)
    params = net.init(jax.random.PRNGKey(0), jnp.asarray(obs))["params"]
    # Non-zero biases and norm parameters, so that a wrong mapping of them shows.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x if path[-1].key == "kernel" else x + 0.1 * rng.normal(size=x.shape).astype(np.float32), params
    )
    (logits,), value = net.apply({"params": params}, jnp.asarray(obs))

    if network == "resmlp":
        actor, critic = torch_torso(params["actor"], t(obs)), torch_torso(params["critic"], t(obs))
    else:
        actor = critic = torch_torso(params["torso"], t(obs))
    np.testing.assert_allclose(linear(params["actor_head"], actor).numpy(), np.asarray(logits), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        linear(params["critic_head"], critic)[:, 0].numpy(), np.asarray(value), rtol=1e-4, atol=1e-4
    )


def test_uint8_frames_are_scaled_to_unit_range_as_torch_does():
    obs = np.random.default_rng(1).integers(0, 256, size=(4, 84, 84, 4), dtype=np.uint8)
    net = ActorCritic(action_dim=4, network="cnn", obs_shape=(84, 84, 4))
    params = net.init(jax.random.PRNGKey(0), jnp.asarray(obs))["params"]
    (logits,), _ = net.apply({"params": params}, jnp.asarray(obs))
    theirs = linear(
        params["actor_head"], torch_nature_cnn(params["torso"], t(obs) / 255.0, cnn_layout_for((84, 84))[0])
    )
    np.testing.assert_allclose(theirs.numpy(), np.asarray(logits), rtol=1e-4, atol=1e-5)
