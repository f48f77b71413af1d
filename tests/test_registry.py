"""registry.py: enrolment, identify() verdicts on real H200 calibrations (match, no match, ambiguous, same GPU
with a new uuid, serial conflicts), refused names, corrupt entries, entries written before identities."""
import json
import math

import numpy as np
import pytest
from recorded import gpu_of, with_changes

from torch_l2topo import L2TopoError, Topology
from torch_l2topo.errors import RegistryError
from torch_l2topo.identity.fingerprint import AMBIGUITY_FACTOR, DEFAULT_THRESHOLD
from torch_l2topo.identity.registry import Registry


def _with_meta(topo: Topology, **meta) -> Topology:
    """The same calibration with some metadata replaced (another uuid hash, a serial hash, a trust verdict)."""
    return Topology(**{k: getattr(topo, k) for k in ("chain_cycles", "chain_ns", "line_cycles", "line_addresses",
                                                     "chain_noise", "line_noise", "sm_clock_ghz")},
                    meta=dict(topo.meta, **meta))


def test_registry_round_trip_and_identify(tmp_path, sigs, topos):
    reg = Registry(tmp_path / "reg")
    assert reg.names() == []
    with pytest.raises(RegistryError, match="no registry at .*reg: enroll a GPU first"):
        reg.identify(sigs["h200-d557bc-cuda-waves"])  # a mistyped directory is not "no match"
    (tmp_path / "reg").mkdir()
    empty = reg.identify(sigs["h200-d557bc-cuda-waves"])
    assert (empty.verdict, empty.name, empty.nearest, empty.distance, empty.margin) == \
        ("no match", None, None, math.inf, 0.0)
    assert "no entry of this GPU model" in empty.explain()
    reg.add("gpu-a", topos["h200-d557bc-cuda-waves"])
    reg.add("gpu-b", topos["h200-f78934-cuda-waves"])
    assert reg.names() == ["gpu-a", "gpu-b"]
    entry = reg.get("gpu-a")
    assert np.array_equal(entry.signature.vector, sigs["h200-d557bc-cuda-waves"].vector)
    assert entry.signature.model == sigs["h200-d557bc-cuda-waves"].model
    assert entry.uuid_hash == topos["h200-d557bc-cuda-waves"].meta["uuid_hash"] and entry.serial_hash is None
    assert not list((tmp_path / "reg").glob("*.tmp")), "atomic write left a temporary file"

    for gpu in sorted({gpu_of(k) for k in topos} - {"d557bc", "f78934"}):
        reg.add(f"gpu-{gpu}", topos[f"h200-{gpu}-cuda-waves"])
    for key, topo in topos.items():
        found = reg.identify(topo)  # a Topology is accepted as well as a signature
        assert found.verdict == "match", (key, found.explain())
        assert found.name == {"d557bc": "gpu-a", "f78934": "gpu-b"}.get(gpu_of(key), f"gpu-{gpu_of(key)}"), key
        assert found.distance < DEFAULT_THRESHOLD / AMBIGUITY_FACTOR and found.margin > 1.9
        assert found.uuid_changed is False and "new UUID" not in found.explain()
        assert found.runner_up_distance > DEFAULT_THRESHOLD * 1.9  # no second candidate anywhere near

    reg.remove("gpu-b")
    found = reg.identify(sigs["h200-f78934-triton-concurrent"])
    assert found.verdict == "no match" and found.distance > DEFAULT_THRESHOLD * AMBIGUITY_FACTOR
    assert found.name is None and found.nearest in reg.names()  # no entry was identified; the nearest is named
    assert found.margin > 1.9 and f"no match: the nearest entry {found.nearest!r}" in found.explain()
    with pytest.raises(RegistryError, match="no registry entry named 'gpu-b'"):
        reg.remove("gpu-b")
    with pytest.raises(RegistryError, match="no registry entry named 'gpu-b'"):
        reg.get("gpu-b")


def test_same_gpu_new_uuid_is_said_plainly(tmp_path, topos):
    reg = Registry(tmp_path)
    reg.add("gpu-a", topos["h200-d557bc-cuda-waves"])
    reg.add("gpu-b", topos["h200-f78934-cuda-waves"])
    query = _with_meta(topos["h200-d557bc-triton-serialized"], uuid_hash="0123456789ab")
    found = reg.identify(query)
    assert found.verdict == "match" and found.name == "gpu-a" and found.uuid_changed
    assert "same GPU, new UUID" in found.explain() and "0123456789ab" in found.explain()
    assert "rests on the map alone" in found.explain()
    # with a serial on both sides the serial says it: the uuid changed, not the board
    reg.add("gpu-a", _with_meta(topos["h200-d557bc-cuda-waves"], serial_hash="aaaaaaaaaaaa"), replace=True)
    found = reg.identify(_with_meta(query, serial_hash="aaaaaaaaaaaa"))
    assert found.verdict == "match" and found.uuid_changed and "the uuid changed, not the GPU" in found.explain()


def test_serial_conflict_is_ambiguous(tmp_path, topos):
    """The map matches an entry whose board serial differs: two boards the map cannot tell apart."""
    reg = Registry(tmp_path)
    reg.add("gpu-a", _with_meta(topos["h200-d557bc-cuda-waves"], serial_hash="aaaaaaaaaaaa"))
    found = reg.identify(_with_meta(topos["h200-d557bc-triton-waves"], serial_hash="bbbbbbbbbbbb"))
    assert found.verdict == "ambiguous" and found.serial_conflict and found.name == "gpu-a"
    assert "cannot tell these two GPUs apart" in found.explain()


def test_two_candidates_within_the_threshold_are_ambiguous(tmp_path, topos):
    """A planted case: one GPU enrolled twice under two uuids (or two GPUs the map cannot tell apart)."""
    reg = Registry(tmp_path)
    reg.add("first", topos["h200-d557bc-cuda-waves"])
    reg.add("second", _with_meta(topos["h200-d557bc-triton-concurrent"], uuid_hash="0123456789ab"))
    reg.add("other", topos["h200-f78934-cuda-waves"])
    found = reg.identify(topos["h200-d557bc-cuda-serialized"])
    assert found.verdict == "ambiguous" and {found.name, found.runner_up} == {"first", "second"}
    assert "two entries are within the threshold" in found.explain()
    # the same GPU (same uuid) enrolled twice is one candidate, not two
    reg.add("second", topos["h200-d557bc-triton-concurrent"], replace=True)
    found = reg.identify(topos["h200-d557bc-cuda-serialized"])
    assert found.verdict == "match" and found.runner_up == "other"


def test_distance_inside_the_band_is_ambiguous(tmp_path, sigs):
    """Between the largest within-device and the smallest between-device distance of the fit: too close."""
    reg = Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    rng = np.random.default_rng(0)
    noise = rng.standard_normal(s.vector.size)
    noise *= DEFAULT_THRESHOLD / np.sqrt(np.mean((noise - np.median(noise)) ** 2))  # ~ the threshold apart
    reg.add("near-threshold", with_changes(s, vector=s.vector + np.r_[noise[:132] * np.sqrt(2), np.zeros(132)]))
    found = reg.identify(s)
    assert DEFAULT_THRESHOLD / AMBIGUITY_FACTOR < found.distance < DEFAULT_THRESHOLD * AMBIGUITY_FACTOR
    assert found.verdict == "ambiguous" and "too close to the threshold" in found.explain()
    assert reg.identify(s, factor=1.0).verdict in ("match", "no match")  # a plain threshold decides


def test_untrusted_query_never_gets_no_match(tmp_path, topos):
    reg = Registry(tmp_path)
    reg.add("gpu-b", topos["h200-f78934-cuda-waves"])
    disturbed = _with_meta(topos["h200-d557bc-cuda-waves"],
                           trust={"trusted": False, "problems": ["the repeats disagree"]})
    found = reg.identify(disturbed)
    assert found.verdict == "ambiguous" and "failed its self-checks" in found.explain()


def test_registry_refuses_duplicate_and_bad_names(tmp_path, sigs):
    reg = Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("gpu-a", s)
    with pytest.raises(RegistryError, match="exists"):
        reg.add("gpu-a", sigs["h200-f78934-cuda-waves"])
    reg.add("gpu-a", sigs["h200-f78934-cuda-waves"], replace=True)
    assert reg.identify(sigs["h200-f78934-cuda-serialized"]).name == "gpu-a"
    for bad in ("../escape", "", ".hidden", "a/b", "x" * 200):
        with pytest.raises(RegistryError, match="registry names"):
            reg.add(bad, s)
    with pytest.raises(RegistryError, match="uuid_hash"):
        reg.add("raw-uuid", s, uuid_hash="GPU-035804ec-5d3f-9bf6-7430-6c8502eeffad")  # never a raw identifier
    with pytest.raises(TypeError, match="Topology or DeviceSignature"):
        reg.add("wrong", s.vector)


def test_registry_skips_other_models(tmp_path, sigs):
    reg = Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("other-model", with_changes(s, name="NVIDIA H100 80GB HBM3"))  # the same numbers, another model
    found = reg.identify(s)
    assert (found.verdict, found.name, found.distance) == ("no match", None, math.inf)


def test_entry_written_before_identities_reads_as_unknown(tmp_path, sigs):
    reg = Registry(tmp_path)
    (tmp_path / "old.json").write_text(json.dumps(sigs["h200-d557bc-cuda-waves"].to_dict()))
    entry = reg.get("old")
    assert entry.uuid_hash is None and entry.serial_hash is None
    found = reg.identify(sigs["h200-d557bc-cuda-serialized"], uuid_hash="0123456789ab")
    assert found.verdict == "match" and found.uuid_changed is None and "new UUID" not in found.explain()


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": "something else"}),
    json.dumps({"format": "torch_l2topo/device-signature", "version": 2,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": [0.0] * 10}),
    json.dumps({"format": "torch_l2topo/device-signature", "version": 2,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": ["a"] * 264}),
    '{"format": "torch_l2topo/device-signature", "version": 2, "device": {"name": "NVIDIA H200", '
    '"sm_count": 132, "cc": [9, 0]}, "vector": [' + ", ".join(["NaN"] * 264) + "]}",
    json.dumps({"format": "torch_l2topo/device-signature", "version": 2,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": [0.0] * 264,
                "identity": {"uuid_hash": "not a hash"}}),
    json.dumps({"format": "torch_l2topo/device-signature", "version": 2,
                "device": {"name": "NVIDIA H200", "sm_count": 132, "cc": [9, 0]}, "vector": [0.0] * 264,
                "identity": "nonsense"}),
    "\xff\xfe",
])
def test_corrupt_registry_entry_is_a_clear_error(tmp_path, sigs, content):
    reg = Registry(tmp_path)
    reg.add("good", sigs["h200-d557bc-cuda-waves"])
    bad = tmp_path / "broken.json"
    bad.write_bytes(content.encode("latin-1"))
    with pytest.raises(RegistryError, match="broken.json") as info:
        reg.identify(sigs["h200-d557bc-cuda-serialized"])
    assert isinstance(info.value, L2TopoError)
    with pytest.raises(RegistryError, match="broken.json"):
        reg.get("broken")


def test_registry_file_with_an_invalid_name_is_reported(tmp_path, sigs):
    reg = Registry(tmp_path)
    reg.add("good", sigs["h200-d557bc-cuda-waves"])
    (tmp_path / "good.json").rename(tmp_path / "not good.json")
    with pytest.raises(RegistryError, match="not good.json"):
        reg.identify(sigs["h200-d557bc-cuda-serialized"])


# ---- the command line: enroll and identify from saved calibrations ----------------------------------
def test_cli_enroll_and_identify_say_same_gpu_new_uuid_and_ambiguous(tmp_path, topos, capsys):
    from torch_l2topo.cli import main

    reg = str(tmp_path / "reg")
    files = {}
    for key, uuid in (("h200-d557bc-cuda-waves", None), ("h200-d557bc-triton-serialized", "0123456789ab"),
                      ("h200-f78934-cuda-waves", None)):
        t = topos[key] if uuid is None else _with_meta(topos[key], uuid_hash=uuid)
        files[key] = str(t.save(tmp_path / f"{key}.npz"))
    assert main(["enroll", "gpu-a", files["h200-d557bc-cuda-waves"], "--registry", reg]) == 0
    assert "enrolled 'gpu-a'" in capsys.readouterr().out
    assert main(["identify", files["h200-d557bc-triton-serialized"], "--registry", reg]) == 0
    out = capsys.readouterr().out
    assert out.startswith("match: 'gpu-a'") and "same GPU, new UUID" in out
    assert main(["identify", files["h200-f78934-cuda-waves"], "--registry", reg, "--json"]) == 1  # no match
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "no match" and doc["runner_up_distance"] is None
    # the same board enrolled again under its new uuid: enroll says so, and identify then has two candidates
    assert main(["enroll", "gpu-a-again", files["h200-d557bc-triton-serialized"], "--registry", reg]) == 0
    assert "same GPU, new UUID" in capsys.readouterr().out
    assert main(["identify", files["h200-d557bc-cuda-waves"], "--registry", reg]) == 3  # ambiguous
    out = capsys.readouterr().out
    assert out.startswith("ambiguous: two entries") and "'gpu-a'" in out and "'gpu-a-again'" in out
    assert main(["enroll", "gpu-a", files["h200-d557bc-cuda-waves"], "--registry", reg]) == 2  # name taken
    assert "exists" in capsys.readouterr().err
