"""Whole episodes played by a trained policy, for evaluation (`genesis-jax eval`).

`act(args, key, obs) -> actions` acts on a batch of observations as training gave them;
`args` (the trained state) is passed to it as an argument, not captured, so a compiled loop
does not bake the parameters into its program. Each episode runs to its own end (a
termination, or the environment's time limit):

- gymnax: one environment per episode, all stepped together under one `jit` for the time
  limit's steps (a `lax.scan`; an environment whose episode has ended is reset by gymnax and
  no longer counted), from `PRNGKey(seed)` drawn as PQN's greedy evaluation draws it;
- gymnasium: one environment on the host, one episode after another, from `reset(seed=seed)`,
  built as training builds it (Atari's preprocessing included). A return is the game's own,
  as Stable-Baselines3's `evaluate_policy` counts it: unclipped, over all lives (a
  `RecordEpisodeStatistics` innermost), not what the learner saw.

With `video_frames`, the first that many frames (RGB arrays) of the episodes, in order, are
returned as well, for `envs.video.write_video`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from genesis_jax.envs.spec import EnvSpec

# The gymnax environments `gymnax.visualize.Visualizer` draws (its `init` / `update`); the
# classic-control ones through gymnasium's renderer, which needs pygame. (PointRobot-misc is
# drawn through pyplot's current figure: left out.)
GYMNAX_CLASSIC_CONTROL = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
GYMNAX_RENDERED = GYMNAX_CLASSIC_CONTROL + tuple(
    "Catch-bsuite Asterix-MinAtar Breakout-MinAtar Freeway-MinAtar Seaquest-MinAtar SpaceInvaders-MinAtar "
    "Pong-misc MetaMaze-misc FourRooms-misc".split()
)


@dataclasses.dataclass(frozen=True)
class Played:
    """Each episode's return and length (the policy's decisions), and the video's frames."""

    returns: np.ndarray
    lengths: np.ndarray
    frames: list = dataclasses.field(default_factory=list)
    fps: int = 30


def offscreen_pygame() -> None:
    """Frames only, no window nor sound: pygame (gymnasium's classic-control renderer) is told
    so, unless the environment says otherwise; else it prints an error a frame on a server
    without a display or sound card."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def check_renders(spec: EnvSpec) -> None:
    """Refuses, in one line, a video of an environment that has no renderer here."""
    if spec.backend == "gymnax":
        if spec.env_id not in GYMNAX_RENDERED:
            raise ValueError(
                f"gymnax has no renderer for {spec.env_id}; it draws {', '.join(GYMNAX_RENDERED)}: "
                "leave out --video, or evaluate a run of one of those"
            )
        if spec.env_id in GYMNAX_CLASSIC_CONTROL and importlib.util.find_spec("pygame") is None:
            raise ImportError(
                f"a video of {spec.env_id} is drawn by gymnasium's classic-control renderer, which needs pygame: "
                "pip install 'gymnasium[classic-control]'"
            )


MAX_EPISODES = 100_000  # episodes played at once: one environment each


def play_gymnax(spec: EnvSpec, act: Callable, args: Any, episodes: int, seed: int, video_frames: int = 0) -> Played:
    """`episodes` episodes of the gymnax environment `spec`, one per environment, under one jit."""
    if spec.max_episode_steps is None:
        raise ValueError(f"{spec.env_id} has no time limit: its episodes cannot be played to their end under jit")
    recorded = min(episodes, video_frames)  # each episode gives at least one frame
    play = _gymnax_program(spec, act, episodes, recorded)
    total, length, running, (states, rewards) = play(args, jax.random.PRNGKey(seed))
    if np.any(np.asarray(running)):  # the time limit ends every episode: never, unless gymnax changes
        raise RuntimeError(f"{spec.env_id}: an episode outlived its time limit of {spec.max_episode_steps} steps")
    lengths = np.asarray(length, np.int64)
    frames = gymnax_frames(spec.env_id, states, np.asarray(rewards), lengths, video_frames) if video_frames else []
    fps = 20 if spec.env_id in GYMNAX_CLASSIC_CONTROL else 10
    return Played(np.asarray(total, np.float64), lengths, frames, fps)


@functools.lru_cache(maxsize=8)  # the same policy played again (another seed) compiles nothing
def _gymnax_program(spec: EnvSpec, act: Callable, episodes: int, recorded: int):
    """The jitted `play(args, key) -> (returns, lengths, still running, (the first `recorded`
    environments' states and rewards at each step))`, over the time limit's steps."""
    from genesis_jax.envs.gymnax_env import GymnaxVecEnv

    env, limit = GymnaxVecEnv(spec.env_id, episodes), spec.max_episode_steps

    def play(args, key):
        reset_key, key = jax.random.split(key)  # as PQN's `greedy_returns` draws its keys
        obs, env_state = env.reset(reset_key)
        act_keys = jax.random.split(jax.random.fold_in(key, 1), limit)

        def step(carry, keys):
            obs, env_state, total, length, running = carry
            env_key, act_key = keys
            action = act(args, act_key, obs)
            seen = jax.tree.map(lambda x: x[:recorded], env_state) if recorded else None
            obs, env_state, reward, ended, cut, _ = env.step(jax.random.split(env_key, episodes), env_state, action)
            total = total + jnp.where(running, reward, 0.0)
            length = length + running.astype(jnp.int32)
            return (obs, env_state, total, length, running & ~(ended | cut)), (seen, reward[:recorded])

        zeros = jnp.zeros(episodes, jnp.float32), jnp.zeros(episodes, jnp.int32), jnp.ones(episodes, bool)
        carry, seen = jax.lax.scan(step, (obs, env_state, *zeros), (jax.random.split(key, limit), act_keys))
        return (*carry[2:], seen)  # returns, lengths, still running, seen

    return jax.jit(play)


def gymnax_frames(env_id: str, states, rewards: np.ndarray, lengths: np.ndarray, limit: int) -> list[np.ndarray]:
    """RGB frames of the recorded episodes ([steps, episodes] states before each action), in
    order, at most `limit`, drawn by gymnax's `Visualizer` on a figure of its own (Agg: no
    display, and pyplot's state untouched); each titled with its episode, its step in it and the
    return once its action is taken."""
    from genesis_jax.envs.gymnax_env import import_gymnax

    gymnax = import_gymnax()
    from gymnax.visualize.visualizer import Visualizer
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    states = jax.tree.map(np.asarray, states)
    steps = [(t, e) for e, length in enumerate(lengths[: rewards.shape[1]]) for t in range(int(length))][:limit]
    picked = [jax.tree.map(lambda x: x[t, e], states) for t, e in steps]
    returns = [float(rewards[: t + 1, e].sum()) for t, e in steps]  # once this frame's action is taken
    env, params = gymnax.make(env_id)
    vis = Visualizer.__new__(Visualizer)  # its __init__ opens a pyplot figure
    vis.env, vis.env_params, vis.state_seq, vis.reward_seq = env, params, picked, returns
    vis.fig = Figure(figsize=(6, 5))
    canvas, vis.ax = FigureCanvasAgg(vis.fig), vis.fig.add_subplot()
    offscreen_pygame()
    vis.init()
    frames = []
    for t, (step, episode) in enumerate(steps):
        vis.update(t)
        # gymnax's title counts frames across episodes: each episode's own step and return
        vis.ax.set_title(f"{env_id}: episode {episode + 1}, step {step + 1}, return {returns[t]:g}")
        canvas.draw()
        frames.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    return frames


# The steps of a gymnasium episode that no time limit ends (a game of Atari's ends itself
# within 27,000), after which `play_gymnasium` refuses to wait for it for ever.
UNLIMITED_EPISODE_STEPS = 100_000


def play_gymnasium(spec: EnvSpec, act: Callable, args, episodes: int, seed: int, action_repeat=1, video_frames=0):
    """`episodes` episodes of the gymnasium environment `spec`, one after another on the host
    (`act`: jitted, it is called once a step)."""
    from genesis_jax.envs.gymnasium_env import in_action_space, make_env, observation_dtype

    if video_frames:
        offscreen_pygame()
    # As training builds it, with a `RecordEpisodeStatistics` innermost: the game's own return, at its own end.
    env = make_env(spec.env_id, action_repeat, "rgb_array" if video_frames else None, episode_stats=True)
    dtype, space = observation_dtype(spec), env.action_space
    returns, lengths, frames, steps, base_key = [], [], [], 0, jax.random.PRNGKey(seed)
    unlimited = env.spec is None or env.spec.max_episode_steps is None
    try:
        obs, _ = env.reset(seed=seed)
        while len(returns) < episodes:
            if len(frames) < video_frames:
                frames.append(np.asarray(env.render(), np.uint8))
            batch = np.asarray(obs, dtype).reshape(1, *spec.obs_shape)
            action = np.asarray(act(args, jax.random.fold_in(base_key, steps), batch))[0]
            action = in_action_space(action, spec, space, space.shape) if spec.continuous else int(action)
            obs, _, terminated, truncated, info = env.step(action)
            steps += 1
            if "episode" in info:  # the game's own end (for Atari: its last life)
                returns.append(float(np.asarray(info["episode"]["r"])))
                lengths.append(steps - sum(lengths))
            if terminated or truncated:  # the learner's episode (a life, for Atari)
                obs, _ = env.reset()
            elif unlimited and steps - sum(lengths) >= UNLIMITED_EPISODE_STEPS:
                raise ValueError(
                    f"{spec.env_id}: an episode ran {UNLIMITED_EPISODE_STEPS} steps without ending, and it has no "
                    "time limit: register it with one (gymnasium.register(..., max_episode_steps=N))"
                )
        fps = int(env.metadata.get("render_fps") or 30)
    finally:
        env.close()
    return Played(np.asarray(returns, np.float64), np.asarray(lengths, np.int64), frames, fps)
