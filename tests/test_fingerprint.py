"""fingerprint.py on real H200 calibrations: same GPU matches, another GPU does not, bad input is refused.

DEFAULT_THRESHOLD was fit on recorded.TUNING_GPUS: the tests that check it use pairs that involve
recorded.TEST_GPUS only."""
import itertools

import numpy as np
import pytest
from recorded import TEST_GPUS, TUNING_GPUS, gpu_of, with_changes

from torch_l2topo import Topology, load_example
from torch_l2topo.analysis.labels import sm_labels
from torch_l2topo.identity import fingerprint as fp


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
        fp.distance(s, fp.DeviceSignature(s.name, s.sm_count, s.cc, s.vector, version=fp.SIGNATURE_VERSION + 1))
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


# ---- the decision, on the labelled collection (issue 11) -------------------------------------------
def test_decide_band_and_candidates():
    t, f = 0.5, 2.0
    assert fp.decide(0.2, threshold=t, factor=f) == fp.MATCH
    assert fp.decide(0.3, threshold=t, factor=f) == fp.AMBIGUOUS  # inside [0.25, 1.0]
    assert fp.decide(0.9, threshold=t, factor=f) == fp.AMBIGUOUS
    assert fp.decide(1.1, threshold=t, factor=f) == fp.NO_MATCH
    assert fp.decide(0.1, 0.45, threshold=t, factor=f) == fp.AMBIGUOUS  # a second device within the threshold
    assert fp.decide(0.1, 0.6, threshold=t, factor=f) == fp.MATCH
    assert fp.decide(0.5, threshold=t, factor=1.0) == fp.MATCH  # factor 1: a plain threshold
    with pytest.raises(ValueError, match="factor"):
        fp.decide(0.1, threshold=t, factor=0.5)


@pytest.fixture(scope="module")
def collection():
    from recorded import load_collection

    return load_collection()


def test_collection_is_labelled_and_carries_no_raw_identifier(collection):
    import re

    from recorded import ROOT

    hex12 = re.compile(r"[0-9a-f]{12}")
    for r in collection:
        assert hex12.fullmatch(r.uuid_hash) and (r.serial_hash is None or hex12.fullmatch(r.serial_hash)), r.key
        assert r.row["session"] and r.row["date"] and r.row["backend"] and r.row["mode"] and r.row["source"], r.key
        if not r.row["member"]:
            uuid = Topology.load(ROOT / r.row["file"]).meta["device"]["uuid"]
            assert uuid.startswith("sha256:"), f"{r.key} carries a raw uuid"
    assert len({r.uuid_hash for r in collection}) >= 12
    assert len({r.session for r in collection}) >= 6


def _split(collection):
    from recorded import TUNING_SESSIONS

    from torch_l2topo.identity import evaluation as fe

    inside = lambda a, b: a.session in TUNING_SESSIONS and b.session in TUNING_SESSIONS  # noqa: E731
    return fe.pairs(collection, inside), fe.pairs(collection, lambda a, b: not inside(a, b))


def test_decision_band_is_the_fit_on_the_tuning_sessions(collection):
    from torch_l2topo.identity import evaluation as fe

    tuning, _ = _split(collection)
    fitted = fe.fit(tuning)
    assert fitted["threshold"] == pytest.approx(fp.DEFAULT_THRESHOLD, rel=0.01)
    assert fitted["factor"] == pytest.approx(fp.AMBIGUITY_FACTOR, rel=0.01)


def test_bench_uses_the_same_split():
    import sys

    from recorded import ROOT, TUNING_SESSIONS

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_fingerprint

    assert tuple(bench_fingerprint.TUNING_SESSIONS) == TUNING_SESSIONS


def test_held_out_pairs_same_device_never_refused_and_serial_collisions_are_reported(collection):
    """On pairs with a calibration outside the tuning sessions: no same-device pair gets "no match". Boards
    with different serials do collide: the sessions of 23:44-23:51 (three machines, serials known) put three
    boards of distinct serials within 0.03 cycles RMS of each other and of machine B's GPU 0 (a63c7a...),
    closer than two calibrations of one GPU. The evaluation must count them as serial collisions (not as
    uuid-only pairs that might be one GPU), and none may be called the same device by its serial."""
    from torch_l2topo.identity import evaluation as fe

    _, test = _split(collection)
    report = fe.evaluate(test, fp.DEFAULT_THRESHOLD, fp.AMBIGUITY_FACTOR)
    assert report["false_non_match"]["n"] >= 80 and report["false_non_match"]["k"] == 0
    assert report["false_match"]["n"] >= 500
    assert report["truth_by"]["serial"] >= 1
    collided = [p for p in report["listed"] if not p["same"] and p["truth"] == "serial"]
    assert report["serial_collisions"]["k"] >= 1 and collided
    for p in collided:
        assert p["verdict"] in ("match", "ambiguous"), p


def test_untrusted_calibrations_are_screened_out(collection):
    from torch_l2topo.identity import evaluation as fe

    untrusted = [r for r in collection if not r.trusted]
    assert {r.row["member"] for r in untrusted} == {"matmul"}  # the recorded runs under another process's matmuls
    assert all(any("L2-resident" in p for p in r.problems) for r in untrusted)
    keys = {k for p in fe.pairs(collection) for k in (p.a, p.b)}
    assert not keys & {r.key for r in untrusted}


def test_raw_repeats_enter_the_chain_map_comparison_only(collection):
    """bench_noise's two GPUs of one session (uuid hashes 5dcc71..., 62ec90...) have chain maps as close as
    two calibrations of one GPU: recorded as found, for the serial to settle (docs/fingerprints.md)."""
    from torch_l2topo.identity import evaluation as fe

    reps = {r.key: r for r in collection if r.signature is None and r.trusted}
    assert len(reps) >= 16
    a = reps["h200-5dcc7192757e-2026-11-30a:cuda_default_r0"]
    b = reps["h200-62ec9099ccd2-2026-11-30a:cuda_default_r0"]
    assert fe.chain_rms(a, b) < 0.1


def test_clopper_pearson():
    from torch_l2topo.identity.evaluation import clopper_pearson

    lo, hi = clopper_pearson(0, 92)
    assert lo == 0 and hi == pytest.approx(1 - 0.025 ** (1 / 92))
    lo, hi = clopper_pearson(5, 10)
    assert lo == pytest.approx(0.1871, abs=1e-4) and hi == pytest.approx(0.8129, abs=1e-4)
    assert clopper_pearson(0, 0) == [0.0, 1.0]
