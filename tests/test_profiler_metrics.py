"""Per-launch metrics against independent oracles: busy time as the count of covered nanoseconds, tail and
imbalance by hand, near shares by counting, the slowest decile from the calibration's latencies, and the
placement estimate from the closed form of the one-class limit (total items over the sum of SM rates)."""
import numpy as np
import pytest

from torch_l2topo.profiler.trace.metrics import blind_near_share, busy_by_sm, launch_metrics
from torch_l2topo.profiler.trace.smmap import SmMap


def _covered_ns(sm, start, end, n_sm):
    """Oracle: for each SM, how many integer nanoseconds lie inside at least one of its CTAs."""
    horizon = int(end.max()) + 1
    out = np.zeros(n_sm, int)
    for s in range(n_sm):
        mask = np.zeros(horizon, bool)
        for a, b in zip(start[sm == s], end[sm == s]):
            mask[a:b] = True
        out[s] = mask.sum()
    return out


def test_busy_time_is_the_union_of_each_sms_ctas():
    rng = np.random.default_rng(0)
    n_sm = 6
    sm = rng.integers(0, n_sm, 200)
    start = rng.integers(0, 5000, 200)
    end = start + rng.integers(1, 400, 200)
    assert busy_by_sm(sm, start, end, n_sm).tolist() == _covered_ns(sm, start, end, n_sm).tolist()


def _smmap(n_sm):
    chain = 280.0 + np.arange(n_sm)  # SM n_sm-1 is the slowest
    return SmMap(partition=np.arange(n_sm) % 2, chain_cycles=chain, sm_clock_ghz=np.full(n_sm, 1.98))


def test_launch_metrics_by_hand():
    n_sm = 20
    # one CTA per SM, SM s busy 1000 + 100 s ns from t = 0; SM 19 also has a second CTA overlapping its first
    sm = np.r_[np.arange(n_sm), 19]
    start = np.r_[np.zeros(n_sm, int), 500]
    end = np.r_[1000 + 100 * np.arange(n_sm), 3500]
    items = np.r_[np.full(n_sm, 10), 5]
    near = np.r_[np.full(n_sm, 4), -1]  # the last CTA did not count near items
    m = launch_metrics(sm, start, end, items, near, n_sm, kernel_ns=4000, smmap=_smmap(n_sm))
    busy = 1000 + 100 * np.arange(n_sm)
    busy[19] = 3500  # union of [0, 2900) and [500, 3500)
    assert m["busy_ns_by_sm"] == busy.tolist() and m["busy_ns_max"] == 3500
    assert m["busy_ns_median"] == int(np.median(busy)) and m["cta_span_ns"] == 3500
    last_end = busy  # every SM's CTAs start at 0 or end where its union ends
    assert m["tail_ns"] == int(3500 - np.median(last_end))
    assert m["imbalance"] == pytest.approx(3500 / busy.mean() - 1, abs=1e-4)
    assert m["near_share"] == pytest.approx(4 * n_sm / (10 * n_sm), abs=1e-4)  # over CTAs that counted
    assert m["far_share"] == pytest.approx(1 - 4 / 10, abs=1e-4)
    assert m["slow_decile_sms"] == [18, 19]  # ceil(0.1 * 20) SMs with the highest latency
    assert m["slow_decile_busy_share"] == pytest.approx((busy[18] + busy[19]) / busy.sum(), abs=1e-4)
    assert m["slow_decile_sm_share"] == pytest.approx(2 / 20)
    # the one-class limit: total items / sum over SMs of (items / busy ns)
    per_sm_items = np.r_[np.full(n_sm - 1, 10), 15]
    balanced = per_sm_items.sum() / (per_sm_items / busy).sum()
    assert m["balanced_span_ns_estimate"] == pytest.approx(balanced, abs=1)
    assert m["placement_saving_ns_estimate"] == pytest.approx(3500 - balanced, abs=1)
    assert "estimate" in m["estimate_note"]


def test_ctas_stand_for_items_when_a_kernel_counts_none():
    sm, start, end = np.array([0, 1]), np.array([0, 0]), np.array([100, 300])
    m = launch_metrics(sm, start, end, np.zeros(2, int), np.full(2, -1), 2, kernel_ns=400)
    assert m["near_share"] is None and "slow_decile_sms" not in m  # no calibration, no counts
    assert m["balanced_span_ns_estimate"] == pytest.approx(2 / (1 / 100 + 1 / 300), abs=1)


def test_blind_near_share_counts_each_partitions_sms():
    partition = np.array([0, 0, 0, 1, -1])  # 3 SMs near partition 0, 1 near partition 1, one undecided
    assert blind_near_share([6, 2, 2], partition) == pytest.approx((6 * 3 / 5 + 2 * 1 / 5) / 10)
    assert blind_near_share(None, partition) is None and blind_near_share([1, 1, 0], np.full(5, -1)) is None


def test_the_placement_estimate_is_plans_limit():
    """The closed form in metrics.placement_estimate is plans.limit over the measured speeds."""
    from torch_l2topo.placement.plans import SpeedModel, Workload, limit
    from torch_l2topo.profiler.trace.metrics import placement_estimate

    rng = np.random.default_rng(3)
    n_sm = 16
    sm = rng.integers(0, n_sm - 2, 300)  # the last two SMs did nothing: they get the median speed
    items = rng.integers(1, 9, 300)
    busy = rng.integers(5_000, 90_000, n_sm)
    per_sm = np.bincount(sm, weights=items, minlength=n_sm)
    expected = limit(SpeedModel.from_measured(per_sm, np.where(per_sm > 0, busy, 0)), Workload(int(items.sum())))
    got = placement_estimate(sm, np.where(per_sm > 0, busy, 0), items, n_sm, span_ns=10**6)
    assert got["balanced_span_ns_estimate"] == pytest.approx(expected, rel=1e-6, abs=1)


def _waves(sm, start, end, n_sm, smmap=None):
    sm, start, end = (np.asarray(x, np.int64) for x in (sm, start, end))
    n = len(sm)
    return launch_metrics(sm, start, end, np.ones(n, int), np.full(n, -1), n_sm, kernel_ns=10**6, smmap=smmap)


def test_two_full_waves_of_one_cta_per_sm():
    # 264 CTAs on 132 SMs, each SM runs two 1000 ns CTAs back to back (touching: never resident together)
    sm = np.r_[np.arange(132), np.arange(132)]
    start = np.r_[np.zeros(132, int), np.full(132, 1000)]
    m = _waves(sm, start, start + 1000, 132)
    assert (m["resident_per_sm"], m["waves"], m["last_wave_fill"], m["ctas_per_sm"]) == (1, 2, 1.0, 2.0)
    assert m["last_wave_cost_ns"] == 0 and m["regrid_saving_ns_estimate"] == 0


def test_a_partial_last_wave_costs_the_time_with_idle_sms():
    # 140 CTAs: SMs 0-7 run a second 1000 ns CTA after the first wave, SMs 8-131 go idle at 1000 ns
    sm = np.r_[np.arange(132), np.arange(8)]
    start = np.r_[np.zeros(132, int), np.full(8, 1000)]
    m = _waves(sm, start, start + 1000, 132)
    assert m["waves"] == 2 and m["last_wave_fill"] == pytest.approx(8 / 132, abs=1e-4)
    assert m["ctas_per_sm"] == pytest.approx(140 / 132, abs=1e-4)
    assert m["last_wave_cost_ns"] == 1000  # from 1000 ns (SM 8 idle for good) to the last end at 2000 ns
    # 140 CTAs of 1000 ns spread over 132 SMs end at 140000 / 132 ns: the re-grid saves 2000 minus that
    assert m["regrid_saving_ns_estimate"] == round(2000 - 140_000 / 132)


def test_ctas_resident_together_widen_a_wave():
    # two CTAs at once on every SM (the second starts while the first runs): 264 CTAs make one wave
    sm = np.r_[np.arange(132), np.arange(132)]
    start = np.r_[np.zeros(132, int), np.full(132, 300)]
    m = _waves(sm, start, start + 1000, 132)
    assert (m["resident_per_sm"], m["waves"], m["last_wave_fill"]) == (2, 1, 1.0)
    assert m["last_wave_cost_ns"] == 0


def test_resident_ctas_against_counting_every_nanosecond():
    from torch_l2topo.profiler.trace.metrics import max_resident

    rng = np.random.default_rng(5)
    sm = rng.integers(0, 4, 60)
    start = rng.integers(0, 2000, 60)
    end = start + rng.integers(1, 300, 60)
    running = np.zeros((4, 2400), int)
    for s, a, b in zip(sm, start, end):
        running[s, a:b] += 1
    assert max_resident(sm, start, end) == running.max()
    assert max_resident(np.array([0, 0]), np.array([0, 5]), np.array([5, 9])) == 1  # touching, not together
    assert max_resident(np.array([3]), np.array([7]), np.array([7])) == 1  # no duration: still one resident
    assert max_resident(np.zeros(0, int), np.zeros(0, int), np.zeros(0, int)) == 0


def test_the_wave_picture_of_one_cta_none_and_foreign_sms():
    m = _waves([5], [100], [600], 132)  # one CTA: one wave with 1 of 132 slots; 131 SMs idle throughout
    assert (m["waves"], m["ctas_per_sm"], m["last_wave_fill"]) == (1, 1.0, pytest.approx(1 / 132, abs=1e-4))
    assert m["last_wave_cost_ns"] == 500 and m["regrid_saving_ns_estimate"] == round(500 * 131 / 132)
    m = _waves([], [], [], 132)
    assert (m["ctas"], m["waves"], m["last_wave_fill"], m["last_wave_cost_ns"]) == (0, 0, None, 0)
    # a CTA on SM 200 of a 2-SM device counts as a CTA but in no wave (as in no SM's busy time)
    m = _waves([0, 1, 200], [0, 0, 0], [100, 100, 900], 2)
    assert (m["ctas"], m["waves"], m["last_wave_fill"], m["last_wave_cost_ns"]) == (3, 1, 1.0, 0)


def test_slow_sm_cost_is_how_much_later_the_slowest_decile_ended():
    n_sm = 20  # _smmap: SMs 18 and 19 are the slowest decile
    sm = np.arange(n_sm)
    end = np.full(n_sm, 1000)
    end[[18, 19]], end[5] = [2500, 3000], 1400
    m = _waves(sm, np.zeros(n_sm, int), end, n_sm, smmap=_smmap(n_sm))
    assert m["slow_sm_cost_ns"] == 3000 - 1400
    end[5] = 3500  # a fast SM ends last: the slow decile cost nothing
    assert _waves(sm, np.zeros(n_sm, int), end, n_sm, smmap=_smmap(n_sm))["slow_sm_cost_ns"] == 0
    only_slow = _waves([18, 19], [0, 0], [10, 20], n_sm, smmap=_smmap(n_sm))
    assert only_slow["slow_sm_cost_ns"] is None  # no SM outside the decile ran: nothing to compare with
    assert "slow_sm_cost_ns" not in _waves(sm, np.zeros(n_sm, int), end, n_sm)  # no calibration
