"""A stand-in GPU for CPU tests of calibrate(): device lookup and measurement replaced by bundled data.

install(monkeypatch_or_None, measurements_dir) patches torch_l2topo.calibrate so that calibrate() runs its
real cache, key, lock, self-check and validation logic, while "measuring" returns the bundled H200
calibration with fresh metadata and repeats (clean ones, or the n-th measurements disturbed as listed in
`disturbed`: the ring evicted, +340 cycles per load as seen under another process's matmuls) and leaves one
marker file per measurement (so tests can count them across processes).
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import numpy as np

import torch_l2topo
from torch_l2topo.device import DeviceInfo
from torch_l2topo.errors import ProbeError
from torch_l2topo.measure import calibration as cal
from torch_l2topo.measure.repeats import Repeats

EVICTED_EXTRA_CYCLES = 340.0

FAKE = DeviceInfo(index=0, name="NVIDIA H200", uuid="GPU-00000000-fake-fake-fake-000000000000", cc=(9, 0),
                  sm_count=132, l2_bytes=60 * 2**20, total_memory=141 * 2**30, driver="580.159.04", mig=False)


def repeats_of(topo, n: int = 3, extra_cycles: float = 0.0, seed: int = 0) -> Repeats:
    """n repeats around a calibration's map (0.05-cycle noise), the chain `extra_cycles` slower."""
    rng = np.random.default_rng(seed)
    chain = topo.chain_cycles + extra_cycles + 0.05 * rng.standard_normal((n, topo.n_sm))
    return Repeats(chain_cycles=chain, chain_ns=chain / 1.98, chain_start_ns=np.zeros((n, topo.n_sm), np.int64),
                   line_median=np.tile(np.median(topo.line_cycles, axis=1), (n, 1)))


def install(patch, measurements_dir: Path, measure_seconds: float = 0.0, info: DeviceInfo = FAKE,
            disturbed=(), blocked=()) -> None:
    """patch(obj, name, value): monkeypatch.setattr in a test, setattr in a child process. disturbed: the
    1-based numbers of the measurements (in this process) whose ring is evicted; blocked: those whose probe
    could not claim every SM (the watchdog's ProbeError)."""
    measurements_dir = Path(measurements_dir)
    count = [0]

    def fake_measure(index, info, cfg, backend, mode):
        time.sleep(measure_seconds)  # a measurement takes time; concurrent callers must overlap
        (measurements_dir / f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        count[0] += 1
        if count[0] in blocked:
            raise ProbeError("chain probe: only 20 of 132 SMs got a probe CTA within 2 s; SMs not reached: 0, 1")
        topo = torch_l2topo.load_example("h200")
        extra = EVICTED_EXTRA_CYCLES if count[0] in disturbed else 0.0
        repeats = repeats_of(topo, cfg.repeats, extra, seed=count[0])
        topo.chain_cycles = np.median(repeats.chain_cycles, axis=0)
        topo.extras.update(repeats.to_extras())
        topo.meta.update(device=info.as_dict(), uuid_hash=info.uuid_hash, backend=backend, mode=mode,
                         config=cal.dataclasses.asdict(cfg))
        return topo

    patch(cal, "resolve_device", lambda device=None: 0)
    patch(cal, "device_info", lambda index: info)
    patch(cal, "device_uuid", lambda index: info.uuid)
    patch(cal, "_measure", fake_measure)
    patch(cal, "RETRY_BACKOFF_S", 0.0)


def calibrate_in_child(cache_dir: str, measurements_dir: str, measure_seconds: float) -> float:
    """Entry point for a spawned process: calibrate the fake GPU, return the chain mean it got."""
    os.environ["TORCH_L2TOPO_CACHE"] = cache_dir
    install(setattr, Path(measurements_dir), measure_seconds)
    return float(torch_l2topo.calibrate().chain_cycles.mean())


def measurements(measurements_dir: Path) -> int:
    return len(list(Path(measurements_dir).iterdir()))
