"""The parity harness's own comparisons cannot pass without comparing (no torch needed)."""

import numpy as np
import pytest

from tests.parity import harness as parity


def test_max_diffs_counts_nan_and_refuses_what_it_cannot_compare():
    ones = {"a": np.ones(3)}
    assert parity.max_diffs({"a": np.array([np.nan, 1.0, 1.0])}, ones) == (np.inf, np.inf)
    assert parity.max_diffs(ones, {"a": np.full(3, np.nan)}) == (np.inf, np.inf)
    with pytest.raises(ValueError, match="no leaves"):
        parity.max_diffs({}, {})
    with pytest.raises(ValueError, match="differ"):
        parity.max_diffs({}, ones)
    with pytest.raises(ValueError, match="differ"):
        parity.max_diffs({**ones, "b": np.zeros(2)}, ones)
    with pytest.raises(ValueError, match="shapes"):
        parity.max_diffs({"a": np.ones((1, 3))}, ones)
