"""A finished run of every registered algorithm is extended by a resume with a longer budget
(the docs: "longer: allowed"), with no other flag: SAC's buffer, capped at the first budget, grows;
a schedule that follows total-steps (epsilon's fall, the learning rate's decay) moves with it,
which the resume says and the summary records."""

import dataclasses
import warnings

import pytest

from genesis_jax.algos import get_algorithm
from genesis_jax.run.config import budget_schedules
from tests.support.registry import NAMES, tiny_config


@pytest.mark.slow  # two tiny trainings per algorithm: about 60 s
@pytest.mark.parametrize("name", NAMES)
def test_a_finished_run_is_extended(name, tmp_path):
    algorithm = get_algorithm(name)
    config, field = tiny_config(name), algorithm.budget_field
    first = algorithm.train(config, str(tmp_path), progress=False)
    longer = dataclasses.replace(config, **{field: 2 * getattr(config, field)})
    schedules = budget_schedules(longer)  # what follows total-steps moves mid-run: said, not silent
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        extended = algorithm.train(longer, str(tmp_path), resume=True, progress=False)
    moved = f"{field.replace('_', '-')}: {getattr(config, field)} -> {getattr(longer, field)}"
    assert extended.summary["config_changes"] == (
        [f"{moved} (moves {' and '.join(schedules)} mid-run)"] if schedules else []
    )
    assert any(moved in str(w.message) for w in said) == bool(schedules)
    assert len(extended.metrics) == 2 * len(first.metrics)
    assert extended.metrics[: len(first.metrics)] == first.metrics  # the first half as it was
