"""fingerprint.py on real H200 calibrations: same GPU matches, another GPU does not, bad input is refused."""
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from torch_l2topo import L2TopoError, Topology, load_example
from torch_l2topo import fingerprint as fp

CALIBRATIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "calibrations"


@pytest.fixture(scope="module")
def topos() -> dict:
    """The recorded calibrations: four H200s (two two-GPU machines) x {cuda, triton} x modes and phases."""
    paths = sorted(CALIBRATIONS.glob("*.npz"))
    assert len(paths) >= 12, f"recorded calibrations missing under {CALIBRATIONS}"
    return {p.stem: Topology.load(p) for p in paths}


@pytest.fixture(scope="module")
def sigs(topos) -> dict:
    return {k: fp.signature(t) for k, t in topos.items()}


def _gpu(name: str) -> str:
    return name.split("-")[1]


def _with(sig: fp.DeviceSignature, **changes) -> fp.DeviceSignature:
    fields = dict(name=sig.name, sm_count=sig.sm_count, cc=sig.cc, vector=sig.vector)
    fields.update(changes)
    return fp.DeviceSignature(**fields)


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
    assert s.model == ("NVIDIA H200", 132, (9, 0))
    assert s.vector.shape == (264,)
    assert np.median(s.block("chain")) == pytest.approx(0.0, abs=1e-9)
    side = s.block("side")
    assert side[0] < 0  # oriented: SM 0 is on side -1
    assert (side > 0).sum() == (side < 0).sum() == 66
    assert np.all(side[0::2] == side[1::2])  # TPC twins sit on one side
    # half of a far - near gap of ~31 cycles (the two partitions of the bimodal line matrix)
    assert 14 < abs(side[0]) < 17


def test_same_gpu_recalibrated_matches_other_gpu_does_not(sigs):
    for a, b in itertools.combinations(sigs, 2):
        d = fp.distance(sigs[a], sigs[b])
        assert d == pytest.approx(fp.distance(sigs[b], sigs[a]))
        if _gpu(a) == _gpu(b):
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
        fp.distance(s, _with(s, name="NVIDIA H100 80GB HBM3"))
    with pytest.raises(ValueError, match="different device models"):
        fp.distance(s, _with(s, cc=(8, 0)))
    with pytest.raises(ValueError, match="different device models"):  # a MIG slice: fewer SMs
        fp.distance(s, _with(s, sm_count=16, vector=s.vector[:32]))
    with pytest.raises(ValueError, match="versions differ"):
        fp.distance(s, fp.DeviceSignature(s.name, s.sm_count, s.cc, s.vector, version=2))
    with pytest.raises(ValueError, match="shape"):
        _with(s, vector=s.vector[:-1])
    with pytest.raises(ValueError, match="NaN"):
        _with(s, vector=np.where(np.arange(264) == 3, np.nan, s.vector))


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


def test_default_threshold_separates_the_recorded_data(sigs):
    within = [fp.distance(sigs[a], sigs[b]) for a, b in itertools.combinations(sigs, 2) if _gpu(a) == _gpu(b)]
    between = [fp.distance(sigs[a], sigs[b]) for a, b in itertools.combinations(sigs, 2) if _gpu(a) != _gpu(b)]
    threshold, margin = fp.calibrate_threshold(within, between)
    assert threshold == pytest.approx(fp.DEFAULT_THRESHOLD, rel=0.05)
    assert margin > 1.5


# ---- the registry ----------------------------------------------------------------------------------
def test_registry_round_trip_and_identify(tmp_path, sigs, topos):
    reg = fp.Registry(tmp_path / "reg")
    assert reg.names() == []
    assert reg.identify(sigs["h200-d557bc-cuda-waves"]) == (None, math.inf, 0.0)
    reg.add("gpu-a", sigs["h200-d557bc-cuda-waves"])
    reg.add("gpu-b", sigs["h200-f78934-cuda-waves"])
    assert reg.names() == ["gpu-a", "gpu-b"]
    assert np.array_equal(reg.get("gpu-a").vector, sigs["h200-d557bc-cuda-waves"].vector)
    assert reg.get("gpu-a").model == sigs["h200-d557bc-cuda-waves"].model
    assert not list((tmp_path / "reg").glob("*.tmp")), "atomic write left a temporary file"

    for gpu in sorted({_gpu(k) for k in topos} - {"d557bc", "f78934"}):
        reg.add(f"gpu-{gpu}", sigs[f"h200-{gpu}-cuda-waves"])
    for key, topo in topos.items():
        name, d, margin = reg.identify(topo)  # a Topology is accepted as well as a signature
        assert name == {"d557bc": "gpu-a", "f78934": "gpu-b"}.get(_gpu(key), f"gpu-{_gpu(key)}"), key
        assert d < fp.DEFAULT_THRESHOLD and margin > 1.2

    reg.remove("gpu-b")
    name, d, margin = reg.identify(sigs["h200-f78934-triton-concurrent"])
    assert name is None and d > fp.DEFAULT_THRESHOLD and margin > 1.5
    with pytest.raises(KeyError):
        reg.remove("gpu-b")


def test_registry_refuses_duplicate_and_bad_names(tmp_path, sigs):
    reg = fp.Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("gpu-a", s)
    with pytest.raises(fp.RegistryError, match="exists"):
        reg.add("gpu-a", sigs["h200-f78934-cuda-waves"])
    reg.add("gpu-a", sigs["h200-f78934-cuda-waves"], replace=True)
    assert reg.identify(sigs["h200-f78934-cuda-serialized"])[0] == "gpu-a"
    for bad in ("../escape", "", ".hidden", "a/b", "x" * 200):
        with pytest.raises(fp.RegistryError, match="registry names"):
            reg.add(bad, s)


def test_registry_skips_other_models(tmp_path, sigs):
    reg = fp.Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("other-model", _with(s, name="NVIDIA H100 80GB HBM3"))  # the same numbers, another model
    assert reg.identify(s) == (None, math.inf, 0.0)


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": "something else"}),
    json.dumps({"format": "torch_l2topo/device-signature", "version": 1,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": [0.0] * 10}),
    json.dumps({"format": "torch_l2topo/device-signature", "version": 1,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": ["a"] * 264}),
    '{"format": "torch_l2topo/device-signature", "version": 1, "device": {"name": "NVIDIA H200", '
    '"sm_count": 132, "cc": [9, 0]}, "vector": [' + ", ".join(["NaN"] * 264) + "]}",
    "\xff\xfe",
])
def test_corrupt_registry_entry_is_a_clear_error(tmp_path, sigs, content):
    reg = fp.Registry(tmp_path)
    reg.add("good", sigs["h200-d557bc-cuda-waves"])
    bad = tmp_path / "broken.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(fp.RegistryError, match="broken.json") as info:
        reg.identify(sigs["h200-d557bc-cuda-serialized"])
    assert isinstance(info.value, L2TopoError)
    with pytest.raises(fp.RegistryError, match="broken.json"):
        reg.get("broken")


def test_registry_file_with_an_invalid_name_is_reported(tmp_path, sigs):
    reg = fp.Registry(tmp_path)
    reg.add("good", sigs["h200-d557bc-cuda-waves"])
    (tmp_path / "good.json").rename(tmp_path / "not good.json")
    with pytest.raises(fp.RegistryError, match="not good.json"):
        reg.identify(sigs["h200-d557bc-cuda-serialized"])


# ---- hashed export ---------------------------------------------------------------------------------
SALTS = ("team-secret-1", b"\x00\x01another-salt", "third salt value")


@pytest.mark.parametrize("salt", SALTS)
def test_hashed_export_matches_same_gpu_only(sigs, salt):
    ex = {k: fp.export_hashed(s, salt) for k, s in sigs.items()}
    for a, b in itertools.combinations(ex, 2):
        same, d = fp.match_hashed(ex[a], ex[b])
        assert same == (_gpu(a) == _gpu(b)), (a, b, d)


def test_hashed_export_reveals_no_map_and_is_deterministic(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    ex = fp.export_hashed(s, "team-secret-1")
    assert ex == fp.export_hashed(s, "team-secret-1")
    assert ex != fp.export_hashed(s, "team-secret-2")
    assert len(bytes.fromhex(ex["chain_bits"])) * 8 == ex["n_bits"] == fp.HASH_BITS
    floats = [v for v in ex.values() if isinstance(v, float)]
    assert not floats and "vector" not in ex
    json.dumps(ex)  # JSON-able as is


def test_hashed_export_refuses_mismatched_salt_model_or_bits(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    ex = fp.export_hashed(s, "team-secret-1")
    with pytest.raises(ValueError, match="salt_id"):
        fp.hashed_distance(ex, fp.export_hashed(s, "team-secret-2"))
    with pytest.raises(ValueError, match="device"):
        fp.hashed_distance(ex, fp.export_hashed(_with(s, name="NVIDIA H100 80GB HBM3"), "team-secret-1"))
    with pytest.raises(ValueError, match="n_bits"):
        fp.hashed_distance(ex, fp.export_hashed(s, "team-secret-1", n_bits=256))
    with pytest.raises(ValueError, match="salt"):
        fp.export_hashed(s, "short")
    with pytest.raises(ValueError, match="multiple of 8"):
        fp.export_hashed(s, "team-secret-1", n_bits=100)
    with pytest.raises(ValueError, match="not a hashed"):
        fp.hashed_distance(ex, s.to_dict())


def test_hashed_export_ignores_a_constant_offset_and_checks_sides(sigs):
    s = sigs["h200-d557bc-cuda-waves"]
    shifted = _with(s, vector=s.vector + np.r_[np.full(132, 3.0), np.zeros(132)])
    assert fp.hashed_distance(fp.export_hashed(s, "team-secret-1"), fp.export_hashed(shifted, "team-secret-1")) == 0
    flipped = _with(s, vector=np.r_[s.block("chain"), -s.block("side")])
    assert fp.hashed_distance(fp.export_hashed(s, "team-secret-1"), fp.export_hashed(flipped, "team-secret-1")) == 1.0
