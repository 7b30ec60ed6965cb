"""PyTorch parity harness: the same work in PyTorch AMP and in genesis-jax, compared.

It lives with the tests, not in the installed package: only the parity tests and
`experiments/parity_report.py` use it, and importing `genesis_jax` never imports torch.
The reference is PyTorch's FP16-trainer pattern: `torch.autocast` + `torch.amp.GradScaler`,
then `unscale_`, `clip_grad_norm_`, `step`, `update`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genesis_jax.amp.loss_scale import DynamicLossScale
from genesis_jax.amp.state import TrainState, train_step
from genesis_jax.nets.actor_critic import ActorCritic
from genesis_jax.nets.mlp import MLP
from genesis_jax.nets.world_model import WorldModel


def _torch():
    try:
        import torch
    except ImportError as err:  # pragma: no cover - exercised only without the test extra
        raise ImportError("the parity harness needs PyTorch: pip install 'genesis-jax[test]'") from err
    return torch


TORCH_DTYPES = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}

# ---------------------------------------------------------------- weight transfer


def dense_to_torch(linear, dense: dict) -> None:
    """Copies a Flax Dense's {'kernel' [in, out], 'bias'} into a torch Linear (weight [out, in])."""
    torch = _torch()
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(np.asarray(dense["kernel"], np.float32).T.copy()))
        linear.bias.copy_(torch.from_numpy(np.asarray(dense["bias"], np.float32).copy()))


def dense_from_torch(linear) -> dict:
    return {
        "kernel": jnp.asarray(linear.weight.detach().cpu().numpy().T),
        "bias": jnp.asarray(linear.bias.detach().cpu().numpy()),
    }


def torch_mlp(features, in_dim: int, activation: str = "tanh"):
    """A torch Sequential mirroring `nets.MLP` (Linear, act, ..., Linear)."""
    torch = _torch()
    acts = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "silu": torch.nn.SiLU}
    layers, prev = [], in_dim
    for i, width in enumerate(features):
        layers.append(torch.nn.Linear(prev, width))
        if i < len(features) - 1:
            layers.append(acts[activation]())
        prev = width
    return torch.nn.Sequential(*layers)


def _linears(seq):
    torch = _torch()
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


def mlp_params_to_torch(params, seq) -> None:
    for i, linear in enumerate(_linears(seq)):
        dense_to_torch(linear, params["params"][f"dense_{i}"])


def mlp_params_from_torch(seq) -> dict:
    return {"params": {f"dense_{i}": dense_from_torch(layer) for i, layer in enumerate(_linears(seq))}}


class _TorchActorCritic:
    """Torch mirror of `nets.ActorCritic` (separate tanh towers; log-std parameter)."""

    def __init__(self, obs_dim, action_dim, hidden=(64, 64), continuous=False):
        torch = _torch()
        self.actor = torch_mlp((*hidden, action_dim), obs_dim)
        self.critic = torch_mlp((*hidden, 1), obs_dim)
        self.log_std = torch.nn.Parameter(torch.zeros(action_dim)) if continuous else None
        self.hidden = tuple(hidden)

    def parameters(self):
        params = list(self.actor.parameters()) + list(self.critic.parameters())
        return params + ([self.log_std] if self.log_std is not None else [])

    def load_flax(self, params):
        p = params["params"]
        for name, seq in (("actor", self.actor), ("critic", self.critic)):
            layers = _linears(seq)
            for i, linear in enumerate(layers[:-1]):
                dense_to_torch(linear, p[f"{name}_{i}"])
            dense_to_torch(layers[-1], p[f"{name}_head"])
        if self.log_std is not None:
            with _torch().no_grad():
                self.log_std.copy_(_torch().from_numpy(np.asarray(p["log_std"]).copy()))

    def grads_as_flax(self):
        out = {}
        for name, seq in (("actor", self.actor), ("critic", self.critic)):
            layers = _linears(seq)
            for i, linear in enumerate(layers):
                key = f"{name}_{i}" if i < len(layers) - 1 else f"{name}_head"
                out[key] = {"kernel": linear.weight.grad.numpy().T, "bias": linear.bias.grad.numpy()}
        if self.log_std is not None:
            out["log_std"] = self.log_std.grad.numpy()
        return {"params": out}

    def __call__(self, obs):
        return self.actor(obs), self.critic(obs)[..., 0]


class _TorchWorldModel:
    """Torch mirror of `nets.WorldModel` with the residual-MLP core (continuous actions)."""

    def __init__(self, obs_dim, action_dim, width, depth):
        torch = _torch()
        L = torch.nn.Linear
        self.layers = {
            "enc_0": L(obs_dim, width),
            "enc_1": L(width, width),
            "action_embed": L(action_dim, width),
            "obs_head": L(width, obs_dim),
            "reward_head": L(width, 1),
            "term_head": L(width, 1),
        }
        for i in range(depth):
            self.layers[f"block_{i}_a"] = L(width, width)
            self.layers[f"block_{i}_b"] = L(width, width)
        self.depth = depth

    def parameters(self):
        return [p for layer in self.layers.values() for p in layer.parameters()]

    def load_flax(self, params):
        for name, linear in self.layers.items():
            dense_to_torch(linear, params["params"][name])

    def grads_as_flax(self):
        return {
            "params": {
                n: {"kernel": layer.weight.grad.numpy().T, "bias": layer.bias.grad.numpy()}
                for n, layer in self.layers.items()
            }
        }

    def __call__(self, obs, action):
        torch = _torch()
        silu = torch.nn.functional.silu
        h = self.layers["enc_1"](silu(self.layers["enc_0"](obs)))
        x = h + self.layers["action_embed"](action)
        for i in range(self.depth):
            x = x + self.layers[f"block_{i}_b"](silu(self.layers[f"block_{i}_a"](silu(x))))
        return (
            obs + self.layers["obs_head"](silu(x)),
            self.layers["reward_head"](silu(x))[..., 0],
            self.layers["term_head"](silu(x))[..., 0],
        )


# ---------------------------------------------------------------- 1. the loss scaler


def overflow_sequence(num_steps: int = 10_000, seed: int = 0) -> np.ndarray:
    """Finite (True) / non-finite (False) flags: long finite runs broken by overflow bursts."""
    rng = np.random.default_rng(seed)
    flags = np.ones(num_steps, bool)
    t = 0
    while t < num_steps:
        t += int(rng.integers(1, 3000))  # a finite run, sometimes past the 2000-step growth interval
        burst = int(rng.integers(1, 40))
        flags[t : t + burst] = False
        t += burst
    return flags


def torch_scaler_trajectory(flags, **settings):
    """(scale, growth tracker) after each step of a real GradScaler fed real gradients,
    with inf or NaN written into them where `flags` says a step is not finite. `settings`
    (init_scale, growth_factor, backoff_factor, growth_interval) left out are GradScaler's
    own defaults, so that a run without them compares the two libraries' defaults."""
    torch = _torch()
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", **settings)
    out = np.zeros((len(flags), 2), np.float64)
    for i, finite in enumerate(flags):
        opt.zero_grad()
        scaler.scale((param * 1e-3).sum()).backward()
        if not finite:
            param.grad[i % 3] = float("inf") if i % 2 else float("nan")
        scaler.step(opt)
        scaler.update()
        out[i] = scaler.get_scale(), int(scaler._growth_tracker.item())
    return out


def jax_scaler_trajectory(flags, **settings):
    """`torch_scaler_trajectory` with `DynamicLossScale(**settings)`: left out, its own defaults."""
    scaler = DynamicLossScale(**settings)

    def step(s, finite):
        s = s.adjust(finite)
        return s, (s.loss_scale, s.growth_tracker)

    _, (scales, trackers) = jax.lax.scan(step, scaler, jnp.asarray(flags))
    return np.stack([np.asarray(scales, np.float64), np.asarray(trackers, np.float64)], axis=1)


# ---------------------------------------------------------------- 2. MLP regression training


def torch_style_adam(learning_rate: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """Adam computed as `torch.optim.Adam` computes it, for isolating numerics.

    optax.adam forms the bias corrections 1 - beta^t from float32 betas: float32(0.999)
    is 1.3e-8 above 0.999, so 1 - beta2^t is 1.3e-5 too small (relatively) in the first
    steps, and every early update is ~6e-6 larger than torch's, which computes those
    corrections in float64. Here they come from float64 log(beta), so only summation order
    differs from torch.
    """
    import math

    log_b1, log_b2 = math.log(b1), math.log(b2)

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return (jnp.zeros([], jnp.int32), zeros, jax.tree.map(jnp.zeros_like, params))

    def update(grads, state, params=None):
        del params
        count, mu, nu = state
        count = count + 1
        mu = jax.tree.map(lambda m, g: m + (1.0 - b1) * (g - m), mu, grads)  # torch's lerp_
        nu = jax.tree.map(lambda v, g: v * b2 + (1.0 - b2) * g * g, nu, grads)
        t = count.astype(jnp.float32)
        step_size = learning_rate / -jnp.expm1(t * log_b1)
        bc2_sqrt = jnp.sqrt(-jnp.expm1(t * log_b2))
        updates = jax.tree.map(lambda m, v: -step_size * m / (jnp.sqrt(v) / bc2_sqrt + eps), mu, nu)
        return updates, (count, mu, nu)

    return optax.GradientTransformation(init, update)


def regression_data(steps: int, batch: int = 64, dim: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, dim)).astype(np.float32)
    y = np.sin(x).sum(-1, keepdims=True).astype(np.float32)
    return x, y


def torch_amp_training(
    init_params, x, y, precision, inject_steps=(), lr=1e-3, max_grad_norm=1.0, init_scale=2.0**16, hidden=(64, 64)
):
    """PyTorch's FP16-trainer pattern on an MLP: per-step losses, skipped steps, final params."""
    torch = _torch()
    model = torch_mlp((*hidden, 1), x.shape[-1])
    mlp_params_to_torch(init_params, model)
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8)
    dtype = TORCH_DTYPES[precision]
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, enabled=precision == "fp16")
    losses, skipped = [], []
    for step in range(len(x)):
        xb, yb = torch.from_numpy(x[step]), torch.from_numpy(y[step])
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=getattr(torch, dtype) if dtype else torch.float32, enabled=dtype is not None):
            pred = model(xb)
        loss = torch.mean((pred.float() - yb) ** 2)
        scaler.scale(loss).backward()
        if step in inject_steps:
            next(model.parameters()).grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if scaler.is_enabled():
            scaler.step(opt)  # skips the step itself when the unscaled gradients are not finite
            scaler.update()
        elif grads_finite:
            opt.step()  # without a scaler, the trainer pattern skips non-finite steps by hand
        if not grads_finite:
            skipped.append(step)
        losses.append(float(loss.detach()))
    return np.asarray(losses), skipped, mlp_params_from_torch(model)


def jax_training(
    init_params,
    x,
    y,
    precision,
    inject_steps=(),
    lr=1e-3,
    max_grad_norm=1.0,
    init_scale=2.0**16,
    hidden=(64, 64),
    optimizer: str = "optax",
):
    """The same work through `amp.train_step` (clipping by `skip_nonfinite`, which
    `TrainState.create` wraps around the optimizer); `optimizer` 'optax' (optax.adam) or
    'torch-style' (`torch_style_adam`)."""
    from genesis_jax.amp.loss_scale import NoOpLossScale
    from genesis_jax.amp.policy import get_precision

    prec = get_precision(precision)
    model = MLP(features=(*hidden, 1), dtype=prec.compute_dtype)

    def loss_fn(params, batch):
        return jnp.mean((model.apply(params, batch[0]) - batch[1]) ** 2), None

    inject = jnp.asarray(sorted(inject_steps) or [-1])

    def grad_transform(grads, state):
        bad = jnp.isin(state.step, inject)
        return jax.tree.map(lambda g: jnp.where(bad, g.at[(0,) * g.ndim].set(jnp.inf), g), grads)

    scaler = DynamicLossScale(init_scale) if prec.loss_scaling == "dynamic" else NoOpLossScale()
    tx = optax.adam(lr, eps=1e-8) if optimizer == "optax" else torch_style_adam(lr, eps=1e-8)
    state = TrainState.create(params=init_params, tx=tx, scaler=scaler, precision=prec, max_grad_norm=max_grad_norm)
    step = jax.jit(lambda state, batch: train_step(state, loss_fn, batch, has_aux=True, grad_transform=grad_transform))
    losses, skipped = [], []
    for i in range(len(x)):
        state, m = step(state, (jnp.asarray(x[i]), jnp.asarray(y[i])))
        losses.append(float(m["loss"]))
        if not bool(m["grads_finite"]):
            skipped.append(i)
    return np.asarray(losses), skipped, state.params


# ---------------------------------------------------------------- 3. the PPO loss


def ppo_batch(n=256, obs_dim=4, action_dim=2, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.integers(0, action_dim, n).astype(np.int32),
        "log_prob": np.log(rng.uniform(0.3, 0.7, n)).astype(np.float32),
        "value": rng.normal(size=n).astype(np.float32),
        "advantage": rng.normal(size=n).astype(np.float32),
        "target": rng.normal(size=n).astype(np.float32),
    }


def torch_ppo_loss_and_grads(params, batch, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, hidden=(64, 64)):
    """CleanRL's PPO loss (clipped surrogate, clipped value loss, entropy) in torch."""
    torch = _torch()
    obs_dim = batch["obs"].shape[-1]
    action_dim = np.asarray(params["params"]["actor_head"]["kernel"]).shape[-1]
    net = _TorchActorCritic(obs_dim, action_dim, hidden)
    net.load_flax(params)
    b = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    logits, newvalue = net(b["obs"])
    dist = torch.distributions.Categorical(logits=logits)
    newlogprob = dist.log_prob(b["action"].long())
    logratio = newlogprob - b["log_prob"]
    ratio = logratio.exp()
    mb_adv = (b["advantage"] - b["advantage"].mean()) / (b["advantage"].std(unbiased=False) + 1e-8)
    pg_loss = torch.max(-mb_adv * ratio, -mb_adv * torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)).mean()
    v_unclipped = (newvalue - b["target"]) ** 2
    v_clipped = b["value"] + torch.clamp(newvalue - b["value"], -clip_eps, clip_eps)
    v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b["target"]) ** 2).mean()
    loss = pg_loss - ent_coef * dist.entropy().mean() + v_loss * vf_coef
    loss.backward()
    return float(loss.detach()), net.grads_as_flax()


def jax_ppo_loss_and_grads(params, batch, clip_eps=0.2, vf_coef=0.5, ent_coef=0.01, hidden=(64, 64)):
    from genesis_jax.algos.ppo.loss import Minibatch, ppo_loss

    action_dim = np.asarray(params["params"]["actor_head"]["kernel"]).shape[-1]
    net = ActorCritic(action_dim=action_dim, hidden=hidden)

    def loss(p):
        pi, v = net.apply(p, jnp.asarray(batch["obs"]))
        return ppo_loss(pi, v, Minibatch(**jax.tree.map(jnp.asarray, batch)), clip_eps, vf_coef, ent_coef)[0]

    value, grads = jax.value_and_grad(loss)(params)
    return float(value), grads


# ---------------------------------------------------------------- 4. the world-model loss


def world_model_batch(n=128, obs_dim=8, action_dim=2, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, 1, action_dim)).astype(np.float32),
        "next_obs": rng.normal(size=(n, 1, obs_dim)).astype(np.float32),
        "reward": rng.normal(size=(n, 1)).astype(np.float32),
        "terminated": (rng.uniform(size=(n, 1)) < 0.3).astype(np.float32),
    }


def torch_world_model_loss_and_grads(params, batch, width, depth):
    torch = _torch()
    obs_dim, action_dim = batch["obs"].shape[-1], batch["action"].shape[-1]
    net = _TorchWorldModel(obs_dim, action_dim, width, depth)
    net.load_flax(params)
    b = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
    pred_obs, reward, term_logit = net(b["obs"], b["action"][:, 0])
    obs_mse = ((pred_obs - b["next_obs"][:, 0]) ** 2).mean(-1)
    reward_mse = (reward - b["reward"][:, 0]) ** 2
    bce = torch.nn.functional.binary_cross_entropy_with_logits(term_logit, b["terminated"][:, 0], reduction="none")
    loss = (obs_mse + reward_mse + bce).mean()
    loss.backward()
    return float(loss.detach()), net.grads_as_flax()


def jax_world_model_loss_and_grads(params, batch, width, depth):
    from genesis_jax.algos.world_model.train import make_loss_fn

    model = WorldModel(obs_dim=batch["obs"].shape[-1], action_dim=batch["action"].shape[-1], width=width, depth=depth)
    loss_fn = make_loss_fn(model)
    value, grads = jax.value_and_grad(lambda p: loss_fn(p, jax.tree.map(jnp.asarray, batch))[0])(params)
    return float(value), grads


def init_world_model(obs_dim=8, action_dim=2, width=64, depth=2, seed=0):
    model = WorldModel(obs_dim=obs_dim, action_dim=action_dim, width=width, depth=depth)
    return model.init(
        jax.random.PRNGKey(seed), jnp.zeros((1, obs_dim)), jnp.zeros((1, 1, action_dim)), method=WorldModel.unroll
    )


def max_diffs(a, b) -> tuple[float, float]:
    """(max abs diff, max rel diff) over all leaves of two pytrees of the same keys and shapes.

    A comparison that could pass without comparing is refused: different keys or shapes (zip
    would drop a leaf, broadcasting would hide a shape), or no leaves. A NaN on either side is
    an infinite difference: max() would skip it (max(0.0, nan) is 0.0).
    """
    paths = [[jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(t)] for t in (a, b)]
    if paths[0] != paths[1]:
        raise ValueError(f"the two pytrees differ: leaves {paths[0]} and {paths[1]}")
    if not paths[0]:
        raise ValueError("the two pytrees have no leaves: nothing to compare")
    abs_d, rel_d = 0.0, 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {x.shape} and {y.shape}")
        d = np.where(np.isnan(x) | np.isnan(y), np.inf, np.abs(x - y))
        abs_d = max(abs_d, float(d.max(initial=0.0)))
        rel_d = max(rel_d, float((d / np.fmax(np.abs(y), 1e-12)).max(initial=0.0)))  # fmax: a NaN y is inf too
    return abs_d, rel_d
