"""A time-budgeted bench row sizes its run in whole positions of its own algorithm."""

from genesis_jax.algos import get_algorithm
from genesis_jax.bench import _steps_for_seconds

TINY_DQN = {
    "row_steps": 100,
    "num_envs": 10,
    "train_frequency": 10,
    "target_update_interval": 100,
    "learning_starts": 0,
    "buffer_size": 200,
    "batch_size": 32,
    "epsilon_steps": 100,
}


def test_a_timed_dqn_row_is_a_whole_number_of_metrics_rows():
    # DQN's position is a metrics row (row_steps), not its replay batch: sizing by batch_size
    # gave 2 x 32 steps, which no DQN config accepts.
    total = _steps_for_seconds(get_algorithm("dqn"), TINY_DQN, "fp32", 0.5)
    assert total % TINY_DQN["row_steps"] == 0 and total >= 2 * TINY_DQN["row_steps"]
    get_algorithm("dqn").config_class(precision="fp32", **TINY_DQN, total_steps=total)  # a config it accepts
