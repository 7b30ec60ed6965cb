"""The example pairs under examples/: each fp16 file is its fp32 twin plus at most a few changed
lines, learns as the twin does, and skips exactly the steps whose gradients are not finite."""

import difflib
import importlib.util
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax import amp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# name: the most lines its fp16 twin may change (the bar for each style of loop)
CHANGED_LINE_LIMITS = {
    "purejaxrl_style_ppo": 10,
    "cleanrl_style_sac": 20,
    "nnx_regression": 8,
    "pytree_regression": 8,
    "equinox_regression": 8,
}


def changed_lines(name: str) -> list[str]:
    """The fp16 twin's added or changed lines, blank lines aside (`diff -B a b | grep '^>'`)."""
    fp32, fp16 = ((EXAMPLES / f"{name}{suffix}.py").read_text().splitlines() for suffix in ("", "_fp16"))
    diff = difflib.unified_diff(fp32, fp16, lineterm="", n=0)
    return [line for line in diff if line.startswith("+") and not line.startswith("+++") and line[1:].strip()]


def load(name: str):
    """An example as a module (its `if __name__ == "__main__"` part does not run)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tree_equal(a, b) -> bool:
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


@pytest.mark.parametrize("name", sorted(CHANGED_LINE_LIMITS))
def test_each_fp16_twin_changes_at_most_its_limit_of_lines(name):
    changed = changed_lines(name)
    assert 0 < len(changed) <= CHANGED_LINE_LIMITS[name], "\n".join(changed)
    assert any("amp." in line for line in changed)  # the change is genesis-jax's, not a rewrite


@pytest.mark.slow  # two 200-step trainings each: ~10 s
@pytest.mark.parametrize("name", ["nnx_regression", "pytree_regression", "equinox_regression"])
def test_the_fp16_twin_learns_as_its_fp32_twin(name):
    if name.startswith("equinox"):
        pytest.importorskip("equinox")
    fp32_losses, *_ = load(name).train(200)
    fp16_losses, *fp16_state = load(f"{name}_fp16").train(200)
    assert fp32_losses[-1] < 0.05 * fp32_losses[0]  # the twin itself learns
    assert fp16_losses[-1] < 0.05 * fp16_losses[0]
    assert abs(fp16_losses[-1] - fp32_losses[-1]) <= 0.1 * fp32_losses[-1]


@pytest.mark.slow
def test_the_pytree_fp16_twin_skips_a_non_finite_step_and_backs_off_once():
    example = load("pytree_regression_fp16")
    params = example.init_params(jax.random.PRNGKey(1))
    opt_state, scaler = example.tx.init(params), amp.DynamicLossScale()
    x, y = jnp.ones((16, 8)), jnp.zeros((16, 1))
    params, opt_state, scaler, _ = example.update(params, opt_state, scaler, x, y)
    new = example.update(params, opt_state, scaler, x.at[0, 0].set(jnp.inf), y)
    assert tree_equal(new[0], params) and tree_equal(new[1].inner_state, opt_state.inner_state)  # bit-identical
    assert float(new[2].loss_scale) == float(scaler.loss_scale) / 2
    assert int(new[2].backoffs) == int(scaler.backoffs) + 1
    assert amp.stats(new[1])["skipped"] == amp.stats(opt_state)["skipped"] + 1


@pytest.mark.slow
def test_the_nnx_fp16_twin_skips_a_non_finite_step_and_backs_off_once():
    from flax import nnx

    example = load("nnx_regression_fp16")
    _, model, optimizer = example.train(3)

    def snapshot():  # the params and Adam's own state, as host arrays
        return jax.tree.map(np.array, (nnx.state(model), nnx.state(optimizer.opt_state)["inner_state"]))

    before, skipped = snapshot(), amp.stats(optimizer)["skipped"]
    scale, backoffs = float(optimizer.scaler.get_value().loss_scale), int(optimizer.scaler.get_value().backoffs)
    example.train_step(model, optimizer, jnp.full((4, 8), jnp.inf), jnp.zeros((4, 1)))
    assert tree_equal(snapshot(), before)
    scaler = optimizer.scaler.get_value()
    assert float(scaler.loss_scale) == scale / 2 and int(scaler.backoffs) == backoffs + 1
    assert amp.stats(optimizer)["skipped"] == skipped + 1 and amp.stats(optimizer)["steps"] == 4


def torch_scales(flags: list[tuple[bool, ...]], init_scale: float, growth_interval: int) -> list[float]:
    """torch.amp.GradScaler shared by one optimizer per flag: the scale after each iteration."""
    torch = pytest.importorskip("torch")
    params = [torch.nn.Parameter(torch.ones(1)) for _ in flags[0]]
    optimizers = [torch.optim.SGD([p], lr=0.1) for p in params]
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for iteration in flags:
        for p, opt, finite in zip(params, optimizers, iteration):
            opt.zero_grad()
            scaler.scale((p * (1.0 if finite else float("inf"))).sum()).backward()
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


# The SAC tests' batch: one size, so that the fp16 twin's end-to-end run traces the same three
# updates as the skip test and loads them from the run's compilation cache (another shape, or a
# weak type, compiles them again).
SAC_BATCH = 16


@pytest.mark.slow  # compiles the example's three jitted updates
def test_the_sac_fp16_twin_skips_exactly_and_backs_off_as_torch_gradscaler():
    example = load("cleanrl_style_sac_fp16")
    states = example.make_states(0)
    scaler = amp.DynamicLossScale(init_scale=2.0**10, growth_interval=2)
    qf, actor, alpha = (s.replace(scaler=scaler) for s in states)
    obs_dim, act_dim = example.env.observation_space.shape[0], example.env.action_space.shape[0]
    key = jax.random.PRNGKey(0)
    obs, actions = jax.random.normal(key, (SAC_BATCH, obs_dim)), jnp.zeros((SAC_BATCH, act_dim))
    clean = (obs, actions, jnp.ones(SAC_BATCH), obs, jnp.zeros(SAC_BATCH))
    poisoned = (obs, actions, jnp.full(SAC_BATCH, jnp.inf, jnp.float32), obs, jnp.zeros(SAC_BATCH))  # inf rewards
    # iteration: (critic finite, actor and temperature finite); the actor sees inf observations
    schedule = [(True, True), (False, True), (True, True), (True, True), (False, False), (True, True)]
    flags, scales = [], []
    for critic_ok, others_ok in schedule:
        batch = clean if critic_ok else poisoned
        actor_obs = obs if others_ok else jnp.full_like(obs, jnp.inf)
        before = (qf, actor)
        qf, *_ = example.update_critic(qf, actor, alpha, *batch, key)
        actor, _, entropy = example.update_actor(actor, qf, alpha, actor_obs, key)
        entropy = entropy if others_ok else jnp.float32(jnp.inf)
        alpha, _ = example.update_temperature(alpha, entropy)
        if not critic_ok:
            assert tree_equal(qf.params, before[0].params) and tree_equal(
                qf.opt_state.inner_state, before[0].opt_state.inner_state
            )
        if not others_ok:
            assert tree_equal(actor.params, before[1].params) and tree_equal(
                actor.opt_state.inner_state, before[1].opt_state.inner_state
            )
        qf, actor, alpha = amp.update_scaler(qf, actor, alpha)
        flags.append((critic_ok, others_ok, others_ok))
        scales.append(float(qf.scaler.loss_scale))
    assert scales == torch_scales(flags, 2.0**10, 2)
    stats = amp.stats(critic=qf, actor=actor, alpha=alpha)
    assert [stats["optimizers"][n]["skipped"] for n in ("critic", "actor", "alpha")] == [2, 1, 1]
    assert stats["backoffs"] == 2  # one per bad iteration, however many optimizers saw it


@pytest.mark.slow  # a few dozen updates of each twin; learning itself is the examples' own 15,000-step runs
@pytest.mark.parametrize("name", ["cleanrl_style_sac", "cleanrl_style_sac_fp16"])
def test_each_sac_twin_runs_its_loop_end_to_end(name, monkeypatch):
    example = load(name)
    monkeypatch.setattr(example, "LEARNING_STARTS", 40)
    monkeypatch.setattr(example, "BATCH_SIZE", SAC_BATCH)
    returns, states = example.train(250)
    assert len(returns) == 1 and np.isfinite(returns[0])  # Pendulum's episodes are 200 steps
    for state in states:
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state.params))
    assert int(states[0].step) == 210 and int(states[1].step) == 105  # the actor every POLICY_FREQUENCY steps
