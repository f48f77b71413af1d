"""identify() on a GPU: a fresh calibration is enrolled, and another process, calibrating the GPU afresh,
finds it (same uuid, same serial hash where the board reports one)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


_CHILD = """
import json, sys
import torch_l2topo
from torch_l2topo.identity.registry import Registry
topo = torch_l2topo.calibrate(0, force=True, backend=sys.argv[2])  # the enrolled one's backend, a new process
print(json.dumps(dict(Registry(sys.argv[1]).identify(topo).to_dict(), backend=topo.meta["backend"])))
"""


def test_identify_a_freshly_enrolled_gpu_from_a_new_process(tmp_path, cache_dir):
    import torch_l2topo
    from torch_l2topo.device import board_serial_hash, device_info
    from torch_l2topo.identity.fingerprint import DEFAULT_THRESHOLD
    from torch_l2topo.identity.registry import Registry

    topo = torch_l2topo.calibrate(0, force=True)
    assert topo.meta["uuid_hash"] == device_info(0).uuid_hash
    assert topo.meta["serial_hash"] == board_serial_hash(0)  # None where the board reports no serial
    reg = Registry(tmp_path / "registry")
    reg.add("fresh", topo)
    # the child imports the installed package, as a user's program would (a PYTHONPATH pointing at the checkout
    # would shadow the install's mapping of triton_kernels/ into the package and lose the Triton backend)
    child = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "registry"), topo.meta["backend"]],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert child.returncode == 0, child.stderr
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert found["backend"] == topo.meta["backend"]
    assert found["verdict"] == "match" and found["name"] == "fresh", found["explanation"]
    assert found["distance"] < DEFAULT_THRESHOLD and found["uuid_changed"] is False
