"""Self-localization on the GPU: in-kernel L2 signatures, and where a kernel ran according to them.

A kernel calls l2_signature (triton_kernels/whereami.py, or cuda_ext/l2_signature.cuh) on a few chosen
lines of a buffer that this process calibrated with the line probe; the classifier (localize.py) maps the
cycle counts to SM, TPC, GPC and L2 partition. Line homes depend on physical addresses, so the buffer must
be the one that was calibrated: Localizer keeps both together.
"""
from __future__ import annotations

import numpy as np

from .probe_layout import LINE_WORDS
from .probes import BACKENDS, _check_choice

SIGNATURE_WARM = 2    # warm loads per line: the first load may miss in L2 after the calibration's eviction
SIGNATURE_TIMED = 8   # timed dependent loads per line, as in the line probe


def measure_signatures(lines, chosen, grid: int, backend: str = "triton"):
    """Launch `grid` one-warp CTAs that each record (%smid, signature over lines `chosen` of `lines`).

    Returns (smid (grid,), cycles per load (grid, k)). k = len(chosen) must be a power of two for Triton.
    """
    import torch

    _check_choice("backend", backend, BACKENDS)
    chosen = np.asarray(chosen, dtype=np.int32)
    k = len(chosen)
    n_lines = lines.numel() // LINE_WORDS
    if k < 1 or chosen.min() < 0 or chosen.max() >= n_lines:
        raise ValueError(f"chosen lines must be in 0..{n_lines - 1}, got {chosen.tolist()}")
    if grid < 1:
        raise ValueError(f"grid must be >= 1, got {grid}")
    idx = torch.from_numpy(chosen).to(lines.device)
    out = torch.full((grid, k + 1), -1, dtype=torch.int64, device=lines.device)
    if backend == "triton":
        if k & (k - 1):
            raise ValueError(f"the Triton signature needs a power-of-two number of lines, got {k}")
        from torch_l2topo.triton_kernels.whereami import whereami_kernel

        whereami_kernel[(grid,)](lines, idx, out, K=k, N_WARM=SIGNATURE_WARM, N_TIMED=SIGNATURE_TIMED, num_warps=1)
    else:
        from torch_l2topo import cuda_ext

        cuda_ext.load(torch.cuda.get_device_capability(lines.device)).whereami(
            lines, idx, out, SIGNATURE_WARM, SIGNATURE_TIMED)
    rows = out.cpu().numpy()
    return rows[:, 0], rows[:, 1:] / SIGNATURE_TIMED
