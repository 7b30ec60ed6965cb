"""Our SAC (fp32, `train()` as users call it) against Rejax's SAC (a whole-run-jitted peer,
`pip install rejax`) on gymnax Pendulum-v1 with matched settings: one environment, one
gradient step per environment step, MLP (H, H) ReLU actor and twin critics, batch 256,
lr 1e-3, Polyak 0.005, gamma 0.99, 1000 random steps first. Run alternately in one process,
so that drift in machine speed hits both alike. Ours: its steps/s (compilation excluded);
Rejax: compiled once (evaluation only at the end, a no-op), the call timed.

    python experiments/sac_vs_peer.py --repeats 2 --total-steps 10000 --out benchmarks/sac-vs-rejax-cpu.md
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from _report import description, emit

from genesis_jax.algos.sac import SACConfig, train
from genesis_jax.run import probes


class FiveValueStep:
    """gymnax 1.0's env with the older 5-value `step` (obs, state, reward, done, info) that
    Rejax 0.1.3 unpacks; done = terminated or truncated, as that gymnax API had it."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "_env":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self._env, name)

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info


def compiled_rejax(total_steps: int, hidden: int):
    """Rejax's SAC, compiled once for `total_steps` steps: `run(key) -> train state`."""
    if importlib.util.find_spec("rejax") is None:
        raise SystemExit("the peer, Rejax's SAC, needs rejax (in no extra of genesis-jax): pip install rejax")
    import gymnax
    from rejax import SAC

    env, env_params = gymnax.make("Pendulum-v1")
    algo = SAC.create(
        env=FiveValueStep(env),
        env_params=env_params,
        total_timesteps=total_steps,
        eval_freq=total_steps,
        skip_initial_evaluation=True,
        num_envs=1,
        num_epochs=1,
        buffer_size=total_steps,
        fill_buffer=1000,
        batch_size=256,
        learning_rate=1e-3,
        polyak=0.995,
        gamma=0.99,
        hidden_layer_sizes=(hidden, hidden),
    )
    algo = algo.replace(eval_callback=lambda algo, ts, rng: ())  # no evaluation episodes timed
    return jax.jit(algo.train).lower(jax.random.PRNGKey(0)).compile()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--total-steps", type=int, default=10_000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rejax_fn = compiled_rejax(args.total_steps, args.hidden)
    speeds = {"rejax": [], "ours": []}
    for i in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(rejax_fn(jax.random.PRNGKey(i)))
        speeds["rejax"].append(args.total_steps / (time.perf_counter() - start))
        config = SACConfig(precision="fp32", total_steps=args.total_steps, hidden=(args.hidden, args.hidden), seed=i)
        speeds["ours"].append(train(config, progress=False).summary["steps_per_second"])
        print(f"repeat {i}: rejax {speeds['rejax'][-1]:.0f}, ours {speeds['ours'][-1]:.0f} steps/s", file=sys.stderr)
    lines = [
        f"SAC Pendulum-v1 fp32, {args.total_steps} steps, hidden ({args.hidden}, {args.hidden}), {args.repeats} "
        f"alternating repeats, device {probes.device_name()}; command: python experiments/sac_vs_peer.py "
        f"{' '.join(sys.argv[1:])}",
        "",
        "| | median steps/s | min | max |",
        "|---|---|---|---|",
    ]
    for name, label in (("rejax", "Rejax SAC (whole run jitted)"), ("ours", "genesis-jax train()")):
        v = speeds[name]
        lines.append(f"| {label} | {statistics.median(v):.0f} | {min(v):.0f} | {max(v):.0f} |")
    ratios = [o / r for o, r in zip(speeds["ours"], speeds["rejax"])]
    lines += [
        "",
        f"ours / Rejax, per repeat: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f}",
    ]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
