"""Physical bounds for an L2 map, measured on the GPU: the latency of an L1 hit and of a DRAM access.

An L2 hit lies between the two (on the H200: L1 ~30-40 cycles, L2 270-350, DRAM 600+). The GPU tests
measure both in the same run as the map they check, so a probe that misses L2 (a ring evicted, clock
reads that skip the loads) fails them. The kernel is triton_kernels/oracle.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import LINE_BYTES, LINE_WORDS
from .launch import launch

DRAM_BYTES = 1 << 30      # 1 GiB: about 17x the H200's L2, so ~94% of random lines miss it
DRAM_LOADS = 2048         # timed dependent loads per program: ~1 ms at ~700 cycles each
L1_LOADS = 256


@dataclass(frozen=True)
class Oracles:
    """Cycles per load: l1 (a line that hits in L1), dram (random lines of DRAM_BYTES), one value per program."""

    l1: np.ndarray
    dram: np.ndarray


def _ring(n_lines: int, device, seed: int):
    """A single random cycle through n_lines 128-byte lines; returns (buffer, address of line 0)."""
    import torch

    order = torch.from_numpy(np.random.default_rng(seed).permutation(n_lines)).to(device)
    buf = torch.zeros(n_lines * LINE_WORDS, dtype=torch.int64, device=device)
    base = buf.data_ptr()
    lines = buf.view(n_lines, LINE_WORDS)
    lines[order, 0] = base + torch.roll(order, -1) * LINE_BYTES  # line order[i] points to order[i + 1]
    return buf, base


def measure_oracles(device, programs: int = 4, seed: int = 0) -> Oracles:
    """Measure the L1-hit and DRAM latencies with `programs` one-warp programs each (Triton)."""
    import torch

    l1_lines = torch.zeros(programs * LINE_WORDS, dtype=torch.int64, device=device)
    l1_lines.view(programs, LINE_WORDS)[:, 0] = l1_lines.data_ptr() + torch.arange(programs, device=device) * LINE_BYTES
    starts = l1_lines.view(programs, LINE_WORDS)[:, 0].clone()
    out = torch.zeros(programs * 3, dtype=torch.int64, device=device)
    launch("latency_oracle", "triton", programs, starts, out, 4, L1_LOADS, True)
    l1 = out.view(programs, 3)[:, 0].cpu().numpy() / L1_LOADS
    n_lines = DRAM_BYTES // LINE_BYTES
    ring, base = _ring(n_lines, device, seed)  # alive until out.cpu() below has waited for the chase
    starts = base + torch.from_numpy(np.random.default_rng(seed + 1).choice(n_lines, programs, replace=False)
                                     ).to(device) * LINE_BYTES
    launch("latency_oracle", "triton", programs, starts, out, 0, DRAM_LOADS, False)
    dram = out.view(programs, 3)[:, 0].cpu().numpy() / DRAM_LOADS
    return Oracles(l1=l1, dram=dram)
