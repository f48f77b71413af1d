"""localize.py: trained on one real H200 calibration, tested on the others of the same GPU and line buffer;
synthetic fixtures for what it must refuse (flat or random maps resolve nothing).

SEPARATION_IN_NOISE was tuned on the recorded calibrations of recorded.TUNING_GPUS; the real-data tests
here use recorded.TEST_GPUS only."""
import numpy as np
import pytest
from recorded import TEST_GPUS

from torch_l2topo.analysis.labels import sm_labels
from torch_l2topo.identity.localize import SMClassifier, evaluate

# Same process and line buffer as the training calibration (line homes follow physical addresses).
HELD_OUT = ("cuda-serialized", "cuda-concurrent", "triton-waves", "triton-serialized", "triton-concurrent")


@pytest.fixture(scope="module")
def calibrations(topos) -> dict:
    return {name[len("h200-"):]: t for name, t in topos.items()}


@pytest.fixture(scope="module")
def classifiers(calibrations) -> dict:
    out = {}
    for gpu in TEST_GPUS:
        train = calibrations[f"{gpu}-cuda-waves"]
        for k in (4, 8, 16):
            out[gpu, k] = SMClassifier().fit(train.line_cycles, sm_labels(train).levels(), n_lines_used=k)
    return out


@pytest.mark.parametrize("gpu", TEST_GPUS)
@pytest.mark.parametrize("k", [4, 8, 16])
def test_claimed_levels_hold_on_held_out_calibrations(calibrations, classifiers, gpu, k):
    clf = classifiers[gpu, k]
    assert len(clf.chosen_lines) == k and len(set(clf.chosen_lines.tolist())) == k
    assert clf.resolvable, "an H200 line map resolves at least its two L2 partitions"
    for other in HELD_OUT:
        t = calibrations[f"{gpu}-{other}"]
        assert np.array_equal(t.line_addresses, calibrations[f"{gpu}-cuda-waves"].line_addresses)
        res = evaluate(clf, t.line_cycles[:, clf.chosen_lines], np.arange(t.n_sm))
        assert res["unit_accuracy"] >= 0.95, (other, res["confusions"])
        for level in clf.resolvable:
            assert res["levels"][level]["accuracy"] >= 0.95, (other, level)


def test_h200_resolution(classifiers):
    for clf in classifiers.values():
        assert np.all(clf.units[0::2] == clf.units[1::2]), "TPC twins must share a unit"
        assert "sm" not in clf.resolvable and "tpc" not in clf.resolvable
        assert clf.finest_level == "partition"
        assert 12 <= clf.n_units <= clf.n_prototypes <= 20
        assert clf.separation >= 12 * clf.noise
        assert 0.2 < clf.noise < 0.5  # per-entry repeat noise of the recorded H200 line maps, in cycles


def test_prediction_ignores_a_constant_offset(calibrations, classifiers):
    clf = classifiers[TEST_GPUS[0], 8]
    x = calibrations[f"{TEST_GPUS[0]}-triton-waves"].line_cycles[:, clf.chosen_lines].astype(np.float64)
    a, b = clf.predict(x), clf.predict(x + 37.5)
    assert np.array_equal(a.unit, b.unit) and np.allclose(a.margin, b.margin)
    assert np.array_equal(a["partition"], a.labels["partition"])
    assert np.all(a["sm"] == -1)  # a unit holds several SMs: no SM label is guessed
    one = clf.predict(x[5])
    assert one.unit.shape == (1,) and one.unit[0] == a.unit[5]


def _synthetic(n_groups=4, twins=2, n_lines=64, noise=0.1, spread=10.0, seed=0):
    """SMs in groups sharing a line profile; group g's profile differs by `spread` cycles on random lines."""
    rng = np.random.default_rng(seed)
    profiles = 300 + spread * rng.integers(0, 2, size=(n_groups, n_lines))
    group = np.repeat(np.arange(n_groups), twins)
    lc = profiles[group] + noise * rng.standard_normal((len(group), n_lines))
    return lc, group


def test_synthetic_groups_are_found_and_predicted():
    lc, group = _synthetic()
    clf = SMClassifier().fit(lc, {"group": group, "half": group // 2}, n_lines_used=4)
    assert clf.n_units == 4 and clf.finest_level == "group"
    assert clf.resolvable == ["group", "half"]
    rng = np.random.default_rng(1)
    fresh = lc[:, clf.chosen_lines] + 0.1 * rng.standard_normal((len(lc), 4)) + 5.0  # re-measured, offset
    res = evaluate(clf, fresh, np.arange(len(lc)))
    assert res["levels"]["group"]["accuracy"] == 1.0 and res["unit_accuracy"] == 1.0
    assert res["levels"]["sm"] == {"accuracy": 0.0, "decided": 0.0, "resolvable": False, "n_labels": 8}


def test_evaluate_reports_confusions():
    lc, group = _synthetic()
    clf = SMClassifier().fit(lc, {"group": group}, n_lines_used=4)
    x = lc[:, clf.chosen_lines].copy()
    x[0] = x[7]  # SM 0 (group 0) measured like SM 7 (group 3)
    res = evaluate(clf, x, np.arange(len(lc)))
    assert res["unit_accuracy"] == pytest.approx(7 / 8)
    assert res["confusions"] == [{"true_unit": 0, "true_sms": [0, 1], "predicted_unit": 3,
                                  "predicted_sms": [6, 7], "count": 1}]


@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_flat_map_resolves_nothing(noise):
    lc, _ = _synthetic(spread=0.0, noise=noise, n_groups=16)
    clf = SMClassifier().fit(lc, {"half": np.arange(32) // 16}, n_lines_used=8)
    assert clf.n_units == 1 and clf.resolvable == [] and clf.finest_level is None
    pred = clf.predict(lc[:, clf.chosen_lines])
    assert np.all(pred["half"] == -1) and np.all(pred["sm"] == -1) and np.all(np.isinf(pred.margin))


def test_random_map_resolves_nothing():
    rng = np.random.default_rng(3)
    lc = 300 + rng.standard_normal((64, 128))
    clf = SMClassifier().fit(lc, {"tpc": np.arange(64) // 2}, n_lines_used=16)
    assert clf.resolvable == [] and clf.n_units == 1


def test_input_validation():
    lc, group = _synthetic()
    with pytest.raises(RuntimeError, match="before fit"):
        SMClassifier().predict(lc[:, :4])
    with pytest.raises(ValueError, match="n_lines_used"):
        SMClassifier().fit(lc, n_lines_used=1)
    with pytest.raises(ValueError, match="n_lines_used"):
        SMClassifier().fit(lc, n_lines_used=65)
    with pytest.raises(ValueError, match="labels"):
        SMClassifier().fit(lc, {"group": group[:-1]})
    with pytest.raises(ValueError, match="labels"):
        SMClassifier().fit(lc, {"group": group - 1})
    with pytest.raises(ValueError, match="NaN"):
        SMClassifier().fit(np.where(lc > 305, np.nan, lc))
    with pytest.raises(ValueError, match="matrix"):
        SMClassifier().fit(lc[0])
    with pytest.raises(ValueError, match="noise"):
        SMClassifier().fit(lc, noise=-1.0)
    clf = SMClassifier().fit(lc, n_lines_used=4)
    with pytest.raises(ValueError, match="shape"):
        clf.predict(lc[:, :5])
    with pytest.raises(ValueError, match="NaN"):
        clf.predict(np.full((2, 4), np.nan))
    with pytest.raises(ValueError, match="true_sm"):
        evaluate(clf, lc[:, clf.chosen_lines], np.arange(len(lc)) + 1)
