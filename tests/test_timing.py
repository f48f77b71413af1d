"""measure/timing.py on CPU: Measurement's statistics against numpy written out here, its readable repr, and
interleaved()'s rounds (warm-up, alternation, samples of several launches) with a stand-in for the CUDA events."""
import math

import numpy as np
import pytest

from torch_l2topo.measure import timing
from torch_l2topo.measure.timing import Measurement


def test_statistics_of_known_times():
    m = Measurement(list(range(1, 11)), label="ten")  # 1..10 ms
    assert m.n == 10 and m.median == 5.5 and m.mean == 5.5
    # linear interpolation between order statistics: position q * (n - 1)
    assert m.quantile(0.2) == pytest.approx(1 + 0.2 * 9) and m.quantile(0.8) == pytest.approx(1 + 0.8 * 9)
    assert m.iqr == pytest.approx(0.5 * 9)
    assert m.spread == pytest.approx((0.6 * 9) / 5.5)
    assert m.quantiles() == {"p20": pytest.approx(2.8), "p50": 5.5, "p80": pytest.approx(8.2), "n": 10}


def test_spread_is_robust_to_one_slow_sample_and_zero_for_equal_times():
    steady = Measurement([1.0] * 19 + [50.0])  # one launch met a clock change
    assert steady.spread == 0.0 and steady.median == 1.0
    assert Measurement([2.0]).spread == 0.0
    assert Measurement([0.0, 0.0, 1.0, 1.0, 1.0]).spread == pytest.approx(1.0)
    assert math.isinf(Measurement([0.0, 0.0, 0.0, 1.0, 2.0]).spread)  # median 0, times differ


def test_the_geometry_fix_spread_is_this_spread():
    """detectors.fix_effect judges a layout fix by Measurement.spread (one definition of spread)."""
    from torch_l2topo.geometry.detectors import fix_effect

    a, b = [1.0, 1.1, 1.2, 1.3, 1.4], [2.0, 2.0, 2.1, 2.5, 3.0]
    assert fix_effect(a, b).spread == max(Measurement(a).spread, Measurement(b).spread)


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="at least one time of x"):
        Measurement([], label="x")
    with pytest.raises(ValueError, match="finite"):
        Measurement([1.0, float("nan")])
    with pytest.raises(ValueError, match="q must be"):
        Measurement([1.0]).quantile(1.5)


def test_repr_reads_at_a_glance():
    # p20 62.6 us, p80 65.2 us (interpolated): spread 2.6 / 63
    assert repr(Measurement([0.061, 0.063, 0.063, 0.064, 0.070], label="gather plain")) == (
        "<Measurement gather plain: median 63 us, IQR 1 us (63 us to 64 us), spread 4.1%, 5 times>")
    assert "median 1.5 s" in repr(Measurement([1500.0]))
    assert "median 3 cycles" in repr(Measurement([3.0], unit="cycles"))


class _FakeInterval:
    """Stands in for the CUDA events: each Interval's time is the number of launches made inside it, times 2 ms,
    plus 1 ms per interval already made (a drift)."""

    made = []

    def __init__(self, stream=None):
        self.index = len(_FakeInterval.made)
        _FakeInterval.made.append(self)

    def __enter__(self):
        self.before = len(_FakeInterval.log)
        return self

    def __exit__(self, *exc):
        self.launches = len(_FakeInterval.log) - self.before

    def ms(self):
        return 2.0 * self.launches + self.index


def test_interleaved_rounds_alternate_and_samples_divide(monkeypatch):
    _FakeInterval.made, _FakeInterval.log = [], []
    monkeypatch.setattr(timing, "Interval", _FakeInterval)
    launches = {name: (lambda n=name: _FakeInterval.log.append(n)) for name in ("a", "b", "c")}
    got = timing.interleaved(launches, 3, warmup=2, per_sample=4)
    order = _FakeInterval.log
    assert order[:6] == ["a", "b", "c"] * 2  # warm-up rounds, untimed
    timed = order[6:][::4]  # one name per sample
    assert timed == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]  # every other round reversed
    assert set(got) == {"a", "b", "c"} and all(m.n == 3 for m in got.values())
    # sample k (k-th interval made) of 4 launches: (8 + k) / 4 ms per launch
    assert got["a"].times == ((8 + 0) / 4, (8 + 5) / 4, (8 + 6) / 4)
    assert got["c"].label == "c"
    fixed = timing.interleaved(launches, 2, warmup=0, alternate=False)
    assert _FakeInterval.log[-6:] == ["a", "b", "c"] * 2 and fixed["b"].n == 2
    with pytest.raises(ValueError):
        timing.interleaved(launches, 0)
    assert np.isfinite(got["b"].median)
