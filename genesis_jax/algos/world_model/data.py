"""Trajectory datasets for the world model: synthetic (known true model) and collected.

A dataset is a dict of numpy arrays over sequences: obs [N, T+1, D], action [N, T] (int)
or [N, T, A], reward [N, T], terminated [N, T] (float 0/1), next_obs [N, T, D] for collected
data (the pre-reset observations), floor [N, T] where the true model is known (each step's
attainable loss), and `meta` (a dict: source, discrete_actions, action_dim). Sequences, not
transitions, so that the same data serves one-step and multi-step (open-loop) training.
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


def synthetic_dataset(
    num_sequences: int = 512, length: int = 32, seed: int = 0, obs_noise: float = 0.05, reward_noise: float = 0.05
) -> dict:
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


def _random_policy(spec, num_envs: int):
    import jax
    import jax.numpy as jnp

    def act(key, obs):
        del obs
        if spec.continuous:
            return jax.random.uniform(
                key,
                (num_envs, spec.action_dim),
                minval=jnp.asarray(spec.action_low),
                maxval=jnp.asarray(spec.action_high),
            )
        return jax.random.randint(key, (num_envs,), 0, spec.action_dim)

    return jax.jit(act)


def collect_dataset(
    env_id: str,
    num_sequences: int = 64,
    length: int = 64,
    seed: int = 0,
    backend: str | None = None,
    policy=None,
    policy_name: str = "random policy",
) -> dict:
    """Trajectories from a gymnax (vmapped, under jit) or gymnasium (host) environment id,
    acting with a random policy or with `policy(key, obs) -> actions` (for all
    `num_sequences` environments at once), such as a trained agent's `act`, named `policy_name`.

    Sequences run on across episode ends; `next_obs` holds each step's pre-reset observation,
    so every one-step target is right (a multi-step window may span an episode end).
    """
    import jax

    from genesis_jax.envs.registry import resolve_backend, resolve_env

    backend = resolve_backend(env_id, backend)
    spec = resolve_env(env_id, backend)
    act, description = (
        (policy, policy_name) if policy is not None else (_random_policy(spec, num_sequences), "random policy")
    )
    keys = jax.random.split(jax.random.PRNGKey(seed), length + 1)
    if backend == "gymnax":
        o, a, r, term, final = _collect_gymnax(env_id, num_sequences, length, act, keys)
    else:
        o, a, r, term, final = _collect_gymnasium(env_id, num_sequences, length, act, keys, seed)
    obs = np.concatenate([o, final[-1:]], axis=0).swapaxes(0, 1)
    return {
        "obs": obs.astype(np.float32),
        "next_obs": final.swapaxes(0, 1).astype(np.float32),
        "action": a.swapaxes(0, 1),
        "reward": r.swapaxes(0, 1).astype(np.float32),
        "terminated": term.swapaxes(0, 1).astype(np.float32),
        "meta": {
            "source": f"{backend}:{env_id}({description}, seed={seed})",
            "discrete_actions": not spec.continuous,
            "action_dim": spec.action_dim,
        },
    }


def _collect_gymnax(env_id, num_envs, length, act, keys):
    import jax

    from genesis_jax.envs.gymnax_env import GymnaxVecEnv

    env = GymnaxVecEnv(env_id, num_envs)

    def step(carry, key):
        obs, state = carry
        k_act, k_env = jax.random.split(key)
        action = act(k_act, obs)
        next_obs, state, reward, terminated, _, final_obs = env.step(jax.random.split(k_env, num_envs), state, action)
        return (next_obs, state), (obs, action, reward, terminated, final_obs)

    @jax.jit
    def rollout(reset_key, step_keys):
        obs, state = env.reset(reset_key)
        return jax.lax.scan(step, (obs, state), step_keys)[1]

    return tuple(np.asarray(x) for x in rollout(keys[0], keys[1:]))


def _collect_gymnasium(env_id, num_envs, length, act, keys, seed):
    from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv

    env = GymnasiumVecEnv(env_id, num_envs)
    try:
        obs = env.reset(seed=seed)
        columns = []
        for t in range(length):
            action = np.asarray(act(keys[t + 1], obs))
            next_obs, reward, terminated, _, final_obs = env.step(action)
            columns.append((obs, action, reward, terminated, final_obs))
            obs = next_obs
    finally:
        env.close()
    return tuple(np.stack(c) for c in zip(*columns))


def save_dataset(data: dict, path: str) -> None:
    arrays = {k: v for k, v in data.items() if k != "meta"}
    np.savez_compressed(path, meta=json.dumps(data["meta"]), **arrays)


DATASET_KEYS = ("obs", "action", "reward", "terminated", "meta")


def load_dataset(path: str) -> dict:
    """A dataset written by `save_dataset` (`genesis-jax collect`); anything else (an empty,
    truncated or foreign file) is refused with one sentence."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no dataset at {path}")
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in DATASET_KEYS if k not in f.files]
            if missing:
                raise ValueError(f"it has no {', '.join(missing)}")
            data = {k: f[k] for k in f.files if k != "meta"}
            data["meta"] = json.loads(str(f["meta"]))
    except Exception as err:  # numpy and zipfile raise many kinds for a damaged file
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path} is not a dataset written by genesis-jax collect: {detail}") from None
    return data


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
    held = {k: v[n - n_eval :] for k, v in arrays.items()}
    return {**train, "meta": data["meta"]}, {**held, "meta": data["meta"]}
