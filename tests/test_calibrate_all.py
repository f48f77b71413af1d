"""calibrate_all() on stand-in GPUs (tests/fake_fleet.py): every device gets its own recorded map, measured at the
same time, cached; a failing device neither stops nor hides the others; both mechanisms (threads, and spawned
processes) give the same maps."""
import functools

import numpy as np
import pytest
from fake_fleet import FakeGpu, calibrated_bytes_in_child, install, recording

import torch_l2topo
from torch_l2topo import CalibrationDisturbed, DeviceError
from torch_l2topo.measure import multi

# Two different real H200s (the held-out pair of tests/recorded.py) and a third recording of the first one's model.
GPUS = {0: FakeGpu("h200-1e5731-cuda-waves", "GPU-fake-0"), 1: FakeGpu("h200-d00e55-cuda-waves", "GPU-fake-1"),
        2: FakeGpu("h200-d557bc-cuda-waves", "GPU-fake-2")}


def _is_recording_of(topo, gpu: FakeGpu) -> bool:
    """The calibration carries `gpu`'s map (fake repeats add 0.05-cycle noise) and its uuid."""
    return (np.abs(topo.chain_cycles - recording(gpu.recording).chain_cycles).max() < 0.5
            and topo.meta["device"]["uuid"] == gpu.uuid)


def test_every_device_gets_its_own_map_first_one_at_a_time_then_together(monkeypatch, cache_dir):
    gpus = {i: FakeGpu(g.recording, g.uuid, measure_s=0.3) for i, g in GPUS.items()}
    log = []
    install(monkeypatch.setattr, gpus, log=log)
    monkeypatch.setattr(multi, "_launched", set())  # a fresh process: no device calibrated yet
    lines = []
    topos = torch_l2topo.calibrate_all(progress=lines.append)
    assert list(topos) == [0, 1, 2]
    assert all(_is_recording_of(topos[i], gpus[i]) for i in gpus)
    assert len(lines) == 3 and all("calibrated" in line for line in lines) and "(3 of 3)" in lines[-1]
    # each device's first calibration in a process ran alone (Triton's first launch is not thread-safe) ...
    spans = sorted((start, end) for _, start, end in log)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:]))
    again = torch_l2topo.calibrate_all()  # cached as calibrate() caches: no new measurement
    assert len(log) == 3 and all(np.array_equal(again[i].chain_cycles, topos[i].chain_cycles) for i in gpus)
    # ... and later ones all at once: every measurement started before any other ended
    torch_l2topo.calibrate_all(force=True)
    assert max(start for _, start, _ in log[3:]) < min(end for _, _, end in log[3:])


def test_named_devices_only_and_each_once(monkeypatch, cache_dir):
    install(monkeypatch.setattr, GPUS)
    topos = torch_l2topo.calibrate_all([2, "cuda:0", 0])
    assert list(topos) == [0, 2] and _is_recording_of(topos[2], GPUS[2])


def test_a_disturbed_device_does_not_stop_the_others(monkeypatch, cache_dir):
    gpus = {0: GPUS[0], 1: FakeGpu(GPUS[1].recording, GPUS[1].uuid, disturbed=True), 2: GPUS[2]}
    install(monkeypatch.setattr, gpus)
    with pytest.raises(CalibrationDisturbed, match="cuda:1"):
        torch_l2topo.calibrate_all()
    out = torch_l2topo.calibrate_all(return_exceptions=True)  # the others were cached by the first call
    assert isinstance(out[1], CalibrationDisturbed)
    assert _is_recording_of(out[0], gpus[0]) and _is_recording_of(out[2], gpus[2])


def test_bad_arguments_are_clear_errors(monkeypatch, cache_dir):
    install(monkeypatch.setattr, GPUS)
    with pytest.raises(ValueError, match="mechanism must be one of threads, processes"):
        torch_l2topo.calibrate_all(mechanism="fork")
    with pytest.raises(DeviceError, match="no devices"):
        torch_l2topo.calibrate_all([])
    with pytest.raises(DeviceError, match="out of range"):
        torch_l2topo.calibrate_all([0, 7])


def test_spawned_processes_give_the_same_maps(monkeypatch, cache_dir):
    gpus = {0: GPUS[0], 1: FakeGpu(GPUS[1].recording, GPUS[1].uuid, disturbed=True)}
    install(monkeypatch.setattr, gpus)
    # each child process installs the fake GPUs itself: it starts without this process's patches
    monkeypatch.setattr(multi, "calibrated_bytes", functools.partial(calibrated_bytes_in_child, gpus))
    out = torch_l2topo.calibrate_all(mechanism="processes", return_exceptions=True)
    assert _is_recording_of(out[0], gpus[0])
    assert isinstance(out[1], CalibrationDisturbed)  # the child's exception, carried back
    assert list(cache_dir.glob("GPU-fake-0-*.npz")) and not list(cache_dir.glob("GPU-fake-1-*.npz"))
