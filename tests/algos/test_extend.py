"""A finished run of every registered algorithm is extended by a resume with a longer budget
(the docs: "longer: allowed"), with no other flag: SAC's buffer, capped at the first budget, grows."""

import dataclasses

import pytest

from genesis_jax.algos import get_algorithm
from tests.support.registry import NAMES, tiny_config


@pytest.mark.slow  # two tiny trainings per algorithm: about 60 s
@pytest.mark.parametrize("name", NAMES)
def test_a_finished_run_is_extended(name, tmp_path):
    algorithm = get_algorithm(name)
    config, field = tiny_config(name), algorithm.budget_field
    first = algorithm.train(config, str(tmp_path), progress=False)
    longer = dataclasses.replace(config, **{field: 2 * getattr(config, field)})
    extended = algorithm.train(longer, str(tmp_path), resume=True, progress=False)
    assert extended.summary["config_changes"] == []
    assert len(extended.metrics) == 2 * len(first.metrics)
    assert extended.metrics[: len(first.metrics)] == first.metrics  # the first half as it was
