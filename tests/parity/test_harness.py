"""The parity harness's own comparisons cannot pass without comparing (no torch needed)."""

import numpy as np
import pytest

from genesis_jax.amp.loss_scale import DynamicLossScale
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


def test_scaler_trajectory_without_settings_is_the_library_default(monkeypatch):
    # The parity test's "defaults" case must compare DynamicLossScale's defaults with GradScaler's,
    # not two copies of numbers written in the harness: a changed default shows in the trajectory.
    flags = np.ones(6, bool)
    monkeypatch.setattr(DynamicLossScale.__init__, "__defaults__", (2.0**16, 2.0, 0.5, 3, None))
    assert parity.jax_scaler_trajectory(flags)[:, 0].max() > 2.0**16
