"""A user's own gymnasium environments (tests/support/custom_envs.py): made as gymnasium makes
them, named from the command line as `module:EnvId`, their actions in their own spaces."""

from genesis_jax.envs.gymnasium_env import make_env
from tests.support import custom_envs  # noqa: F401 (registers the environments)


def test_an_environment_without_a_render_mode_argument_is_made():
    env = make_env("Probe-v0")  # gymnasium.make("Probe-v0") makes it: so must this
    assert env.reset(seed=0)[0].shape == (3,)
