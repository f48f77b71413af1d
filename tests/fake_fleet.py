"""Stand-in GPUs for CPU tests of calibrate_all() and the fleet: several devices, each "measuring" one recorded
real H200 calibration behind the real calibrate() (its cache, key, lock and self-checks all run).

install(patch, gpus, current) patches the device lookups of calibrate(), device.py (what placement's
check_topology reads), gather.py and multi.py: device index i is gpus[i], a FakeGpu naming a recording under
tests/data/calibrations/ and a uuid (two indices with one uuid are one GPU seen twice). A FakeGpu may
be disturbed (every measurement's ring evicted, as under another process's matmuls: calibrate() raises
CalibrationDisturbed) or slow (each measurement takes measure_s). Each measurement appends (index, start,
end) to `log` when one is given, so tests can see which ran at the same time.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
from fake_gpu import EVICTED_EXTRA_CYCLES, repeats_of
from recorded import CALIBRATIONS

from torch_l2topo.device import DeviceInfo
from torch_l2topo.errors import DeviceError
from torch_l2topo.topology import Topology


@dataclass(frozen=True)
class FakeGpu:
    recording: str            # file stem under tests/data/calibrations/
    uuid: str
    disturbed: bool = False   # every measurement evicted: calibrate() refuses it after its attempts
    measure_s: float = 0.0    # how long one measurement takes
    name: str = "NVIDIA H200"

    def info(self, index: int) -> DeviceInfo:
        return DeviceInfo(index=index, name=self.name, uuid=self.uuid, cc=(9, 0), sm_count=132, l2_bytes=60 * 2**20,
                          total_memory=141 * 2**30, driver="580.159.04", mig=False)


def recording(stem: str) -> Topology:
    return Topology.load(CALIBRATIONS / f"{stem}.npz")


def install(patch, gpus: dict, current: int = 0, log: list | None = None) -> None:
    """patch(obj, name, value): monkeypatch.setattr in a test, setattr in a spawned process. current: the
    index that device=None means (a rank's torch.cuda.current_device())."""
    from torch_l2topo import device
    from torch_l2topo.distributed import gather
    from torch_l2topo.measure import calibration, multi

    infos = {i: g.info(i) for i, g in gpus.items()}

    def resolve(dev=None) -> int:
        index = current if dev is None else dev if isinstance(dev, int) else int(str(dev).split(":")[1])
        if index not in gpus:
            raise DeviceError(f"CUDA device index {index} is out of range: {len(gpus)} fake devices")
        return index

    def fake_measure(index, info, cfg, backend, mode):
        gpu, start = gpus[index], time.time()
        time.sleep(gpu.measure_s)
        topo = recording(gpu.recording)
        repeats = repeats_of(topo, cfg.repeats, EVICTED_EXTRA_CYCLES if gpu.disturbed else 0.0, seed=index)
        topo.chain_cycles = np.median(repeats.chain_cycles, axis=0)
        topo.extras.update(repeats.to_extras())
        topo.meta.update(device=info.as_dict(), uuid_hash=info.uuid_hash, backend=backend, mode=mode,
                         config=dataclasses.asdict(cfg))
        if log is not None:
            log.append((index, start, time.time()))
        return topo

    for module in (calibration, device, gather, multi):
        patch(module, "resolve_device", resolve)
    for module in (calibration, device, gather):
        patch(module, "device_info", infos.__getitem__)
    patch(calibration, "device_uuid", lambda index: infos[index].uuid)
    patch(calibration, "_measure", fake_measure)
    patch(calibration, "RETRY_BACKOFF_S", 0.0)
    patch(multi, "visible_devices", lambda: sorted(gpus))


def calibrated_bytes_in_child(gpus: dict, index: int, options: dict) -> bytes:
    """multi.calibrated_bytes in a spawned process of calibrate_all(mechanism="processes"), with the fake `gpus`
    installed first (the child starts without the parent's patches; it inherits the environment, and so the
    calibration cache). Bind `gpus` with functools.partial."""
    from torch_l2topo.measure import multi

    install(setattr, gpus)
    return multi.calibrated_bytes(index, options)
