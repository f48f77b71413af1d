"""device.py's board serial hash: NVML first, then nvidia-smi, None when neither says; never raises."""
import subprocess
import sys
import types

import pytest

from torch_l2topo import device

UUID = "035804ec-5d3f-9bf6-7430-6c8502eeffad"  # a made-up uuid in torch's bare format


@pytest.fixture
def gpu(monkeypatch):
    """One fake CUDA device with UUID, no NVML, no nvidia-smi; the per-process cache emptied."""
    monkeypatch.setattr(device, "device_uuid", lambda index: UUID)
    monkeypatch.setattr(device, "_serial_hashes", {})
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError

    def no_smi(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", no_smi)
    return monkeypatch


def _fake_nvml(serial):
    def get_serial(handle):
        if isinstance(serial, Exception):
            raise serial
        return serial

    return types.SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                 nvmlDeviceGetHandleByUUID=lambda u: u if u == f"GPU-{UUID}" else 1 / 0,
                                 nvmlDeviceGetSerial=get_serial)


def _fake_smi(stdout, returncode=0):
    return lambda *a, **k: subprocess.CompletedProcess(a, returncode, stdout=stdout, stderr="")


def test_no_nvml_no_smi_is_none(gpu):
    assert device.board_serial_hash(0) is None


def test_nvml_serial_is_hashed_like_the_uuid(gpu):
    gpu.setitem(sys.modules, "pynvml", _fake_nvml(b"1654321098765"))
    h = device.board_serial_hash(0)
    assert h == device.uuid_hash("1654321098765") and len(h) == 12 and "1654321098765" not in h


@pytest.mark.parametrize("value", ["N/A", "[N/A]", "", "  ", "[Not Supported]", None])
def test_nvml_without_a_serial_falls_back_to_smi(gpu, value):
    gpu.setitem(sys.modules, "pynvml", _fake_nvml(RuntimeError("NotSupported") if value is None else value))
    gpu.setattr(subprocess, "run", _fake_smi(f"GPU-ffffffff-0000-0000-0000-000000000000, 111\nGPU-{UUID}, 222\n"))
    assert device.board_serial_hash(0) == device.uuid_hash("222")  # the row of this uuid, not the first


@pytest.mark.parametrize("stdout,returncode", [("GPU-" + UUID + ", [N/A]\n", 0), ("GPU-" + UUID + ", N/A\n", 0),
                                               ("", 0), ("garbage\n", 0), ("GPU-" + UUID + ", 222\n", 9),
                                               ("GPU-other, 222\n", 0)])
def test_smi_without_a_usable_serial_is_none(gpu, stdout, returncode):
    gpu.setattr(subprocess, "run", _fake_smi(stdout, returncode))
    assert device.board_serial_hash(0) is None


def test_smi_timeout_is_none_and_result_is_cached(gpu):
    calls = []

    def hung(*a, **k):
        calls.append(1)
        raise subprocess.TimeoutExpired("nvidia-smi", 10)

    gpu.setattr(subprocess, "run", hung)
    assert device.board_serial_hash(0) is None
    assert device.board_serial_hash(0) is None and len(calls) == 1  # one lookup per process


def test_no_device_is_none(gpu):
    def no_device(index):
        raise RuntimeError("no CUDA")

    gpu.setattr(device, "device_uuid", no_device)
    assert device.board_serial_hash(3) is None
