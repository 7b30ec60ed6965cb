"""Trajectory datasets for the world model: synthetic (known true model) and collected.

A dataset is a dict of numpy arrays over sequences: obs [N, T+1, D], action [N, T] (int)
or [N, T, A], reward [N, T], terminated [N, T] (float 0/1), plus `meta` (a dict: source,
discrete_actions, action_dim, noise_floor where known). Sequences, not transitions, so that
the same data serves one-step and multi-step (open-loop) training.
"""

from __future__ import annotations

import json
import os

import numpy as np

SYNTHETIC_OBS_DIM = 8
SYNTHETIC_ACTION_DIM = 2


def _binary_entropy(p):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log(p) + (1 - p) * np.log(1 - p))


def synthetic_dataset(num_sequences: int = 512, length: int = 32, seed: int = 0, obs_noise: float = 0.05,
                      reward_noise: float = 0.05) -> dict:
    """A seeded linear-Gaussian system: s' = A s + B a + N(0, obs_noise^2), r = c.s + d.a + N(0, reward_noise^2),
    terminated ~ Bernoulli(sigmoid(w.s')). The attainable loss of each sample is known."""
    if num_sequences < 2 or length < 1:
        raise ValueError(f"synthetic data needs num_sequences >= 2 and length >= 1, got {num_sequences}, {length}")
    rng = np.random.default_rng(seed)
    d, a = SYNTHETIC_OBS_DIM, SYNTHETIC_ACTION_DIM
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    A = 0.95 * q  # stable rotation-like dynamics
    B = rng.normal(scale=0.5, size=(d, a))
    c, dvec, w = rng.normal(size=d), rng.normal(size=a), rng.normal(scale=1.5, size=d)
    obs = np.zeros((num_sequences, length + 1, d))
    obs[:, 0] = rng.normal(size=(num_sequences, d))
    actions = rng.uniform(-1, 1, size=(num_sequences, length, a))
    rewards = np.zeros((num_sequences, length))
    term_prob = np.zeros((num_sequences, length))
    for t in range(length):
        obs[:, t + 1] = obs[:, t] @ A.T + actions[:, t] @ B.T + rng.normal(scale=obs_noise, size=(num_sequences, d))
        rewards[:, t] = obs[:, t] @ c + actions[:, t] @ dvec + rng.normal(scale=reward_noise, size=num_sequences)
        term_prob[:, t] = 1.0 / (1.0 + np.exp(-(obs[:, t + 1] @ w)))
    terminated = (rng.uniform(size=term_prob.shape) < term_prob).astype(np.float32)
    return {
        "obs": obs.astype(np.float32),
        "action": actions.astype(np.float32),
        "reward": rewards.astype(np.float32),
        "terminated": terminated,
        # Per-step expected loss of the true model: obs MSE (mean over dims) + reward MSE + BCE.
        "floor": (obs_noise**2 + reward_noise**2 + _binary_entropy(term_prob)).astype(np.float32),
        "meta": {"source": f"synthetic-linear-gaussian(seed={seed})", "discrete_actions": False, "action_dim": a},
    }


def collect_dataset(env_id: str, num_sequences: int = 64, length: int = 64, seed: int = 0) -> dict:
    """Random-policy trajectories from a gymnax environment id (vmapped, under jit)."""
    import jax
    import jax.numpy as jnp

    from genesis_jax.envs.gymnax_env import GymnaxVecEnv

    env = GymnaxVecEnv(env_id, num_sequences)
    spec = env.spec

    def random_action(key):
        if spec.continuous:
            return jax.random.uniform(key, (num_sequences, spec.action_dim), minval=jnp.asarray(spec.action_low), maxval=jnp.asarray(spec.action_high))
        return jax.random.randint(key, (num_sequences,), 0, spec.action_dim)

    def step(carry, key):
        obs, state = carry
        k_act, k_env = jax.random.split(key)
        action = random_action(k_act)
        next_obs, state, reward, terminated, truncated, final_obs = env.step(k_env, state, action)
        return (next_obs, state), (obs, action, reward, terminated, final_obs)

    @jax.jit
    def rollout(key):
        k0, k1 = jax.random.split(key)
        obs, state = env.reset(k0)
        _, (o, act, r, term, final) = jax.lax.scan(step, (obs, state), jax.random.split(k1, length))
        return o, act, r, term, final

    o, act, r, term, final = (np.asarray(x) for x in rollout(jax.random.PRNGKey(seed)))
    # Sequences run across resets; each transition's target is the pre-reset observation.
    obs = np.concatenate([o, final[-1:]], axis=0).swapaxes(0, 1)
    next_obs = final.swapaxes(0, 1)
    return {
        "obs": obs.astype(np.float32),
        "next_obs": next_obs.astype(np.float32),
        "action": act.swapaxes(0, 1),
        "reward": r.swapaxes(0, 1).astype(np.float32),
        "terminated": term.swapaxes(0, 1).astype(np.float32),
        "meta": {"source": f"gymnax:{env_id}(random policy, seed={seed})", "discrete_actions": not spec.continuous,
                 "action_dim": spec.action_dim},
    }


def save_dataset(data: dict, path: str) -> None:
    arrays = {k: v for k, v in data.items() if k != "meta"}
    np.savez_compressed(path, meta=json.dumps(data["meta"]), **arrays)


def load_dataset(path: str) -> dict:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no dataset at {path}")
    with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files if k != "meta"}
        data["meta"] = json.loads(str(f["meta"]))
    return data


def transitions(data: dict) -> dict:
    """One-step samples flattened over sequences and time."""
    n, t = data["reward"].shape
    next_obs = data["next_obs"] if "next_obs" in data else data["obs"][:, 1:]
    out = {
        "obs": data["obs"][:, :t].reshape(n * t, -1),
        "action": data["action"].reshape((n * t,) + data["action"].shape[2:]),
        "next_obs": next_obs.reshape(n * t, -1),
        "reward": data["reward"].reshape(n * t),
        "terminated": data["terminated"].reshape(n * t),
    }
    if "floor" in data:
        out["floor"] = data["floor"].reshape(n * t)
    return out


def split(data: dict, eval_fraction: float = 0.2) -> tuple[dict, dict]:
    """(train, eval) by whole sequences, deterministic: the last sequences are held out."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval fraction must lie in (0, 1), got {eval_fraction}")
    n = data["reward"].shape[0]
    n_eval = max(1, int(round(n * eval_fraction)))
    if n_eval >= n:
        raise ValueError(f"{n} sequences are too few to hold out {eval_fraction:.0%} for evaluation")
    arrays = {k: v for k, v in data.items() if k != "meta"}
    train = {k: v[: n - n_eval] for k, v in arrays.items()}
    held = {k: v[n - n_eval:] for k, v in arrays.items()}
    return {**train, "meta": data["meta"]}, {**held, "meta": data["meta"]}
