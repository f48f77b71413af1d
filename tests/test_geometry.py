"""The geometry detectors (torch_l2topo/geometry/detectors.py) on curves with planted answers, on flat and noisy curves
(reported as not found), and on the curves recorded on H200s (tests/data/geometry/*.npz)."""
from pathlib import Path

import numpy as np
import pytest

from torch_l2topo.geometry import detectors as G

RECORDED = sorted((Path(__file__).resolve().parent / "data" / "geometry").glob("*.npz"))
MB = 1 << 20


def _footprints(per_octave=4):
    return 2.0 ** np.arange(1, 9, 1 / per_octave) * MB


@pytest.mark.parametrize("noise", [0.0, 1.0, 3.0])
def test_planted_regimes_and_knees(noise):
    x = _footprints()
    rng = np.random.default_rng(0)
    y = np.where(x < 24 * MB, 275, np.where(x < 56 * MB, 305, 640)) + rng.normal(0, noise, x.size)
    r = G.find_regimes(x, y)
    assert r.found and len(r.knees) == 2
    np.testing.assert_allclose(r.levels, [275, 305, 640], atol=3)
    assert 16 * MB <= r.knees[0].mid <= 32 * MB and 45 * MB <= r.knees[1].mid <= 70 * MB
    assert r.knees[0].onset < r.knees[0].mid < r.knees[0].end


def test_a_ramp_between_two_plateaus_is_one_knee():
    x = _footprints()
    y = np.interp(np.log2(x / MB), [1, 4, 7, 9], [270, 270, 650, 650])
    r = G.find_regimes(x, y + np.random.default_rng(1).normal(0, 1, x.size))
    assert len(r.knees) == 1
    assert r.knees[0].onset == pytest.approx(16 * MB, rel=0.2) and r.knees[0].end == pytest.approx(128 * MB, rel=0.2)


@pytest.mark.parametrize("seed", range(5))
def test_flat_and_noisy_curves_have_no_knee(seed):
    x = _footprints()
    rng = np.random.default_rng(seed)
    assert not G.find_regimes(x, np.full(x.size, 300.0)).found
    noisy = G.find_regimes(x, 300 + rng.normal(0, 15, x.size))
    assert not noisy.found and noisy.reason


def test_effective_capacity_from_a_random_replacement_curve():
    x = _footprints()
    cap, hit, miss = 30 * MB, 300.0, 700.0
    y = miss - (miss - hit) * np.minimum(1, cap / x)
    assert G.effective_capacity(x, y, hit, miss) == pytest.approx(cap, rel=1e-6)
    assert G.effective_capacity(x, np.full(x.size, hit), hit, miss) is None  # every load hits: no estimate
    assert G.effective_capacity(x, y, miss, hit) is None


def test_a_step_under_the_relative_floor_is_not_a_knee():
    x = _footprints()
    assert not G.find_regimes(x, np.where(x < 32 * MB, 300.0, 304.0)).found  # 1.3% < REL_STEP


def test_bad_curves_are_refused():
    with pytest.raises(ValueError):
        G.find_regimes([1, 2, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        G.find_regimes([1, 2, 3], [1, np.nan, 3])


@pytest.mark.parametrize("granule", [32, 64, 128])
def test_first_touch_granule(granule):
    k = np.array([8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512])
    rng = np.random.default_rng(granule)
    y = np.where(k < granule, 290, 660) + rng.normal(0, 4, k.size)
    e = G.hit_extent(k, y)
    assert e.found and e.granule == granule
    assert e.hit == pytest.approx(290, abs=5) and e.miss == pytest.approx(660, abs=5)


def test_first_touch_with_scattered_dram_latencies():
    """As recorded on an H200: hits within a few cycles, misses anywhere in 640-990 cycles."""
    k = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096]
    y = [365, 360, 357, 346, 342, 679, 815, 695, 798, 985, 695, 725, 796, 723]
    assert G.hit_extent(k, y).granule == 64


def test_first_touch_negatives():
    k = np.array([8, 16, 32, 64, 128, 256])
    assert not G.hit_extent(k, np.full(k.size, 650.0)).found            # all alike
    assert not G.hit_extent(k, [290, 660, 290, 660, 290, 660]).found     # interleaved: no granule
    assert not G.hit_extent(k, 600 + np.random.default_rng(0).normal(0, 30, k.size)).found


def test_stride_sweep_saturation():
    s = np.array([4, 8, 16, 32, 64, 128, 256, 512])
    line, hit, miss = 128, 290.0, 650.0
    y = hit + (miss - hit) * np.minimum(1, s / line)
    sat = G.saturation(s, y + np.random.default_rng(2).normal(0, 2, s.size))
    assert sat.found and sat.at == line
    assert not G.saturation(s, np.full(s.size, 650.0)).found
    assert not G.saturation(s, hit + 10 * s).found  # still rising at the end


def test_prefetch_dips():
    s = np.array([128, 256, 512, 1024, 2048, 4096])
    rnd = 640 + np.random.default_rng(3).normal(0, 3, s.size)
    reg = rnd.copy()
    reg[[2, 3, 4]] -= 200  # planted dips at 512, 1024 and 2048 B
    d = G.find_dips(s, reg, rnd)
    assert d.found and d.dips.tolist() == [512, 1024, 2048]
    assert not G.find_dips(s, rnd + 2, rnd).found
    assert not G.find_dips(s, rnd - 20, rnd).found  # 3% faster: under the 10% a prefetcher must show


def _xor_labels(addr, mask, page_bit, seed=0):
    pages = addr >> page_bit
    const = np.random.default_rng(seed).integers(0, 2, pages.max() + 1)
    par = np.zeros(addr.size, dtype=np.int64)
    v = addr & mask
    while np.any(v):
        par ^= v & 1
        v >>= 1
    return par ^ const[pages]


def test_xor_model_recovers_planted_bits():
    addr = (1 << 30) + np.arange(1 << 16, dtype=np.int64) * 128  # 8 MB in 128-byte blocks, four 2 MB pages
    mask = (1 << 8) | (1 << 11) | (1 << 14) | (1 << 19)
    labels = _xor_labels(addr, mask, 21)
    flips = G.bit_flips(addr, labels, np.arange(7, 21))
    assert flips.granularity() == 256
    np.testing.assert_array_equal(flips.flip[[1, 4, 7, 12]], 1.0)
    model = G.xor_model(addr, labels, 21)
    assert model.mask == mask and model.ambiguous.size == 0
    res = G.held_out_accuracy(addr, labels, 21)
    assert res["accuracy"] == 1.0 and res["bits"] == [8, 11, 14, 19]


def test_xor_model_on_random_labels_is_ambiguous_and_at_chance():
    addr = np.arange(1 << 16, dtype=np.int64) * 128
    labels = np.random.default_rng(5).integers(0, 2, addr.size)
    res = G.held_out_accuracy(addr, labels, 21)
    assert len(res["ambiguous_bits"]) == 14
    assert abs(res["accuracy"] - 0.5) < 0.02


def test_page_patterns_model_a_non_linear_hash():
    """Pages that repeat one of three random patterns (or its complement): no XOR explains them, the page
    patterns predict every held-out block; random labels stay at chance."""
    rng = np.random.default_rng(0)
    per_page = 1 << (21 - 7)
    pats = rng.integers(0, 2, (3, per_page))
    addr = (1 << 30) + np.arange(32 * per_page, dtype=np.int64) * 128
    labels = np.concatenate([pats[rng.integers(0, 3)] ^ rng.integers(0, 2) for _ in range(32)])
    assert G.held_out_accuracy(addr, labels, 21)["accuracy"] < 0.7
    res = G.pattern_accuracy(addr, labels, 21)
    assert res["accuracy"] == 1.0 and res["distinct_patterns"] == 3
    chance = G.pattern_accuracy(addr, rng.integers(0, 2, addr.size), 21)
    assert abs(chance["accuracy"] - 0.5) < 0.02 and chance["distinct_patterns"] == 16
    with pytest.raises(ValueError):
        G.pattern_accuracy(addr[:100], labels[:100], 21)


def test_bit_flips_skip_undecided_and_check_shapes():
    addr = np.arange(8, dtype=np.int64) * 128
    labels = np.array([0, 1, 0, 1, -1, -1, -1, -1])
    f = G.bit_flips(addr, labels, [7, 8])
    assert f.flip.tolist() == [1.0, 0.0] and f.pairs.tolist() == [2, 2]
    with pytest.raises(ValueError):
        G.bit_flips(addr, labels[:3], [7])
    with pytest.raises(ValueError):
        G.xor_model(addr, labels + 2, 21)


def test_lfsr_orders_are_permutations():
    from torch_l2topo.geometry.suite import LFSR_TAPS, lfsr_order

    for k in LFSR_TAPS:
        o = lfsr_order(1 << k)
        assert np.array_equal(np.sort(o), np.arange(1 << k)), k
        assert abs(np.corrcoef(np.arange(o.size), o)[0, 1]) < 0.2  # not an address order
    with pytest.raises(ValueError):
        lfsr_order(1000)


def test_first_rise_planted_and_negatives():
    x = _footprints()
    y = np.where(x <= 28 * MB, 285.0, 285 + 10 * (x - 28 * MB) / MB)  # flat, then a ramp, no second plateau
    r = G.first_rise(x, y + np.random.default_rng(6).normal(0, 1, x.size))
    assert r.found and r.flat_until <= 28 * MB < r.rises_at <= 34 * MB
    regimes = G.find_regimes(x, y)  # a ramp without a second plateau: no regimes to find, the reason first_rise exists
    assert not regimes.found and regimes.reason.startswith("1 plateau(s)")
    assert not G.first_rise(x, np.full(x.size, 285.0)).found
    assert not G.first_rise(x, 285 + np.random.default_rng(7).normal(0, 15, x.size)).found
    bump = np.full(x.size, 285.0)
    bump[10] = 400  # leaves and comes back: no knee
    assert not G.first_rise(x, bump).found


def test_the_recorded_curves_are_there():
    """The recorded tests below run on every file found: an empty folder must fail, not pass by running none."""
    assert len(RECORDED) >= 2, "the full suite's H200 curves (tests/data/geometry/*.npz) are missing"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_h200_curves(path):
    """The detectors' verdicts on the full suite's recorded curves: the numbers docs/geometry.md quotes."""
    d = np.load(path)
    assert G.hit_extent(d["ft_k"], d["ft_cycles"]).granule == 64             # first touch
    assert G.saturation(d["stride"], d["stride_cycles"]).at == 64           # cold stride sweep
    for key in ("cap_mean", "cap_near", "cap_far"):                          # all SMs warm the footprint
        rise = G.first_rise(d["cap_footprint"], d[key])
        assert rise.found and 20 * MB <= rise.flat_until < rise.rises_at <= 34 * MB, key
    r = G.find_regimes(d["cap_footprint"], d["cap_mean"])
    assert r.found and 330 < r.levels[0] < 400 and r.levels[-1] > 650       # per-load timing: + ~68 cycles
    cap = G.effective_capacity(d["cap_footprint"], d["cap_mean"], d["cap_mean"][1], d["cap_mean"][-1])
    assert 25 * MB < cap < 40 * MB
    near, far = np.mean(d["cap_near"][1:10]), np.mean(d["cap_far"][1:10])
    assert 25 < far - near < 45                                              # the partition step, in L2
    rise = G.first_rise(d["sw_footprint"], d["sw_cycles"])                   # one SM on its own ring
    assert rise.flat_until == 28 * MB and rise.rises_at == 32 * MB and 270 < rise.level < 300
    assert not G.find_dips(d["pf_stride"], d["pf_cold_regular"], d["pf_cold_random"]).found   # no prefetch
    assert not G.find_dips(d["pf_stride"], d["pf_warm_regular"], d["pf_warm_random"]).found
    one, spread = G.saturation(d["k"], d["one_rate"]), G.saturation(d["k"], d["spread_rate"])
    assert one.at == 64 and spread.at == 96 and spread.top > 3 * one.top         # one slice class saturates
    flip = dict(zip(d["bits"].astype(int), d["partition_flip"]))
    assert flip[7] < 1e-4 and flip[9] < 1e-4 and 0.2 < flip[8] < 0.5          # 256 B granules; not an XOR


CONFLICT_RECORDED = [p for p in RECORDED if "cs_aligned" in np.load(p)]


def test_recordings_with_the_conflict_set_search_exist():
    assert CONFLICT_RECORDED, "no recorded curves have the conflict-set grid (cs_*): the check below would run on none"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_recorded_conflict_sets(path):
    """The conflict-set verdict on the recorded grids: the README's 'the hash hides every set'."""
    d = np.load(path)
    if "cs_aligned" not in d:
        pytest.skip(f"{path.name} was recorded before the conflict-set search: it has no cs_* curves")
    hit, miss = d["cs_refs"]
    cs = G.conflict_sets(d["cs_n"], d["cs_stride"], d["cs_aligned"], hit, miss, control=d["cs_control"])
    assert not cs.found and cs.excess.max() < 0.1                         # the hash hides every set
    assert 250 < hit < 320 and miss > hit + 300


CONFLICT_N = np.array([1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256])
CONFLICT_S = 4096 * 2 ** np.arange(14)


def _conflict_grid(noise: float, seed: int, hit=285.0):
    return hit + np.random.default_rng(seed).normal(0, noise, (CONFLICT_S.size, CONFLICT_N.size))


@pytest.mark.parametrize("noise", [0.0, 3.0])
def test_planted_conflict_set(noise):
    """A plain 16-way set-indexed cache: from a 256 KiB stride on, n > 16 lines share a set and all miss."""
    y = _conflict_grid(noise, 8)
    y[CONFLICT_S >= 256 << 10] += np.where(CONFLICT_N > 16, 700.0 - 285.0, 0.0)
    r = G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 285, 700, control=_conflict_grid(noise, 9))
    assert r.found and r.ways == [None] * 6 + [16] * 8
    assert r.verdict().startswith("conflict found at stride 262144 B: n > 16 lines miss")


def test_random_replacement_conflicts_partly_and_is_still_found():
    y = _conflict_grid(1.0, 10)
    frac = np.clip(1 - 8 / CONFLICT_N, 0, 1)  # 8 ways, random replacement: a rising miss fraction
    y[-1] += frac * (700 - 285)
    r = G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 285, 700)
    assert r.found and r.ways[:-1] == [None] * 13 and 8 <= r.ways[-1] <= 12


@pytest.mark.parametrize("seed", range(4))
def test_flat_and_noisy_grids_have_no_conflict(seed):
    for noise in (0.0, 10.0):
        r = G.conflict_sets(CONFLICT_N, CONFLICT_S, _conflict_grid(noise, seed), 285, 700)
        assert not r.found and r.reason
        assert r.verdict().startswith("no conflict set found up to n=256 lines for strides 4096-33554432 B")


def test_a_rise_the_control_shares_is_not_a_conflict():
    """TLB reach: the same lines moved off the power-of-two alignment rise as much, so no set conflict."""
    y = _conflict_grid(1.0, 11)
    y[-3:] += np.where(CONFLICT_N > 64, 200.0, 0.0)
    assert G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 285, 700).found
    assert not G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 285, 700, control=y + 1).found


def test_conflict_edge_cases():
    y = _conflict_grid(0.0, 0)
    last = y.copy()
    last[:, -1] += 400  # only the last point misses: one point is no conflict set
    assert not G.conflict_sets(CONFLICT_N, CONFLICT_S, last, 285, 700).found
    every = y + 400  # misses even with one line: not a conflict (a broken chase, or not an L2 hit at all)
    assert not G.conflict_sets(CONFLICT_N, CONFLICT_S, every, 285, 700).found
    with pytest.raises(ValueError):
        G.conflict_sets(CONFLICT_N, CONFLICT_S, y[:, :-1], 285, 700)
    with pytest.raises(ValueError):
        G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 700, 285)
    with pytest.raises(ValueError):
        G.conflict_sets(CONFLICT_N, CONFLICT_S, y, 285, 700, control=y[:-1])


def test_fix_effect():
    rng = np.random.default_rng(12)
    base = 1.0 + rng.normal(0, 0.005, 15)
    assert G.fix_effect(0.7 * base, base).verdict == "faster"
    assert G.fix_effect(1.3 * base, base).verdict == "slower"
    same = G.fix_effect(rng.permutation(base), base)
    assert same.verdict == "no effect" and same.ratio == pytest.approx(1.0, abs=0.01)
    noisy = 1.0 + rng.normal(0, 0.1, 15)
    assert G.fix_effect(0.95 * noisy, noisy).verdict == "no effect"  # 5% inside a ~13% spread
    with pytest.raises(ValueError):
        G.fix_effect([1.0], [1.0, 1.0])
