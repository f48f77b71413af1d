"""embedding_bag: torch.nn.functional.embedding_bag's semantics, argument checks and errors, on a Triton gather.

    out = torch_l2topo.ops.embedding_bag(input, weight, offsets, mode="sum")

Contract: torch's arguments (max_norm, norm_type, scale_grad_by_freq and sparse aside), checked in torch's order
with torch's exception types and messages; backward for "sum" and "mean". fp32/bf16/fp16 tables on a GPU run the
Triton kernel (triton_kernels/embedding_bag.py), CPU tensors torch's own op, fp64 (on a GPU, or with
include_last_offset) `reference_bags`. The op is `torch.ops.torch_l2topo.embedding_bag`, whose fake implementation
is its own body: torch.compile(fullgraph=True) and CUDA graphs keep it whole; it mutates nothing. Index and
offset values are checked on a GPU by a device assert in the kernel (no host sync; it never reads outside the
table), on the CPU on the host.

Dispatch: an eager call needing no autograd graph runs the body directly (policy.direct_call). Small eager calls
under "auto" run the C++ eager kernel (eager_launch, ops/eager_kernels.py) where its estimated GPU time is below
EAGER_BELOW_US, the Triton call's host time; graphs and compiled code keep the Triton kernel. Docs: docs/ops.md.
"""
from __future__ import annotations

from typing import Optional

import torch

from .eager_kernels import eager_device, gpu_us
from .policy import AUTO, PLAIN_TENSORS, check_policy, direct_call, launch_placed, pow2, triton_launcher

try:
    from ..triton_kernels.embedding_bag import embedding_bag_backward_kernel, embedding_bag_kernel
except ImportError:  # no Triton: every call takes the PyTorch-ops path (reference_bags)
    embedding_bag_kernel = embedding_bag_backward_kernel = None

MODES = {"sum": 0, "mean": 1, "max": 2}
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
NO_PADDING = -1
# Bytes of one [ROWS, BLOCK_D] tile: 8 KB of rows in flight per program, whatever the row dtype (a tile counted
# in elements held half as many bf16 bytes, and a 32-row bag of 256-byte bf16 rows then took two dependent
# steps), on one warp: sixteen 16-byte loads in flight per thread and up to 32 programs per SM. One warp per
# tile: faster than 2 or 4 in benchmarks/bench_ops_kernels.py on the H200 (docs/ops.md).
TILE_BYTES = 8192
BYTES_PER_WARP = 8192
MAX_WARPS = 8
# Short bags come several to a program (bags_per_program), as long as the launch keeps this many programs: ~8
# single-warp programs per H200 SM, each with a tile of up to 8 KB of rows in flight (8 MB at once over the GPU).
MIN_PROGRAMS = 1024
# Small eager calls: the eager launch where its estimated GPU time is below the Triton call's host time (module doc).
# 52.0: the geometric mean of that host time on the fastest and slowest H200 host measured (docs/ops.md), so a
# wrong choice costs the same ratio at most on either; not tuned on the timings the rule is tested against.
EAGER_BELOW_US = 52.0
_is_compiling = torch.compiler.is_compiling  # read once: the eager rule's reads are its cost (eager_launch)
_is_capturing = torch._C._cuda_isCurrentStreamCapturing


def embedding_bag(input: torch.Tensor, weight: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                  mode: str = "mean", per_sample_weights: Optional[torch.Tensor] = None,
                  padding_idx: Optional[int] = None, include_last_offset: bool = False, *, policy: str = "auto",
                  check_indices: bool = True) -> torch.Tensor:
    """torch.nn.functional.embedding_bag on the Triton gather kernel (the module docstring says where a call runs).

    Args:
        input: int32 or int64 indices: 1-D with `offsets`, or 2-D (bags, fixed bag length) with offsets None.
        weight: the (num_embeddings, embedding_dim) table: fp32, bf16, fp16 or fp64.
        offsets: 1-D, where each bag starts in `input` (1-D input only).
        mode: "sum", "mean" (torch's default) or "max".
        per_sample_weights: weights of input's shape and weight's dtype (mode "sum" only).
        padding_idx: a row that counts in no sum, mean or maximum.
        include_last_offset: offsets holds n_bags + 1 entries, the last one ending the last bag (CSR).
        policy: "auto", or a placement policy (torch_l2topo.ops.policy).
        check_indices: check index and offset values; on a GPU inside the kernel, without a host sync. False
            compiles the check out (the kernel skips out-of-range entries either way). Small eager calls under
            "auto" with checked indices run the C++ eager kernel (eager_launch), which checks them too.

    Returns:
        (n_bags, embedding_dim) in weight's dtype; empty bags give zeros.

    Raises:
        ValueError: shapes, mode or policy that torch (or the placement layer) refuses, with torch's messages.
        RuntimeError: index or weight dtypes, devices, padding_idx, include_last_offset without offsets, or (CPU
            tensors) index and offset values that torch refuses, with torch's messages. On a GPU a bad value is
            a device-side assert at the next synchronization, as in torch's CUDA index kernels.
        NotImplementedError: per_sample_weights with a mode other than "sum".
    """
    if policy == AUTO and check_indices:
        launch = eager_launch(input, weight, offsets, mode, per_sample_weights, padding_idx)
        if launch is not None:
            return launch(weight, input, offsets, MODES[mode], include_last_offset)
    check_policy(policy)
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
    compiling = torch.compiler.is_compiling()
    if check_indices and weight.device.type == "cpu" and not compiling:
        _check_values(input, offsets, weight.size(0))
    check = check_indices and weight.is_cuda and not compiling
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.contiguous()
    args = (input.contiguous(), offsets.contiguous(), weight, per_sample_weights, MODES[mode], padding,
            include_last_offset, check, policy)
    if direct_call(weight, per_sample_weights):
        return _forward(*args)
    return torch.ops.torch_l2topo.embedding_bag(*args)


def eager_launch(input, weight, offsets, mode, per_sample_weights=None, padding_idx=None):
    """The launch that runs a small eager call under "auto" (eager_kernels.py: the C++ eager kernel, or torch's op
    until it is built), or None for the Triton kernel: an eager call on CUDA tensors (a plain tensor or an
    nn.Parameter table; 1-D input with 1-D offsets, a 2-D fp32/bf16/fp16 table, no per_sample_weights or
    padding_idx, a known mode, no autograd), outside compilation and CUDA graph capture, that the launch does on the
    GPU in less than EAGER_BELOW_US (module doc). Every read here is host time on the calls it picks, so each is
    read once."""
    # compilation first: under torch.compile the size test below would put guards on the sizes
    if _is_compiling() or per_sample_weights is not None or padding_idx is not None or offsets is None \
            or mode not in MODES:
        return None
    if type(weight) not in PLAIN_TENSORS or not weight.is_cuda or weight.dtype not in KERNEL_DTYPES \
            or input.ndim != 1 or offsets.ndim != 1 or (weight.requires_grad and torch.is_grad_enabled()):
        return None
    shape = weight.shape
    if len(shape) != 2:
        return None
    n_rows, dim = shape
    row_bytes = dim * weight.itemsize
    device = eager_device(weight.get_device())
    terms = device.terms  # before the launch: eager_kernels._build sets bags first
    if gpu_us(terms, input.numel(), offsets.numel(), row_bytes, n_rows * row_bytes, device.l2_bytes) \
            >= EAGER_BELOW_US or _is_capturing():
        return None
    return device.bags


def _promoted_indices(input, offsets):
    """input and offsets in their common integer dtype, as torch promotes them (int32 or int64, else torch's
    error)."""
    common = torch.promote_types(input.dtype, offsets.dtype)
    if common not in INDEX_DTYPES:
        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the following scalar types: "
                           f"Long, Int; but got {_legacy_type(common, input.device)} instead (while checking "
                           "arguments for embedding_bag)")
    if input.dtype == offsets.dtype:  # the usual call: no .to (a dispatcher call each)
        return input, offsets
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


def _check_values(input, offsets, n_rows: int) -> None:
    """torch's data checks on the host, with its messages (CPU tensors)."""
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


def tile_config(n_indices: int, n_bags: int, dim: int, itemsize: int = 4) -> tuple:
    """(ROWS, BLOCK_D, num_warps) of the kernels: a chunk of ROWS rows covers a typical bag in one step, up to
    TILE_BYTES per tile, with one warp per BYTES_PER_WARP (at most MAX_WARPS)."""
    block_d = pow2(dim)
    mean_rows = max(1, -(-n_indices // max(n_bags, 1)))
    rows = min(pow2(mean_rows), max(1, TILE_BYTES // (block_d * itemsize)))
    return rows, block_d, min(MAX_WARPS, max(1, rows * block_d * itemsize // BYTES_PER_WARP))


def bags_per_program(n_bags: int, rows: int, block_d: int, itemsize: int) -> int:
    """BAGS of the forward kernel: the largest power of two whose bags' first ROWS rows fit in TILE_BYTES while
    the launch keeps at least MIN_PROGRAMS programs (1 for a bag that fills a tile alone)."""
    bags = 1
    while 2 * bags * rows * block_d * itemsize <= TILE_BYTES and n_bags // (2 * bags) >= MIN_PROGRAMS:
        bags *= 2
    return bags


def launch_kernel(input, offsets, weight, per_sample_weights, out, check: bool, mode: int, padding_idx: int,
                  policy: str, config: Optional[tuple] = None, bags: Optional[int] = None) -> None:
    """The forward kernel over every bag of `out`, placed as `policy` says (policy.launch_placed; its items are
    groups of BAGS bags); check: the kernel asserts its data checks (compiled with debug=True for the assert
    alone: the kernel module's doc). config: (ROWS, BLOCK_D, num_warps), default tile_config's; bags: BAGS,
    default bags_per_program's."""
    n_bags, dim = out.shape
    itemsize = weight.element_size()
    rows, block_d, num_warps = config or tile_config(input.numel(), n_bags, dim, itemsize)
    bags = bags or bags_per_program(n_bags, rows, block_d, itemsize)
    psw = per_sample_weights if per_sample_weights is not None else out  # never read when HAS_PSW is off

    def launch(grid, plan, state, place):
        triton_launcher(embedding_bag_kernel, out)[(grid,)](
            input, offsets, weight, psw, out, n_bags, input.numel(), offsets.numel(), weight.size(0), dim,
            weight.stride(0), padding_idx, plan, state, MODE=mode, HAS_PSW=per_sample_weights is not None,
            CHECK=check, ROWS=rows, BAGS=bags, BLOCK_D=block_d, PLACE=place, num_warps=num_warps, debug=check,
            sanitize_overflow=False)

    launch_placed("embedding_bag", policy, launch, -(-n_bags // bags), out)


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


def _forward(input: torch.Tensor, offsets: torch.Tensor, weight: torch.Tensor,
             per_sample_weights: Optional[torch.Tensor], mode: int, padding_idx: int, include_last_offset: bool,
             check: bool, policy: str) -> torch.Tensor:
    """The op's body (eager calls without autograd run it directly): 1-D input and offsets of one integer dtype,
    padding_idx normalized (-1: none); check: assert the kernel's data checks (GPU)."""
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
    launch_kernel(input, offsets, weight, per_sample_weights, out, check, mode, padding_idx, policy)
    return out


_embedding_bag_op = torch.library.custom_op("torch_l2topo::embedding_bag", _forward, mutates_args=())
_embedding_bag_op.register_fake(_forward)  # the body on fake tensors: allocations only (policy.triton_launcher)


def _setup_context(ctx, inputs, output):
    input, offsets, weight, per_sample_weights, mode, padding_idx, include_last_offset, _, _ = inputs
    ctx.mode, ctx.padding_idx, ctx.include_last_offset = mode, padding_idx, include_last_offset
    ctx.weight_shape = weight.shape
    needs_weight = per_sample_weights is not None and ctx.needs_input_grad[3]
    ctx.save_for_backward(input, offsets, weight if needs_weight else None, per_sample_weights)


def _backward(ctx, grad):
    """Dense weight gradient (sum, mean) and per_sample_weights gradient (sum): the backward kernel on a GPU
    (embedding_bag_backward), PyTorch ops elsewhere; accumulated in fp32 (fp64 for fp64 tables)."""
    input, offsets, weight, per_sample_weights = ctx.saved_tensors
    if ctx.mode == MODES["max"]:
        raise NotImplementedError("torch_l2topo.ops.embedding_bag: backward is implemented for mode 'sum' and "
                                  "'mean'; train mode 'max' with torch.nn.functional.embedding_bag")
    need_weight = ctx.needs_input_grad[2]
    need_psw = per_sample_weights is not None and ctx.needs_input_grad[3]
    n_bags = grad.size(0)
    grad_weight = grad_psw = None
    if n_bags == 0 or input.numel() == 0:
        grad_weight = grad.new_zeros(ctx.weight_shape) if need_weight else None
        grad_psw = torch.zeros_like(per_sample_weights) if need_psw else None
    elif _runs_on_triton(grad):
        grad_weight, grad_psw = torch.ops.torch_l2topo.embedding_bag_backward(
            input, offsets, grad.contiguous(), weight, per_sample_weights, ctx.weight_shape[0], ctx.mode,
            ctx.padding_idx, need_weight, need_psw)
        grad_weight, grad_psw = (grad_weight if need_weight else None), (grad_psw if need_psw else None)
    else:
        grad_weight, grad_psw = _reference_backward(ctx, grad, input, offsets, weight, per_sample_weights,
                                                    need_weight, need_psw)
    return None, None, grad_weight, grad_psw, None, None, None, None, None


def _reference_backward(ctx, grad, input, offsets, weight, per_sample_weights, need_weight: bool, need_psw: bool):
    n_bags = grad.size(0)
    bag, keep = entry_bags(input, offsets, n_bags, ctx.include_last_offset, ctx.padding_idx)
    acc = torch.promote_types(grad.dtype, torch.float32)
    scale = keep.to(acc)
    if ctx.mode == MODES["mean"]:
        scale = scale / _bag_counts(bag, keep, n_bags, acc).clamp(min=1)[bag]
    elif per_sample_weights is not None:
        scale = scale * per_sample_weights.to(acc)
    grad_rows = grad.to(acc)[bag]
    grad_weight = grad_psw = None
    if need_weight:
        grad_rows_scaled = grad_rows * scale[:, None]
        grad_weight = torch.zeros(ctx.weight_shape, device=grad.device, dtype=acc)
        grad_weight = grad_weight.scatter_add_(0, input.long()[:, None].expand_as(grad_rows_scaled),
                                               grad_rows_scaled).to(grad.dtype)
    if need_psw:
        grad_psw = ((grad_rows * weight[input].to(acc)).sum(1) * keep).to(per_sample_weights.dtype)
    return grad_weight, grad_psw


def _backward_impl(input: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor, weight: Optional[torch.Tensor],
                 per_sample_weights: Optional[torch.Tensor], n_rows: int, mode: int, padding_idx: int,
                 need_weight: bool, need_psw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_weight (n_rows, dim) in grad's dtype, grad_psw) on the GPU; an output not needed is empty. Bags
    are offsets[:n_bags] with n_bags = grad.size(0) (include_last_offset's last offset ends the last bag)."""
    n_bags, dim = grad.shape
    acc = torch.zeros((n_rows, dim) if need_weight else (0, dim), dtype=torch.float32, device=grad.device)
    grad_psw = (torch.zeros_like(per_sample_weights) if need_psw else grad.new_empty(0))
    rows, block_d, num_warps = tile_config(input.numel(), n_bags, dim, grad.element_size())
    w = weight if need_psw else grad  # never read without NEED_PSW
    psw = per_sample_weights if per_sample_weights is not None else grad  # never read without HAS_PSW
    triton_launcher(embedding_bag_backward_kernel, grad)[(n_bags,)](
        input, offsets, grad, w, psw, acc, grad_psw, input.numel(), offsets.numel(), n_rows, dim,
        w.stride(0) if need_psw else dim, padding_idx, MEAN=mode == MODES["mean"],
        HAS_PSW=per_sample_weights is not None, NEED_WEIGHT=need_weight, NEED_PSW=need_psw, ROWS=rows,
        BLOCK_D=block_d, num_warps=num_warps)
    return acc.to(grad.dtype), grad_psw


_backward_op = torch.library.custom_op("torch_l2topo::embedding_bag_backward", _backward_impl, mutates_args=())
_backward_op.register_fake(_backward_impl)


_embedding_bag_op.register_autograd(_backward, setup_context=_setup_context)
