"""The independent check of a partition map: the blocks of a sample timed by the calibration's best SM pair,
one SM at a time, the mean of many loads each (reprobe), and how often the map agrees with it (agreement).
The kernel is triton_kernels/partition_probe.py's partition_reprobe_kernel.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .maps import PartitionMap, n_blocks_of, setup_for, storage_of

REPROBE_WARM = 2
REPROBE_TIMED = 16


@dataclass(frozen=True, eq=False)
class Reprobe:
    """The independent check: blocks (n,) probed; cycles (2, n) the mean cycles per load (of n_timed) seen by
    sms[0] (near partition 0) and sms[1] (near partition 1); homes (n,) the partition of the SM that saw it
    faster."""

    blocks: np.ndarray
    cycles: np.ndarray
    homes: np.ndarray
    sms: tuple[int, int]
    elapsed_s: float


def reprobe(tensor, sample_blocks, *, topology=None, block_bytes: int = 256, n_timed: int = REPROBE_TIMED,
            timeout_s: float = 2.0, warmup_ms: float = 50.0) -> Reprobe:
    """The independent check of a map: the blocks `sample_blocks` timed by the calibration's best SM pair,
    one SM at a time after warming the clocks for warmup_ms, the mean of n_timed loads each (not the map's
    fastest load: an independent statistic, and one slow load moves a mean of 16 by < half the smallest
    recorded difference); a block's home is the partition of the SM that saw it faster. Takes the GPU lock."""
    import torch

    from ...measure.calibration import measuring
    from ...measure.probes import checked_launch, to_device, warm_clocks

    t0 = time.perf_counter()
    storage = storage_of(tensor, block_bytes)
    blocks = np.asarray(sample_blocks, dtype=np.int64).ravel()
    n_blocks = n_blocks_of(storage.nbytes(), block_bytes)
    if blocks.size == 0 or blocks.min() < 0 or blocks.max() >= n_blocks:
        raise ValueError(f"sample_blocks must be a non-empty list of block indices in 0..{n_blocks - 1}")
    index, device = tensor.device.index, tensor.device
    setup = setup_for(index, topology, "triton")
    rows = np.full(setup.n_sm, -1, dtype=np.int32)
    rows[list(setup.pairs.best)] = [0, 1]
    with measuring(index), torch.cuda.device(index):
        warm_clocks(device, warmup_ms)
        cycles = torch.full((2, blocks.size), -1, dtype=torch.int64, device=device)
        # two SMs measure, one after the other (wave 1)
        checked_launch(device, "partition_reprobe", "triton", setup.n_sm, 1, timeout_s,
                       blocks.size * (REPROBE_WARM + n_timed),
                       (storage.data_ptr(), to_device(blocks, device), to_device(rows, device), cycles, blocks.size,
                        block_bytes, 0, REPROBE_WARM, n_timed), measuring_sms=2)
    c = cycles.cpu().numpy() / n_timed
    homes = np.where(c[0] < c[1], 0, np.where(c[1] < c[0], 1, -1))
    homes[(c < 0).any(axis=0)] = -1
    return Reprobe(blocks=blocks, cycles=c, homes=homes.astype(np.int8), sms=setup.pairs.best,
                   elapsed_s=time.perf_counter() - t0)


def agreement(pmap: PartitionMap, check: Reprobe) -> float:
    """Fraction of the reprobed blocks whose home the map gives the same (undecided in either counts as
    disagreement)."""
    mine = pmap.homes[check.blocks]
    return float(np.mean((mine >= 0) & (mine == check.homes)))
