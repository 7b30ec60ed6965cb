"""SAC on the template: exact update counts, the Polyak target, three optimizers under one
loss scaler (each skips on its own gradients, the scale backs off once per iteration), bad
input, learning Pendulum-v1 (SIGKILL and resume: tests/algos/test_registry.py)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.algos.base import Algorithm
from genesis_jax.algos.sac import SAC, SACConfig, train
from genesis_jax.amp.optim import find_skip_state as skip_state
from genesis_jax.cli import main
from tests.support.helpers import tree_equal

# A tiny run: 8 environments, one iteration per row, small networks and batches.
TINY = dict(num_envs=8, steps_per_row=8, batch_size=8, learning_starts=8, hidden=(16, 16), buffer_size=256)


def iterations(config, n):
    """The state before and after each of `n` iterations (one row each), and their metrics."""
    algo = SAC(config)
    update = jax.jit(algo.update)
    states, metrics = [algo.init(jax.random.PRNGKey(config.seed))], []
    for _ in range(n):
        state, m = update(states[-1], None)
        states.append(state)
        metrics.append(jax.device_get(m))
    return states, metrics


@pytest.mark.slow  # a compiled run of its own: 25 s of CPU
def test_a_tiny_run_counts_its_updates_and_each_optimizer_s_skips_exactly():
    tiny = {**TINY, "num_envs": 2, "learning_starts": 15, "eval_episodes": 0}  # no greedy evaluation: not counted here
    config = SACConfig(**tiny, total_steps=64, precision="fp16", init_loss_scale=2.0**8, inject_nonfinite=0.25)
    result = train(config, progress=False)
    s, state = result.summary, result.state
    # 32 iterations of 2 steps; the buffer holds 15 after iteration 8 (ceil(15 / 2)): 25 updates.
    updates = 32 - (math.ceil(15 / 2) - 1)
    assert [r["row"] for r in result.metrics] == list(range(1, 9))
    assert [r["step"] for r in result.metrics] == list(range(8, 65, 8))
    assert sum(r["updates"] for r in result.metrics) == updates == s["gradient_iterations"]
    assert [int(getattr(state, n).step) for n in ("critic", "actor", "alpha")] == [updates] * 3
    assert int(state.iteration) == 32
    # The injected faults hit the critics' steps alone; the summary adds up all three optimizers.
    assert s["critic_skipped"] == config.fault_injection(config.seed).count_nonfinite(updates) > 0
    assert s["actor_skipped"] == s["alpha_skipped"] == 0
    assert s["skipped_updates"] == s["critic_skipped"] == sum(r["skipped"] for r in result.metrics)
    assert s["total_updates"] == 3 * updates and s["overflow_rate"] == s["skipped_updates"] / (3 * updates)
    # 64 transitions of (obs 3 + action 1 + reward 1 + next obs 3) float32 and a uint8 flag, and counters.
    assert 64 * (8 * 4 + 1) <= s["buffer_bytes"] < 64 * (8 * 4 + 1) + 64
    assert result.metrics[0]["critic_loss"] is None and result.metrics[-1]["critic_loss"] is not None


def gradscaler_trace(any_skip, scale, growth_interval):
    """PyTorch's GradScaler.update(), once per iteration, from whether any optimizer skipped."""
    trace, tracker = [], 0
    for skipped in any_skip:
        if skipped:
            scale, tracker = scale * 0.5, 0
        else:
            tracker += 1
            if tracker == growth_interval:
                scale, tracker = scale * 2.0, 0
        trace.append(scale)
    return trace


# fp16, the critics' gradients made non-finite on seeded steps, a scale that grows every 3 clean iterations.
FAULTY = SACConfig(
    **TINY,
    total_steps=256,
    tau=0.05,
    precision="fp16",
    init_loss_scale=2.0**10,
    growth_interval=3,
    inject_nonfinite=0.3,
)


@pytest.fixture(scope="module")
def faulty_run():
    return iterations(FAULTY, 24)


@pytest.mark.slow  # the faulty_run fixture compiles a SAC run: about 30 s on 2 cores
def test_every_iteration_updates_and_the_targets_are_the_polyak_average(faulty_run):
    states, metrics = faulty_run
    assert [int(m["updates"]) for m in metrics] == [1] * 24  # learning-starts 8 = one step of the 8 envs
    for before, after in zip(states, states[1:]):
        old_target, online = jax.device_get(before.target), jax.device_get(after.critic.params)
        expected = jax.tree.map(lambda t, p: 0.95 * np.float64(t) + 0.05 * np.float64(p), old_target, online)
        jax.tree.map(lambda e, got: np.testing.assert_allclose(got, e, rtol=1e-6, atol=1e-7), expected, after.target)


@pytest.mark.slow  # the faulty_run fixture compiles a SAC run: about 30 s on 2 cores
def test_a_critic_overflow_skips_the_critic_alone_and_backs_the_scale_off_once(faulty_run):
    states, metrics = faulty_run
    critic_skips = [int(m["critic_skipped"]) for m in metrics]
    assert 0 < sum(critic_skips) < 24  # the seeded faults hit some iterations, not all
    faults = FAULTY.fault_injection(FAULTY.seed)
    assert critic_skips == [int(faults.is_nonfinite_step(step)) for step in range(24)]
    for before, after, skipped in zip(states, states[1:], critic_skips):
        changed = lambda name: not np.array_equal(kernel(after, name), kernel(before, name))  # noqa: E731
        if skipped:  # the critics bit-identical on their skipped step
            tree_equal(after.critic.params, before.critic.params)
            tree_equal(skip_state(after.critic.opt_state).inner_state, skip_state(before.critic.opt_state).inner_state)
        assert changed("critic") != bool(skipped)
        assert changed("actor") and float(after.alpha.params) != float(before.alpha.params)  # these still step
        assert float(after.actor.scaler.loss_scale) == float(after.critic.scaler.loss_scale)  # one scaler
    assert sum(int(m["actor_skipped"]) + int(m["alpha_skipped"]) for m in metrics) == 0
    assert [float(s.critic.scaler.loss_scale) for s in states[1:]] == gradscaler_trace(critic_skips, 2.0**10, 3)
    final = states[-1]
    assert (int(final.critic.skipped), int(final.actor.skipped), int(final.alpha.skipped)) == (sum(critic_skips), 0, 0)


def kernel(state, name):
    return np.asarray(getattr(state, name).params["params"]["Dense_0"]["kernel"])


def test_a_discrete_environment_is_refused_in_one_line_before_anything_compiles(tmp_path, capsys, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("compiled")

    monkeypatch.setattr(Algorithm, "compile_chunk", no_compile)
    with pytest.raises(
        ValueError, match=r"sac needs continuous actions; CartPole-v1 has discrete ones: use dqn or pqn"
    ):
        SAC(SACConfig(env="CartPole-v1"))
    out = tmp_path / "run"
    assert main(["train", "sac", "--env", "CartPole-v1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CartPole-v1" in err and "dqn" in err and "Traceback" not in err
    assert not out.exists()


def test_an_environment_with_infinite_or_equal_action_bounds_is_refused_before_anything_compiles(monkeypatch):
    from tests.support import custom_envs  # registers ProbeUnbounded-v0

    monkeypatch.setattr(Algorithm, "compile_chunk", lambda *args, **kwargs: pytest.fail("compiled"))
    with pytest.raises(
        ValueError, match=r"^sac squashes its actions into the action bounds; ProbeUnbounded-v0 has infinite"
    ):
        SAC(SACConfig(env="ProbeUnbounded-v0"))  # tanh times an infinite scale: NaN actions
    gym = pytest.importorskip("gymnasium")
    space = gym.spaces.Box(np.float32([0, 1]), np.float32([1, 1]))  # the second action fixed: log(0) in its log-prob
    gym.registry.pop("ProbeFixedAction-v0", None)
    gym.register("ProbeFixedAction-v0", entry_point=custom_envs.Probe, kwargs={"action_space": space})
    with pytest.raises(ValueError, match=r"^sac needs each action's low below its high; ProbeFixedAction-v0 has"):
        SAC(SACConfig(env="ProbeFixedAction-v0"))


@pytest.mark.slow  # gymnasium stepped from the compiled loop: 15 s
def test_the_host_path_trains_on_gymnasium_environments():
    config = SACConfig(**{**TINY, "num_envs": 2}, env="Pendulum-v1", env_backend="gymnasium", total_steps=400)
    result = train(config, progress=False)
    assert result.summary["env_backend"] == "gymnasium"
    # 200 iterations of 2 environments; learning from the 4th; each environment ends one 200-step episode.
    assert result.summary["gradient_iterations"] == 197 and sum(r["episodes"] for r in result.metrics) == 2
    assert math.isfinite(result.summary["final_return"])


# About a minute each on two CPU cores: the long lane (`pytest --long`). Their result, with three
# seeds of each precision, is in benchmarks/sac-pendulum-cpu.md; the suite trains SAC at every
# precision at its tiny size (tests/algos/test_every_precision.py) and on Pendulum above.
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.run_bound
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_sac_learns_pendulum_within_20k_steps(precision):
    result = train(SACConfig(precision=precision, total_steps=20_000, hidden=(64, 64)), progress=False)
    assert result.summary["final_return"] > -200, [r["episode_return"] for r in result.metrics]


def test_the_actor_and_critic_heads_compute_in_float32_under_a_half_precision():
    # A Q value past float16's 65504 must stay finite: the torso computes in float16, the head in float32.
    from genesis_jax.amp import dtype_report
    from genesis_jax.nets.sac import Net

    net, obs, act = Net(("mlp", (16,)), 1, jnp.float16), jnp.ones((4, 3)), jnp.ones((4, 1))
    params = net.init(jax.random.PRNGKey(0), obs, act)
    head = sorted(params["params"])[-1]  # Dense_0 the torso's layer, Dense_1 the head
    params["params"][head]["kernel"] = jnp.full_like(params["params"][head]["kernel"], 1e5)
    q = net.apply(params, obs, act)
    assert q.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(q))) and float(jnp.max(q)) > 65504
    matmuls = dtype_report(lambda p: net.apply(p, obs, act), params).dtypes("matmul")
    assert matmuls == {"float16": 1, "float32": 1}, matmuls


@pytest.mark.slow  # a tiny SAC run on gymnasium, then what it collects: about 15 s
def test_collect_repeats_a_trained_agents_actions_or_refuses_an_environment_that_cannot(tmp_path, capsys):
    run, data = tmp_path / "sac", tmp_path / "pendulum.npz"
    config = SACConfig(**{**TINY, "total_steps": 32}, env="Pendulum-v1", env_backend="gymnasium", action_repeat=4)
    train(config, str(run), progress=False)
    argv = ["collect", "--env", "Pendulum-v1", "--policy", str(run), "--num-sequences", "2", "--sequence-length", "4"]
    assert main([*argv, "--env-backend", "gymnasium", "--out", str(data)]) == 0
    assert "action-repeat 4" in json.loads(str(np.load(data)["meta"]))["source"]
    assert main([*argv, "--env-backend", "gymnax", "--out", str(tmp_path / "gymnax.npz")]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("repeats each action 4 times, which gymnasium environments do: collect with --env-backend gymnasium")
    )


@pytest.mark.parametrize("precision", ["fp16", "fp16-full"])
def test_the_temperature_and_every_exp_log_and_sum_of_the_losses_are_float32(precision):
    """alpha = exp(log alpha) and the temperature loss's exp in float32, also where log alpha is a
    float16 parameter (fp16-full): read from the update's jaxpr (`amp.dtype_report`), nothing runs.
    (fp16-full's float16 squares and powers are Adam's, on its float16 moments.)"""
    from genesis_jax.amp import dtype_report

    algo = SAC(SACConfig(**SAC.presets.tiny, precision=precision))
    state = jax.eval_shape(algo.init, jax.random.PRNGKey(0))
    report = dtype_report(algo.update, state, algo.data)
    half = [op for op in report.ops if op.op in ("exp", "log", "log1p", "logistic") and op.inputs[0] == "float16"]
    assert not half, half
    assert set(report.dtypes("reduction")) <= {"float32", "int32", "bool"}, report.dtypes("reduction")
