"""Small eager embedding bags on a CUDA C++ kernel bound with pybind11 (cuda_ext/eager_bags.cu).

A small eager call costs what the host spends on it: on the H200 machines torch's own call took 11-19 us, and
our Triton kernel's lean launch alone 16 us of a 37-72 us call (binding its arguments, Triton's launcher, the
output allocation and our Python around them: benchmarks/results/history/eager_host_h200_*.json). No Python in
front of torch's call can be cheaper than none: the op's argument checks and its choice cost ~2 us, 10-17% of
torch's call. A pybind11 function that allocates the output and launches a plain CUDA kernel takes 6-10 us, and
our whole call through it 8-13 us (benchmarks/results/diagnosis/eager_host_h200.json), so embedding_bag's small
eager calls (embedding_bag.eager_launch) run here. On the full grid's shapes it takes, the module's call took
0.43-0.69x torch's eager call, and the kernel's GPU time 0.45-1.04x torch's (benchmarks/results/
eager_kernel_h200.json); the op's whole call took 0.74-0.78x torch's at the default grid's small shapes
(benchmarks/results/ops_eb_eager_kernel_h200.json).

Availability: the module is built with torch.utils.cpp_extension (nvcc and a C++ compiler; measure/extension.py,
cached per torch version and GPU architecture) in a background thread that the first such call on a device
starts, so no call waits for a compiler. Until it is loaded, where it cannot be built, with
TORCH_L2TOPO_EAGER_BAGS=0 in the environment, or for calls the kernel does not take (cuda_ext/eager_bindings.cpp),
those calls run torch's own op (`torch_bags`), as they did before this module.
"""
from __future__ import annotations

import logging
import os
import threading

import torch

from .policy import device_properties

log = logging.getLogger("torch_l2topo")
ENV_SWITCH = "TORCH_L2TOPO_EAGER_BAGS"  # "0": never build, small calls run torch's op


def torch_bags(weight, input, offsets, mode: int, include_last_offset: bool) -> torch.Tensor:
    """torch's own op for a small eager call: torch.embedding_bag, where torch.nn.functional.embedding_bag ends."""
    return torch.embedding_bag(weight, input, offsets, False, mode, False, None, include_last_offset, None)[0]


class EagerDevice:
    """What a small eager call on one CUDA device needs: the L2's size (embedding_bag's estimate of torch's time)
    and the launch that runs it (the C++ module's `bags` once loaded, torch_bags until then)."""

    __slots__ = ("l2_bytes", "cc", "launch")

    def __init__(self, l2_bytes: int, cc: tuple[int, int], launch):
        self.l2_bytes, self.cc, self.launch = l2_bytes, cc, launch


_devices: dict[int, EagerDevice] = {}
_loaded: dict[tuple[int, int], object] = {}  # compute capability -> the module's bags function
_builds: dict[tuple[int, int], threading.Thread] = {}
_lock = threading.Lock()  # guards the three dicts and the devices' launch


def eager_device(index: int) -> EagerDevice:
    """The EagerDevice of CUDA device `index`, made once; the first one of a compute capability starts its build."""
    device = _devices.get(index)
    return device if device is not None else _new_device(index)


def _new_device(index: int) -> EagerDevice:
    props = device_properties(index)
    with _lock:
        if index not in _devices:
            cc = (props.major, props.minor)
            _devices[index] = EagerDevice(int(getattr(props, "L2_cache_size", 0)), cc,
                                          _loaded.get(cc, torch_bags))
            if os.environ.get(ENV_SWITCH, "1") != "0" and cc not in _builds:
                _builds[cc] = threading.Thread(target=_build, args=(cc,), daemon=True,
                                               name=f"l2topo-eager-bags-sm{cc[0]}{cc[1]}")
                _builds[cc].start()
        return _devices[index]


def wait_for_build(index: int, timeout: float | None = None) -> bool:
    """Wait for device `index`'s build (tests, benchmarks); True if small calls there now run the C++ kernel."""
    device = eager_device(index)
    thread = _builds.get(device.cc)
    if thread is not None:
        thread.join(timeout)
    return device.launch is not torch_bags


def _build(cc: tuple[int, int]) -> None:
    from ..errors import BackendUnavailable
    from ..measure.extension import load_eager_bags

    try:
        bags = load_eager_bags(cc).bags
    except BackendUnavailable as exc:  # torch's op keeps the calls: slower on the host, never wrong
        log.warning("small eager embedding_bag calls keep torch's op: %s", exc)
        return
    with _lock:
        _loaded[cc] = bags
        for device in _devices.values():
            if device.cc == cc:
                device.launch = bags
    log.info("small eager embedding_bag calls on sm_%d%d now run the C++ eager kernel", *cc)
