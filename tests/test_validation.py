"""Bad input gets a clear error: devices (no CUDA, index, compute capability, MIG) and probe options."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import torch_l2topo
from torch_l2topo import DeviceError, ProbeConfig
from torch_l2topo import device as dev


@pytest.fixture
def two_gpus(monkeypatch):
    """Pretend the machine has two GPUs: an H200 (cc 9.0) and a Turing card (cc 7.5)."""
    cards = [SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                             L2_cache_size=60 * 2**20, total_memory=141 * 2**30, uuid="GPU-a"),
             SimpleNamespace(name="Tesla T4", major=7, minor=5, multi_processor_count=40,
                             L2_cache_size=4 * 2**20, total_memory=16 * 2**30, uuid="GPU-b")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: cards[i])
    monkeypatch.setattr(dev, "driver_version", lambda: "580.159.04")
    return cards


def test_no_cuda_device_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="no CUDA device") as info:
        torch_l2topo.calibrate()
    # it points at what works without a GPU, in Python and on the command line, and both do work
    assert "torch_l2topo.load_example()" in str(info.value) and "torch_l2topo examples" in str(info.value)
    assert torch_l2topo.load_example().n_sm == 132


@pytest.mark.parametrize("device", [2, -1, "cuda:5"])
def test_device_index_out_of_range(two_gpus, device):
    with pytest.raises(DeviceError, match="out of range.*2 device"):
        dev.resolve_device(device)


@pytest.mark.parametrize("device", ["cpu", "banana", True, 1.5])
def test_device_of_the_wrong_kind(two_gpus, device):
    with pytest.raises(DeviceError):
        dev.resolve_device(device)


@pytest.mark.parametrize("device,index", [(None, 0), (1, 1), ("cuda:1", 1), (torch.device("cuda", 1), 1),
                                          ("cuda", 0)])
def test_device_spellings(two_gpus, device, index):
    assert dev.resolve_device(device) == index


def test_compute_capability_below_8_is_refused(two_gpus):
    assert dev.device_info(0).cc == (9, 0)
    with pytest.raises(DeviceError, match="compute capability 7.5.*8.0 or newer"):
        dev.device_info(1)


def test_mig_instances_are_recognised(two_gpus, monkeypatch):
    assert not dev.device_info(0).mig
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-1234")
    assert dev.device_info(0).mig


@pytest.mark.parametrize("field,value", [("n_lines", 0), ("n_lines", 2.5), ("line_timed", -1), ("repeats", "2"),
                                         ("chain_bytes", 1000), ("timeout_s", 0), ("warmup_ms", float("nan")),
                                         ("seed", -3), ("line_warm", True)])
def test_bad_probe_options_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        ProbeConfig(**{field: value}).validate()


def test_a_ring_larger_than_half_the_l2_is_refused():
    with pytest.raises(ValueError, match="L2-resident"):
        ProbeConfig(chain_bytes=64 << 20).validate(l2_bytes=60 << 20)
    ProbeConfig().validate(l2_bytes=60 << 20)


def test_unknown_calibrate_options_and_choices(two_gpus):
    with pytest.raises(TypeError, match="unknown options"):
        torch_l2topo.calibrate(n_line=5)
    with pytest.raises(ValueError, match="mode"):
        torch_l2topo.calibrate(mode="fast")
    with pytest.raises(ValueError, match="backend"):
        torch_l2topo.calibrate(backend="opencl")


def test_uuid_hash_is_stable_and_short():
    assert dev.uuid_hash("GPU-a") == dev.uuid_hash("GPU-a") != dev.uuid_hash("GPU-b")
    assert len(dev.uuid_hash("GPU-a")) == 12 and np.all([c in "0123456789abcdef" for c in dev.uuid_hash("x")])
