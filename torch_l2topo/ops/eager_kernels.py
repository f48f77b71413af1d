"""Small eager calls on CUDA C++ kernels bound with pybind11: embedding bags (cuda_ext/eager_bags.cu) and forests
(cuda_ext/eager_forest.cu), one module (cuda_ext/eager_bindings.cpp).

Why: a small eager call costs what the host spends on it. A Triton kernel's launch from Python (binding its
arguments, Triton's launcher, the output allocation) is most of such a call, and no Python in front of torch's
own embedding_bag can be cheaper than none; a pybind11 function that allocates the output and launches a plain
CUDA kernel costs a fraction of either. So embedding_bag's small eager calls (embedding_bag.eager_launch) and
forest_predict's (forest_predict.eager_forest) run these kernels. Each embedding-bag launch comes with an
estimate of its GPU time (`gpu_us`) that embedding_bag's rule compares with the Triton call's host time.

Availability: the module is built ahead of time (`python -m torch_l2topo build`, or build_now()) with
torch.utils.cpp_extension (measure/extension.py, cached per torch version and GPU architecture); the first such
call on a device starts a background thread that loads it if it was built, and never compiles, so no job waits
for or runs a compiler. Until it is loaded, where it was not built, or with TORCH_L2TOPO_EAGER_KERNELS=0, small
embedding bags run torch's own op (`torch_bags`) and forests the Triton kernel. Docs: docs/ops.md.
"""
from __future__ import annotations

import logging
import os
import threading

import torch

from .policy import device_properties

log = logging.getLogger("torch_l2topo")
ENV_SWITCH = "TORCH_L2TOPO_EAGER_KERNELS"  # "0": never build (module doc)
KEPT_ON_TORCH = "small eager embedding_bag and forest_predict calls keep torch's op and the Triton kernel: %s"
# GPU microseconds of each launch, as terms: per row of the mean bag, per MB read, per bag, per row read, per row
# read from a table larger than the L2. Fitted by benchmarks/fit_eager_rule.py to H200 CUDA-graph times (docs/ops.md).
TORCH_OP_US = (0.147, 0.291, 6.57e-4, 8.68e-6, 4.43e-5)     # torch's op (benchmarks/fit_eager_rule.py)
EAGER_KERNEL_US = (0.0674, 0.0593, 2.74e-4, 3.72e-5, 2.32e-5)  # the C++ kernel (the same fit)


def gpu_us(terms: tuple, rows: int, bags: int, row_bytes: int, table_bytes: int, l2: int) -> float:
    """Estimated GPU microseconds of a launch with these `terms` for `rows` rows of `row_bytes` in `bags` bags of a
    table of `table_bytes`, on a GPU whose L2 holds `l2` bytes."""
    per_bag_row, per_mb, per_bag, per_row, per_dram_row = terms
    per_row += row_bytes * 1e-6 * per_mb + (per_dram_row if table_bytes > l2 else 0.0)
    return rows * (per_bag_row / (bags or 1) + per_row) + bags * per_bag


def torch_bags(weight, input, offsets, mode: int, include_last_offset: bool) -> torch.Tensor:
    """torch's own op for a small eager call: torch.embedding_bag, where torch.nn.functional.embedding_bag ends."""
    return torch.embedding_bag(weight, input, offsets, False, mode, False, None, include_last_offset, None)[0]


class EagerDevice:
    """What a small eager call on one CUDA device needs: the L2's size; the launch that runs an embedding bag (the
    C++ module's `bags` once loaded, torch_bags until then) and that launch's gpu_us terms; the module's `forest`
    (None until loaded)."""

    __slots__ = ("l2_bytes", "cc", "bags", "terms", "forest")

    def __init__(self, l2_bytes: int, cc: tuple[int, int], module=None):
        self.l2_bytes, self.cc = l2_bytes, cc
        self.bags, self.terms = (torch_bags, TORCH_OP_US) if module is None else (module.bags, EAGER_KERNEL_US)
        self.forest = None if module is None else module.forest


_devices: dict[int, EagerDevice] = {}
_loaded: dict[tuple[int, int], object] = {}  # compute capability -> the C++ module
_builds: dict[tuple[int, int], threading.Thread] = {}
_lock = threading.Lock()  # guards the three dicts and the devices' bags, terms and forest


def eager_device(index: int) -> EagerDevice:
    """The EagerDevice of CUDA device `index`, made once; the first one of a compute capability starts its build."""
    device = _devices.get(index)
    return device if device is not None else _new_device(index)


def _new_device(index: int) -> EagerDevice:
    props = device_properties(index)
    with _lock:
        if index not in _devices:
            cc = (props.major, props.minor)
            _devices[index] = EagerDevice(int(getattr(props, "L2_cache_size", 0)), cc, _loaded.get(cc))
            if os.environ.get(ENV_SWITCH, "1") != "0" and cc not in _builds:
                _builds[cc] = threading.Thread(target=_build, args=(cc,), daemon=True,
                                               name=f"l2topo-eager-kernels-sm{cc[0]}{cc[1]}")
                _builds[cc].start()
        return _devices[index]


def wait_for_build(index: int, timeout: float | None = None) -> bool:
    """Wait for device `index`'s build (tests, benchmarks); True if small calls there now run the C++ kernels."""
    device = eager_device(index)
    thread = _builds.get(device.cc)
    if thread is not None:
        thread.join(timeout)
    return device.forest is not None


def _build(cc: tuple[int, int]) -> None:
    """The background load of a first call (never a compile): the module built ahead of time, or a note."""
    from ..errors import BackendUnavailable
    from ..measure.extension import load_eager_kernels

    try:
        module = load_eager_kernels(cc, compile=False)
    except BackendUnavailable as exc:  # torch's op and the Triton kernel keep the calls: slower, never wrong
        log.warning(KEPT_ON_TORCH, exc)
        return
    _install(cc, module)


def build_now(index: int) -> bool:
    """Build the module for device `index` here and now if need be (minutes the first time), and use it: what
    `python -m torch_l2topo build` does for every GPU, for tests and benchmarks. True once small calls there run
    the C++ kernels; a failed build warns and leaves them on torch's op."""
    from ..errors import BackendUnavailable
    from ..measure.extension import load_eager_kernels

    wait_for_build(index)  # the first call's background load, if it is running
    device = eager_device(index)
    if device.forest is None:
        try:
            _install(device.cc, load_eager_kernels(device.cc))
        except BackendUnavailable as exc:
            log.warning(KEPT_ON_TORCH, exc)
    return device.forest is not None


def _install(cc: tuple[int, int], module) -> None:
    with _lock:
        _loaded[cc] = module
        for device in _devices.values():
            if device.cc == cc:  # bags first: a call that reads terms then bags (eager_launch) can pair the
                device.bags = module.bags  # kernel with torch's terms (fewer calls sent to it), never torch's op
                device.terms = EAGER_KERNEL_US  # with the kernel's larger line
                device.forest = module.forest
    log.info("small eager embedding_bag and forest_predict calls on sm_%d%d now run the C++ eager kernels", *cc)
