"""Trajectory datasets: the `.npz` files `genesis-jax collect` writes and a world model trains on.

A dataset is a dict of numpy arrays over sequences: obs [N, T+1, D], action [N, T] (int)
or [N, T, A], reward [N, T], terminated [N, T] (float 0/1), next_obs [N, T, D] for collected
data (the pre-reset observations), floor [N, T] where the true model is known (each step's
attainable loss), and `meta` (a dict: source, discrete_actions, action_dim). Sequences, not
transitions, so that the same data serves one-step and multi-step (open-loop) training.

Here: collecting them from an environment (`collect_dataset`), writing and reading them
(`save_dataset`, `load_dataset`), checking them (`validate_dataset`) and the sizes and paths
before anything is collected; `split` holds sequences out for evaluation. The world model's
synthetic datasets (a known true model) are in `genesis_jax.algos.world_model.data`.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from genesis_jax.amp.loss_scale import INT32_MAX


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

    check_collect_args(env_id, num_sequences, length, seed)
    backend = resolve_backend(env_id, backend)
    spec = resolve_env(env_id, backend)
    check_collect_args(env_id, num_sequences, length, seed, spec)  # the memory it needs, now the spaces are known
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
    """Writes `data` to `path` whole or not at all: into a temporary file beside it, then renamed."""
    arrays = {k: v for k, v in data.items() if k != "meta"}
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "xb") as f:
            np.savez_compressed(f, meta=json.dumps(data["meta"]), **arrays)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise


DATASET_KEYS = ("obs", "action", "reward", "terminated", "meta")
OPTIONAL_KEYS = ("next_obs", "floor")


def load_dataset(path: str) -> dict:
    """A dataset written by `save_dataset` (`genesis-jax collect`); anything else (an empty,
    truncated or foreign file, or one `validate_dataset` refuses) is refused with one sentence."""
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
    validate_dataset(data, path)
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


# -- validation: one sentence naming the file, the key and what is wrong ---------------------

META_KEYS = {"source": str, "discrete_actions": bool, "action_dim": int}
_KIND_NAMES = {str: "a string", bool: "true or false", int: "an integer"}
# The float32 loss squares the prediction errors of obs, next_obs and reward: beyond
# sqrt(float32 max) ~ 1.8e19 a value's squared error is inf, and every step would be skipped.
SQUARED_ERROR_LIMIT = float(np.sqrt(np.finfo(np.float32).max))
_NETWORK_INPUTS = ("obs", "action")  # cast to the compute dtype by the first layers (next_obs: a target)
_SQUARED_TARGETS = ("obs", "next_obs", "reward")


class DatasetError(ValueError):
    """A trajectory dataset that cannot be trained on; the message names the file and the key."""


def _where(mask: np.ndarray) -> str:
    """The first index where `mask` holds, and how many places it holds at."""
    first = tuple(int(i) for i in np.argwhere(mask)[0])
    return f"at {list(first)} ({int(mask.sum())} of {mask.size} values)"


def _check_meta(meta) -> None:
    if not isinstance(meta, dict):
        raise DatasetError(f"meta must be a dict with {', '.join(META_KEYS)}, got a {type(meta).__name__}")
    for key, kind in META_KEYS.items():
        if key not in meta:
            raise DatasetError(f"meta has no {key} (it needs {', '.join(META_KEYS)})")
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise DatasetError(f"meta {key} must be {_KIND_NAMES[kind]}, got {value!r}")
    if meta["action_dim"] < 1:
        raise DatasetError(f"meta action_dim must be >= 1, got {meta['action_dim']}")


def _expected_shapes(obs: np.ndarray, meta: dict) -> dict[str, tuple]:
    """Each array's shape from obs [N, T+1, D] and meta: what the other keys must match."""
    if obs.ndim != 3 or obs.shape[0] < 2 or obs.shape[1] < 2 or obs.shape[2] < 1:
        raise DatasetError(
            f"obs must have shape [sequences, steps + 1, features] with at least 2 sequences (some are held "
            f"out for evaluation) of at least 2 observations, got {obs.shape}"
        )
    n, t, d = obs.shape[0], obs.shape[1] - 1, obs.shape[2]
    action = (n, t) if meta["discrete_actions"] else (n, t, meta["action_dim"])
    return {"action": action, "reward": (n, t), "terminated": (n, t), "next_obs": (n, t, d), "floor": (n, t)}


_SHAPE_LABELS = {
    "action": "[sequences, steps, action_dim]",
    "next_obs": "[sequences, steps, features]",
    "reward": "[sequences, steps]",
    "terminated": "[sequences, steps]",
    "floor": "[sequences, steps]",
}


def _shape_problem(key: str, shape: tuple, expected: tuple) -> str:
    n, t = expected[:2]
    if len(shape) >= 1 and shape[0] != n:
        return f"{key} has {shape[0]} sequences, obs has {n}"
    if len(shape) >= 2 and shape[1] != t:
        return (
            f"{key} has {shape[1]} steps per sequence but obs has {t + 1} observations per sequence; "
            f"it needs one observation more than steps (each step's next one)"
        )
    label = "[sequences, steps]" if len(expected) == 2 else _SHAPE_LABELS[key]
    return f"{key} must have shape {label} = {expected}, got {shape}"


def _check_obs_length(arrays: dict, obs_steps: int) -> None:
    """Blames obs when every per-step key agrees on a step count that obs does not fit."""
    steps = {x.shape[1] for key, x in arrays.items() if key not in ("obs", "next_obs") and x.ndim >= 2}
    if len(steps) == 1 and obs_steps not in steps:
        (t,) = steps
        keys = ", ".join(k for k in arrays if k not in ("obs", "next_obs"))
        raise DatasetError(
            f"obs has {obs_steps + 1} observations per sequence, but {keys} have {t} steps: obs needs {t + 1} "
            f"(one more than steps: each step's next observation)"
        )


def _first_bad(key: str, x: np.ndarray, bad: np.ndarray, problem: str) -> DatasetError:
    """The error for `x`'s values where `bad` holds: the first one, where, how many, and why."""
    return DatasetError(f"{key} holds {x[bad][0]:g} {_where(bad)}; {problem}")


def _check_values(key: str, x: np.ndarray, meta: dict, input_limit: float, precision: str) -> None:
    if key == "action" and meta["discrete_actions"]:
        if x.dtype.kind not in "iu":
            raise DatasetError(f"action must hold integers (meta says discrete actions), got dtype {x.dtype}")
        dim = meta["action_dim"]
        if x.min() < 0 or x.max() >= dim:
            raise _first_bad(key, x, (x < 0) | (x >= dim), f"actions must lie in [0, {dim}) (meta action_dim {dim})")
        return
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise _first_bad(key, x, ~np.isfinite(x), "every value must be finite")
    low, high = x.min(), x.max()
    if key == "terminated" and (low < 0 or high > 1):
        raise _first_bad(key, x, (x < 0) | (x > 1), "termination flags must lie in [0, 1]")
    if key == "floor" and low < 0:
        raise _first_bad(key, x, x < 0, "a loss floor is >= 0")
    largest = max(abs(float(low)), abs(float(high)))
    if key in _NETWORK_INPUTS and largest > input_limit:
        raise _first_bad(
            key,
            x,
            np.abs(x) > input_limit,
            f"the network of a run in {precision} takes |x| <= {input_limit:g} (its compute dtype's largest value)",
        )
    if key in _SQUARED_TARGETS and largest > SQUARED_ERROR_LIMIT:
        raise _first_bad(
            key,
            x,
            np.abs(x) > SQUARED_ERROR_LIMIT,
            f"the float32 squared error of a value beyond |x| = {SQUARED_ERROR_LIMIT:.3g} is infinite",
        )


def validate_dataset(data: dict, source: str, compute_dtype=np.float32, precision: str = "fp32") -> None:
    """Refuses, in one sentence naming `source` (the file), the key and what is wrong, a dataset
    the world model cannot train on: meta not a dict with source, discrete_actions and
    action_dim; a missing key; arrays not numeric, of the wrong shape or of sequence counts
    and lengths that disagree (obs [N, T+1, D]; action [N, T] integers in [0, action_dim) or
    [N, T, action_dim]; reward and terminated [N, T]; next_obs [N, T, D]; floor [N, T]); values
    not finite, terminated outside [0, 1], a negative floor; network inputs (obs, continuous
    actions) beyond what `compute_dtype` holds (float16: 65504), and obs, next_obs or reward
    beyond sqrt(float32 max), whose squared error is infinite. Either would make every step's
    gradients non-finite: the run would skip them all. Training holds sequences out for
    evaluation, so there must be at least 2.

    Raises:
        DatasetError: a ValueError; its message names `source`, the key and what is wrong.
    """
    try:
        missing = [k for k in DATASET_KEYS if k not in data]
        if missing:
            raise DatasetError(f"it has no {', '.join(missing)} (a dataset needs {', '.join(DATASET_KEYS)})")
        _check_meta(data["meta"])
        arrays = {
            k: np.asarray(v) for k, v in data.items() if k != "meta" and (k in DATASET_KEYS or k in OPTIONAL_KEYS)
        }
        for key, x in arrays.items():
            if x.dtype.kind not in "biuf":
                raise DatasetError(f"{key} must hold real numbers (integers, floats or booleans), got dtype {x.dtype}")
        expected = _expected_shapes(arrays["obs"], data["meta"])
        _check_obs_length(arrays, expected["reward"][1])
        for key, x in arrays.items():
            if key != "obs" and x.shape != expected[key]:
                raise DatasetError(_shape_problem(key, x.shape, expected[key]))
        input_limit = float(np.finfo(np.float32).max)
        if np.dtype(compute_dtype).itemsize < 4:
            import jax.numpy as jnp

            input_limit = float(jnp.finfo(compute_dtype).max)
        for key, x in arrays.items():
            _check_values(key, x, data["meta"], input_limit, precision)
    except DatasetError as err:
        raise DatasetError(f"{source}: {err}") from None


# -- collect: its arguments and its output, checked before anything is collected -------------

SEED_MAX = 2**32 - 1  # jax.random.PRNGKey keeps a seed's low 32 bits
PEAK_COPIES = 3  # collection holds the arrays about three times: the rollout, the host copy, the saved layout


def dataset_bytes(num_sequences: int, length: int, obs_dim: int, action_dim: int, continuous: bool) -> int:
    """Bytes of a collected dataset's arrays: obs and next_obs (float32, obs_dim each), the
    actions (float32 action_dim, or one int32), reward and terminated (float32)."""
    per_step = 4 * (2 * obs_dim + (action_dim if continuous else 1) + 2)
    return num_sequences * (length + 1) * per_step


def available_memory_bytes() -> int | None:
    """The host memory a new allocation can have (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_collect_args(env_id: str, num_sequences, length, seed, spec=None) -> None:
    """Refuses, before anything is collected, sizes that are not positive integers, a seed a
    PRNG key does not hold, and a dataset whose arrays (held about `PEAK_COPIES` times while
    collecting) would not fit in the host memory available now."""
    for name, value in (("num-sequences", num_sequences), ("sequence-length", length)):
        if (
            isinstance(value, (bool, np.bool_))
            or not isinstance(value, (int, np.integer))
            or not 1 <= value < INT32_MAX
        ):
            raise ValueError(f"{name} must be a positive integer (below 2^31-1: JAX's int32 shapes), got {value!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= SEED_MAX:
        raise ValueError(f"seed must be an integer from 0 to {SEED_MAX} (2^32-1), got {seed!r}")
    if spec is None:
        return
    size = dataset_bytes(num_sequences, length, spec.obs_dim, spec.action_dim, spec.continuous)
    check_fits_in_memory(f"collecting {num_sequences} sequences x {length} steps of {env_id}", size)


def check_fits_in_memory(what: str, dataset_size: int) -> None:
    """Refuses `what` when a dataset of `dataset_size` bytes, held about `PEAK_COPIES` times
    while it is made, would not fit in the host memory available now (rather than let the
    allocation abort the process)."""
    need, have = PEAK_COPIES * dataset_size, available_memory_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"{what} needs about {need / 2**30:.1f} GiB of memory (a {dataset_size / 2**30:.1f} GiB dataset, "
            f"held about {PEAK_COPIES} times), but {have / 2**30:.1f} GiB is available; use fewer or shorter sequences"
        )


def check_output_path(path: str) -> None:
    """Refuses, before anything is collected, an output path that is not a new .npz in an
    existing directory this process can write to (FileNotFoundError for a missing directory,
    an OSError such as PermissionError for one it cannot write)."""
    if not path.endswith(".npz"):
        raise ValueError(f"dataset path must end in .npz, got {path!r}")
    if os.path.exists(path):
        raise ValueError(f"{path} exists; choose another path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"the directory of {path} does not exist: create {directory} first")
    try:  # a real write: permission bits say nothing to root, nor about a read-only file system
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".genesis-jax-write-check-")
    except OSError as err:
        raise OSError(err.errno, f"cannot write to {directory} ({err.strerror})", path) from None
    os.close(fd)
    os.remove(probe)
