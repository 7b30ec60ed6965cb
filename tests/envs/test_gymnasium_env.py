"""A user's own gymnasium environments (tests/support/custom_envs.py): made as gymnasium makes
them, named from the command line as `module:EnvId`, their actions in their own spaces."""

import numpy as np

from genesis_jax.envs import resolve_env
from genesis_jax.envs.gymnasium_env import GymnasiumVecEnv, make_env
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
