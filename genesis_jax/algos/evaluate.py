"""A trained run put to use: `load` its policy, `evaluate` it over whole episodes.

`load(run_dir)` reads the newest checkpoint's metadata (the algorithm that wrote it and its
settings), builds that algorithm as its run did, restores the state through the run layer's
checks (`CheckpointStore.restore`: the checksum, the shapes and the values no run writes, so a
checkpoint that resume refuses is refused here in the same words) and asks the algorithm for
its acting function, the template's one hook for it:

    Algorithm.act(state, greedy=True) -> act(key, obs) -> actions

(PPO: the distribution's mode or a sample; DQN and PQN: argmax Q or epsilon-greedy at the
epsilon the run reached; SAC: tanh of the mean or a sample). An algorithm without it (the
world model) does not act, and its runs are refused in one line.

>>> import genesis_jax
>>> policy = genesis_jax.load("runs/ppo-cartpole")            # doctest: +SKIP
>>> policy(obs)                                               # doctest: +SKIP
>>> print(genesis_jax.evaluate(policy, episodes=10).line())   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.algos import REGISTRY, get_algorithm, loadable
from genesis_jax.envs.play import MAX_EPISODES
from genesis_jax.envs.spec import EnvSpec
from genesis_jax.envs.video import check_video_path, write_video
from genesis_jax.run.checkpoint import CheckpointMismatchError, CheckpointStore
from genesis_jax.run.run_dir import RunDirectory, RunDirectoryError
from genesis_jax.run.session import renamed_attribute

# What a config records that says where it ran, not what it learned: a policy runs on one device,
# in this process (how host environments ran: no subprocesses here).
_ONE_PROCESS = dict(devices=1, coordinator_address=None, num_processes=None, process_id=None, vectorization="sync")


def acting_algorithms() -> list[str]:
    """The registered algorithms that act, implement `act` (whose runs `load` and `genesis-jax eval` take)."""
    return [name for name, algorithm in loadable().items() if algorithm.act is not None]


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """A trained run's policy, as `load` returns it: call it on observations.

    `policy(obs)` -> actions, jitted: one observation (shape `spec.obs_shape`) gives one
    action, a batch [N, *obs_shape] gives N. A greedy policy needs no key; one that samples
    (`greedy=False`) takes it: `policy(obs, key)`. `policy.act(key, obs)` is the same on a
    batch alone, the form `genesis-jax collect` and `evaluate` act with."""

    algorithm: str  # the registry's name: "ppo", "dqn", "sac", "pqn"
    config: Any  # the run's config, as its checkpoint recorded it
    spec: EnvSpec  # the environment it acts in
    greedy: bool
    run_dir: str
    row: int  # the checkpoint's row: its update (PPO, PQN) or row (DQN, SAC)
    row_key: str  # the algorithm's name for a row: "update" or "row"
    env_steps: int  # environment steps trained up to that checkpoint (one seed's)
    precision: str  # the run's precision: what the policy computes in
    seed_index: int  # of a multi-seed run, the seed (0: the first, --seed itself)
    status: str  # "finished", or how the run ended (a stopped or unfinished run's newest checkpoint plays)
    state: Any = dataclasses.field(repr=False)  # the seed's restored training state
    act_with: Callable = dataclasses.field(repr=False)  # jitted (state, key, obs) -> actions

    @property
    def seed(self) -> int:
        """The training seed of the seed played (seed k of an N-seed run is --seed + k)."""
        return self.config.seed + self.seed_index

    position = renamed_attribute("Policy", "position", "row")
    position_key = renamed_attribute("Policy", "position_key", "row_key")

    def act(self, key, obs):
        """Actions for a batch of observations [N, *obs_shape]."""
        return self.act_with(self.state, key, obs)

    def __call__(self, obs, key=None):
        obs = jnp.asarray(obs)
        shape = tuple(self.spec.obs_shape)
        single = obs.shape == shape
        if not single and obs.shape[1:] != shape:
            raise ValueError(
                f"observations of {self.spec.env_id} have shape {shape} (or [N, *{shape}]), got {obs.shape}"
            )
        if key is None:
            if not self.greedy:
                raise ValueError("a policy loaded with greedy=False samples: give it a key, policy(obs, key)")
            key = jax.random.PRNGKey(0)  # unused by a greedy policy
        if not _one_key(key):  # JAX's own error came from deep inside the sampling
            shown = f"{key.dtype}{list(key.shape)}" if hasattr(key, "shape") else type(key).__name__
            raise ValueError(f"the key is one jax.random.key(seed) or PRNGKey(seed) for the whole batch, got {shown}")
        actions = self.act(key, obs[None] if single else obs)
        return actions[0] if single else actions

    def describe(self) -> str:
        """'PPO CartPole-v1 [fp16] greedy, checkpoint at update 244 (499712 steps)'."""
        how = "greedy" if self.greedy else "as trained"
        seed = f", the run's seed {self.seed} (index {self.seed_index})" if self.config.num_seeds > 1 else ""
        return (
            f"{self.algorithm.upper()} {self.spec.env_id} [{self.precision}] {how}{seed}, checkpoint at "
            f"{self.row_key} {self.row} ({self.env_steps} steps)"
        )


def _one_key(key) -> bool:
    """Whether `key` is one PRNG key: typed (jax.random.key) or raw (PRNGKey: uint32[2])."""
    dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return shape == ()
    return dtype == jnp.uint32 and shape == jax.random.PRNGKey(0).shape  # (2,); (4,) under the rbg implementation


def _status(reader: RunDirectory, row: int, newest: int, total: int, key: str) -> str:
    """How the run ended, from its summary, and where the checkpoint played stands in it."""
    summary = reader.read_summary()
    if summary is None:
        ended = "unfinished (no summary.json: killed, or still running)"
    elif isinstance(summary.get("iterations"), int) and summary["iterations"] < newest:
        # a resume writes its summary as it ends: this one is an earlier session's
        earlier = f"summary.json is of an earlier session, which ended at {key} {summary['iterations']}"
        ended = f"unfinished ({earlier}: killed, or still running)"
    elif not summary:
        ended = "of unknown end (summary.json cannot be read)"
    else:
        stopped = summary.get("stopped")
        how = {None: "finished", "diverged": "stopped by the divergence guard", "failed": "failed"}
        ended = how.get(stopped, f"stopped by {stopped}")
    if row < total:
        ended += f": its checkpoint at {key} {row} of {total} plays"
    return ended


def _config(algorithm, meta: dict, row: int, directory: str):
    fields = {f.name for f in dataclasses.fields(algorithm.config_class) if f.init}
    values = {k: v for k, v in {**(meta.get("config") or {}), **_ONE_PROCESS}.items() if k in fields}
    try:
        return algorithm.config_class(**values)
    except (TypeError, ValueError) as err:
        raise CheckpointMismatchError(
            f"checkpoint at step {row} in {directory} records settings this version refuses: {err}"
        ) from None


def load(
    run_dir, greedy: bool = True, *, seed_index: int = 0, step: int | None = None, allow_unverified: bool = False
) -> Policy:
    """The policy of a run of an algorithm that acts (PPO, DQN, SAC, PQN), from its newest
    checkpoint (or the one at `step`, in the run's rows: its updates for PPO and PQN).

    Args:
        run_dir: the run directory (`--out` of `genesis-jax train`).
        greedy: act greedily (PPO: the most likely action; DQN, PQN: argmax Q; SAC: tanh of
            the mean); False: as in training (a sample; epsilon-greedy at the run's last epsilon).
        seed_index: of a run of several seeds, which one (0: the first).
        step: the checkpoint to load (default: the newest).
        allow_unverified: load a checkpoint without a checksum (refused otherwise).

    Returns:
        a `Policy`: `policy(obs) -> action`, jitted, in the run's precision.

    Raises (each in one sentence; the CLI: exit 2):
        FileNotFoundError: no such directory.
        RunDirectoryError: a directory without a checkpoint (no run, or one that saved none).
        CheckpointMismatchError: a corrupted or altered checkpoint (as resume refuses it), or
            one genesis-jax's algorithms did not write.
        ValueError: a run of an algorithm that does not act (the world model), a seed index
            or step the run does not have.
    """
    path = pathlib.Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"no run directory {run_dir}")
    if not path.is_dir():
        raise RunDirectoryError(f"{run_dir} is not a directory")
    reader = RunDirectory.__new__(RunDirectory)  # one that only reads (its constructor checks for a run to write)
    reader.path = path
    if not any((path / name).exists() for name in ("checkpoints", "metrics.jsonl", "summary.json")):
        raise RunDirectoryError(f"{run_dir} holds no run (no checkpoints/, metrics.jsonl or summary.json)")
    if not reader.checkpoints.is_dir():
        raise RunDirectoryError(f"{run_dir} holds {reader.contents()} but no checkpoint: there is no policy to load")
    with CheckpointStore(reader.checkpoints, async_save=False) as store:
        steps = store.all_steps()
        if not steps:
            raise RunDirectoryError(
                f"{run_dir} holds {reader.contents()} but no complete checkpoint: there is no policy to load"
            )
        integer = isinstance(step, (int, np.integer)) and not isinstance(step, bool)
        if step is not None and not (integer and step in steps):  # 2.0 == 2, but names no checkpoint
            what = step if integer else f"{step!r} (a {type(step).__name__}, not an int)"
            raise ValueError(f"{run_dir} has no checkpoint at {what}; it has {', '.join(map(str, steps))}")
        row = steps[-1] if step is None else int(step)
        meta = store.read_meta(row)
        kind = meta.get("kind")
        if kind not in REGISTRY:
            raise CheckpointMismatchError(
                f"checkpoint at step {row} in {store.directory} comes from a {kind or 'unknown'} run, not one of "
                f"genesis-jax's algorithms: policies load from runs of {', '.join(acting_algorithms())}"
            )
        algorithm = get_algorithm(kind)
        if algorithm.act is None:
            raise ValueError(
                f"{run_dir} holds a {kind} run, which does not act in an environment: policies load from runs of "
                f"{', '.join(acting_algorithms())}"
            )
        config = _config(algorithm, meta, row, store.directory)
        num_seeds = getattr(config, "num_seeds", 1)
        if isinstance(seed_index, bool) or not isinstance(seed_index, int) or not 0 <= seed_index < num_seeds:
            raise ValueError(
                f"seed-index must be from 0 to {num_seeds - 1} (the run has {num_seeds}), got {seed_index}"
            )
        algo = algorithm(config, recorded=True)  # the run's networks and environment, as its run built them
        try:
            keys = algo.seed_keys()
            init = algo.init if num_seeds == 1 else (lambda keys: jax.lax.map(algo.init, keys))
            target = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(init, keys))
            state, meta = store.restore(
                target, row, kind, algorithm.train_state_path, allow_unverified=allow_unverified
            )
        finally:
            algo.close()
    if num_seeds > 1:
        state = jax.tree.map(lambda x: x[seed_index], state)
    return Policy(
        algorithm=kind,
        config=config,
        spec=algo.spec,
        greedy=greedy,
        run_dir=str(run_dir),
        row=row,
        row_key=algorithm.row_key,
        env_steps=row * algo.steps_per_row,
        precision=meta.get("precision") or config.train_precision().name,
        seed_index=seed_index,
        status=_status(reader, row, steps[-1], algo.num_rows, algorithm.row_key),
        state=state,
        act_with=jax.jit(lambda state, key, obs: algo.act(state, greedy)(key, obs)),
    )


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Whole episodes a policy played: each one's return and length (its decisions)."""

    policy: Policy = dataclasses.field(repr=False)
    returns: list[float]
    lengths: list[int]
    seed: int
    backend: str  # where the episodes ran: gymnax, or gymnasium (an EnvPool run plays on gymnasium's ALE)
    video: str | None = None
    video_frames: int = 0

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """The returns' standard deviation (over the episodes, as Stable-Baselines3's `evaluate_policy`)."""
        return float(np.std(self.returns))

    def line(self) -> str:
        """The one line `genesis-jax eval` prints."""
        p, n = self.policy, len(self.returns)
        text = (
            f"{p.describe()}: mean return {self.mean:.2f} +/- {self.std:.2f} over {n} episode{'s' * (n != 1)} "
            f"(min {min(self.returns):.2f}, max {max(self.returns):.2f}, {np.mean(self.lengths):.1f} steps on "
            f"average; eval seed {self.seed})"
        )
        if p.status != "finished":
            text += f"; the run is {p.status}"
        if self.video:
            text += f"; wrote {self.video} ({self.video_frames} frames)"
        return text

    def to_dict(self) -> dict:
        """What `genesis-jax eval --json` prints."""
        p = self.policy
        return {
            "run_dir": p.run_dir,
            "algorithm": p.algorithm,
            "env": p.spec.env_id,
            "env_backend": self.backend,
            "precision": p.precision,
            "greedy": p.greedy,
            "checkpoint": {p.row_key: p.row, "step": p.env_steps},
            "seed_index": p.seed_index,
            "run_status": p.status,
            "eval_seed": self.seed,
            "episodes": len(self.returns),
            "mean_return": self.mean,
            "std_return": self.std,
            "min_return": float(min(self.returns)),
            "max_return": float(max(self.returns)),
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            "video": self.video,
            "video_frames": self.video_frames,
        }


def _integer_in(name: str, value, least: int, most: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        at_most = "" if most is None else f" (at most {most})"
        what = f"a positive integer{at_most}" if least == 1 else f"an integer from {least} to {most}"
        raise ValueError(f"{name} must be {what}, got {value!r}")


def check_eval_options(episodes: int, seed: int, video: str | None, video_frames: int) -> None:
    """Refuses, in one line, options `evaluate` cannot play with: `genesis-jax eval` asks
    before it reads a checkpoint."""
    _integer_in("episodes", episodes, 1, MAX_EPISODES)
    _integer_in("seed", seed, 0, 2**32 - 1)
    # At most a million frames where a video records them; without one they bound nothing.
    _integer_in("video-frames", video_frames, 1, 10**6 if video is not None else None)
    if video is not None:
        check_video_path(video)


def evaluate(
    policy: Policy, episodes: int = 10, seed: int = 0, video: str | None = None, video_frames: int = 1000
) -> Evaluation:
    """`episodes` whole episodes of `policy` in its run's environment (its time limit, its
    preprocessing), deterministic from `seed`: gymnax environments all together under one
    jit, gymnasium ones on the host one after another (`envs.play`). `video` (.gif or .mp4)
    records the first `video_frames` frames of them, where the environment renders (gymnax's
    renderers; gymnasium's rgb_array); elsewhere it is refused, in one line, before anything plays."""
    from genesis_jax.envs.play import check_renders, play_gymnasium, play_gymnax
    from genesis_jax.envs.registry import resolve_env

    check_eval_options(episodes, seed, video, video_frames)
    spec = policy.spec
    if spec.backend == "envpool":  # its Atari preprocessing is the gymnasium path's (envs.envpool_env)
        spec = dataclasses.replace(resolve_env(spec.env_id, "gymnasium"), obs_shape=spec.obs_shape)
    if video is not None:
        check_renders(spec)
    frames = 0 if video is None else video_frames
    if spec.backend == "gymnax":
        played = play_gymnax(spec, policy.act_with, policy.state, episodes, seed, frames)
    else:
        repeat = getattr(policy.config, "action_repeat", 1)
        played = play_gymnasium(spec, policy.act_with, policy.state, episodes, seed, repeat, frames)
    if video is not None:
        write_video(played.frames, video, played.fps)
    return Evaluation(
        policy, played.returns.tolist(), played.lengths.tolist(), seed, spec.backend, video, len(played.frames)
    )
