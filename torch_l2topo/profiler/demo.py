"""The host side of the profiler's demonstration kernels, used by its GPU tests, its benchmark and the fixture
recording: row sums that record their CTAs with this package's recorder (triton_kernels/recorder_demo.py, no
placement involved), and a copy instrumented with Proton's scopes (triton_kernels/proton_demo.py).

row_sums(x) equals x.sum(dim=1) (the reference the tests compare with). While recording is on
(measure.recording: profile(), recording(), or a trace handler while torch.profiler collects) each
program appends one record: rows summed, and how many of them are homed in its SM's L2 partition when
item_class (each row's home partition) and sm_partition (each SM's partition, -1 undecided) are given.
"""
from __future__ import annotations

import re

import torch

from ..measure.recording import active_recorder

KERNEL_NAME = "row_sum_kernel"
_idle: dict = {}  # device -> 1-word int64 tensor standing in for the recorder buffer when recording is off


def _int32(values, n: int, device, fill: int) -> torch.Tensor:
    if values is None:
        return torch.full((n,), fill, dtype=torch.int32, device=device)
    return torch.as_tensor(values, device=device).to(torch.int32)


def row_sums(x: torch.Tensor, *, item_class=None, sm_partition=None, grid: int | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """x.sum(dim=1) of a 2-D float32 CUDA tensor by `grid` programs (default: one per row, at most 4 per SM),
    recording its CTAs while recording is on."""
    import triton

    from ..triton_kernels.recorder_demo import row_sum_kernel

    if x.ndim != 2 or x.dtype != torch.float32 or not x.is_cuda:
        raise ValueError(f"row_sums takes a 2-D float32 CUDA tensor, got {tuple(x.shape)} {x.dtype} on {x.device}")
    x = x.contiguous()
    n_rows, dim = x.shape
    device = x.device
    n_sm = torch.cuda.get_device_properties(device).multi_processor_count
    grid = grid or max(min(n_rows, 4 * n_sm), 1)
    out = torch.empty(n_rows, dtype=torch.float32, device=device) if out is None else out
    rec = active_recorder(device.index)
    if rec is None:
        buffer, tag = _idle.setdefault(device.index, torch.zeros(1, dtype=torch.int64, device=device)), 0
    else:
        # the class census reads item_class on the host: not during graph capture (a sync)
        capturing = torch.cuda.is_current_stream_capturing()
        buffer, tag = rec.buffer, rec.register(KERNEL_NAME, None if capturing else item_class)
    with torch.cuda.device(device):
        row_sum_kernel[(grid,)](x, out, n_rows, dim, _int32(item_class, n_rows, device, 2),
                                _int32(sm_partition, n_sm, device, -1), buffer, tag, RECORD=rec is not None,
                                BLOCK=triton.next_power_of_2(dim))
    return out


def scoped_copy(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """A copy of the 1-D float32 CUDA tensor x by a kernel with a Proton scope (what a Proton session records)."""
    import triton

    from ..triton_kernels.proton_demo import scoped_copy_kernel

    y = torch.empty_like(x)
    with torch.cuda.device(x.device):
        scoped_copy_kernel[(triton.cdiv(x.numel(), block),)](x, y, x.numel(), BLOCK=block)
    return y


def ptx_instructions(ptx: str, kernel: str) -> list:
    """A kernel's PTX without what names its source (comments, .loc/.file lines, debug sections, the kernel's
    own name), whitespace normalized: two kernels compiled to the same machine code compare equal."""
    out = []
    for line in ptx.replace(kernel, "KERNEL").splitlines():
        line = line.split("//")[0].strip()
        if line.startswith(".section"):
            break
        if line and not line.startswith((".loc", ".file")):
            out.append(re.sub(r"\s+", " ", line))
    return out
