"""The world model's synthetic trajectory datasets: a known true model, so each step's
attainable loss (`floor`) is known. Datasets' format, files, checks and collection from an
environment: `genesis_jax.data.trajectories`.
"""

from __future__ import annotations

import numpy as np

from genesis_jax.data.trajectories import check_fits_in_memory

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
    # float64 while it is generated: obs, actions, rewards and termination probabilities
    size = 8 * num_sequences * (length + 1) * (SYNTHETIC_OBS_DIM + SYNTHETIC_ACTION_DIM + 2)
    check_fits_in_memory(f"synthetic data of {num_sequences} sequences x {length} steps", size)
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


SMALL_UNITS = 0.01  # synthetic-small: the synthetic system's observations and rewards in these units


def small_units_dataset(num_sequences: int = 512, length: int = 32, seed: int = 0, scale: float = SMALL_UNITS) -> dict:
    """`synthetic_dataset` in small units: observations and rewards times `scale`, and no
    episode ends. Its loss is small (the attainable one scale^2 times the synthetic system's
    MSE terms; termination's cross-entropy tends to 0), so are its gradients: the case where a
    float16 backward without loss scaling loses them."""
    data = synthetic_dataset(num_sequences, length, seed)
    noise = 0.05**2 + 0.05**2  # synthetic_dataset's obs_noise^2 + reward_noise^2
    return {
        **data,
        "obs": data["obs"] * np.float32(scale),
        "reward": data["reward"] * np.float32(scale),
        "terminated": np.zeros_like(data["terminated"]),
        "floor": np.full_like(data["floor"], scale**2 * noise),
        "meta": {**data["meta"], "source": f"synthetic-small-units(seed={seed}, scale={scale:g}, no terminations)"},
    }


WIDE_OBS_DIM = 256  # synthetic-wide: observation dimensions, each a mix of the system's 8


def wide_dataset(
    num_sequences: int = 512, length: int = 32, seed: int = 0, obs_dim: int = WIDE_OBS_DIM, scale: float = 1.0
) -> dict:
    """The synthetic system without episode ends, in `scale` units (`small_units_dataset`; 1: its
    own), seen through `obs_dim` observations: an orthogonal projection of its state, scaled so each
    dimension keeps the state's size. A model that predicts many outputs with a loss averaged over
    all of them, as pixel world models average theirs: each output's gradient is its error over
    outputs x batch. Trained on a small multiple of that loss (`WorldModelConfig.loss_weight`, as an
    auxiliary loss is weighted), a float16 backward without loss scaling flushes those gradients to
    zero. The attainable loss is `small_units_dataset`'s: the projection keeps each dimension's noise."""
    d = SYNTHETIC_OBS_DIM
    if obs_dim < d:
        raise ValueError(f"synthetic-wide needs obs_dim >= {d}, got {obs_dim}")
    size = 4 * num_sequences * (length + 1) * obs_dim
    check_fits_in_memory(f"wide synthetic data of {num_sequences} sequences x {length} steps", size)
    data = small_units_dataset(num_sequences, length, seed, scale)
    basis, _ = np.linalg.qr(np.random.default_rng([seed, obs_dim]).normal(size=(obs_dim, d)))
    projection = (basis * np.sqrt(obs_dim / d)).astype(np.float32)  # obs_dim x d, orthogonal columns
    source = f"synthetic-wide(seed={seed}, obs_dim={obs_dim}, scale={scale:g}, no terminations)"
    return {**data, "obs": data["obs"] @ projection.T, "meta": {**data["meta"], "source": source}}
