"""`genesis-jax eval` and `genesis_jax.load`: every algorithm that acts has its trained policy
loaded and played over whole episodes; the returns are checked against the same episodes
played one step at a time by hand (and PQN's against its own greedy evaluation), videos are
written where the environment renders, and what cannot be played is refused in one line."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat

import jax
import numpy as np
import optax
import pytest

import genesis_jax
from genesis_jax import amp
from genesis_jax.algos import REGISTRY
from genesis_jax.algos.evaluate import acting_algorithms
from genesis_jax.cli import main
from genesis_jax.envs.gymnax_env import GymnaxVecEnv
from genesis_jax.envs.video import write_video
from genesis_jax.run.checkpoint import CheckpointStore
from tests.support.files import one_line_error, snapshot
from tests.support.processes import cpu_env, run_python
from tests.support.registry import tiny_argv

ACTING = acting_algorithms()
# PQN's tiny run as test_pqn_greedy_return_is_each_seeds_own_greedy_evaluation needs it (2 seeds,
# each evaluated greedily after training): one PQN run serves both tests.
OVERRIDES = {"pqn": {"num_seeds": 2, "seed": 3, "eval_episodes": 32}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`trained(name, **overrides)`: the run directory of the algorithm's tiny fp16 run (trained once)."""
    root, runs = tmp_path_factory.mktemp("runs"), {}

    def train(name: str, **overrides) -> pathlib.Path:
        key = (name, *sorted(overrides.items()))
        if key not in runs:
            out = root / f"{name}-{len(runs)}"
            argv = ["train", name, *tiny_argv(name, precision="fp16", **overrides), "--quiet", "--out", str(out)]
            assert main(argv) == 0
            runs[key] = out
        return runs[key]

    return train


def eval_json(capsys, run, *options) -> dict:
    capsys.readouterr()
    assert main(["eval", str(run), "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)


def played_by_hand(policy, episodes: int, seed: int):
    """The episodes `genesis-jax eval` plays on gymnax, one vector step at a time in Python:
    the same keys (PQN's greedy evaluation's), the loaded policy called on each batch."""
    spec = policy.spec
    env = GymnaxVecEnv(spec.env_id, episodes)
    reset_key, key = jax.random.split(jax.random.PRNGKey(seed))
    obs, state = env.reset(reset_key)
    step = jax.jit(env.step)
    total, length, running = np.zeros(episodes), np.zeros(episodes, int), np.ones(episodes, bool)
    for env_key in jax.random.split(key, spec.max_episode_steps):
        if not running.any():
            break
        obs, state, reward, terminated, truncated, _ = step(jax.random.split(env_key, episodes), state, policy(obs))
        total += np.where(running, np.asarray(reward, np.float64), 0.0)
        length += running
        running &= ~np.asarray(terminated | truncated)
    return total, length


def test_every_registered_algorithm_but_the_world_model_acts():
    assert set(ACTING) == set(REGISTRY) - {"world-model"}


@pytest.mark.slow  # a tiny fp16 run of each, then its evaluation: about 15 s each on 2 cores
@pytest.mark.parametrize("name", ACTING)
def test_eval_plays_whole_episodes_of_every_algorithm_that_acts(trained, capsys, name):
    run = trained(name, **OVERRIDES.get(name, {}))
    result = eval_json(capsys, run, "--episodes", "3", "--seed", "5")
    assert result["algorithm"] == name and result["precision"] == "fp16" and result["greedy"]
    assert result["episodes"] == len(result["returns"]) == len(result["lengths"]) == 3
    assert result["run_status"] == "finished" and result["env_backend"] == "gymnax"
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    assert result["std_return"] == pytest.approx(np.std(result["returns"]))

    policy = genesis_jax.load(run)
    assert (policy.algorithm, policy.precision, policy.greedy) == (name, "fp16", True)
    returns, lengths = played_by_hand(policy, 3, seed=5)
    assert result["returns"] == pytest.approx(returns.tolist(), rel=1e-5)
    assert result["lengths"] == lengths.tolist()
    assert all(1 <= n <= policy.spec.max_episode_steps for n in lengths)

    # One observation gives one action, a batch one each: the same.
    obs = GymnaxVecEnv(policy.spec.env_id, 4).reset(jax.random.PRNGKey(1))[0]
    assert np.allclose(np.asarray(policy(obs[2])), np.asarray(policy(obs))[2])

    # As trained (a sample, or epsilon-greedy): the same number of whole episodes.
    sampled = eval_json(capsys, run, "--episodes", "2", "--stochastic")
    assert not sampled["greedy"] and len(sampled["returns"]) == 2
    stochastic = genesis_jax.load(run, greedy=False)  # one key, typed or raw; a seed or a key a row: refused
    typed, raw = stochastic(obs, jax.random.key(3)), stochastic(obs, jax.random.PRNGKey(3))
    assert np.shape(typed) == np.shape(raw) == np.shape(policy(obs)) and len(raw) == 4
    for key, shown in ((7, "int"), (jax.random.split(jax.random.PRNGKey(3), 4), "uint32[4, 2]")):
        with pytest.raises(ValueError) as refused:
            stochastic(obs, key)
        assert (
            str(refused.value)
            == f"the key is one jax.random.key(seed) or PRNGKey(seed) for the whole batch, got {shown}"
        )


@pytest.mark.slow  # tiny PPO runs: fp32 and bf16 in this process, fp16 on 4 devices in another: about 45 s
@pytest.mark.parametrize("precision, devices", [("fp32", 1), ("bf16", 1), ("fp16", 4)])
def test_a_run_of_any_precision_and_device_count_plays(tmp_path, capsys, precision, devices):
    """Runs in fp32 (the default) and bf16 failed to load: their fixed scaler was checked against
    `load`'s template of zeros. A run on 4 devices failed as corrupted: Orbax took the saved
    4-device sharding, which the evaluating process, on one, does not have."""
    out = tmp_path / "run"
    argv = ["train", "ppo", *tiny_argv("ppo", precision=precision, num_envs=4), "--quiet", "--out", str(out)]
    if devices == 1:
        assert main(argv) == 0
    else:
        done = run_python(["-m", "genesis_jax.cli", *argv, "--devices", str(devices)], cpu_env(host_devices=devices))
        assert done.returncode == 0, done.stderr[-2000:]
    result = eval_json(capsys, out, "--episodes", "2")
    assert (result["precision"], result["episodes"], result["run_status"]) == (precision, 2, "finished")
    assert genesis_jax.load(out).precision == precision


@pytest.mark.slow  # the tiny PQN run of 2 seeds (shared), each seed's evaluation over 32 episodes
def test_pqn_greedy_return_is_each_seeds_own_greedy_evaluation(trained, capsys):
    run = trained("pqn", **OVERRIDES["pqn"])
    summary = json.loads((run / "summary.json").read_text())
    for index, expected in enumerate(summary["eval_return_per_seed"]):  # seed k evaluated from seed + k
        result = eval_json(capsys, run, "--episodes", "32", "--seed", str(3 + index), "--seed-index", str(index))
        assert result["seed_index"] == index and result["mean_return"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # the tiny PQN run of 2 seeds (shared), and what each seed collects
def test_collect_plays_the_seed_it_is_asked_for_and_says_which(trained, capsys, tmp_path):
    """A run of several seeds collected with seed 0 alone, and the dataset did not say."""
    run = trained("pqn", **OVERRIDES["pqn"])
    sources, collected = [], []
    for index in (0, 1):
        out = tmp_path / f"seed{index}.npz"
        argv = ["collect", "--env", "CartPole-v1", "--policy", str(run), "--seed-index", str(index)]
        assert main([*argv, "--num-sequences", "4", "--sequence-length", "8", "--out", str(out)]) == 0
        data = np.load(out)
        sources.append(json.loads(str(data["meta"]))["source"])
        collected.append(data["action"])
    assert [s.split(", the run's seed ")[1].split(",")[0] for s in sources] == ["3", "4"]  # --seed 3: seeds 3, 4
    assert not np.array_equal(*collected)  # each seed's own policy acted
    out = tmp_path / "random.npz"
    assert main(["collect", "--env", "CartPole-v1", "--seed-index", "1", "--out", str(out)]) == 2
    assert "a random policy has none" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow  # a tiny PQN run on MinAtar Breakout, 4 frames drawn by gymnax's renderer
def test_a_video_of_a_gymnax_environment(trained, capsys, tmp_path):
    from PIL import Image

    run = trained("pqn", env="Breakout-MinAtar", network="mlp")
    video = tmp_path / "breakout.gif"
    result = eval_json(capsys, run, "--episodes", "2", "--video", str(video), "--video-frames", "4")
    assert result["video"] == str(video) and result["video_frames"] == 4
    with Image.open(video) as gif:
        assert gif.n_frames == 4 and gif.size == (600, 500)
    assert main(["eval", str(run), "--video", str(video)]) == 2  # never overwritten
    assert "exists" in one_line_error(capsys)


@pytest.mark.slow  # the tiny PPO run (shared), 3 frames
def test_a_video_of_cartpole_needs_pygame_and_says_so(trained, capsys, tmp_path):
    import importlib.util

    run, video = trained("ppo"), tmp_path / "cartpole.gif"
    if importlib.util.find_spec("pygame") is None:
        assert main(["eval", str(run), "--video", str(video)]) == 2
        assert "needs pygame: pip install 'gymnasium[classic-control]'" in one_line_error(capsys)
        assert not video.exists()
        return
    from PIL import Image

    result = eval_json(capsys, run, "--episodes", "1", "--video", str(video), "--video-frames", "3")
    assert result["video_frames"] == 3
    with Image.open(video) as gif:
        assert gif.n_frames == 3


@pytest.mark.slow  # a tiny PPO run on Atari Breakout (gymnasium, ale-py), one game, 3 frames: about 20 s
def test_a_video_of_a_gymnasium_environment_and_the_games_own_return(trained, capsys, tmp_path):
    pytest.importorskip("ale_py", reason="Atari needs ale-py (pip install -e '.[atari]')")
    from PIL import Image

    run = trained("ppo", env="ALE/Breakout-v5", network="mlp", num_envs=2, num_steps=16, total_steps=32)
    video = tmp_path / "breakout.gif"
    result = eval_json(capsys, run, "--episodes", "1", "--video", str(video), "--video-frames", "3")
    assert result["env_backend"] == "gymnasium" and len(result["returns"]) == 1
    with Image.open(video) as gif:
        assert gif.n_frames == 3 and gif.size == (160, 210)  # ALE's own screen
    # One game is all its lives (the learner's episodes end at each): more steps than one life lasts.
    assert result["lengths"][0] > 50


def test_video_files_are_written_whole(tmp_path):
    from PIL import Image

    frames = [np.full((8, 6, 3), 40 * i, np.uint8) for i in range(5)]
    write_video(frames, str(tmp_path / "v.gif"), fps=10)
    with Image.open(tmp_path / "v.gif") as gif:
        assert gif.n_frames == 5 and gif.size == (6, 8)
    umask = os.umask(0o022)  # a new file's mode, as any other file's: it was mkstemp's private 0600
    try:
        write_video(frames, str(tmp_path / "shared.gif"), fps=10)
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "shared.gif").stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".genesis-jax-partial-")]
    cv2 = pytest.importorskip("cv2")
    write_video(frames, str(tmp_path / "v.mp4"), fps=10)
    capture = cv2.VideoCapture(str(tmp_path / "v.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 5
    capture.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.gif", "v.gif", "v.mp4"]  # no temporary file left


def save_checkpoint(run: pathlib.Path, kind: str) -> None:
    state = amp.TrainState.create(params={"w": np.ones(3, np.float32)}, tx=optax.adam(1e-3), precision="fp32")
    with CheckpointStore(run / "checkpoints", async_save=False) as store:
        store.save(1, state, {"kind": kind}, force=True)


@pytest.mark.parametrize(
    "make, words",
    [
        (None, "no run directory"),
        (lambda run: run.mkdir(), "holds no run"),
        (lambda run: (run.mkdir(), (run / "metrics.jsonl").write_text('{"update": 1}\n')), "but no checkpoint"),
        (lambda run: (run.mkdir(), (run / "checkpoints").mkdir()), "no complete checkpoint"),
        (lambda run: save_checkpoint(run, "world-model"), "world-model run, which does not act"),
        (lambda run: save_checkpoint(run, "demo"), "comes from a demo run, not one of genesis-jax's algorithms"),
    ],
)
def test_what_cannot_be_played_is_refused_in_one_line(tmp_path, capsys, make, words):
    run = tmp_path / "run"
    if make is not None:
        make(run)
    before = snapshot(tmp_path)
    assert main(["eval", str(run)]) == 2
    assert words in one_line_error(capsys)
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # the tiny PPO run (shared), a resume attempt and evaluations of copies
def test_a_corrupted_checkpoint_is_refused_as_resume_refuses_it_and_a_stopped_run_still_plays(
    trained, capsys, tmp_path
):
    run = trained("ppo")
    bad = pathlib.Path(shutil.copytree(run, tmp_path / "bad"))
    alter_keeping_the_checksum(bad / "checkpoints")
    assert main(["eval", str(bad)]) == 2
    refused = one_line_error(capsys)
    assert "is corrupted: its content does not match the checksum" in refused
    resume = ["train", "ppo", *tiny_argv("ppo", precision="fp16", total_steps=512), "--quiet", "--resume"]
    assert main(resume + ["--out", str(bad)]) == 2
    assert one_line_error(capsys) == refused  # resume's own words

    stopped = pathlib.Path(shutil.copytree(run, tmp_path / "stopped"))
    summary = json.loads((stopped / "summary.json").read_text())
    (stopped / "summary.json").write_text(json.dumps({**summary, "stopped": "SIGTERM"}))
    assert main(["eval", str(stopped), "--episodes", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith("; the run is stopped by SIGTERM")
    # a resume killed before its end leaves the summary of the session before it: not "finished"
    (stopped / "summary.json").write_text(json.dumps({**summary, "iterations": summary["iterations"] - 1}))
    earlier = f"unfinished (summary.json is of an earlier session, which ended at update {summary['iterations'] - 1}"
    assert eval_json(capsys, stopped, "--episodes", "1")["run_status"].startswith(earlier)
    (stopped / "summary.json").unlink()
    assert "unfinished" in eval_json(capsys, stopped, "--episodes", "1")["run_status"]

    for options, words in (
        (["--episodes", "0"], "episodes must be a positive integer"),
        (["--video-frames", "0"], "video-frames must be a positive integer, got 0"),  # a video or not
        (["--seed-index", "1"], "seed-index must be from 0 to 0"),
        (["--step", "3"], "has no checkpoint at 3"),
        (["--video", str(tmp_path / "x.avi")], "must end in .gif or .mp4"),
    ):
        assert main(["eval", str(run), *options]) == 2
        assert words in one_line_error(capsys)
    for step in ("4", 4.0):  # 4.0 == 4, and read checkpoints/4.0: "corrupted"
        with pytest.raises(ValueError, match=f"has no checkpoint at {step!r} \\(a {type(step).__name__}, not an int"):
            genesis_jax.load(run, step=step)
    with pytest.raises(ValueError, match="has no checkpoint at 7; it has 4"):  # a numpy integer is one
        genesis_jax.load(run, step=np.int64(7))


def test_video_frames_are_bounded_where_a_video_records_them():
    from genesis_jax.algos.evaluate import check_eval_options

    check_eval_options(1, 0, None, 2_000_000)  # no video: the frames bound nothing (as before 0.4.4)
    with pytest.raises(ValueError, match=r"video-frames must be a positive integer \(at most 1000000\), got 2000000"):
        check_eval_options(1, 0, "run.gif", 2_000_000)


def alter_keeping_the_checksum(checkpoints: pathlib.Path) -> None:
    """The newest checkpoint re-saved by Orbax itself with one parameter changed and the
    checksum it was written with: readable, but not what was saved."""
    import orbax.checkpoint as ocp

    step = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    with CheckpointStore(checkpoints, async_save=False) as store:
        state, meta = store.restore_raw(step)
    state = jax.tree.map(np.array, state)  # writable copies
    state["train_state"]["params"]["params"]["actor_head"]["bias"] += 1.0
    shutil.rmtree(checkpoints / str(step))
    manager = ocp.CheckpointManager(checkpoints, item_names=("state", "meta"))
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    manager.close()


def test_one_key_is_one_key_of_either_kind_under_any_prng_implementation():
    from genesis_jax.algos.evaluate import _one_key

    before = jax.config.jax_default_prng_impl
    try:
        for impl in ("threefry2x32", "rbg"):  # rbg's raw keys are uint32[4]: the greedy default key was refused
            jax.config.update("jax_default_prng_impl", impl)
            assert _one_key(jax.random.PRNGKey(0)) and _one_key(jax.random.key(0))
            assert not _one_key(jax.random.split(jax.random.PRNGKey(0), 2)) and not _one_key(7)
    finally:
        jax.config.update("jax_default_prng_impl", before)
