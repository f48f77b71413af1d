"""repeats.py: GPU-wide level steps inside a calibration are aligned away (a synthetic map with planted steps,
and the H200 repeats recorded by benchmarks/bench_noise.py); single-SM waves are left to the plain median."""
from pathlib import Path

import numpy as np
import pytest

from torch_l2topo.measure.repeats import MIN_WAVE_FOR_ALIGNMENT, align_levels, combine

RECORDED = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "noise").glob("*.npz"))


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
    """Three default calibrations per backend, back to back, on each recorded H200: plain medians differ by up
    to 0.43 cycles per SM after a constant offset; aligned ones made in one GPU state by < 0.15 (0.06-0.13
    measured), and alignment never makes a pair worse."""
    with np.load(path) as z:
        for backend in ("triton", "cuda"):
            runs = [z[f"{backend}_default_r{r}_repeat_chain_cycles"] for r in range(3)]
            aligned, plain = [combine(c, 16) for c in runs], [np.median(c, axis=0) for c in runs]
            for i in range(3):
                for j in range(i + 1, 3):
                    spread = _spread_after_offset(aligned[i], aligned[j])
                    assert spread <= _spread_after_offset(plain[i], plain[j]) + 0.03, (backend, i, j)
                    if abs(np.median(aligned[i] - aligned[j])) < SAME_STATE_OFFSET:
                        assert spread < 0.15, (backend, i, j)
