"""identify() on a GPU: a fresh calibration is enrolled, and another process, calibrating the GPU afresh,
finds it (same uuid, same serial hash where the board reports one)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys
import torch_l2topo
from torch_l2topo.registry import Registry
topo = torch_l2topo.calibrate(0, force=True)  # the backend of the enrolled one, in a new process
print(json.dumps(Registry(sys.argv[1]).identify(topo).to_dict()))
"""


def test_identify_a_freshly_enrolled_gpu_from_a_new_process(tmp_path, cache_dir):
    import torch_l2topo
    from torch_l2topo.device import board_serial_hash, device_info
    from torch_l2topo.fingerprint import DEFAULT_THRESHOLD
    from torch_l2topo.registry import Registry

    topo = torch_l2topo.calibrate(0, force=True)
    assert topo.meta["uuid_hash"] == device_info(0).uuid_hash
    assert topo.meta["serial_hash"] == board_serial_hash(0)  # None where the board reports no serial
    reg = Registry(tmp_path / "registry")
    reg.add("fresh", topo)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "registry")], capture_output=True,
                           text=True, timeout=300, env=env)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["verdict"] == "match" and found["name"] == "fresh", found["explanation"]
    assert found["distance"] < DEFAULT_THRESHOLD and found["uuid_changed"] is False
