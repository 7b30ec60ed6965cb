"""Every registered algorithm trains a few updates at every precision: fp16-full (float16
params and optimizer moments) included, its targets and Adam's eps included. fp32 and fp16 are
checked (`check_a_few_updates`) on runs tests/algos/test_registry.py trains anyway: its 1-seed
fp32 run and its fp16 run never interrupted (16 times the tiny budget), no program compiled twice."""

import pytest

from tests.support.registry import CHECKED_IN_REGISTRY, NAMES, TWO_SEEDS, check_a_few_updates, tiny_run

PRECISIONS = ("fp32", "bf16", "fp16", "fp16-full")


@pytest.mark.slow  # 2 tiny trainings per algorithm (bf16, fp16-full; fp32 and fp16: test_registry.py's), compiled
@pytest.mark.filterwarnings("ignore:precision 'fp16-full'")
@pytest.mark.parametrize("precision", [p for p in PRECISIONS if p not in CHECKED_IN_REGISTRY])
@pytest.mark.parametrize("name", NAMES)
def test_a_few_updates_at_every_precision(name, precision):
    two_seeds = (name, precision) in TWO_SEEDS
    check_a_few_updates(name, precision, tiny_run(name, precision=precision, **({"num_seeds": 2} if two_seeds else {})))
