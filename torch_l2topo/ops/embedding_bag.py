"""embedding_bag: torch.nn.functional.embedding_bag's semantics, argument checks and errors, on a Triton gather.

    out = torch_l2topo.ops.embedding_bag(input, weight, offsets, mode="sum")

The same arguments as torch.nn.functional.embedding_bag (max_norm, norm_type, scale_grad_by_freq and sparse
aside): 1-D input with offsets or 2-D input of fixed-length bags, modes "sum", "mean" (torch's default) and
"max", per_sample_weights (mode "sum"), padding_idx (excluded from sums, means and maxima), include_last_offset.
Arguments are checked in torch's order with torch's exception types and messages (tests/test_ops_embedding_bag.py
compares them on the CPU). Backward (sum and mean) gives the dense weight gradient and, for "sum", the
per_sample_weights gradient, as torch does.

Where it runs: fp32, bf16 and fp16 tables on a CUDA device through the Triton kernel
(triton_kernels/embedding_bag.py); CPU tensors through torch's own CPU op; where torch's op means something else
(fp64 with include_last_offset: torch 2.13's fp64 CPU path ignores offsets[-1]) and for fp64 tables on a GPU,
through `reference_bags`, the kernel's semantics in PyTorch ops (tested against torch's op, and sharing its bag
assignment with the backward). The op is
`torch.ops.torch_l2topo.embedding_bag`, a torch.library.triton_op: its body calls only PyTorch ops and the
wrapped kernel (mutates nothing: the output is allocated inside), so torch.compile(fullgraph=True) traces into
it and CUDA graphs capture it.

Data checks (indices inside the table, offsets[0] == 0, offsets non-decreasing and ending inside the input): in
eager mode they run before the launch (on a GPU one reduction and one host sync; `check_indices=False` skips
them); inside CUDA graph capture and compiled regions they cannot run (no host sync there), and the kernel then
skips out-of-range entries instead of reading outside the table.

Placement: `policy=` is validated now; the kernel is a plain launch (one program per bag). The switch to the
placement layer (contract v2) is: the kernel's ITEM LOOP line becomes the plan_start / plan_next / plan_finish
loop around `_bag`, with PLACE a constexpr; the op gains the plan and state tensors as inputs (state in
mutates_args); `launch_kernel` takes the grid and PLACE from Placement(policy=...) instead of (n_bags,).
"""
from __future__ import annotations

from typing import Optional

import torch

from .policy import resolve_policy

try:
    from ..triton_kernels.embedding_bag import embedding_bag_kernel
except ImportError:  # no Triton: every call takes the PyTorch-ops path (reference_bags)
    embedding_bag_kernel = None

MODES = {"sum": 0, "mean": 1, "max": 2}
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
NO_PADDING = -1
# Elements of one [ROWS, BLOCK_D] tile: 2048 fp32 = 8 KB of rows in flight per program (16 elements, four
# 16-byte loads per thread at 4 warps), enough to cover L2/DRAM latency at full occupancy.
TILE_ELEMENTS = 2048
ELEMENTS_PER_WARP = 512


def embedding_bag(input: torch.Tensor, weight: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                  mode: str = "mean", per_sample_weights: Optional[torch.Tensor] = None,
                  padding_idx: Optional[int] = None, include_last_offset: bool = False, *, policy: str = "auto",
                  check_indices: bool = True) -> torch.Tensor:
    """torch.nn.functional.embedding_bag(input, weight, offsets, mode=..., per_sample_weights=...,
    padding_idx=..., include_last_offset=...) on the Triton gather kernel: (n_bags, embedding_dim), weight's
    dtype. policy: "auto" or "plain" (the placement policies raise PlacementError until the integration).
    check_indices: check the index and offset values before the launch in eager mode (see the module doc)."""
    resolve_policy(policy, "embedding_bag")
    if per_sample_weights is not None and input.size() != per_sample_weights.size():
        raise ValueError(f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is not None, then it "
                         f"must have the same shape as the input ({input.shape})")
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is a mini-batch of "
                             f"fixed length sequences. However, found offsets of type {type(offsets)}")
        if input.size(1) == 0:
            raise RuntimeError("step must be nonzero")  # torch.arange's error, as torch raises it here
        offsets = torch.arange(0, input.numel(), input.size(1), dtype=input.dtype, device=input.device)
        include_last_offset = False
        input = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif input.dim() == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension {input.dim()}")
    if mode not in MODES:
        raise ValueError("mode has to be one of sum, mean or max")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError("embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                  f"supported for mode='sum' (got mode='{mode}'). Please open a feature request on "
                                  "GitHub.")
    input, offsets = _promoted_indices(input, offsets)
    _check_types(weight, per_sample_weights)
    for name, tensor in (("input", input), ("offsets", offsets), ("per_sample_weights", per_sample_weights)):
        if tensor is not None and tensor.device != weight.device:
            raise RuntimeError(f"Expected all tensors to be on the same device, but {name} is on {tensor.device} "
                               f"and weight on {weight.device}")
    padding = _normalized_padding(padding_idx, weight.size(0))
    if include_last_offset and offsets.numel() < 1:
        raise RuntimeError("include_last_offset: number of offset should be at least 1")
    if check_indices and not torch.compiler.is_compiling() and not _capturing(weight):
        _check_values(input, offsets, weight.size(0))
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.contiguous()
    return torch.ops.torch_l2topo.embedding_bag(input.contiguous(), offsets.contiguous(), weight,
                                                per_sample_weights, MODES[mode], padding, include_last_offset)


def _promoted_indices(input, offsets):
    """input and offsets in their common integer dtype, as torch promotes them (int32 or int64, else torch's
    error)."""
    common = torch.promote_types(input.dtype, offsets.dtype)
    if common not in INDEX_DTYPES:
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {_legacy_type(common, input.device)} instead (while checking "
                           "arguments for embedding_bag)")
    return input.to(common), offsets.to(common)


def _check_types(weight, per_sample_weights):
    if not weight.dtype.is_floating_point or weight.dtype not in (*KERNEL_DTYPES, torch.float64):
        raise RuntimeError("Expected tensor for argument #1 'weight' to have one of the following scalar types: "
                           f"Half, BFloat16, Float, Double; but got {_legacy_type(weight.dtype, weight.device)} "
                           "instead (while checking arguments for embedding_bag)")
    if per_sample_weights is not None and per_sample_weights.dtype != weight.dtype:
        raise RuntimeError("Expected tensor for argument #1 'weight' to have the same type as tensor for argument "
                           f"#1 'per_sample_weights'; but type {_legacy_type(weight.dtype, weight.device)} does not "
                           f"equal {_legacy_type(per_sample_weights.dtype, weight.device)} (while checking "
                           "arguments for embedding_bag)")


def _legacy_type(dtype, device) -> str:
    """torch's legacy type name ("torch.FloatTensor", "torch.cuda.HalfTensor") that its error messages use."""
    return torch.empty(0, dtype=dtype, device=device.type if device.type in ("cpu", "cuda") else "cpu").type()


def _normalized_padding(padding_idx, n_rows: int) -> int:
    if padding_idx is None:
        return NO_PADDING
    if not -n_rows <= padding_idx < n_rows:
        raise RuntimeError(f"padding_idx must be within the number of embeddings, -{n_rows} through {n_rows - 1}, "
                           f"but got {padding_idx}")
    return padding_idx % n_rows


def _capturing(tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


def _check_values(input, offsets, n_rows: int) -> None:
    """torch's data checks, with its messages: one reduction and one host sync on a GPU."""
    n = input.numel()
    if offsets.numel() == 0:
        return
    stats = [offsets[0], offsets[-1], (offsets[1:] < offsets[:-1]).any().to(offsets.dtype)]
    if n:
        stats += [input.min(), input.max()]
    first, last, decreasing, *extremes = torch.stack(stats).tolist()
    if first != 0:
        raise RuntimeError("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                           f"position 0. However, got {first}")
    if last > n:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {last}")
    if decreasing:
        raise RuntimeError("embedding_bag: offsets must be non-decreasing (bag b is input[offsets[b]:offsets[b+1]])")
    if extremes and (extremes[0] < 0 or extremes[1] >= n_rows):
        bad = int(torch.nonzero((input < 0) | (input >= n_rows))[0, 0])
        raise RuntimeError(f"Index {bad} of input takes value {int(input[bad])} which is not in the valid range "
                           f"[0, {n_rows})")


def _runs_on_triton(weight) -> bool:
    return weight.is_cuda and weight.dtype in KERNEL_DTYPES and embedding_bag_kernel is not None


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tile_config(n_indices: int, n_bags: int, dim: int) -> tuple:
    """(ROWS, BLOCK_D, num_warps) of the kernel: a chunk of ROWS rows covers a typical bag in one step, up to
    TILE_ELEMENTS per tile, with one warp per ELEMENTS_PER_WARP elements (at most 8)."""
    block_d = _pow2(dim)
    mean_rows = max(1, -(-n_indices // max(n_bags, 1)))
    rows = min(_pow2(mean_rows), max(1, TILE_ELEMENTS // block_d))
    return rows, block_d, min(8, max(1, rows * block_d // ELEMENTS_PER_WARP))


def launch_kernel(input, offsets, weight, per_sample_weights, out, mode: int, padding_idx: int) -> None:
    """The forward kernel over every bag of `out` (a plain launch: program p takes bag p)."""
    n_bags, dim = out.shape
    rows, block_d, num_warps = tile_config(input.numel(), n_bags, dim)
    psw = per_sample_weights if per_sample_weights is not None else out  # never read when HAS_PSW is off
    torch.library.wrap_triton(embedding_bag_kernel)[(n_bags,)](
        input, offsets, weight, psw, out, input.numel(), offsets.numel(), weight.size(0), dim, weight.stride(0),
        padding_idx, MODE=mode, HAS_PSW=per_sample_weights is not None, ROWS=rows, BLOCK_D=block_d,
        num_warps=num_warps)


def entry_bags(input, offsets, n_bags: int, include_last_offset: bool, padding_idx: int):
    """(bag of every input entry, whether it counts): entries before offsets[0] or, with include_last_offset,
    from offsets[-1] on belong to no bag; padding entries count in none."""
    position = torch.arange(input.numel(), device=input.device, dtype=offsets.dtype)
    bag = (torch.searchsorted(offsets[:n_bags], position, right=True) - 1).clamp_(min=0)
    keep = (input != padding_idx) & (position >= offsets[0])
    if include_last_offset:
        keep &= position < offsets[n_bags]
    return bag, keep


def reference_bags(input, offsets, weight, per_sample_weights, mode: int, padding_idx: int,
                   include_last_offset: bool) -> torch.Tensor:
    """The op in PyTorch ops (the CPU path, and fp64 tables on a GPU): the kernel's semantics, accumulated in
    fp32 (fp64 for fp64 tables); bag b is input[offsets[b]:offsets[b + 1]], the last one ending at offsets[-1]
    with include_last_offset (the CSR meaning torch documents; torch 2.13's own fp64 CPU path reads on to the
    end of the input instead)."""
    n_bags = offsets.size(0) - 1 if include_last_offset else offsets.size(0)
    acc = torch.promote_types(weight.dtype, torch.float32)
    shape = (n_bags, weight.size(1))
    bag, keep = entry_bags(input, offsets, n_bags, include_last_offset, padding_idx)
    rows = weight[input].to(acc)
    if mode == MODES["max"]:
        rows = rows.masked_fill(~keep[:, None], float("-inf"))
        out = torch.full(shape, float("-inf"), dtype=acc, device=weight.device)
        out = out.scatter_reduce_(0, bag[:, None].expand_as(rows), rows, "amax")
        return out.masked_fill_(out == float("-inf"), 0).to(weight.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(acc)[:, None]
    # scatter_add_ adds entry after entry (and is far faster than index_add_ on the CPU)
    out = torch.zeros(shape, dtype=acc, device=weight.device).scatter_add_(0, bag[:, None].expand_as(rows),
                                                                             rows * keep[:, None])
    if mode == MODES["mean"]:
        out = out / _bag_counts(bag, keep, n_bags, acc).clamp(min=1)[:, None]
    return out.to(weight.dtype)


def _bag_counts(bag, keep, n_bags: int, dtype) -> torch.Tensor:
    return torch.zeros(n_bags, dtype=dtype, device=bag.device).scatter_add_(0, bag, keep.to(dtype))


@torch.library.triton_op("torch_l2topo::embedding_bag", mutates_args=())
def _embedding_bag_op(input: torch.Tensor, offsets: torch.Tensor, weight: torch.Tensor,
                      per_sample_weights: Optional[torch.Tensor], mode: int, padding_idx: int,
                      include_last_offset: bool) -> torch.Tensor:
    """The checked call: 1-D input and offsets of one integer dtype, padding_idx normalized (-1: none)."""
    n_bags = offsets.size(0) - 1 if include_last_offset else offsets.size(0)
    if n_bags == 0 or input.numel() == 0 or weight.size(1) == 0:
        return weight.new_zeros((n_bags, weight.size(1)))
    if not _runs_on_triton(weight):
        if weight.is_cpu and not (include_last_offset and weight.dtype == torch.float64):
            padding = None if padding_idx == NO_PADDING else padding_idx  # torch's own CPU op: the same semantics
            return torch.embedding_bag(weight, input, offsets, False, mode, False, per_sample_weights,
                                       include_last_offset, padding)[0]
        return reference_bags(input, offsets, weight, per_sample_weights, mode, padding_idx, include_last_offset)
    out = weight.new_empty((n_bags, weight.size(1)))
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    launch_kernel(input, offsets, weight, per_sample_weights, out, mode, padding_idx)
    return out


def _setup_context(ctx, inputs, output):
    input, offsets, weight, per_sample_weights, mode, padding_idx, include_last_offset = inputs
    ctx.mode, ctx.padding_idx, ctx.include_last_offset = mode, padding_idx, include_last_offset
    ctx.weight_shape = weight.shape
    needs_weight = per_sample_weights is not None and ctx.needs_input_grad[3]
    ctx.save_for_backward(input, offsets, weight if needs_weight else None, per_sample_weights)


def _backward(ctx, grad):
    """Dense weight gradient (sum, mean) and per_sample_weights gradient (sum) from PyTorch ops, accumulated in
    fp32 (fp64 for fp64 tables)."""
    input, offsets, weight, per_sample_weights = ctx.saved_tensors
    if ctx.mode == MODES["max"]:
        raise NotImplementedError("torch_l2topo.ops.embedding_bag: backward is implemented for mode 'sum' and "
                                  "'mean'; train mode 'max' with torch.nn.functional.embedding_bag")
    n_bags = grad.size(0)
    grad_weight = grad_psw = None
    if n_bags == 0 or input.numel() == 0:
        grad_weight = grad.new_zeros(ctx.weight_shape) if ctx.needs_input_grad[2] else None
        if per_sample_weights is not None and ctx.needs_input_grad[3]:
            grad_psw = torch.zeros_like(per_sample_weights)
        return None, None, grad_weight, grad_psw, None, None, None
    bag, keep = entry_bags(input, offsets, n_bags, ctx.include_last_offset, ctx.padding_idx)
    acc = torch.promote_types(grad.dtype, torch.float32)
    scale = keep.to(acc)
    if ctx.mode == MODES["mean"]:
        scale = scale / _bag_counts(bag, keep, n_bags, acc).clamp(min=1)[bag]
    elif per_sample_weights is not None:
        scale = scale * per_sample_weights.to(acc)
    grad_rows = grad.to(acc)[bag]
    if ctx.needs_input_grad[2]:
        grad_rows_scaled = grad_rows * scale[:, None]
        grad_weight = torch.zeros(ctx.weight_shape, device=grad.device, dtype=acc)
        grad_weight = grad_weight.scatter_add_(0, input.long()[:, None].expand_as(grad_rows_scaled),
                                               grad_rows_scaled).to(grad.dtype)
    if per_sample_weights is not None and ctx.needs_input_grad[3]:
        grad_psw = ((grad_rows * weight[input].to(acc)).sum(1) * keep).to(per_sample_weights.dtype)
    return None, None, grad_weight, grad_psw, None, None, None


_embedding_bag_op.register_autograd(_backward, setup_context=_setup_context)
