"""compare_maps: offsets removed, rank agreement, shapes and NaNs refused."""
import numpy as np
import pytest

from torch_l2topo.analysis.compare import compare_maps


def test_a_constant_offset_is_separated_from_per_entry_differences():
    a = np.linspace(270, 300, 132)
    b = a - 2.0
    b[5] += 0.5
    r = compare_maps(a, b)
    assert r["offset"] == pytest.approx(2.0)
    assert r["max_after_offset"] == pytest.approx(0.5)
    assert r["max_abs_diff"] == pytest.approx(2.0)
    assert r["spearman"] == pytest.approx(1.0, abs=1e-3)


def test_unrelated_maps_have_low_rank_correlation():
    rng = np.random.default_rng(0)
    assert abs(compare_maps(rng.normal(size=500), rng.normal(size=500))["spearman"]) < 0.2


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        compare_maps(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="NaN"):
        compare_maps(np.array([1.0, np.nan]), np.zeros(2))
