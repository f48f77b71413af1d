"""Partition maps of tensors: the L2 partition each block of a CUDA tensor's storage is homed in.

A line's home partition follows its physical address (on the H200 it changes every 256 bytes), fixed for an
allocation's lifetime, and an SM reads lines of its own partition faster; so a map is measured once per
allocation and cached.

This module owns partition_map() (measure, classify, cache) and what it keeps per GPU: the setup (calibration,
SM near/far latencies, pairs) and, per tensor size, the probe plan with the classifier's data. The jobs it puts
together have their own modules: the decision (decision.py), the SM pairs that time each block (pairs.py), what
is derived once per calibration and kept on disk (calibrated.py), the independent serialized check (check.py),
the per-allocation cache (cache.py); the kernels are in triton_kernels/partition_probe.py.

Cost contract: a cold map does no host work per block, and its launches and copies do not grow with the tensor:
the probe's timings stay on the GPU, the decision reads a few numbers per pair group back, and the result is
one copy of 5 bytes a block. Docs: docs/usage.md ("Placing work").
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from ...errors import ProbeError, check_choice
from ...layout import LINE_BYTES
from ...measure.probes import to_device
from .cache import MapCache
from .calibrated import calibrated
from .decision import BlockPairs, block_pairs_expanded, block_pairs_of_plan, classify_blocks
from .pairs import Pairs, probe_plan

N_TIMED = 4            # timed loads per block and SM, of which the map keeps the fastest (cost count in
                       # triton_kernels/partition_probe.py)

PLANS_KEPT = 8  # per setup, the most recently used tensor sizes (a 32 MB tensor's: 1 MB of pair ids on the GPU)
MAPS = MapCache()  # every map measured in this process, per storage and block size


@dataclass(frozen=True, eq=False)
class PartitionMap:
    """homes: (n_blocks,) int8, the L2 partition of each block_bytes block of the storage (block i starts
    at byte i * block_bytes; partitions numbered as in sm_labels of the calibration; -1: undecided).
    margin: (n_blocks,) cycles per load from the decision threshold (classify_blocks). data_ptr, nbytes,
    device_index: the storage mapped. elapsed_s: wall time of the call that measured it (a cached map keeps
    it); probe_s: of its kernel launch and wait."""

    homes: np.ndarray
    margin: np.ndarray
    block_bytes: int
    data_ptr: int
    nbytes: int
    device_index: int
    elapsed_s: float
    probe_s: float

    @property
    def n_blocks(self) -> int:
        return len(self.homes)

    @property
    def undecided_fraction(self) -> float:
        return float(np.mean(self.homes < 0))

    def blocks(self, partition: int) -> np.ndarray:
        """Indices of the blocks homed in `partition`."""
        return np.flatnonzero(self.homes == partition)


@dataclass(frozen=True, eq=False)
class ProbePlan:
    """What the probe plan fixes for tensors of n_blocks blocks on one device, the same for every such tensor:
    the plan (host, and on the device for the kernel), how many SMs time blocks, and the classifier's
    BlockPairs (each block's pair id on the device)."""

    n_blocks: int
    plan: np.ndarray
    plan_t: object
    n_timing: int
    blocks: BlockPairs


@dataclass(frozen=True, eq=False)
class GpuSetup:
    """What partition maps of one GPU share: its calibration, SM count, the SMs' calibrated near/far latencies
    (labels.sm_labels), the SM pairs (choose_pairs) and, per tensor size and device, the probe plan (plan())."""

    topology: object
    n_sm: int
    near: np.ndarray
    far: np.ndarray
    pairs: Pairs
    plans: dict = field(default_factory=dict, repr=False)  # (n_blocks, device) -> ProbePlan, oldest first
    templates: dict = field(default_factory=dict, repr=False)  # device -> BlockPairs of one block per pair

    def plan(self, n_blocks: int, device) -> ProbePlan:
        """The ProbePlan for n_blocks blocks on `device`, made on first use and kept: the same object for every
        tensor of the size, while it is among the PLANS_KEPT sizes used last. A new size costs one small copy of
        the plan to the device and a few launches there (block_pairs_expanded from a per-device template made
        once; sizes of fewer blocks than SM pairs: block_pairs_of_plan)."""
        key = (int(n_blocks), str(device))
        hit = self.plans.pop(key, None)
        if hit is None:
            plan = probe_plan(n_blocks, self.pairs.sms, self.n_sm)
            hit = ProbePlan(n_blocks=int(n_blocks), plan=plan, plan_t=to_device(plan.ravel(), device),
                            n_timing=int(np.sum(plan[:, 1] > plan[:, 0])), blocks=self._block_pairs(n_blocks, device))
            while len(self.plans) >= PLANS_KEPT:
                del self.plans[next(iter(self.plans))]
        self.plans[key] = hit
        return hit

    def _block_pairs(self, n_blocks: int, device) -> BlockPairs:
        n_pairs = len(self.pairs.sms)
        if n_blocks < n_pairs:
            return block_pairs_of_plan(probe_plan(n_blocks, self.pairs.sms, self.n_sm), n_blocks, self.near,
                                       self.far, device)
        template = self.templates.get(str(device))
        if template is None:
            template = self.templates[str(device)] = block_pairs_of_plan(
                probe_plan(n_pairs, self.pairs.sms, self.n_sm), n_pairs, self.near, self.far, device)
        return block_pairs_expanded(template, n_blocks)

    @classmethod
    def of(cls, topology, use_cache: bool = True) -> "GpuSetup":
        """The setup a calibration implies: its near/far latencies and pairs from calibrated.calibrated (kept on
        disk per calibration: a fresh process reads a small file, imports no scipy and fits nothing; use_cache=False
        derives them). No plan yet: plan() makes each size's. ProbeError if the calibration shows no two
        partitions."""
        c = calibrated(topology, use_cache)
        return cls(topology, topology.n_sm, c.near, c.far, c.pairs)


_SETUPS: dict[tuple, GpuSetup] = {}


def setup_for(index: int, topology=None, backend: str = "triton") -> GpuSetup:
    """The GpuSetup of cuda:index (from `topology`, checked to be this device's, else calibrate()), made once
    per process and calibration."""
    key = (index, None if topology is None else id(topology))
    hit = _SETUPS.get(key)
    if hit is not None and (topology is None or hit.topology is topology):
        return hit
    from ...measure.calibration import calibration_for

    setup = _SETUPS[key] = GpuSetup.of(calibration_for(index, topology, backend=backend))
    return setup


def clear_cache(setups: bool = False) -> None:
    """Forget every cached map; setups=True also the per-GPU setups (calibration, SM labels, pairs, plans)."""
    MAPS.clear()
    if setups:
        _SETUPS.clear()


def storage_of(tensor, block_bytes: int):
    """The tensor's storage, checked: a CUDA tensor, not empty, line-aligned; block_bytes a multiple of a line."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cuda":
        raise ValueError(f"partition maps are of CUDA tensors; this tensor is on {tensor.device}")
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, int) or block_bytes < LINE_BYTES \
            or block_bytes % LINE_BYTES:
        raise ValueError(f"block_bytes must be a positive multiple of {LINE_BYTES}, got {block_bytes!r}")
    storage = tensor.untyped_storage()
    if tensor.numel() == 0 or storage.nbytes() < 8:
        raise ValueError("the tensor is empty: there is nothing to map")
    if storage.data_ptr() % LINE_BYTES:
        raise ValueError(f"the storage starts at {storage.data_ptr():#x}, not on a {LINE_BYTES}-byte line: "
                         "blocks would straddle lines (allocate with torch; its allocator aligns to 512 bytes)")
    return storage


def n_blocks_of(nbytes: int, block_bytes: int) -> int:
    """Blocks mapped in a storage of `nbytes`: each block whose first 8 bytes (the word the probe loads) lie
    in it; a last block of fewer than 8 bytes is left out."""
    return (nbytes - 8) // block_bytes + 1


def _launch_probe(tensor, plan_t, n_blocks: int, n_timing: int, n_sm: int, block_bytes: int, backend: str,
                  timeout_s: float):
    """partition_probe_kernel once over the tensor's storage: ((2, n_blocks) int32 on the device, the fastest of
    N_TIMED loads of each block in clock counts, -1 where nothing was timed; host wall time of the launch and
    wait). Launches: the output's fill, the control block's two, the kernel; one copy of the control block
    back (probes.checked_launch)."""
    import torch

    from ...measure.probes import checked_launch

    storage = storage_of(tensor, block_bytes)
    cycles = torch.full((2, n_blocks), -1, dtype=torch.int32, device=tensor.device)
    per_sm = 2 * n_blocks // max(n_timing, 1) + 1
    elapsed = checked_launch(tensor.device, "partition_probe", backend, n_sm, n_sm, timeout_s,
                             per_sm * (1 + N_TIMED), (storage.data_ptr(), plan_t, cycles, n_blocks, block_bytes, 0,
                                                      N_TIMED))
    return cycles, elapsed


def run_probe(tensor, plan: np.ndarray, n_sm: int, *, block_bytes: int = 256, backend: str = "triton",
              timeout_s: float = 2.0):
    """Launch partition_probe_kernel once over the tensor's storage: (cycles (2, n_blocks) float32 of the fastest
    of N_TIMED loads of each block, row p by the SM of partition p, NaN where nothing was timed; host wall time
    of the launch and wait), on the host. The caller holds the GPU lock. (partition_map keeps the timings on
    the GPU: probe_timings.)"""
    n_blocks = n_blocks_of(storage_of(tensor, block_bytes).nbytes(), block_bytes)
    plan = np.asarray(plan, dtype=np.int64)
    cycles, elapsed = _launch_probe(tensor, to_device(plan.ravel(), tensor.device), n_blocks,
                                    int(np.sum(plan[:, 1] > plan[:, 0])), n_sm, block_bytes, backend, timeout_s)
    c = cycles.cpu().numpy().astype(np.float32)  # exact: clock counts of one load
    c[c < 0] = np.nan
    return c, elapsed


def probe_timings(tensor, plan: ProbePlan, n_sm: int, *, block_bytes: int, backend: str, timeout_s: float):
    """run_probe for partition_map, with the plan's device copy and the timings left on the device: ((2, n_blocks)
    float64 tensor, NaN where nothing was timed; host wall time). Three launches after the probe's. The caller
    holds the GPU lock."""
    import torch

    cycles, elapsed = _launch_probe(tensor, plan.plan_t, plan.n_blocks, plan.n_timing, n_sm, block_bytes, backend,
                                    timeout_s)
    return cycles.to(torch.float64).masked_fill_(cycles < 0, math.nan), elapsed


def probe_backend(backend: str, index: int) -> str:
    """The probe's backend for partition_map(backend=...): "auto" is "cuda" where the probes' CUDA extension was
    built ahead of time for this GPU's architecture (is_built: no compiler starts), else "triton"."""
    if backend != "auto":
        return backend
    import torch

    return "cuda" if _built_ahead(torch.cuda.get_device_capability(index)) else "triton"


@functools.cache
def _built_ahead(cc: tuple) -> bool:
    """Whether the probes' extension for `cc` was built ahead of time, asked once per process (the answer hashes
    every source file; a map of each new tensor must not)."""
    from torch_l2topo import cuda_ext

    from ...measure.extension import extension_name, is_built

    return is_built(extension_name(cc), cuda_ext.SOURCES)


def partition_map(tensor, *, topology=None, backend: str = "triton", block_bytes: int = 256,
                  timeout_s: float = 2.0) -> PartitionMap:
    """The L2 partition of every `block_bytes` block of `tensor`'s storage, measured with all SMs at once.

    A non-contiguous tensor or a view maps its whole storage (block i starts at byte i * block_bytes of the
    storage, not of the view). The map is cached per storage until the storage is freed or moves (clear_cache()
    forgets them all); a cached map is returned as the same object. Measuring takes the GPU lock.

    Args:
        tensor: a CUDA tensor whose storage starts on a 128-byte line (torch's allocator aligns it).
        topology: the calibration whose SM labels (partition numbers) and SM pairs are used; default
            calibrate(device), cached per process.
        backend: the probe's: "triton", "cuda" (the CUDA extension's, built on first use if it was not built
            ahead of time) or "auto": "cuda" where `python -m torch_l2topo build` built the extension for this
            GPU (a fresh process then neither imports Triton nor compiles), else "triton". The calibration
            is read or measured as by default either way.
        block_bytes: the block size, a positive multiple of 128 bytes.
        timeout_s: the probe's watchdog deadline.

    Returns:
        A PartitionMap: homes (int8 per block: 0/1, -1 undecided), margins, the storage mapped and timings.

    Raises:
        TypeError: `tensor` is not a torch.Tensor.
        ValueError: the tensor is not on a CUDA device, is empty or not line-aligned; block_bytes or backend is
            invalid.
        CalibrationMismatch: `topology` is another GPU's calibration.
        ProbeError: the calibration or the timings show no two partitions (a broken probe), the probe failed,
            or the call came during CUDA graph capture (map the tensor before capturing).
        ProbeTimeout: the probe ran past timeout_s.
    """
    import torch

    from ...measure.calibration import measuring

    t0 = time.perf_counter()
    storage = storage_of(tensor, block_bytes)
    check_choice("backend", backend, ("auto", "triton", "cuda"))
    hit = MAPS.get(tensor, block_bytes)
    if hit is not None:
        return hit
    if torch.cuda.is_current_stream_capturing():
        raise ProbeError("partition_map cannot measure during CUDA graph capture: map the tensor before capturing")
    index = tensor.device.index
    setup = setup_for(index, topology)
    backend = probe_backend(backend, index)
    plan = setup.plan(n_blocks_of(storage.nbytes(), block_bytes), tensor.device)
    # the classification's kernels run under the lock too: another process's probe must not time beside them
    with measuring(index), torch.cuda.device(index):
        cycles, probe_s = probe_timings(tensor, plan, setup.n_sm, block_bytes=block_bytes, backend=backend,
                                        timeout_s=timeout_s)
        classes = classify_blocks(cycles, plan.blocks)
    if not classes.found:
        raise ProbeError(f"partition map of cuda:{index}: {classes.reason}; the probe measured no partitions")
    pmap = PartitionMap(homes=classes.homes, margin=classes.margin, block_bytes=block_bytes,
                        data_ptr=storage.data_ptr(), nbytes=storage.nbytes(), device_index=index,
                        elapsed_s=time.perf_counter() - t0, probe_s=probe_s)
    MAPS.put(tensor, block_bytes, pmap)
    return pmap
