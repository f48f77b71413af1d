"""repeats.py: GPU-wide level steps inside a calibration are aligned away (a synthetic map with planted steps,
and the H200 repeats recorded by benchmarks/bench_noise.py); single-SM waves are left to the plain median; a
TPC whose SM clock dipped is put back at its wave's clock (planted dips, negative fixtures, and the recorded
repeats where it happened)."""
from pathlib import Path

import numpy as np
import pytest

from torch_l2topo.measure.repeats import (
    FIXED_NS,
    MIN_WAVE_FOR_ALIGNMENT,
    align_levels,
    at_wave_clock,
    combine,
    fit_fixed_ns,
)

RECORDED = sorted((Path(__file__).resolve().parent / "data" / "noise").glob("*.npz"))


def planted(steps, n_rep=3, n_sm=132, wave=16, seed=0):
    """A map, and its repeats with the GPU's level stepping at (repeat, first wave, new level) times."""
    rng = np.random.default_rng(seed)
    truth = 280 + 15 * rng.random(n_sm)
    level = np.zeros((n_rep, n_sm // wave + 1))
    for r, k, value in steps:  # from wave k of repeat r on (in time order), the level is `value`
        level[r, k:] = value
        level[r + 1:, :] = value
    values = truth + level[:, np.arange(n_sm) // wave] + 0.02 * rng.standard_normal((n_rep, n_sm))
    return truth, values


def _spread_after_offset(a, b):
    d = a - b
    return float(np.abs(d - np.median(d)).max())


def test_a_level_step_inside_a_calibration_is_aligned_away():
    # the pattern recorded on an H200: +0.37 from the second wave of the second repeat on
    truth, values = planted([(1, 1, 0.37)])
    assert _spread_after_offset(np.median(values, axis=0), truth) > 0.3  # the plain median mixes the states
    assert _spread_after_offset(combine(values, 16), truth) < 0.08


def test_two_steps_and_a_lone_excursion():
    truth, values = planted([(0, 5, -1.1), (1, 3, 0.0)])
    assert _spread_after_offset(combine(values, 16), truth) < 0.08


def test_no_step_changes_nothing_and_levels_center_on_zero():
    truth, values = planted([])
    np.testing.assert_allclose(combine(values, 16), np.median(values, axis=0), atol=0.02)
    assert abs(np.median(align_levels(values, 16))) < 1e-9


def test_single_sm_waves_and_one_repeat_are_left_alone():
    _, values = planted([(1, 1, 0.37)])
    assert not align_levels(values, MIN_WAVE_FOR_ALIGNMENT - 1).any()
    assert not align_levels(values[:1], 16).any()
    lines = np.repeat(values[:, :, None], 4, axis=2)  # per-SM vectors (the line probe) align alike
    np.testing.assert_allclose(combine(lines, 16)[:, 0], combine(values, 16))


# Two calibrations whose maps differ by more than this constant were made in different GPU states: a state
# is more than an offset (on c7c0b2d62f61 the +1.0-cycle state also moves SMs by 0.13 cycles sd), so the
# 0.15-cycle agreement is only asked of calibrations made in one state.
SAME_STATE_OFFSET = 0.3


@pytest.mark.skipif(not RECORDED, reason="no recorded noise repeats")
@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_h200_calibrations_agree_once_aligned(path):
    """Three or four default calibrations per backend, back to back, on each recorded H200: plain medians differ
    by up to 0.43 cycles per SM after a constant offset; put at their wave's clock and aligned (what calibrate()
    does), ones made in one GPU state by < 0.2 (0.04-0.17 measured), and the pipeline never makes such a pair
    worse (pairs 1.5 cycles apart, in two states, differ by 0.10-0.15 either way: a state is more than an offset).
    0.15-0.17 is on 5455fea76280, SMs 128-131 alone: the four TPCs outside any GPC, which move more than the
    others when the GPU's latency level steps (1.15-1.25 against 0.9 cycles in c7c0b2d62f61's +1.0 state), so
    a step leaves them off the wave level by 20-30% of it."""
    with np.load(path) as z:
        for backend in ("triton", "cuda"):
            runs = [(z[f"{backend}_default_r{r}_repeat_chain_cycles"], z[f"{backend}_default_r{r}_repeat_chain_ns"])
                    for r in range(4) if f"{backend}_default_r{r}_repeat_chain_cycles" in z]
            fixed = FIXED_NS[(9, 0)]
            aligned = [combine(at_wave_clock(c, c / ns, 16, fixed), 16) for c, ns in runs]
            plain = [np.median(c, axis=0) for c, _ in runs]
            for i in range(len(runs)):
                for j in range(i + 1, len(runs)):
                    if abs(np.median(aligned[i] - aligned[j])) < SAME_STATE_OFFSET:
                        spread = _spread_after_offset(aligned[i], aligned[j])
                        assert spread <= _spread_after_offset(plain[i], plain[j]) + 0.03, (backend, i, j)
                        assert spread < 0.2, (backend, i, j)


# ---- the SM clock (at_wave_clock) ----------------------------------------------------------------------------
def clocked(fixed_ns=71.0, dips=((0, (0, 1), 1.9745), (1, (40, 41), 1.975)), n_rep=3, n_sm=132, seed=0):
    """A map and its repeats in cycles, t_ns = fixed_ns + S / f, every SM at 1.98 GHz but the TPCs of `dips`
    (repeat, SMs, clock) whose clock fell in that repeat."""
    rng = np.random.default_rng(seed)
    s_cycles = 140 + 15 * rng.random(n_sm)
    clock = np.full((n_rep, n_sm), 1.98)
    for r, sms, f in dips:
        clock[r, list(sms)] = f
    cycles = fixed_ns * clock + s_cycles + 0.01 * rng.standard_normal((n_rep, n_sm))
    return fixed_ns * 1.98 + s_cycles, cycles, clock


def test_a_tpc_whose_clock_dipped_is_put_back_at_its_waves_clock():
    truth, cycles, clock = clocked(dips=((0, (0, 1), 1.9745), (1, (0, 1), 1.9745)))  # two of three repeats
    assert _spread_after_offset(combine(cycles, 16), truth) > 0.35  # the median keeps the dipped value
    fixed = fit_fixed_ns(cycles, clock, 16)
    assert fixed == pytest.approx(71.0, rel=0.05)
    assert _spread_after_offset(combine(at_wave_clock(cycles, clock, 16, fixed), 16), truth) < 0.05


def test_steady_clocks_are_not_fitted_and_change_nothing():
    truth, cycles, clock = clocked(dips=())
    assert fit_fixed_ns(cycles, clock, 16) is None
    np.testing.assert_array_equal(at_wave_clock(cycles, clock, 16, 71.0), cycles)
    # unrelated noise on the clocks is not taken for a clock effect
    rng = np.random.default_rng(1)
    assert fit_fixed_ns(cycles, clock + 0.002 * rng.standard_normal(clock.shape), 16) is None


def test_a_gpu_wide_clock_change_is_left_to_the_alignment():
    _, cycles, clock = clocked(dips=())
    clock[1] = 1.97  # every SM of repeat 1: the wave's clock moved with it, nothing is shifted per SM
    np.testing.assert_allclose(at_wave_clock(cycles, clock, 16, 71.0), cycles)


def _aligned_range(cycles, wave=16):
    return float(np.ptp(cycles - align_levels(cycles, wave), axis=0).max())


RECORDED_CLOCK_DIPS = [  # (recording, calibration) of the recorded H200 repeats where TPC clocks dipped
    ("h200-c7c0b2d62f61-2026-11-30b", "cuda_default_r0"),
    ("h200-c7c0b2d62f61-2026-11-30b", "triton_repeats5_r2"),
    ("h200-5455fea76280-2026-12-01a", "cuda_repeats5_r1"),
    ("h200-5455fea76280-2026-12-01a", "triton_default_r1"),
]


@pytest.mark.parametrize("recording, calibration", RECORDED_CLOCK_DIPS)
def test_recorded_clock_dips_are_the_repeat_noise_the_correction_removes(recording, calibration):
    """On the recorded calibrations whose TPC clocks dipped, the aligned repeats of one calibration disagreed
    by 0.29-0.46 cycles per SM (the old statistic: over 0.25); put at their wave's clock (the H200 value, not a
    fit on this data), by under 0.15."""
    path = RECORDED[[p.stem for p in RECORDED].index(recording)]
    with np.load(path) as z:
        cycles, ns = z[f"{calibration}_repeat_chain_cycles"], z[f"{calibration}_repeat_chain_ns"]
    clock = cycles / ns
    assert _aligned_range(cycles) > 0.25
    assert _aligned_range(at_wave_clock(cycles, clock, 16, FIXED_NS[(9, 0)])) < 0.15
