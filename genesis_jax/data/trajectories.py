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
import math
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.amp._checks import is_int
from genesis_jax.amp.loss_scale import INT32_MAX
from genesis_jax.envs.video import check_new_path, written_whole


def random_policy(spec, num_envs: int):
    if spec.continuous and not spec.bounded_actions:  # uniform(-inf, inf): NaN
        raise ValueError(
            f"a random policy draws its actions uniformly within the action bounds; {spec.env_id} has infinite ones"
        )

    def act(key, _obs):
        if spec.continuous:
            low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
            return jax.random.uniform(key, (num_envs, spec.action_dim), minval=low, maxval=high)
        return jax.random.randint(key, (num_envs,), 0, spec.action_dim)

    return jax.jit(act)


def collect_dataset(
    env_id: str,
    num_sequences=64,
    length=64,
    seed=0,
    backend=None,
    policy=None,
    policy_name="random policy",
    action_repeat=1,
) -> dict:
    """Trajectories from a gymnax (vmapped, under jit) or host (gymnasium, EnvPool) environment
    id, acting with a random policy or with `policy(key, obs) -> actions` (for all
    `num_sequences` environments at once), such as a trained agent's `act`, named `policy_name`;
    on host environments, each action repeated `action_repeat` times (a trained agent's own).

    Sequences run on across episode ends; `next_obs` holds each step's pre-reset observation,
    so every one-step target is right, and an episode end shows where it differs from the next `obs` (the
    world model's multi-step windows stop there).
    """
    from genesis_jax.envs.registry import resolve_env

    check_collect_args(env_id, num_sequences, length, seed)
    spec = resolve_env(env_id, backend)
    check_collect_args(env_id, num_sequences, length, seed, spec)  # the memory it needs, now the spaces are known
    if policy is None:
        policy, policy_name = random_policy(spec, num_sequences), "random policy"
    keys = jax.random.split(jax.random.PRNGKey(seed), length + 1)
    o, a, r, term, final = _rollout(spec, num_sequences, policy, keys, seed, action_repeat)  # [steps, sequences]
    columns = {"obs": np.concatenate([o, final[-1:]]), "next_obs": final, "action": a, "reward": r, "terminated": term}
    data = {k: v.swapaxes(0, 1) if k == "action" else v.swapaxes(0, 1).astype(np.float32) for k, v in columns.items()}
    repeat = f", action-repeat {action_repeat}" if action_repeat != 1 else ""
    source = f"{spec.backend}:{env_id}({policy_name}, seed={seed}{repeat})"
    return {**data, "meta": {"source": source, "discrete_actions": not spec.continuous, "action_dim": spec.action_dim}}


def _rollout(spec, num_envs: int, act, keys, seed: int, action_repeat: int = 1) -> tuple:
    """[steps, envs] (obs, action, reward, terminated, final_obs) of `act` in `spec`'s
    environments, one compiled scan (host environments stepped through `io_callback`)."""
    from genesis_jax.envs.in_loop import in_loop_env

    env, host = in_loop_env(spec, num_envs, seed, action_repeat=action_repeat), spec.backend != "gymnax"

    def step(carry, key):
        obs, state = carry
        k_act, k_env = (key, key) if host else jax.random.split(key)  # host envs: the policy has the key
        action = act(k_act, obs)
        next_obs, state, reward, terminated, _, final_obs = env.step(jax.random.split(k_env, num_envs), state, action)
        return (next_obs, state), (obs, action, reward, terminated, final_obs)

    rollout = jax.jit(lambda first, step_keys: jax.lax.scan(step, first, step_keys)[1])
    try:  # reset eagerly: a host environment computing with JAX (gymnasium's phys2d) cannot be traced
        return tuple(np.asarray(x) for x in rollout(env.reset(keys[0]), keys[1:]))
    finally:
        env.close()


def save_dataset(data: dict, path: str) -> None:
    """Writes `data` to `path` whole or not at all (`envs.video.written_whole`)."""
    with written_whole(path) as partial, open(partial, "wb") as f:
        np.savez_compressed(f, **{k: json.dumps(v) if k == "meta" else v for k, v in data.items()})


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
            if missing:  # a foreign file: not a dataset at all
                raise ValueError(f"it has no {', '.join(missing)}")
            try:
                meta = json.loads(str(f["meta"]))
            except ValueError:  # np.savez(meta={...}) pickles the dict, which is not loaded
                raise ValueError("its meta is not a dict's JSON text (write meta=json.dumps(meta))") from None
            data = {k: meta if k == "meta" else f[k] for k in f.files}
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
    part = lambda rows: {k: v if k == "meta" else v[rows] for k, v in data.items()}  # noqa: E731
    return part(slice(None, n - n_eval)), part(slice(n - n_eval, None))


# -- validation: one sentence naming the file, the key and what is wrong ---------------------

META_KEYS = {"source": str, "discrete_actions": bool, "action_dim": int}
_KIND_NAMES = {str: "a string", bool: "true or false", int: "an integer"}
# The float32 loss squares the prediction errors of obs, next_obs and reward: beyond
# sqrt(float32 max) ~ 1.8e19 a value's squared error is inf, and every step would be skipped.
SQUARED_ERROR_LIMIT = float(np.sqrt(np.finfo(np.float32).max))


class DatasetError(ValueError):
    """A trajectory dataset that cannot be trained on; the message names the file and the key."""


def _check_meta(meta) -> None:
    if not isinstance(meta, dict):
        raise DatasetError(f"meta must be a dict with {', '.join(META_KEYS)}, got a {type(meta).__name__}")
    for key, kind in META_KEYS.items():
        if key not in meta:
            raise DatasetError(f"meta has no {key} (it needs {', '.join(META_KEYS)})")
        if not isinstance(meta[key], kind) or (kind is int and isinstance(meta[key], bool)):
            raise DatasetError(f"meta {key} must be {_KIND_NAMES[kind]}, got {meta[key]!r}")
    if meta["action_dim"] < 1:
        raise DatasetError(f"meta action_dim must be >= 1, got {meta['action_dim']}")


def _check_shapes(arrays: dict, meta: dict) -> None:
    """Every array's shape against obs [N, T+1, D] and meta; obs is blamed where every per-step
    key agrees on a step count that it does not fit."""
    obs = arrays["obs"]
    if obs.ndim != 3 or obs.shape[0] < 2 or obs.shape[1] < 2 or obs.shape[2] < 1:
        raise DatasetError(
            f"obs must have shape [sequences, steps + 1, features] with at least 2 sequences (some are held "
            f"out for evaluation) of at least 2 observations, got {obs.shape}"
        )
    (n, t, d), per_step = (obs.shape[0], obs.shape[1] - 1, obs.shape[2]), [k for k in arrays if "obs" not in k]
    steps = {arrays[k].shape[1] for k in per_step if arrays[k].ndim >= 2}
    if len(steps) == 1 and t not in steps:
        raise DatasetError(
            f"obs has {t + 1} observations per sequence, but {', '.join(per_step)} have {min(steps)} steps: obs needs "
            f"{min(steps) + 1} (one more than steps: each step's next observation)"
        )
    continuous = (meta["action_dim"],) if not meta["discrete_actions"] else ()
    expected = {"action": (n, t, *continuous), "next_obs": (n, t, d)}
    for key, shape in ((k, x.shape) for k, x in arrays.items() if k != "obs"):
        want = expected.get(key, (n, t))
        if shape == want:
            continue
        if len(shape) >= 1 and shape[0] != n:
            raise DatasetError(f"{key} has {shape[0]} sequences, obs has {n}")
        if len(shape) >= 2 and shape[1] != t:
            raise DatasetError(
                f"{key} has {shape[1]} steps per sequence but obs has {t + 1} observations per sequence; "
                f"it needs one observation more than steps (each step's next one)"
            )
        last = {2: "", 3: ", action_dim" if key == "action" else ", features"}[len(want)]
        raise DatasetError(f"{key} must have shape [sequences, steps{last}] = {want}, got {shape}")


def _beyond(x: np.ndarray, limit: float) -> np.ndarray:
    """Where |x| > `limit`; none where `x`'s dtype cannot hold a finite value above it (float16
    data against float32's limits: the comparison would overflow the limit to inf, with a warning)."""
    if x.dtype.kind == "f" and limit >= float(np.finfo(x.dtype).max):
        return np.zeros(x.shape, bool)
    return np.abs(x) > limit


def _check_values(key: str, x: np.ndarray, meta: dict, input_limit: float, precision: str) -> None:
    """The first value of `x` each check refuses: where, how many, and why."""
    if key == "action" and meta["discrete_actions"]:
        if x.dtype.kind not in "iu":
            raise DatasetError(f"action must hold integers (meta says discrete actions), got dtype {x.dtype}")
        dim = meta["action_dim"]
        checks = [(True, lambda: (x < 0) | (x >= dim), f"actions must lie in [0, {dim}) (meta action_dim {dim})")]
    else:
        big = lambda limit: lambda: _beyond(x, limit)  # noqa: E731
        network = f"the network of a run in {precision} takes |x| <= {input_limit:g} (its compute dtype's maximum)"
        squared = f"the float32 squared error of a value beyond |x| = {SQUARED_ERROR_LIMIT:.3g} is infinite"
        checks = [
            (True, lambda: ~np.isfinite(x), "every value must be finite"),
            (key == "terminated", lambda: (x < 0) | (x > 1), "termination flags must lie in [0, 1]"),
            (key == "floor", lambda: x < 0, "a loss floor is >= 0"),
            (key in ("obs", "action"), big(input_limit), network),  # the network's inputs, cast to its compute dtype
            (key in ("obs", "next_obs", "reward"), big(SQUARED_ERROR_LIMIT), squared),
        ]
    for applies, bad, problem in checks:
        if applies and (mask := bad()).any():
            where = f"at {[int(i) for i in np.argwhere(mask)[0]]} ({int(mask.sum())} of {mask.size} values)"
            raise DatasetError(f"{key} holds {x[mask][0]:g} {where}; {problem}")


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
        arrays = {k: np.asarray(v) for k, v in data.items() if k in DATASET_KEYS + OPTIONAL_KEYS and k != "meta"}
        for key, x in arrays.items():
            if x.dtype.kind not in "biuf":
                raise DatasetError(f"{key} must hold real numbers (integers, floats or booleans), got dtype {x.dtype}")
        _check_shapes(arrays, data["meta"])
        for key, x in arrays.items():
            _check_values(key, x, data["meta"], float(jnp.finfo(compute_dtype).max), precision)
    except DatasetError as err:
        raise DatasetError(f"{source}: {err}") from None


# -- collect: its arguments and its output, checked before anything is collected -------------

SEED_MAX = 2**32 - 1  # jax.random.PRNGKey keeps a seed's low 32 bits
PEAK_COPIES = 3  # collection holds the arrays about three times: the rollout, the host copy, the saved layout


def dataset_bytes(num_sequences: int, length: int, obs_dim: int, action_dim: int, continuous: bool) -> int:
    """Bytes of a collected dataset's arrays: obs and next_obs (float32, obs_dim each), the
    actions (float32 action_dim, or one int32), reward and terminated (float32)."""
    return num_sequences * (length + 1) * 4 * (2 * obs_dim + (action_dim if continuous else 1) + 2)


def host_memory_bytes() -> int | None:
    """The host memory a new allocation can have (Linux's MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_collect_args(env_id: str, num_sequences, length, seed, spec=None) -> None:
    """Refuses, before anything is collected, sizes that are not positive integers, a seed a
    PRNG key does not hold, and (given the environment's `spec`) a dataset that would not fit
    in the host memory available now (`check_fits_in_memory`)."""
    for name, value in (("num-sequences", num_sequences), ("sequence-length", length)):
        if not (is_int(value) and 1 <= value < INT32_MAX):
            raise ValueError(f"{name} must be a positive integer (below 2^31-1: JAX's int32 shapes), got {value!r}")
    if not (is_int(seed) and 0 <= seed <= SEED_MAX):
        raise ValueError(f"seed must be an integer from 0 to {SEED_MAX} (2^32-1), got {seed!r}")
    if spec is not None:
        if len(spec.obs_shape) != 1:  # the dataset's obs are [sequences, steps + 1, features]
            raise ValueError(
                f"a dataset holds vector observations (the world model's); {env_id}'s are {list(spec.obs_shape)}"
            )
        size = dataset_bytes(num_sequences, length, math.prod(spec.obs_shape), spec.action_dim, spec.continuous)
        check_fits_in_memory(f"collecting {num_sequences} sequences x {length} steps of {env_id}", size)


def check_fits_in_memory(what: str, dataset_size: int) -> None:
    """Refuses `what` when a dataset of `dataset_size` bytes, held about `PEAK_COPIES` times
    while it is made, would not fit in the host memory available now (rather than let the
    allocation abort the process)."""
    need, have = PEAK_COPIES * dataset_size, host_memory_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"{what} needs about {need / 2**30:.1f} GiB of memory (a {dataset_size / 2**30:.1f} GiB dataset, "
            f"held about {PEAK_COPIES} times), but {have / 2**30:.1f} GiB is available; use fewer or shorter sequences"
        )


def check_output_path(path: str) -> None:
    """Refuses, before anything is collected, an output path that is not a new .npz in an
    existing directory this process can write to (FileNotFoundError for a missing directory,
    an OSError such as PermissionError for one it cannot write)."""
    check_new_path(path, "dataset", (".npz",))
    directory = os.path.dirname(os.path.abspath(path))
    try:  # a real write: permission bits say nothing to root, nor about a read-only file system
        tempfile.TemporaryFile(dir=directory, prefix=".genesis-jax-write-check-").close()
    except OSError as err:
        raise OSError(err.errno, f"cannot write to {directory} ({err.strerror})", path) from None
