"""On GPUs: calibrate_all() on every local GPU with both mechanisms, and the fleet of a real torchrun job (NCCL) on 1
and 2 GPUs: one row per rank, each on its own GPU, the GPUs told apart, each rank's placement on its own map."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch_l2topo
from torch_l2topo.analysis.compare import compare_maps
from torch_l2topo.device import device_info
from torch_l2topo.measure.multi import MECHANISMS

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_calibrate_all_calibrates_every_local_gpu(mechanism, cache_dir):
    topos = torch_l2topo.calibrate_all(mechanism=mechanism, use_cache=False)
    assert list(topos) == list(range(_gpus()))
    for index, topo in topos.items():
        assert topo.meta["uuid_hash"] == device_info(index).uuid_hash and topo.meta["trust"]["trusted"]
        # an L2 map: between an L1 hit (tens of cycles) and DRAM (600+)
        assert 100 < np.median(topo.chain_cycles) < 600
        # the same map as a calibration of that GPU alone: calibrating the others at once did not disturb it
        alone = torch_l2topo.calibrate(index, use_cache=False)
        assert compare_maps(alone.chain_cycles, topo.chain_cycles)["median_after_offset"] < 1.0


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_fleet_of_a_torchrun_job(nproc, tmp_path):
    if _gpus() < nproc:
        pytest.skip(f"needs {nproc} GPUs, this machine has {_gpus()}")
    env = dict(os.environ, TORCH_L2TOPO_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                          str(ROOT / "tests" / "fleet_gpu_job.py"), str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    fleet = json.loads((tmp_path / "fleet.json").read_text())
    rows = {row["rank"]: row for row in fleet["table"]}
    assert sorted(rows) == list(range(nproc)) and all(rows[r]["error"] is None for r in rows)
    assert [rows[r]["device_index"] for r in range(nproc)] == list(range(nproc))  # rank r on cuda:r (LOCAL_RANK)
    assert len({rows[r]["uuid_hash"] for r in rows}) == nproc  # every rank its own GPU
    assert not [f for f in fleet["findings"] if f["check"] in ("same GPU", "calibration")]
    for rank in range(nproc):
        seen = json.loads((tmp_path / f"placement-rank{rank}.json").read_text())
        assert seen["current_device"] == rank
        assert [c["device"] for c in seen["calls"]] == [rank]
        assert [c["uuid_hash"] for c in seen["calls"]] == [seen["own_uuid_hash"]] == [rows[rank]["uuid_hash"]]
    # the GPUs are told apart by uuid above; by map only where their layouts differ (boards of one layout can have
    # matching fingerprints: health.py), so the distance is shown, not asserted
    print(run.stdout[-2000:])
