"""Our PPO against Stable-Baselines3's on the same gymnasium task and hyperparameters:
steps/s and final return in one table. Needs `pip install -e '.[peers]'`.

    python experiments/compare_peers.py --env CartPole-v1 --total-steps 100000 --num-envs 4
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np
from _report import description, emit


def run_sb3(env_id: str, total_steps: int, num_envs: int, seed: int) -> dict:
    if importlib.util.find_spec("stable_baselines3") is None:
        raise SystemExit("the peer, Stable-Baselines3's PPO, needs stable_baselines3: pip install -e '.[peers]'")
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)  # SB3's recommendation for small MLP policies on CPU
    env = make_vec_env(env_id, n_envs=num_envs, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=128,
        batch_size=num_envs * 128 // 4,
        n_epochs=4,
        learning_rate=lambda f: 2.5e-4 * f,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        policy_kwargs={"net_arch": [64, 64], "activation_fn": torch.nn.Tanh},
        device="cpu",
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=total_steps)
    seconds = time.perf_counter() - start
    returns = [ep["r"] for ep in model.ep_info_buffer]
    return {
        "impl": "stable-baselines3 PPO (torch, CPU)",
        "steps_per_second": total_steps / seconds,
        "final_return": float(np.mean(returns)) if returns else float("nan"),
    }


def run_ours(env_id: str, total_steps: int, num_envs: int, seed: int, backend: str, precision: str) -> dict:
    from genesis_jax.algos.ppo import PPOConfig, train

    s = train(
        PPOConfig(
            env=env_id, env_backend=backend, precision=precision, total_steps=total_steps, num_envs=num_envs, seed=seed
        ),
        progress=False,
    ).summary
    return {
        "impl": f"genesis-jax PPO ({backend}, {precision})",
        "steps_per_second": s["steps_per_second"],
        "final_return": s["final_return"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--total-steps", type=int, default=100_000)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precisions", default="fp32,fp16")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = [run_sb3(args.env, args.total_steps, args.num_envs, args.seed)]
    for precision in args.precisions.split(","):
        rows.append(run_ours(args.env, args.total_steps, args.num_envs, args.seed, "gymnasium", precision))
    lines = [
        f"{args.env}, {args.total_steps} steps, {args.num_envs} envs, seed {args.seed}; "
        f"command: python {' '.join(sys.argv)}",
        "",
        "| implementation | steps/s | vs SB3 | final return |",
        "|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['steps_per_second']:.0f} | "
            f"{r['steps_per_second'] / rows[0]['steps_per_second']:.2f}x | {r['final_return']:.1f} |"
        )
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
