"""The embedding-bag kernels: the forward gathers BAGS consecutive bags per item, ROWS rows of each at a time as
one [BAGS, ROWS, BLOCK_D] tile; the backward adds each bag's output gradient into the weight gradient rows of
its entries.

Bandwidth is the whole game: every row of a step's tile is one tile load, so BAGS x ROWS independent row loads
are in flight per program, each a run of 16-byte vector loads (the row stride is specialised as a multiple of 16
elements when it is). Sums and means accumulate in fp32. Bag b spans input[offsets[b] : offsets[b + 1]]; entries
equal to padding_idx, and out-of-range ones, contribute nothing and count towards no mean, so the kernels never
read or write outside the table. Short bags come BAGS to a program (ops/embedding_bag.py: bags_per_program): a
program with one short bag has little to do but wait.
CHECK: a bad index or offset fails a tl.device_assert with CHECK_MESSAGE, as torch's CUDA index kernels assert,
with no host sync and no launch beside the kernel's; a checked launch passes debug=True and
sanitize_overflow=False (debug alone also asserts on int32 overflow). The forward's items (groups of BAGS bags)
come from the placement helpers: in PLACE_DIRECT mode they compile to nothing. Docs: docs/ops.md.
"""
import triton
import triton.language as tl

from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start

CHECK_MESSAGE = tl.constexpr(
    "embedding_bag: an index is outside [0, num_embeddings), or offsets are not valid (offsets[0] must be 0, "
    "non-decreasing, and not past the input's length)")
# mode codes of torch.embedding_bag (and of the op's schema)
MODE_SUM = tl.constexpr(0)
MODE_MEAN = tl.constexpr(1)
MODE_MAX = tl.constexpr(2)


@triton.jit
def _bag_span(bag, real, offsets_ptr, n_indices, n_offsets, CHECK: tl.constexpr):
    """(start, end) of each bag's entries (a scalar bag or a vector of them), clamped into the input; an empty
    span where `real` is false (past the last bag); asserts valid offsets of the real bags when CHECK."""
    start = tl.load(offsets_ptr + bag, mask=real, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + bag + 1, mask=real & (bag + 1 < n_offsets), other=n_indices).to(tl.int64)
    if CHECK:
        tl.device_assert(~real | ((start >= 0) & (end >= start) & (end <= n_indices) & ((bag != 0) | (start == 0))),
                         CHECK_MESSAGE)
    start = tl.maximum(start, 0)
    return start, tl.where(real, tl.minimum(end, n_indices), start)


@triton.jit
def _bags(group, input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_bags, n_indices, n_offsets, n_rows, dim,
          stride_w, padding_idx, MODE: tl.constexpr, HAS_PSW: tl.constexpr, CHECK: tl.constexpr,
          ROWS: tl.constexpr, BAGS: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[b, :dim] = bag b's sum / mean / max of weight rows (fp32 accumulation), 0 for an empty bag, for the
    BAGS bags b of `group` (b < n_bags): one [BAGS, ROWS, BLOCK_D] tile per step, ROWS rows of every bag."""
    bag = group.to(tl.int64) * BAGS + tl.arange(0, BAGS)
    real = bag < n_bags
    start, end = _bag_span(bag, real, offsets_ptr, n_indices, n_offsets, CHECK)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < dim
    if MODE == MODE_MAX:
        acc = tl.full([BAGS, BLOCK_D], float("-inf"), tl.float32)
    else:
        acc = tl.zeros([BAGS, BLOCK_D], tl.float32)
    count = tl.zeros([BAGS, ROWS], tl.int32)
    for step in range(0, tl.max(end - start, axis=0), ROWS):
        pos = start[:, None] + step + tl.arange(0, ROWS)[None, :]
        in_bag = pos < end[:, None]
        idx = tl.load(input_ptr + pos, mask=in_bag, other=0).to(tl.int64)
        in_table = (idx >= 0) & (idx < n_rows)
        take = in_bag & in_table & (idx != padding_idx)
        mask = take[:, :, None] & col_ok[None, None, :]
        row_ptrs = weight_ptr + idx[:, :, None] * stride_w + cols[None, None, :]
        if MODE == MODE_MAX:
            rows = tl.load(row_ptrs, mask=mask, other=float("-inf"))
            acc = tl.maximum(acc, tl.max(rows.to(tl.float32), axis=1))
        else:
            rows = tl.load(row_ptrs, mask=mask, other=0.0).to(tl.float32)
            if HAS_PSW:
                rows = rows * tl.load(psw_ptr + pos, mask=take, other=0.0).to(tl.float32)[:, :, None]
            acc += tl.sum(rows, axis=1)
        count += take.to(tl.int32)
        if CHECK:
            tl.device_assert(in_table | ~in_bag, CHECK_MESSAGE)
    n_taken = tl.sum(count, axis=1)
    if MODE == MODE_MEAN:
        acc = acc / tl.maximum(n_taken, 1).to(tl.float32)[:, None]
    if MODE == MODE_MAX:
        acc = tl.where(n_taken[:, None] > 0, acc, 0.0)
    tl.store(out_ptr + bag[:, None] * dim + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=real[:, None] & col_ok[None, :])


@triton.jit
def embedding_bag_kernel(input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_bags, n_indices, n_offsets, n_rows,
                         dim, stride_w, padding_idx, plan_ptr, state_ptr, MODE: tl.constexpr, HAS_PSW: tl.constexpr,
                         CHECK: tl.constexpr, ROWS: tl.constexpr, BAGS: tl.constexpr, BLOCK_D: tl.constexpr,
                         PLACE: tl.constexpr):
    sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
    group, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
    n_done = 0
    while group >= 0:
        _bags(group, input_ptr, offsets_ptr, weight_ptr, psw_ptr, out_ptr, n_bags, n_indices, n_offsets, n_rows, dim,
              stride_w, padding_idx, MODE, HAS_PSW, CHECK, ROWS, BAGS, BLOCK_D)
        n_done += 1
        group, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
    plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)


@triton.jit
def embedding_bag_backward_kernel(input_ptr, offsets_ptr, grad_ptr, weight_ptr, psw_ptr, grad_weight_ptr,
                                  grad_psw_ptr, n_indices, n_offsets, n_rows, dim, stride_w, padding_idx,
                                  MEAN: tl.constexpr, HAS_PSW: tl.constexpr, NEED_WEIGHT: tl.constexpr,
                                  NEED_PSW: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program p takes bag p, loads its output gradient row once (scaled by 1 / count for a mean) and adds it,
    times the entry's per-sample weight, into grad_weight[index] with fp32 atomic adds: no (entries x dim)
    intermediate is written. With per-sample weights it also writes each entry's gradient,
    dot(grad_out[bag], weight[index])."""
    bag = tl.program_id(0)
    start, end = _bag_span(bag, True, offsets_ptr, n_indices, n_offsets, False)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < dim
    grad = tl.load(grad_ptr + bag.to(tl.int64) * dim + cols, mask=col_ok, other=0.0).to(tl.float32)
    if MEAN:
        count = tl.zeros([ROWS], tl.int32)
        for first in range(start, end, ROWS):
            pos = first + tl.arange(0, ROWS)
            idx = tl.load(input_ptr + pos, mask=pos < end, other=padding_idx).to(tl.int64)
            count += ((pos < end) & (idx >= 0) & (idx < n_rows) & (idx != padding_idx)).to(tl.int32)
        grad = grad / tl.maximum(tl.sum(count, axis=0), 1).to(tl.float32)
    for first in range(start, end, ROWS):
        pos = first + tl.arange(0, ROWS)
        in_bag = pos < end
        idx = tl.load(input_ptr + pos, mask=in_bag, other=0).to(tl.int64)
        take = in_bag & (idx >= 0) & (idx < n_rows) & (idx != padding_idx)
        mask = take[:, None] & col_ok[None, :]
        if NEED_WEIGHT:
            rows = tl.broadcast_to(grad[None, :], [ROWS, BLOCK_D])
            if HAS_PSW:
                rows = rows * tl.load(psw_ptr + pos, mask=take, other=0.0).to(tl.float32)[:, None]
            tl.atomic_add(grad_weight_ptr + idx[:, None] * dim + cols[None, :], rows, mask=mask, sem="relaxed")
        if NEED_PSW:
            w = tl.load(weight_ptr + idx[:, None] * stride_w + cols[None, :], mask=mask, other=0.0)
            dot = tl.sum(w.to(tl.float32) * grad[None, :], axis=1)
            tl.store(grad_psw_ptr + pos, dot.to(grad_psw_ptr.dtype.element_ty), mask=in_bag)
