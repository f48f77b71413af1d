"""registry.py: enrolment, identify() on real H200 calibrations, refused names, corrupt entries."""
import json
import math

import numpy as np
import pytest

from recorded import with_changes, gpu_of
from torch_l2topo import L2TopoError
from torch_l2topo.errors import RegistryError
from torch_l2topo.fingerprint import DEFAULT_THRESHOLD
from torch_l2topo.registry import Registry


def test_registry_round_trip_and_identify(tmp_path, sigs, topos):
    reg = Registry(tmp_path / "reg")
    assert reg.names() == []
    assert reg.identify(sigs["h200-d557bc-cuda-waves"]) == (None, math.inf, 0.0)
    reg.add("gpu-a", sigs["h200-d557bc-cuda-waves"])
    reg.add("gpu-b", sigs["h200-f78934-cuda-waves"])
    assert reg.names() == ["gpu-a", "gpu-b"]
    assert np.array_equal(reg.get("gpu-a").vector, sigs["h200-d557bc-cuda-waves"].vector)
    assert reg.get("gpu-a").model == sigs["h200-d557bc-cuda-waves"].model
    assert not list((tmp_path / "reg").glob("*.tmp")), "atomic write left a temporary file"

    for gpu in sorted({gpu_of(k) for k in topos} - {"d557bc", "f78934"}):
        reg.add(f"gpu-{gpu}", sigs[f"h200-{gpu}-cuda-waves"])
    for key, topo in topos.items():
        name, d, margin = reg.identify(topo)  # a Topology is accepted as well as a signature
        assert name == {"d557bc": "gpu-a", "f78934": "gpu-b"}.get(gpu_of(key), f"gpu-{gpu_of(key)}"), key
        assert d < DEFAULT_THRESHOLD and margin > 1.2

    reg.remove("gpu-b")
    name, d, margin = reg.identify(sigs["h200-f78934-triton-concurrent"])
    assert name is None and d > DEFAULT_THRESHOLD and margin > 1.5
    with pytest.raises(RegistryError, match="no registry entry named 'gpu-b'"):
        reg.remove("gpu-b")
    with pytest.raises(RegistryError, match="no registry entry named 'gpu-b'"):
        reg.get("gpu-b")


def test_registry_refuses_duplicate_and_bad_names(tmp_path, sigs):
    reg = Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("gpu-a", s)
    with pytest.raises(RegistryError, match="exists"):
        reg.add("gpu-a", sigs["h200-f78934-cuda-waves"])
    reg.add("gpu-a", sigs["h200-f78934-cuda-waves"], replace=True)
    assert reg.identify(sigs["h200-f78934-cuda-serialized"])[0] == "gpu-a"
    for bad in ("../escape", "", ".hidden", "a/b", "x" * 200):
        with pytest.raises(RegistryError, match="registry names"):
            reg.add(bad, s)


def test_registry_skips_other_models(tmp_path, sigs):
    reg = Registry(tmp_path)
    s = sigs["h200-d557bc-cuda-waves"]
    reg.add("other-model", with_changes(s, name="NVIDIA H100 80GB HBM3"))  # the same numbers, another model
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
