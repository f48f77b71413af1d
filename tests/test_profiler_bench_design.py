"""The adjacent-cycle comparison of the profiler's benchmark (benchmarks/profiler_cycles.py) on synthetic
cycle times with a known answer: a profiled cycle that costs `own` in itself and leaves `deferred` to the next
cycle (the records' drain) must read own + deferred, whatever the loop's slow drift; the design it replaced
(each cycle against its two plain neighbours) reads own - deferred there, which is why it was replaced."""
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path[:0] = [str(BENCH), str(BENCH / "diagnose")]
import diag_profiler_components as components  # noqa: E402
import profiler_cycles as design  # noqa: E402


def _block(kinds, n, own, deferred, rng, drift=0.3):
    """Cycle times (s): a plain cycle of ~4 ms whose speed wanders slowly by +-drift, noise of 1%, and each
    non-plain kind's own cost in its cycle and deferred cost in the next."""
    base = 0.004 * (1 + drift * np.sin(np.arange(n) / 40.0 + rng.uniform(0, 6)))
    t = base * (1 + 0.01 * rng.standard_normal(n))
    for c in range(n):
        kind = kinds[c % len(kinds)]
        if kind != "plain":
            t[c] += own[kind]
            if c + 1 < n:
                t[c + 1] += deferred[kind]
    return t


@pytest.mark.parametrize("own_us,deferred_us", [(60, 0), (60, 50), (0, 80), (-10, 30)])
def test_unit_pairs_read_the_cost_a_cycle_leaves_to_the_next_too(own_us, deferred_us):
    kinds = design.kind_sequence(["ours", "other"])
    assert kinds == ["ours", "plain", "plain", "plain", "other", "plain", "plain", "plain"]
    rng = np.random.default_rng(1)
    own = {"ours": own_us * 1e-6, "other": 0.0}
    deferred = {"ours": deferred_us * 1e-6, "other": 0.0}
    pairs = {"ours": [], "other": []}
    for _ in range(12):
        for kind, got in design.unit_pairs(_block(kinds, 100, own, deferred, rng), kinds, skip=2).items():
            pairs[kind] += got
    for kind, expected in (("ours", own_us + deferred_us), ("other", 0.0)):
        a, b = np.array(pairs[kind]).T
        got = design.compare(a, b, cycles_per_unit=2)
        assert got["pairs"] == len(pairs[kind]) >= 12 * 11
        assert abs(got["diff_us"]["p50"] - expected) < 15, (kind, got["diff_us"])
        lo, hi = got["diff_us"]["p50_ci90"]
        assert lo - 5 <= expected <= hi + 5
        # relative to one plain cycle (the unit is two cycles)
        assert got["diff_over_b_median"] == pytest.approx(got["diff_us"]["p50"] / (np.median(b) / 2 * 1e6))


def test_the_replaced_design_read_the_deferred_cost_against_us():
    """Each cycle against the mean of its plain neighbours, with ours every other cycle (what the committed
    2026-12-02 run measured): own - deferred."""
    rng = np.random.default_rng(2)
    kinds = ["ours", "plain"]
    diffs = []
    for _ in range(12):
        t = _block(kinds, 100, {"ours": 60e-6}, {"ours": 50e-6}, rng)
        diffs += [(t[c] - (t[c - 1] + t[c + 1]) / 2) * 1e6 for c in range(2, 99, 2)]
    assert abs(np.median(diffs) - (60 - 50)) < 15


def test_unit_pairs_leave_out_the_first_cycles_and_need_plain_cycles_around():
    kinds = design.kind_sequence(["ours"])
    t = np.full(12, 0.004)
    got = design.unit_pairs(t, kinds, skip=5)
    assert [len(v) for v in got.values()] == [1]  # cycle 8 only: 4 is before skip, 12 has no cycles after it


def test_time_calls_times_each_call_it_wraps_and_still_makes_it(monkeypatch):
    """diag_profiler_components --time-calls: every wrapped call still runs (its result comes back) and leaves one
    host time (s)."""
    for owner, name in components.TIMED_CALLS:
        monkeypatch.setattr(owner, name, getattr(owner, name))  # restored after the test
    seen = []
    real_flush = components.spool.RecordSpool.flush
    monkeypatch.setattr(components.spool.RecordSpool, "flush", lambda self: seen.append("flush") or real_flush(self))
    import gc

    callbacks = list(gc.callbacks)
    times = components.time_calls()
    gc.callbacks[:] = callbacks  # no collection of later tests is timed into this test's buckets
    spool = components.spool.RecordSpool()
    spool.flush()
    spool.flush()
    assert seen == ["flush", "flush"] and len(times["RecordSpool.flush"]) == 2
    assert all(0 <= us < 1e6 for us in times["RecordSpool.flush"])
    assert times["RecordSpool.take_all"] == [] and "recording.reset_dirty" in times
    times.kind = "ours"
    spool.flush()
    assert len(dict.get(times, "RecordSpool.flush")) == 2 and len(dict.get(times, "ours: RecordSpool.flush")) == 1
