"""trust.py and calibrate()'s self-checks on CPU: synthetic repeats with known answers, a stand-in GPU whose
measurements are disturbed on purpose (nothing disturbed is ever cached), and the recorded H200 runs."""
from pathlib import Path

import fake_gpu
import numpy as np
import pytest

import torch_l2topo
from torch_l2topo.errors import CalibrationDisturbed
from torch_l2topo.measure import trust
from torch_l2topo.measure.repeats import Repeats

TOPO = torch_l2topo.load_example("h200")


def test_clean_repeats_pass_every_check():
    v = trust.check(fake_gpu.repeats_of(TOPO))
    assert v.trusted and not v.problems and not v.notes
    assert 0.89 < v.figures["resident_ratio_median"] < 1.02 and v.figures["repeat_ptp_max"] < 0.5


def test_an_evicted_ring_is_caught_by_the_same_run_line_probe():
    v = trust.check(fake_gpu.repeats_of(TOPO, extra_cycles=fake_gpu.EVICTED_EXTRA_CYCLES))
    assert not v.trusted and "not L2-resident" in v.problems[0] and v.figures["resident_ratio_max"] > 1.9


def test_a_partly_evicted_ring_is_caught_too():
    # a quarter of the loads missing L2 (~ +85 cycles) is far above the clean ratio (<= 1.015)
    assert not trust.check(fake_gpu.repeats_of(TOPO, extra_cycles=85.0)).trusted


def test_repeats_that_disagree_are_refused():
    r = fake_gpu.repeats_of(TOPO)
    chain = r.chain_cycles.copy()
    chain[1, 17] += 3.0  # one SM disturbed in one repeat
    v = trust.check(Repeats(chain, chain / 1.98, r.chain_start_ns, r.line_median))
    assert not v.trusted and "SM 17" in v.problems[0] and "repeats disagree" in v.problems[0]


def test_a_clock_that_moved_while_probing_is_refused():
    r = fake_gpu.repeats_of(TOPO)
    ns = r.chain_ns.copy()
    ns[2] *= 1.05  # the third repeat ran at a 5% lower clock
    v = trust.check(Repeats(r.chain_cycles, ns, r.chain_start_ns, r.line_median))
    assert not v.trusted and "clock moved" in v.problems[0]


def test_a_clock_or_map_that_moved_since_the_previous_calibration_is_said_not_refused():
    previous = torch_l2topo.load_example("h200")
    previous.sm_clock_ghz = previous.sm_clock_ghz * 1.1
    v = trust.check(fake_gpu.repeats_of(TOPO, extra_cycles=5.0), previous=previous)
    assert v.trusted and len(v.notes) == 2
    assert "previous calibration's 2.17" in v.notes[0] and "+5.0 cycles" in v.notes[1]


def test_repeats_validate_their_input():
    r = fake_gpu.repeats_of(TOPO)
    with pytest.raises(ValueError, match="one shape"):
        Repeats(r.chain_cycles, r.chain_ns[:, :5], r.chain_start_ns, r.line_median)
    with pytest.raises(ValueError, match="finite and positive"):
        Repeats(r.chain_cycles * np.nan, r.chain_ns, r.chain_start_ns, r.line_median)
    assert Repeats.from_extras({}) is None
    back = Repeats.from_extras(r.to_extras())
    assert np.array_equal(back.chain_cycles, r.chain_cycles)


# ---- calibrate() on a stand-in GPU ---------------------------------------------------------------------
@pytest.fixture
def gpu(monkeypatch, tmp_path):
    def install(disturbed=(), blocked=()):
        fake_gpu.install(monkeypatch.setattr, tmp_path / "m", disturbed=disturbed, blocked=blocked)
        return tmp_path / "m"

    (tmp_path / "m").mkdir()
    return install


def test_a_disturbed_attempt_is_retried_and_only_the_clean_one_cached(gpu, cache_dir):
    runs = gpu(disturbed=(1,))
    topo = torch_l2topo.calibrate()
    assert topo.meta["trust"]["trusted"] and topo.meta["trust"]["attempt"] == 2
    assert fake_gpu.measurements(runs) == 2
    assert torch_l2topo.calibrate().meta["trust"]["attempt"] == 2  # the cached one
    assert fake_gpu.measurements(runs) == 2


def test_a_calibration_disturbed_on_every_attempt_is_refused_and_not_cached(gpu, cache_dir):
    runs = gpu(disturbed=(1, 2, 3))
    with pytest.raises(CalibrationDisturbed, match="disturbed on all 3 attempts; last: the ring was not L2-resident"):
        torch_l2topo.calibrate()
    assert fake_gpu.measurements(runs) == 3
    assert not list(cache_dir.glob("*.npz"))


def test_sms_held_by_other_work_count_as_a_disturbed_attempt(gpu, cache_dir):
    runs = gpu(blocked=(1,))
    assert torch_l2topo.calibrate().meta["trust"]["attempt"] == 2
    assert fake_gpu.measurements(runs) == 2


def test_sms_held_on_every_attempt_is_refused_even_unchecked(gpu, cache_dir):
    gpu(blocked=(1, 2))
    with pytest.raises(CalibrationDisturbed, match="only 20 of 132 SMs got a probe CTA"):
        torch_l2topo.calibrate(check=False, attempts=2)
    assert not list(cache_dir.glob("*.npz"))


def test_check_false_returns_the_untrusted_map_without_caching_it(gpu, cache_dir):
    gpu(disturbed=(1, 2))
    topo = torch_l2topo.calibrate(check=False, attempts=2)
    assert topo.meta["trust"]["trusted"] is False and "not L2-resident" in topo.meta["trust"]["problems"][0]
    assert "NOT TRUSTED" in topo.summary()
    assert not list(cache_dir.glob("*.npz"))


def test_a_recalibration_says_when_the_map_moved(gpu, cache_dir, caplog):
    gpu()
    torch_l2topo.calibrate()
    first = next(cache_dir.glob("*.npz"))
    old = torch_l2topo.Topology.load(first)
    old.chain_cycles = old.chain_cycles - 10.0  # as if the GPU had been faster at the previous calibration
    old.save(first)
    topo = torch_l2topo.calibrate(force=True)
    assert topo.meta["trust"]["trusted"] and "moved by +10.0 cycles" in topo.meta["trust"]["notes"][0]
    assert "moved by +10.0 cycles" in caplog.text


def test_attempts_must_be_positive(gpu, cache_dir):
    gpu()
    with pytest.raises(ValueError, match="attempts"):
        torch_l2topo.calibrate(attempts=0)


# ---- recorded H200 runs (benchmarks/bench_trust.py): test data only, the thresholds predate them ------
RECORDED = sorted((Path(__file__).resolve().parent / "data" / "trust").glob("*.npz"))


@pytest.mark.skipif(not RECORDED, reason="no recorded runs")
@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_recorded_idle_runs_pass_and_matmul_runs_are_refused(path):
    """Each recording holds unchecked calibrations of one H200: idle, under another process's bf16 matmuls,
    idle again. Ground truth from physics, not from the detector: the matmul map sits hundreds of cycles above
    the idle one (DRAM, not L2), the second idle map within a cycle of the first."""
    with np.load(path) as z:
        def verdict(name):
            return trust.check(Repeats(*(z[f"{name}_repeat_{k}"] for k in ("chain_cycles", "chain_ns",
                                                                           "chain_start_ns", "line_median"))))

        idle = z["idle_chain_cycles"]
        assert np.median(z["matmul_chain_cycles"] - idle) > 200 and abs(np.median(z["idle2_chain_cycles"] - idle)) < 1
        assert verdict("idle").trusted and verdict("idle2").trusted
        bad = verdict("matmul")
        assert not bad.trusted and "not L2-resident" in bad.problems[0]
