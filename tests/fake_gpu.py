"""A stand-in GPU for CPU tests of calibrate(): device lookup and measurement replaced by bundled data.

install(monkeypatch_or_None, measurements_dir) patches torch_l2topo.calibrate so that calibrate() runs its
real cache, key, lock and validation logic, while "measuring" returns the bundled H200 calibration with
fresh metadata and leaves one marker file per measurement (so tests can count them across processes).
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import torch_l2topo
from torch_l2topo import calibration as cal
from torch_l2topo.device import DeviceInfo

FAKE = DeviceInfo(index=0, name="NVIDIA H200", uuid="GPU-00000000-fake-fake-fake-000000000000", cc=(9, 0),
                  sm_count=132, l2_bytes=60 * 2**20, total_memory=141 * 2**30, driver="580.159.04", mig=False)


def install(patch, measurements_dir: Path, measure_seconds: float = 0.0, info: DeviceInfo = FAKE) -> None:
    """patch(obj, name, value): monkeypatch.setattr in a test, setattr in a child process."""
    measurements_dir = Path(measurements_dir)

    def fake_measure(index, info, cfg, backend, mode):
        time.sleep(measure_seconds)  # a measurement takes time; concurrent callers must overlap
        (measurements_dir / f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        topo = torch_l2topo.load_example("h200")
        topo.meta.update(device=info.as_dict(), uuid_hash=info.uuid_hash, backend=backend, mode=mode,
                         config=cal.dataclasses.asdict(cfg))
        return topo

    patch(cal, "resolve_device", lambda device=None: 0)
    patch(cal, "device_info", lambda index: info)
    patch(cal, "_measure", fake_measure)


def calibrate_in_child(cache_dir: str, measurements_dir: str, measure_seconds: float) -> float:
    """Entry point for a spawned process: calibrate the fake GPU, return the chain mean it got."""
    os.environ["TORCH_L2TOPO_CACHE"] = cache_dir
    install(setattr, Path(measurements_dir), measure_seconds)
    return float(torch_l2topo.calibrate().chain_cycles.mean())


def measurements(measurements_dir: Path) -> int:
    return len(list(Path(measurements_dir).iterdir()))
