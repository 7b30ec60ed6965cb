"""DQN and SAC on 4 forced CPU devices (their replay batch's rows split over the devices)
against 1 device, in one subprocess (XLA_FLAGS must be set before JAX starts). Short runs:
the devices sum the batch in another order, and over a long run RL amplifies that rounding
until the runs part (a DQN run's final return once 57.3 against 68.4), so no test claims more."""

import numpy as np
import pytest

from tests.run.test_parallel import run_worker

pytestmark = pytest.mark.slow  # one 4-device subprocess compiling 4 runs


@pytest.fixture(scope="module")
def runs():
    return run_worker("off_policy")


def test_dqn_on_four_devices_matches_one_device_to_1e_4_over_300_updates(runs):
    one, four = runs["1"], runs["4"]
    assert four["dqn_replicas_agree"] and four["dqn_updates"] == one["dqn_updates"] == 300
    assert four["dqn_episodes"] == one["dqn_episodes"]  # the same actions, so the same episodes
    assert one["dqn_losses"][:2] == [None, None]  # rows before learning-starts: no update
    np.testing.assert_allclose(four["dqn_losses"][2:], one["dqn_losses"][2:], rtol=1e-4)


def test_sac_on_four_devices_matches_one_device_to_1e_4_over_8_updates(runs):
    one, four = runs["1"], runs["4"]
    assert four["sac_replicas_agree"] and four["sac_updates"] == one["sac_updates"] == 8
    np.testing.assert_allclose(four["sac_losses"], one["sac_losses"], rtol=1e-4)
