"""A user's own gymnasium environments (tests/support/custom_envs.py): made as gymnasium makes
them, named from the command line as `module:EnvId`, their actions in their own spaces."""

import pickle

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genesis_jax.envs import play, resolve_env
from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv, gymnasium_spec, io_callback_step, make_env
from tests.support import custom_envs  # noqa: F401 (registers the environments)


def test_an_environment_without_a_render_mode_argument_is_made():
    env = make_env("Probe-v0")  # gymnasium.make("Probe-v0") makes it: so must this
    assert env.reset(seed=0)[0].shape == (3,)


def test_discrete_actions_that_start_at_one_reach_the_environment_in_its_space():
    spec = resolve_env("ProbeFromOne-v0")
    assert spec.action_dim == 3 and not spec.continuous
    env = GymnasiumVecEnv("ProbeFromOne-v0", num_envs=3)
    env.reset(seed=0)
    env.step(np.array([0, 1, 2]))  # the networks' actions 0..2 are the environment's 1..3
    assert [e.unwrapped.actions for e in env.envs.envs] == [[1], [2], [3]]
    env.close()
    made = make_env("ProbeFromOne-v0")  # its spec records the action shift: it still pickles (to a subprocess)
    assert pickle.loads(pickle.dumps(made.spec)).additional_wrappers[0].kwargs["func"](0) == 1


def test_continuous_actions_reach_the_environment_in_its_space_dtype_and_bounds():
    env = GymnasiumVecEnv("ProbeBox-v0", num_envs=2)
    env.reset(seed=0)
    env.step(np.array([[0.5, -3.0], [9.0, 1.0]], np.float32))  # clipped to the float bounds: float32 still
    sent = [e.unwrapped.actions[0] for e in env.envs.envs]
    assert all(a.dtype == np.float32 for a in sent) and np.array_equal(sent, [[0.5, -2.0], [2.0, 1.0]])
    env.close()
    ints = GymnasiumVecEnv("ProbeIntBox-v0", num_envs=2)  # an integer Box: rounded, not truncated (3.99 was 3)
    ints.reset(seed=0)
    ints.step(np.array([[3.99, 0.6], [-0.4, 2.5]], np.float32))
    assert np.array_equal([e.unwrapped.actions[0] for e in ints.envs.envs], [[4, 1], [0, 2]])
    ints.close()


def test_an_environment_of_ones_own_is_named_module_colon_id(tmp_path, monkeypatch):
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium\ngymnasium.register('Mine-v0', entry_point='tests.support.custom_envs:Probe')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = resolve_env("my_envs:Mine-v0")  # importing my_envs registers Mine-v0, as gymnasium.make does
    assert (spec.env_id, spec.backend, spec.obs_shape, spec.action_dim) == ("my_envs:Mine-v0", "gymnasium", (3,), 2)
    env = GymnasiumVecEnv(spec.env_id, num_envs=1)  # the id the run records makes it again
    assert env.reset(seed=0).shape == (1, 3)
    env.close()
    with pytest.raises(ValueError, match=r"^no_such_envs:Mine-v0: cannot import no_such_envs to register Mine-v0"):
        resolve_env("no_such_envs:Mine-v0")
    with pytest.raises(ValueError, match=r"^my_envs:Yours-v0: importing my_envs registers no environment 'Yours-v0'"):
        resolve_env("my_envs:Yours-v0")


def test_eval_refuses_to_wait_for_ever_for_an_episode_nothing_ends(monkeypatch):
    monkeypatch.setattr(play, "UNLIMITED_EPISODE_STEPS", 50)
    spec, act = resolve_env("ProbeEndless-v0"), lambda args, key, obs: np.zeros(len(obs), int)
    with pytest.raises(
        ValueError, match=r"^ProbeEndless-v0: an episode ran 50 steps without ending, and it has no time"
    ):
        play.play_gymnasium(spec, act, None, episodes=1, seed=0)


def test_channels_first_images_are_refused_as_such_and_small_channels_last_ones_kept():
    # gymnasium's FrameStackObservation stacks first: (4, 84, 84) trained as 4 rows of 84 channels
    with pytest.raises(ValueError, match=r"\(4, 84, 84\) look channels-first; .* move the channels last") as err:
        gymnasium_spec("ProbeChannelsFirst-v0")
    assert str(err.value).endswith("np.moveaxis(obs, 0, -1), gymnasium.spaces.Box(0, 255, (84, 84, 4), np.uint8))")
    # the fix as the message gives it is taken
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    moved = lambda: gym.wrappers.TransformObservation(  # noqa: E731
        custom_envs.Probe(space), lambda obs: np.moveaxis(obs, 0, -1), gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    )
    if "ProbeMovedChannels-v0" not in gym.envs.registry:
        gym.register("ProbeMovedChannels-v0", entry_point=moved)
    assert gymnasium_spec("ProbeMovedChannels-v0").obs_shape == (84, 84, 4)
    assert gymnasium_spec("ProbeSmallImage-v0").obs_shape == (3, 3, 5)


def test_float_images_stay_images_in_float32_with_their_values_and_uint8_ones_stay_uint8():
    for env_id in ("ProbeFloatImage-v0", "ProbeFloat64Image-v0"):
        spec = gymnasium_spec(env_id)
        assert (spec.obs_shape, spec.obs_dtype) == ((10, 10, 3), "float32")  # not flattened, not quantised
        env = GymnasiumVecEnv(env_id, num_envs=2)
        obs = env.reset(seed=0)
        assert obs.shape == (2, 10, 10, 3) and obs.dtype == np.float32 and np.all(obs == 0.5)
        obs, _, _, _, _, final_obs = jax.jit(io_callback_step(env))(None, (), jnp.zeros(2, int))
        assert obs.dtype == final_obs.dtype == jnp.float32 and bool(jnp.all(obs == 0.5))
        env.close()
    assert gymnasium_spec("ProbeSmallImage-v0").obs_dtype == "uint8"
    assert gymnasium_spec("Probe-v0").obs_dtype == "float32"
    with pytest.raises(ValueError, match=r"\(3, 84, 84\) look channels-first") as err:
        gymnasium_spec("ProbeFloatChannelsFirst-v0")
    assert str(err.value).endswith("gymnasium.spaces.Box(0.0, 1.0, (84, 84, 3), np.float32))")
