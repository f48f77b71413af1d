"""fingerprint.py on real H200 calibrations: same GPU matches, another GPU does not, bad input is refused.

DEFAULT_THRESHOLD was fit on recorded.TUNING_GPUS: the tests that check it use pairs that involve
recorded.TEST_GPUS only."""
import itertools

import numpy as np
import pytest

from recorded import with_changes, TEST_GPUS, TUNING_GPUS, gpu_of
from torch_l2topo import Topology, load_example
from torch_l2topo import fingerprint as fp
from torch_l2topo.labels import sm_labels


def _flat_topology(n_sm=8, n_lines=16, noise=0.0, seed=0) -> Topology:
    rng = np.random.default_rng(seed)
    lc = (300 + noise * rng.standard_normal((n_sm, n_lines))).astype(np.float32)
    per_sm = np.full(n_sm, 280.0, dtype=np.float32)
    return Topology(chain_cycles=per_sm.copy(), chain_ns=per_sm / 2, line_cycles=lc,
                    line_addresses=np.arange(n_lines, dtype=np.int64) * 128, chain_noise=np.zeros(n_sm, np.float32),
                    line_noise=np.full(n_sm, noise, np.float32), sm_clock_ghz=np.full(n_sm, 2.0, np.float32),
                    meta={"device": {"name": "Synthetic", "sm_count": n_sm, "cc": [9, 0]}})


# ---- the signature ---------------------------------------------------------------------------------
def test_signature_holds_centered_chain_and_partition_sides(sigs, topos):
    s = sigs["h200-d557bc-cuda-waves"]
    labels = sm_labels(topos["h200-d557bc-cuda-waves"])
    assert np.array_equal(s.block("side") > 0, labels.partition == 1)  # the sides are the one source's labels
    assert s.model == ("NVIDIA H200", 132, (9, 0))
    assert s.vector.shape == (264,)
    assert np.median(s.block("chain")) == pytest.approx(0.0, abs=1e-9)
    side = s.block("side")
    assert side[0] < 0  # oriented: SM 0 is on side -1
    assert (side > 0).sum() == (side < 0).sum() == 66
    assert np.all(side[0::2] == side[1::2])  # TPC twins sit on one side
    # half of a far - near gap of ~31 cycles (the two partitions of the bimodal line matrix)
    assert 14 < abs(side[0]) < 17


def _held_out_pairs(sigs):
    """Pairs of recorded calibrations that were not both in the threshold's tuning set."""
    return [(a, b) for a, b in itertools.combinations(sigs, 2) if gpu_of(a) in TEST_GPUS or gpu_of(b) in TEST_GPUS]


def test_same_gpu_recalibrated_matches_other_gpu_does_not(sigs):
    pairs = _held_out_pairs(sigs)
    assert sum(gpu_of(a) == gpu_of(b) for a, b in pairs) >= 40 and sum(gpu_of(a) != gpu_of(b) for a, b in pairs) >= 100
    for a, b in pairs:
        d = fp.distance(sigs[a], sigs[b])
        assert d == pytest.approx(fp.distance(sigs[b], sigs[a]))
        if gpu_of(a) == gpu_of(b):
            assert d < fp.DEFAULT_THRESHOLD / 1.5, (a, b, d)  # other backend or mode: well inside
        else:
            assert d > fp.DEFAULT_THRESHOLD * 1.5, (a, b, d)


def test_distance_ignores_a_constant_offset(topos):
    t = topos["h200-d557bc-cuda-waves"]
    shifted = Topology(**{k: getattr(t, k) for k in ("chain_ns", "line_addresses", "chain_noise", "line_noise",
                                                     "sm_clock_ghz")},
                       chain_cycles=t.chain_cycles + 2.0, line_cycles=t.line_cycles + 2.0, meta=t.meta)
    assert fp.distance(fp.signature(t), fp.signature(shifted)) == pytest.approx(0.0, abs=1e-5)


def test_bundled_examples_agree_with_recorded_set(sigs):
    assert fp.distance(fp.signature(load_example("h200-f78934-triton-waves")),
                       sigs["h200-f78934-cuda-serialized"]) < fp.DEFAULT_THRESHOLD


def test_other_model_or_length_is_refused_not_matched(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    with pytest.raises(ValueError, match="different device models"):
        fp.distance(s, with_changes(s, name="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="different device models"):
        fp.distance(s, with_changes(s, cc=(8, 0)))
    with pytest.raises(ValueError, match="different device models"):  # a MIG slice: fewer SMs
        fp.distance(s, with_changes(s, sm_count=16, vector=s.vector[:32]))
    with pytest.raises(ValueError, match="versions differ"):
        fp.distance(s, fp.DeviceSignature(s.name, s.sm_count, s.cc, s.vector, version=2))
    with pytest.raises(ValueError, match="shape"):
        with_changes(s, vector=s.vector[:-1])
    with pytest.raises(ValueError, match="NaN"):
        with_changes(s, vector=np.where(np.arange(264) == 3, np.nan, s.vector))


def test_signature_needs_device_metadata(topos):
    t = topos["h200-d557bc-cuda-waves"]
    bare = Topology(**{k: getattr(t, k) for k in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses",
                                                  "chain_noise", "line_noise", "sm_clock_ghz")}, meta={})
    with pytest.raises(ValueError, match="GPU model"):
        fp.signature(bare)


def test_flat_map_has_no_partition_sides():
    for noise in (0.0, 0.3):
        s = fp.signature(_flat_topology(noise=noise))
        assert np.all(s.block("side") == 0)


def test_calibrate_threshold():
    t, m = fp.calibrate_threshold([0.1, 0.2], [0.8, 1.0])
    assert t == pytest.approx(0.4) and m == pytest.approx(2.0)
    t, m = fp.calibrate_threshold([0.0], [0.08])
    assert t == pytest.approx(0.04) and m == pytest.approx(2.0)
    with pytest.raises(ValueError, match="no threshold separates"):
        fp.calibrate_threshold([0.3, 0.9], [0.5])
    with pytest.raises(ValueError, match="at least one"):
        fp.calibrate_threshold([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        fp.calibrate_threshold([float("nan")], [1.0])


def test_default_threshold_is_the_fit_on_the_tuning_set(sigs):
    """Reproduces the constant from the data it documents (its six calibrations per GPU: both backends x three
    modes); whether it generalizes is test_same_gpu_recalibrated_matches_other_gpu_does_not's question."""
    tuning = {k: v for k, v in sigs.items() if gpu_of(k) in TUNING_GPUS}
    pairs = list(itertools.combinations(tuning, 2))
    within = [fp.distance(tuning[a], tuning[b]) for a, b in pairs if gpu_of(a) == gpu_of(b)]
    between = [fp.distance(tuning[a], tuning[b]) for a, b in pairs if gpu_of(a) != gpu_of(b)]
    threshold, margin = fp.calibrate_threshold(within, between)
    assert threshold == pytest.approx(fp.DEFAULT_THRESHOLD, rel=0.01)
    assert margin > 1.5
